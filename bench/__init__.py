"""Measurements: make bench, bench-peers, tune, soak and chaos (overload); the images study in bench/studies/.

They run from the checkout, serve its model repository (or $TRITONNX_MODEL_REPOSITORY) and write
their results under bench/results/ (not committed; kept reports go to bench/reports/).
"""

from pathlib import Path

from tritonnx.common.paths import Paths

REPOSITORY = Paths.from_environment().model_repository
RESULTS = Path(__file__).resolve().parent / "results"
