"""What a bundle may ask of Model.load (polygrad/limits.py): work and memory grow with the file, the node
count is checked before decoding, JSON nesting and upcast unrolling are bounded, every kernel of the table
is valid, optimizer hyperparameters have the format's kinds, and each refusal says how to raise the cap.

The crafted files are tests/bundle_corpus.py's; polygrad-js checks the same files
(tests/test_bundle_differential.py, polygrad-js/test/limits.test.js).
"""
from __future__ import annotations

import pytest

from bundle_corpus import CRAFTED, one_kernel, reduction, split
from polygrad import BundleError, Model, bundle, limits
from polygrad.model.format import from_manifest
from polygrad.uop import serialize
from polygrad.uop.validate import kernel_work

GPT2_SMALL_FILE = 502_081_984  # load_hf(gpt2 small, max_seq_len=1024).save(): measured, see docs/bundle-format.md
GPT2_SMALL_BYTES = 2_491_544_208  # its buffers
GPT2_SMALL_WORK = 8_261_019_893_760  # node evaluations of its forward at 1024 tokens


def crafted(name: str) -> bytes:
    return CRAFTED[name][1]()


def test_a_2_38_step_reduction_is_refused_unless_the_caller_raises_max_work():
    blob = crafted("work_2_38_reduction")
    assert len(blob) < 2048
    with pytest.raises(BundleError, match=r"evaluates up to \d+ kernel nodes per call.*max_work=N"):
        Model.load(blob)
    Model.load(blob, max_work=2**42).dispose()  # loads; nothing runs


@pytest.mark.parametrize("name", [n for n in CRAFTED if n.startswith("work_")])
def test_work_is_summed_over_blocks_and_calls_at_the_default_cap(name):
    blob = crafted(name)
    if CRAFTED[name][0] == "accept":
        Model.load(blob).dispose()
    else:
        # (a loop of no points is refused as such, docs/bundle-format.md 4.1, before its work is counted)
        with pytest.raises(BundleError, match="kernel nodes per call|not 0 for all of them"):
            Model.load(blob)


def test_kernel_work_is_each_blocks_nodes_times_its_loop_points():
    def nodes(block):
        return len(block.toposort())
    k = reduction([2**10, 2**12])
    assert kernel_work(k) == nodes(k.src[0]) * 2**22
    k = reduction([2**20], blocks=3)  # the blocks add up (shared nodes count in each)
    assert kernel_work(k) == sum(nodes(b) for b in k.src) * 2**20
    k = reduction([2**30, 0])  # an empty inner loop still runs its outer one
    assert kernel_work(k) == nodes(k.src[0]) * 2**30


def test_a_tiny_file_cannot_make_the_loader_zero_fill_a_1gib_cache():
    blob = crafted("cache_1gib")
    assert len(blob) < 2048
    with pytest.raises(BundleError, match=r"more than 268435456 bytes.*max_bytes=N"):
        Model.load(blob)


def test_the_memory_cap_is_the_callers_when_given():
    blob = one_kernel(reduction([4]), 1, 1, extra_buffers=({"name": "t", "role": "temporary", "dtype": "float32",
                                                            "shape": [1 << 16], "size": 1 << 16},))
    Model.load(blob, max_bytes=(1 << 18) + 8).dispose()
    with pytest.raises(BundleError, match="max_bytes"):
        Model.load(blob, max_bytes=(1 << 18) + 7)
    with pytest.raises(Exception, match="max_bytes"):
        Model.load(blob, max_bytes="lots")


def test_the_defaults_admit_a_gpt2_small_saved_with_max_seq_len_1024():
    # the buffer table of a 2.49 GB model (unstored, so from_manifest allocates nothing) passes the default for
    # a file of GPT-2 small's size and not for a small file
    manifest, body, _ = split(crafted("cache_1gib"))
    cache = next(b for b in manifest["buffers"] if b["role"] == "cache")
    cache["shape"] = [GPT2_SMALL_BYTES // 4]
    cache["size"] = GPT2_SMALL_BYTES // 4
    from_manifest(manifest, memoryview(body), limits.default_max_bytes(GPT2_SMALL_FILE),
                  limits.default_max_work(GPT2_SMALL_FILE))
    with pytest.raises(BundleError, match="max_bytes"):
        from_manifest(manifest, memoryview(body), limits.default_max_bytes(4096), limits.default_max_work(4096))
    assert limits.default_max_work(GPT2_SMALL_FILE) >= GPT2_SMALL_WORK


def test_the_node_count_is_checked_before_any_node_is_decoded(monkeypatch):
    built = []
    real = serialize.decode_arg
    monkeypatch.setattr(serialize, "decode_arg", lambda *a, **k: built.append(1) or real(*a, **k))
    with pytest.raises(BundleError, match=f"the limit is {limits.MAX_NODES}"):
        Model.load(crafted("nodes_over_limit"))
    assert not built


@pytest.mark.parametrize("name", ["json_depth_300_ignored_key", "json_depth_10000_producer",
                                  "json_depth_10000_node_arg"])
def test_manifest_json_nests_at_most_256_levels(name):
    with pytest.raises(BundleError, match="deeper than 256|nests JSON too deeply|recursion"):
        Model.load(crafted(name))


def test_json_nesting_within_the_limit_is_read():
    Model.load(crafted("json_depth_200_ignored_key")).dispose()
    assert bundle.json_depth({"a": [[1], {"b": []}]}) == 4


@pytest.mark.parametrize("points", [257, 65536])
def test_an_upcast_range_past_256_points_is_refused(points):
    with pytest.raises(BundleError, match=f"unrolls {points} points of upcast RANGEs; the limit is 256"):
        Model.load(crafted(f"upcast_{points}"))


def test_every_kernel_of_the_table_is_validated_called_or_not():
    Model.load(crafted("kernel_uncalled_valid")).dispose()
    with pytest.raises(BundleError, match="kernel 1 'E_oob': INDEX node .* can reach element 0..7"):
        Model.load(crafted("kernel_uncalled_out_of_bounds"))


@pytest.mark.parametrize("name", [n for n in CRAFTED if n.startswith("optimizer_")])
def test_optimizer_hyperparameters_have_the_formats_kinds(name):
    if CRAFTED[name][0] == "accept":
        Model.load(crafted(name)).dispose()
    else:
        with pytest.raises(BundleError, match="training.optimizer"):
            Model.load(crafted(name))


def test_a_malformed_node_reached_only_through_a_buffer_shape_is_a_bundle_error():
    # a size expression turned into a DEFINE_VAR without an arg: printing it raised TypeError
    with pytest.raises(BundleError, match="kernel 0"):
        Model.load(crafted("kernel_shape_node_without_arg"))


def test_an_integer_may_be_written_as_any_json_number_with_an_integral_value():
    # polygrad-js reads 21.0 and 21 alike (JSON has one number type); Python refused 21.0
    Model.load(crafted("integers_written_as_floats")).dispose()
    with pytest.raises(BundleError, match="kernel must be an integer, got float"):
        Model.load(crafted("integer_with_a_fraction"))


def test_a_buffer_used_as_a_value_is_a_bundle_error():
    # a WHERE arm pointing at an int32 DEFINE_GLOBAL passed the dtype checks; the index proof then raised
    # TypeError (Python) and polygrad-js's lowering a TypeError of its own
    with pytest.raises(BundleError, match="uses a DEFINE_GLOBAL .* as a value"):
        Model.load(crafted("kernel_buffer_as_value"))


@pytest.mark.parametrize("name", ["reduce_nested_same_range", "reduce_siblings_same_range"])
def test_each_range_is_the_loop_of_one_reduce(name):
    # nested, the C renderer raised KeyError at the first call; side by side, the work count (one evaluation
    # per point) would miss the second loop
    with pytest.raises(BundleError, match="RANGE 0 is reduced by two REDUCEs"):
        Model.load(crafted(name))
