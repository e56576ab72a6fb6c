"""The images install exactly what the venv runs: every pin of deploy/docker/requirements-image.txt
is the venv's version, and agrees with requirements*.txt where those pin the same package."""

import importlib.metadata
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^\s#]+)", line.strip())
        if match:
            found[match.group(1).lower().replace("_", "-")] = match.group(2)
    return found


def test_the_image_pins_are_the_venvs_versions():
    image = pins(ROOT / "deploy/docker/requirements-image.txt") | pins(ROOT / "deploy/docker/requirements-models.txt")
    assert {"numpy", "onnxruntime", "pillow", "tritonclient", "grpcio", "protobuf", "aiohttp", "psutil", "onnx"} <= set(
        image
    )
    installed = {name: importlib.metadata.version(name) for name in image}
    assert installed == image


def test_the_image_pins_agree_with_the_requirement_files():
    image = pins(ROOT / "deploy/docker/requirements-image.txt")
    declared = pins(ROOT / "requirements.txt") | pins(ROOT / "requirements-serving.txt")
    shared = set(image) & set(declared)
    assert len(shared) >= 8
    assert {name: image[name] for name in shared} == {name: declared[name] for name in shared}
