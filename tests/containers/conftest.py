"""What every container test needs: the images, built once per session."""

from __future__ import annotations

import subprocess

import pytest

from tests.serving import CHECKOUT

IMAGES = {"cpu": "tritonnx:cpu", "demo": "tritonnx:demo", "ngc": "tritonnx:ngc"}
# The images with the demo models in /models (tritonnx:cpu has none: a repository is mounted there).
DEMO_IMAGES = ("demo", "ngc")


@pytest.fixture(scope="session")
def images() -> dict[str, str]:
    """Every image, built (or found up to date in the layer cache), the engine started first if needed."""
    done = subprocess.run([str(CHECKOUT / "deploy/docker/images.sh"), "all"], cwd=CHECKOUT, capture_output=True,
                          text=True, timeout=1500, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return IMAGES
