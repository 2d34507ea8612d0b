"""The generators of polygrad-js's tables: one module per file of src/generated/.

Stage: build (development tool). Input: a definition in polygrad-core (polygrad/definitions/, or a
module that computes constants). Output: the text of one JavaScript module.

A generator module is any `tools/gen/<table>.py` whose name does not start with `_`; it exposes

    OUT: pathlib.Path      the file it writes, under polygrad-js/src/generated/
    render() -> str        that file's whole text, starting with `_js.header(...)` ("do not edit")
    exports() -> dict      (optional) the values the file's module.exports holds, as Python data:
                           tests/test_generated_tables.py loads the file in Node and compares them

`tools/gen_all.py` finds the modules by listing this folder, so a new table needs no registration:
add the module, run `python polygrad-js/tools/gen_all.py`, and require the file from src/.
`_js.py` holds what the generators share (the header, JavaScript literals).
"""
