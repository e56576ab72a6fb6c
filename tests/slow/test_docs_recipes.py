"""The docs' recipes, run as a user runs them beside `make serve`, against a stack of their own (slow: a stack and
every page's recipes, a few minutes).

Every `<!-- test: run -->` block of README.md and docs/*.md (tests/docs_blocks.py) runs from a scratch folder laid
out as the checkout: `.venv` (a link to this one), `model_repository/` (demo models, linked) and `build/` (the
stack's logs; no admin key file: the recipes read the key from the environment), with the files the recipes
name. The well-known addresses in a block become the stack's free ports. A page's blocks run in order; the models a page added are unloaded and removed after it, so
every page starts from the same repository. Every `protobuf` block is loaded by tritonserver as a model's config.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.docs_blocks import ADDRESS, CHECKOUT, PAGES, Block, all_blocks, blocks, write_recipe_files
from tests.graphs import small_classifier
from tests.helpers import wait_until
from tests.serving import MODEL_REPOSITORY
from tritonnx.client.model_control import TritonControl
from tritonnx.server.repository import link_models
from tritonnx.server.stack import ServingStack

# What the run blocks call: the small image model, the text model, and the image pipeline of the small one.
MODELS = ("mobilenet_v3_small", "text_classifier", "image_preprocess", "mobilenet_v3_small_image")
RUN_PAGES = [page for page in PAGES if any(block.marker == "run" for block in blocks(page))]
CONFIG_BLOCKS = [block for block in all_blocks() if block.kind == "protobuf"]
BLOCK_TIMEOUT_S = 300


@dataclass
class Served:
    stack: ServingStack
    home: Path  # the scratch checkout the blocks run in

    @property
    def repository(self) -> Path:
        return self.stack.repository

    def ports(self) -> dict[str, str]:
        """Each well-known port of `make serve` -> the stack's."""
        triton, facade = self.stack.triton, self.stack.facade
        assert facade is not None
        return {
            "8000": str(triton.ports.http),
            "8001": str(triton.ports.grpc),
            "8002": str(triton.ports.metrics),
            "8003": str(self.stack.supervisor_metrics_port),
            "50051": str(facade.grpc_port),
            "3000": str(facade.http_port),
        }

    def environment(self) -> dict[str, str]:
        triton = self.stack.triton
        return {
            **os.environ,
            "TRITONNX_HOME": str(self.home),
            "TRITONNX_MODEL_REPOSITORY": str(self.repository),
            "TRITONNX_BUILD_DIR": str(self.home / "build"),
            "TRITONNX_ADMIN_KEY": self.stack.admin_key,
            "TRITONNX_TRITON_URL": triton.grpc_url,
            "TRITONNX_TRITON_HTTP_URL": triton.http_url,
        }

    def run(self, block: Block) -> subprocess.CompletedProcess:
        ports = self.ports()
        text = ADDRESS.sub(lambda m: f"127.0.0.1:{ports[m.group(1)]}", block.text)
        command = (
            [sys.executable, "-c", text] if block.kind == "python" else ["bash", "-e", "-o", "pipefail", "-c", text]
        )
        return subprocess.run(
            command,
            cwd=self.home,
            env=self.environment(),
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT_S,
            check=False,
        )


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[Served]:
    home = tmp_path_factory.mktemp("docs-recipes")
    (home / ".venv").symlink_to(CHECKOUT / ".venv")
    link_models(home / "model_repository", {model: MODEL_REPOSITORY / model for model in MODELS})
    write_recipe_files(home)
    # As under `make serve`, whose demo repository makes resnet50 the default: a model the health probe can call.
    facade_args = ["--default-model", "mobilenet_v3_small"]
    stack = ServingStack(
        home / "model_repository", home / "build", facade_args=facade_args, supervised=True, supervisor_metrics_port=0
    )
    with stack:  # no build/admin-key: the recipes read the key from the environment, where the user set it
        yield Served(stack, home)


@pytest.fixture
def control(served) -> Iterator[TritonControl]:
    with TritonControl(served.stack.triton.grpc_url, admin_key=served.stack.admin_key) as control:
        yield control


def remove_models(served: Served, control: TritonControl, names: set[str]) -> None:
    """Unload and delete what a page added: model folders, and the publish records beside them."""
    for name in sorted(names):
        path = served.repository / name
        if path.is_file():
            path.unlink()
            continue
        if any(entry.get("name") == name for entry in control.index()):
            control.unload(name)
        shutil.rmtree(path)
    # The next page starts from a ready server: a version swapped out may still be unloading.
    wait_until(control.server_ready, 60, lambda: f"tritonserver ready again; its index: {control.index()}")


@pytest.mark.parametrize("page", RUN_PAGES, ids=lambda page: str(page.relative_to(CHECKOUT)))
def test_a_pages_recipes_run_as_written(served, control, page: Path):
    before = {path.name for path in served.repository.iterdir()}
    try:
        for block in (b for b in blocks(page) if b.marker == "run"):
            done = served.run(block)
            assert done.returncode == block.exit_code, (
                f"{block.id} exited {done.returncode}, not {block.exit_code}:\n{block.text}\n"
                f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
            )
    finally:
        remove_models(served, control, {path.name for path in served.repository.iterdir()} - before)


@pytest.mark.parametrize("block", CONFIG_BLOCKS, ids=lambda block: block.id)
def test_a_config_in_the_docs_loads_in_tritonserver(served, control, block: Block):
    """The block as a model's config.pbtxt, over a small graph in versions 1-4 (a version policy may name them)."""
    name = "config_" + re.sub(r"\W", "_", block.id)
    folder = served.repository / name
    for version in range(1, 5):
        small_classifier(folder / str(version) / "model.onnx")
    named = re.search(r"^\s*(platform|backend)\s*:", block.text, re.MULTILINE)
    (folder / "config.pbtxt").write_text(block.text if named else 'platform: "onnxruntime_onnx"\n' + block.text)
    try:
        control.load(name)
        assert control.ready(name)
    finally:
        remove_models(served, control, {name})


def test_the_triton_metrics_the_metrics_page_names_are_on_tritons_page(served):
    named = set(re.findall(r"`(nv_\w+)`", (CHECKOUT / "docs" / "metrics.md").read_text()))
    with urllib.request.urlopen(served.stack.triton.metrics_url, timeout=10) as response:
        page = response.read().decode()
    exported = set(re.findall(r"^# TYPE (\w+) ", page, re.MULTILINE))
    assert named and not named - exported, f"docs/metrics.md names metrics Triton does not export: {named - exported}"
