"""Small ONNX graphs, a model folder of them and a stand-in for Triton's model control: what the signature, model
version and `tritonnx-models` tests share."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from tritonnx.client.model_control import READY, ControlError, States
from tritonnx.server.versions import ModelFolder, selected_versions

CONFIG = 'backend: "python"\nmax_batch_size: 8\n'

# What Triton's get_model_config gives for a graph `x` FP32 [batch, 4] -> `y` FP32 [batch, 4] with max_batch_size 8.
SERVED = {
    "name": "m",
    "max_batch_size": 8,
    "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": ["4"]}],
    "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": ["4"]}],
}


def identity_graph(path: Path, inputs=(("x", TensorProto.FLOAT, ["batch", 4]),), outputs=("y",)) -> Path:
    """A graph whose outputs copy its first input (an Identity each)."""
    source = inputs[0][0]
    graph = helper.make_graph(
        [helper.make_node("Identity", [source], [name]) for name in outputs],
        "g",
        [helper.make_tensor_value_info(name, kind, shape) for name, kind, shape in inputs],
        [helper.make_tensor_value_info(name, inputs[0][1], inputs[0][2]) for name in outputs],
    )
    onnx.save(onnx_model(graph), path)
    return path


def onnx_model(graph: onnx.GraphProto) -> onnx.ModelProto:
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def make_model(repository: Path, versions=(1,), config: str = CONFIG) -> ModelFolder:
    folder = repository / "m"
    folder.mkdir(parents=True)
    (folder / "config.pbtxt").write_text(config)
    for version in versions:
        (folder / str(version)).mkdir()
        identity_graph(folder / str(version) / "model.onnx")
        (folder / str(version) / "model.py").write_text(f"# model.py of version {version}\n")
    return ModelFolder.find(repository, "m")


class RecordingControl:
    """Triton's model control as the folder decides it: a load serves what the policy selects from the
    folder, unless a version's model.onnx is in `refuse` (its load fails and nothing changes)."""

    def __init__(self, folder: ModelFolder) -> None:
        self.folder = folder
        self.loads = 0
        self.refuse: set[bytes] = set()
        self.served: list[int] = list(folder.versions()[-1:])
        self.known: States = {v: (READY, "") for v in self.served}

    def states(self, model: str) -> States:
        return dict(self.known)

    def served_config(self, model: str) -> dict | None:
        return SERVED if self.served else None

    def load(self, model: str) -> None:
        self.loads += 1
        selected = selected_versions(self.folder.version_policy(), self.folder.versions())
        for version in selected:
            if (self.folder.path / str(version) / "model.onnx").read_bytes() in self.refuse:
                self.known[version] = ("UNAVAILABLE", "Internal: ModelConfigError: no\n\nAt:\n  x.py(1): f\n")
                raise ControlError(f"load failed for model 'm': version {version} is at UNAVAILABLE state")
        for version in self.served:
            if version not in selected:
                self.known[version] = ("UNAVAILABLE", "unloaded")
        self.served = selected
        self.known.update({v: (READY, "") for v in selected})
