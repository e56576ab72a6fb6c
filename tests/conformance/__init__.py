"""The conformance tier: ONNX's own test models served through tritonserver, every output checked.

`corpus.py` (the cases the `onnx` wheel ships), `serving.py` (a chunk of them served and checked) and
`__main__.py` (`make conformance`: the whole corpus, about 15 minutes) are the suite itself; pytest
collects only `test_*.py` here: a slice of the corpus and the command at its smallest
(`make test-conformance`).
"""
