"""The conformance tier: models nobody wrote for tritonnx, served through tritonserver, every output checked.

ONNX's own test models: `corpus.py` (the cases the `onnx` wheel ships), `serving.py` (a chunk of them served and
checked). The exporters' corpus: `export_models.py` (torch.onnx.export of transformers, torchvision and timm, run in
a venv of its own) and `exported.py` (served behind Triton's batcher, each answer compared with in-process ONNX
Runtime alone). `__main__.py` is `make conformance` (both, about 20 minutes); pytest collects only `test_*.py`
here: a slice of each and the command at its smallest (`make test-conformance`).
"""
