"""Plain-data definitions that polygrad-core and polygrad-js share, one source for both languages.

Stage: definitions. Input: nothing. Output: tables (no code from outside this folder is imported).
Python reads them directly; polygrad-js/tools/gen/*.py render them into polygrad-js/src/generated/.
"""
