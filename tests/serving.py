"""What the integration and slow tests share: the checkout's repository and facades in front of a
test Triton (the fixtures themselves are in tests/conftest.py)."""

from __future__ import annotations

import re
from pathlib import Path

from tritonnx.server import facade as facade_process
from tritonnx.server.facade import FacadeProcess
from tritonnx.server.repository import read_config
from tritonnx.server.stubs import instance_count
from tritonnx.server.triton import TritonServer

CHECKOUT = Path(__file__).resolve().parents[1]
MODEL_REPOSITORY = CHECKOUT / "model_repository"
MODELS = ("resnet50", "mobilenet_v3_small", "text_classifier", "token_classifier")
# The image pipeline: its pre-processing model and one ensemble per image classifier.
IMAGE_CLASSIFIERS = ("resnet50", "mobilenet_v3_small")
IMAGE_PIPELINES = ("image_preprocess", *(f"{model}_image" for model in IMAGE_CLASSIFIERS))
SERVED_MODELS = MODELS + IMAGE_PIPELINES  # every model of the repository: the ONNX ones, then the pipeline's

# The facade under test: a small in-flight cap and message limit make backpressure and size
# limits testable with a few requests.
FACADE_MAX_IN_FLIGHT = 8
FACADE_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
FACADE_TEST_ARGS = [
    "--max-in-flight",
    str(FACADE_MAX_IN_FLIGHT),
    "--max-message-bytes",
    str(FACADE_MAX_MESSAGE_BYTES),
    "--health-interval",
    "1",
]


def start_facade(triton: TritonServer, workdir: Path, *extra: str) -> FacadeProcess:
    """A facade of its own in front of `triton`, ready; the caller stops it."""
    return facade_process.start_facade(
        triton.grpc_url, triton.admin_key, workdir / "facade.log", [*FACADE_TEST_ARGS, *extra]
    )


def demo_stubs() -> int:
    """How many Python stub processes Triton starts for the checkout's repository: an instance each, ensembles none."""
    configs = [read_config(folder) for folder in MODEL_REPOSITORY.iterdir() if (folder / "config.pbtxt").is_file()]
    return sum(instance_count(config) for config in configs if config.get("platform") != "ensemble")


def onnx_file(model: str) -> Path:
    return MODEL_REPOSITORY / model / "1" / "model.onnx"


def demo_config(model: str, instances: int) -> str:
    """A demo model's config.pbtxt with `instances` in its one instance group, whatever the committed count."""
    config, found = re.subn(
        r"(instance_group\s*\[\s*\{[^}]*count:\s*)\d+",
        rf"\g<1>{instances}",
        (MODEL_REPOSITORY / model / "config.pbtxt").read_text(),
    )
    assert found == 1, f"{model}'s config.pbtxt has no instance count"
    return config
