"""polygrad.hf: the Hugging Face loaders of the separate polygrad-hf distribution, under the polygrad name.

Stage: user API shim. Input: nothing. Output: polygrad_hf's public names (download_hf, load_hf,
generate, Tokenizer, load_tokenizer and its errors), or an ImportError that names `pip install
polygrad-hf` when that distribution is not installed.
"""
try:
    from polygrad_hf import *  # noqa: F401,F403
    from polygrad_hf import __all__  # noqa: F401
except ModuleNotFoundError as e:
    if e.name != "polygrad_hf":
        raise
    raise ModuleNotFoundError("polygrad.hf needs the polygrad-hf distribution: pip install polygrad-hf "
                              "(or pip install 'polygrad[hf]')", name="polygrad.hf") from None
