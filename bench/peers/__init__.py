"""The benchmark's peers: other ways to serve the same model.onnx, each at its best documented setup.

Each peer lives in a folder of its own (`<peer>/server.py`, `<peer>/requirements.txt`) and runs from a venv of its own
(`venvs`): their frameworks pull numpy 2, protobuf 6 and more, which must never reach the project's .venv. Nothing
here imports more than the standard library at package level: the peers import `bench.peers.common` in their venvs.
"""
