"""`tritonnx-models check`: the verdict on a model's batching, and why, before it is served."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from tests.batch_corpus import CORPUS
from tritonnx.commands import models as models_cli


def check(path, capsys) -> tuple[int, list[str], str]:
    code = models_cli.main(["check", str(path)])
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err


@pytest.mark.parametrize(
    ("case", "verdict"),
    [
        ("reduce_negative_axis", "each request runs alone (the batch-axis rule)"),
        ("trilu_of_transposed_rows", "each request runs alone (rows checked at load differ)"),
        ("trilu_of_each_row", "batches (rows checked at load agree)"),
        ("softmax_last_axis", "batches (the batch-axis rule finds its rows independent)"),
    ],
)
def test_the_first_line_is_the_verdict_and_the_lines_after_it_say_why(tmp_path, capsys, case, verdict):
    path = tmp_path / f"{case}.onnx"
    onnx.save(CORPUS[case].model, path)
    code, lines, _ = check(path, capsys)
    assert code == 0 and lines[0] == f"{path}: {verdict}"
    assert CORPUS[case].phrase in "\n".join(lines[1:])
    assert (len(lines) > 1) == (CORPUS[case].rule != "independent")


def test_a_graph_with_a_fixed_first_dim_is_said_not_to_batch(tmp_path, capsys):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])
    graph = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "g", [x], [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, tmp_path / "fixed.onnx")
    code, lines, _ = check(tmp_path / "fixed.onnx", capsys)
    assert code == 0 and lines == [f"{tmp_path / 'fixed.onnx'}: no batching: input 'x' has a fixed first dim 3, so "
                                   "Triton hands it each request's tensors whole (max_batch_size 0)"]  # fmt: skip


def test_a_file_that_is_not_a_model_exits_1_saying_why(tmp_path, capsys):
    (tmp_path / "empty.onnx").write_bytes(b"")
    code, lines, err = check(tmp_path / "empty.onnx", capsys)
    assert code == 1 and lines == [] and err.strip() == f"error: {tmp_path / 'empty.onnx'}: empty.onnx is empty"
