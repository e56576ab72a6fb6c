"""The corpus of tests/batch_corpus.py served by a real tritonserver, every graph with Triton's dynamic batcher.

Each graph is written in the one-line style of Triton's onnxruntime backend, with a batcher that waits long enough
for concurrent requests to merge. Requests of different rows go in at once: every answer equals in-process ONNX
Runtime on the request alone; Triton's statistics show that the batcher merged requests; a coupled graph's instance
ran each of them alone (its log line says so, and its answers would be wrong otherwise), a control ran them together.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient

from tests.batch_corpus import CORPUS, rows
from tests.kserve import execution_counts, infer_concurrently, reference_session
from tritonnx.backend.runner import rows_agree
from tritonnx.server.stack import ServingStack

CONFIG = (
    'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
    "dynamic_batching { max_queue_delay_microseconds: 300000 }\n"
    "instance_group [{ count: 1, kind: KIND_CPU }]\n"
)
SIZES = (1, 2, 1, 1)  # the rows of each request of a burst
BURSTS = 5  # at most, until Triton merges requests of one burst


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("batch-independence")
    repository = workdir / "repository"
    for name, case in CORPUS.items():
        (repository / name / "1").mkdir(parents=True)
        onnx.save(case.model, repository / name / "1" / "model.onnx")
        (repository / name / "config.pbtxt").write_text(CONFIG)
    with ServingStack(repository, workdir, with_facade=False, triton_http=False) as stack:
        yield stack


@pytest.fixture(scope="module")
def client(served):
    with grpcclient.InferenceServerClient(served.triton.grpc_url) as client:
        yield client


@pytest.mark.parametrize("model", CORPUS)
def test_merged_requests_each_get_their_own_answer_and_only_controls_run_together(served, client, model):
    case = CORPUS[model]
    reference = reference_session(served.triton.model_repository / model / "1" / "model.onnx")
    merged = False
    for burst in range(BURSTS):
        requests = [{"x": rows(n, seed=100 * burst + i)} for i, n in enumerate(SIZES)]
        before = execution_counts(client, model, served.triton.admin_headers)
        answers = infer_concurrently(client, model, requests, ["y"])
        for request, answer in zip(requests, answers, strict=True):
            assert answer.error is None, answer.error
            expected = reference.run(["y"], request)[0]
            if case.coupled:
                np.testing.assert_array_equal(answer.outputs["y"], expected)  # its own run, as in-process
            else:
                assert rows_agree({"y": answer.outputs["y"]}, [{"y": expected}]) is None
        inferences, executions = execution_counts(
            client, model, served.triton.admin_headers, at_least=before[0] + sum(SIZES)
        )
        assert inferences - before[0] == sum(SIZES)
        if executions - before[1] < len(SIZES):
            merged = True
            break
    assert merged, f"Triton never merged a burst of {len(SIZES)} concurrent requests in {BURSTS} tries"
    log = served.triton.log_file.read_text(errors="replace")
    alone = f"model '{model}': its rows are not independent" in log
    assert alone == case.coupled
