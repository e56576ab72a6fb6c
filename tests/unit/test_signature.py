"""The signature check of a new model file against what Triton serves (tritonnx/server/signature.py): what breaks a
client is named, what fits passes, batching predicted as auto-complete decides it, and files that cannot load."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from tests.unit.graphs import SERVED, identity_graph, onnx_model
from tritonnx.backend.onnx_io import read_graph_io
from tritonnx.server.signature import (
    Signature,
    SignatureError,
    Tensor,
    auto_completed_max_batch_size,
    check_onnx,
    check_signature,
    incompatibilities,
)


def signature_of(path: Path, max_batch_size: int = 8) -> Signature:
    return Signature.from_graph(read_graph_io(path), max_batch_size)


def test_the_same_graph_fits_the_served_config(tmp_path):
    served = Signature.from_config(SERVED)
    assert served == signature_of(identity_graph(tmp_path / "m.onnx"))
    assert incompatibilities(served, signature_of(identity_graph(tmp_path / "m.onnx"))) == []
    assert served.describe() == "inputs x (FP32 [-1, 4]); outputs y (FP32 [-1, 4]); max_batch_size 8"


def test_a_fixed_input_dim_may_become_dynamic_not_the_other_way():
    served = Signature((Tensor("x", "FP32", (4,)),), (Tensor("y", "FP32", (-1,)),), 8)
    wider = Signature((Tensor("x", "FP32", (-1,)),), (Tensor("y", "FP32", (4,)),), 8)
    assert incompatibilities(served, wider) == []
    narrower = incompatibilities(wider, served)
    assert narrower == [
        "input 'x' takes dims [4] in the new file, not every shape of the served [-1]",
        "output 'y' has dims [-1] in the new file, clients of the served model get [4]",
    ]


@pytest.mark.parametrize(
    ("new", "problem"),
    [
        (Signature((Tensor("x", "FP16", (4,)),), (Tensor("y", "FP32", (4,)),), 8), "input 'x' is FP16 in the new file"),
        (Signature((Tensor("x", "FP32", (4, 1)),), (Tensor("y", "FP32", (4,)),), 8), "input 'x' takes dims [4, 1]"),
        (Signature((Tensor("pixels", "FP32", (4,)),), (Tensor("y", "FP32", (4,)),), 8), "input 'x' is gone"),
        (
            Signature((Tensor("x", "FP32", (4,)), Tensor("z", "FP32", (1,))), (Tensor("y", "FP32", (4,)),), 8),
            "the new file needs input 'z', which clients of the served model do not send",
        ),
        (Signature((Tensor("x", "FP32", (4,)),), (Tensor("scores", "FP32", (4,)),), 8), "output 'y' is gone"),
        (
            Signature((Tensor("x", "FP32", (4,)),), (Tensor("extra", "FP32", (1,)), Tensor("y", "FP32", (4,))), 8),
            "output 'y' is not output 1 of the new file any more (['extra', 'y'])",
        ),
        (Signature((Tensor("x", "FP32", (4,)),), (Tensor("y", "INT64", (4,)),), 8), "output 'y' is INT64"),
        (
            Signature((Tensor("x", "FP32", (4,)),), (Tensor("y", "FP32", (4,)),), 0),
            "the served model batches up to 8, the new file does not batch",
        ),
    ],
)
def test_what_breaks_a_client_is_named(new, problem):
    served = Signature.from_config(SERVED)
    found = incompatibilities(served, new)
    assert any(p.startswith(problem) for p in found), found


def test_added_optional_inputs_and_trailing_outputs_fit():
    served = Signature.from_config(SERVED)
    new = Signature(
        (Tensor("x", "FP32", (4,)), Tensor("temperature", "FP32", (1,), optional=True)),
        (Tensor("y", "FP32", (4,)), Tensor("logits", "FP32", (4,))),
        8,
    )
    assert incompatibilities(served, new) == []
    assert incompatibilities(
        Signature((Tensor("x", "FP32", (4,), optional=True),), (), 8), Signature((Tensor("x", "FP32", (4,)),), (), 8)
    ) == ["input 'x' may be left out of requests to the served model, the new file needs it"]


def test_batching_is_predicted_as_auto_complete_decides_it(tmp_path):
    dynamic = read_graph_io(identity_graph(tmp_path / "d.onnx"))
    fixed = read_graph_io(identity_graph(tmp_path / "f.onnx", inputs=(("x", TensorProto.FLOAT, [3, 4]),)))
    assert auto_completed_max_batch_size(dynamic, written=None) == 4  # Triton's default
    assert auto_completed_max_batch_size(dynamic, written=None, default=8) == 8  # the server's --backend-config
    assert auto_completed_max_batch_size(fixed, written=None) == 0
    assert auto_completed_max_batch_size(dynamic, written=16) == 16
    assert auto_completed_max_batch_size(dynamic, written=0) == 0


def test_a_config_writing_inputs_and_outputs_is_predicted_not_to_batch(tmp_path):
    """Tutorial style: every dim written and no max_batch_size; auto-complete completes nothing, so it serves with 0."""
    (tmp_path / "1").mkdir()
    onnx_file = identity_graph(tmp_path / "1" / "model.onnx")
    (tmp_path / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\n'
        'input [{ name: "x", data_type: TYPE_FP32, dims: [-1, 4] }]\n'
        'output [{ name: "y", data_type: TYPE_FP32, dims: [-1, 4] }]\n'
    )
    served = {"max_batch_size": 0, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": ["-1", "4"]}],
              "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": ["-1", "4"]}]}  # fmt: skip
    new = check_signature("m", tmp_path / "config.pbtxt", read_graph_io(onnx_file), served, False, lambda _: None)
    assert new.max_batch_size == 0
    assert [t.dims for t in new.inputs] == [(-1, 4)]


def test_a_file_onnx_runtime_cannot_load_is_refused_with_its_reason(tmp_path):
    (tmp_path / "garbage.onnx").write_bytes(b"not an onnx model")
    with pytest.raises(SignatureError, match="not an ONNX model that can be served"):
        check_onnx(tmp_path / "garbage.onnx")
    # The graph reads, but an operator that does not exist cannot load.
    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    onnx.save(onnx_model(graph), tmp_path / "bad_op.onnx")
    with pytest.raises(SignatureError, match="ONNX Runtime cannot load .*NoSuchOp"):
        check_onnx(tmp_path / "bad_op.onnx")
    with pytest.raises(SignatureError, match="is not a file"):
        check_onnx(tmp_path / "missing.onnx")
