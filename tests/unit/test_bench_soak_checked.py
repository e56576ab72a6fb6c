"""The soak's checked targets without a server: their requests, the reference outputs, answers judged."""

import asyncio

import numpy as np
import onnx
from onnx import TensorProto, helper
from tritonclient.grpc import service_pb2

from bench.peers.common import session
from bench.soak.load import CheckedFacade, CheckedTriton
from tritonnx.client.proto import inference_pb2


def text_model(path):
    """Two INT64 inputs of [batch, sequence], two FP32 outputs: their sum and the mask, as floats."""
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"]) for n in ("ids", "mask")]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "sequence"]) for n in ("sum", "float")]
    nodes = [
        helper.make_node("Add", ["ids", "mask"], ["both"]),
        helper.make_node("Cast", ["both"], ["sum"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["mask"], ["float"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(nodes, "text", inputs, outputs)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return session(path)


def test_the_facade_target_checks_every_named_output_of_every_answer(tmp_path):
    target = CheckedFacade("127.0.0.1:1", "m", text_model(tmp_path / "m.onnx"))
    target.payloads = asyncio.run(target._build(None))  # no channel needed to build the facade's requests
    assert len(target.payloads) == 4 and len(set(target.payloads)) == 4  # four different sequences

    def answer(index, version="1", change=0.0, drop=False):
        request = inference_pb2.PredictRequest.FromString(target.payloads[index])
        ids, mask = (np.frombuffer(t.raw_data, np.int64) for t in request.inputs)
        response = inference_pb2.PredictResponse(model_version=version)
        outputs = {"sum": (ids + mask).astype(np.float32) + change, "float": mask.astype(np.float32)}
        for name, values in outputs.items():
            if not (drop and name == "float"):
                tensor = response.outputs.add(name=name, dtype=inference_pb2.FP32, shape=[1, len(values)])
                tensor.raw_data = values.tobytes()
        return response.SerializeToString()

    target.check(0, answer(0))
    target.check(3, answer(3, version="2"))
    assert target.wrong == 0 and target.versions == {"1": 1, "2": 1}
    target.check(1, answer(1, change=1.0))
    target.check(2, answer(2, drop=True))
    target.check(1, answer(0))  # the answer to another request
    assert target.wrong == 3 and len(target.wrong_examples) == 3
    assert "sum differ" in target.wrong_examples[0] and "float differ" in target.wrong_examples[1]


def test_the_triton_target_checks_its_answers_by_output_name(tmp_path):
    target = CheckedTriton("127.0.0.1:1", "m", text_model(tmp_path / "m.onnx"))
    ids, mask = (target.images[0][name] for name in ("ids", "mask"))  # the first request's, as the reference ran it
    assert ids.shape == (1, 16) and (mask == 1).all()

    def answer(order, change=0.0):
        outputs = {"sum": (ids + mask).astype(np.float32) + change, "float": mask.astype(np.float32)}
        response = service_pb2.ModelInferResponse(model_version="3")
        for name in order:
            response.outputs.add(name=name, datatype="FP32", shape=[1, 16])
            response.raw_output_contents.append(outputs[name].tobytes())
        return response.SerializeToString()

    target.check(0, answer(["float", "sum"]))  # outputs in another order than the graph's: matched by name
    assert target.wrong == 0 and target.versions == {"3": 1}
    target.check(0, answer(["sum", "float"], change=0.5))
    assert target.wrong == 1
