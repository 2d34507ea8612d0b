"""The version of polygrad-core: what `polygrad.__version__` and a bundle's "producer" field say.

Stage: none (a constant). Input: nothing. Output: `__version__`. Its own module so that code below
the package root (model/core.py writing a bundle) reads it without importing `polygrad` itself.
"""
__version__ = "0.1.0"
