"""The benchmark's peers: other ways to serve the same model.onnx, each at its best documented setup.

Each peer lives in a folder of its own (`<peer>/server.py` and `<peer>/requirements.txt`) and runs
from a venv of its own under build/peers/ (`venvs`): their frameworks pull numpy 2, protobuf 5 and
more, which must never reach the project's .venv. `servers` starts them (and tritonnx's own paths)
for the benchmark, `reference` checks their answers against in-process ONNX Runtime, and
`python -m bench.peers` (make bench-peers) measures them all with the one load engine.

Nothing here imports more than the standard library at package level: the peers' servers import
`bench.peers.common` inside their own venvs.
"""
