"""What Python and polygrad-js must agree on, as plain data: one definition, two languages.

Stage: shared (no stage of its own). Input: nothing. Output: the tables below, read directly by
polygrad's Python modules and turned into polygrad-js's `src/generated/*.js` by
`polygrad-js/tools/gen_all.py` (one generator per table in `polygrad-js/tools/gen/`):

    ops.py        every op of the IR: src count, dtype classes, the levels where it may appear
    dtypes.py     every dtype: serialised name, item size, kind, integer range
    limits.py     what a bundle may ask of the loader (re-exported by polygrad/limits.py)
    bundle.py     the .pgb container and manifest: magic, versions, header layout, roles,
                  entrypoints, manifest keys, the kernel codec's format and versions
    optimizer.py  optimizer defaults, hyperparameter kinds and value rules, state-layout constants
    symbolic_rules.py  the index-simplification rules, rows over a fixed vocabulary both languages implement
    quant_formats.py   llama.cpp's block formats weights are kept in (Q8_0 ... Q6_K); no generated JS table:
                  polygrad-js runs their dequantization as the plain IR a saved kernel holds

The modules hold data only and import nothing from polygrad outside this folder, so the generators
can read them without importing the library's machinery, and Python cannot drift from them. Change
a definition, then run `python polygrad-js/tools/gen_all.py`; tests/test_generated_tables.py fails
while a generated file differs from what its definition gives.
"""
