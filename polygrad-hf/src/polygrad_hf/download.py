"""download_hf: fetch a Hugging Face repository snapshot (config, weights, tokenizer) to the local cache.

Stage: user API, before checkpoint reading. Input: a repo id (or a local folder, passed through).
Output: the local folder path. The download is huggingface_hub's `snapshot_download` (its cache, its
authentication, its progress bars); without huggingface_hub installed the error names the pip line.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

from polygrad_hf.errors import need_package

# what load_hf reads: the config, single or sharded safetensors with the index, the tokenizer files. Not
# GGUF: such repositories hold one file per quantization, so the caller names the one to fetch.
DEFAULT_PATTERNS = ("*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken")


def download_hf(repo_id: str | os.PathLike, revision: str | None = None, cache_dir: str | os.PathLike | None = None,
                allow_patterns: Sequence[str] | str | None = None, **kwargs: Any) -> str:
    """The local folder of `repo_id` at `revision`, downloaded (or found in the cache) by huggingface_hub.

    An existing local folder or file is returned unchanged. `allow_patterns` defaults to the config,
    safetensors and tokenizer files (not PyTorch .bin weights, not GGUF: for a GGUF repository name the
    file, e.g. allow_patterns=["*Q8_0.gguf"], and pass that file to load_hf); other keyword arguments
    (token=, local_files_only=, ...) go to `huggingface_hub.snapshot_download`.
    """
    if os.path.exists(os.fspath(repo_id)):
        return os.fspath(repo_id)
    if not isinstance(repo_id, str) or not repo_id:
        raise TypeError(f"download_hf takes a repo id such as 'gpt2' or a local folder, got {repo_id!r}")
    hub = need_package("huggingface_hub", "huggingface_hub", "download_hf")
    patterns = list(DEFAULT_PATTERNS) if allow_patterns is None else allow_patterns
    # called through the module attribute at call time, so a patched or updated hub function is the one used
    return hub.snapshot_download(repo_id, revision=revision, cache_dir=cache_dir,  # type: ignore[attr-defined]
                                 allow_patterns=patterns, **kwargs)
