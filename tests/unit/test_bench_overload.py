"""The direct path's bounded model (bench/overload.py): the policy docs/models.md gives for exposed ports."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from bench import REPOSITORY
from bench.overload import BOUNDED_INSTANCES, BOUNDED_THREADS, QUEUE_BOUND, bounded, held_requests


@pytest.mark.parametrize("model", ["resnet50", "mobilenet_v3_small"])
def test_a_bounded_demo_model_rejects_past_its_queue_with_two_single_threaded_instances(model):
    text = bounded((REPOSITORY / model / "config.pbtxt").read_text())
    config = text_format.Parse(text, model_config_pb2.ModelConfig())

    policy = config.dynamic_batching.default_queue_policy
    assert policy.max_queue_size == QUEUE_BOUND and policy.timeout_action == model_config_pb2.ModelQueuePolicy.REJECT
    [group] = config.instance_group
    assert group.count == BOUNDED_INSTANCES == 2
    assert config.parameters["intra_op_thread_count"].string_value == str(BOUNDED_THREADS) == "1"
    assert held_requests(text) == QUEUE_BOUND + 2 * config.max_batch_size


def test_a_config_without_a_dynamic_batcher_cannot_be_bounded():
    with pytest.raises(ValueError, match="no dynamic_batching"):
        bounded("max_batch_size: 4\ninstance_group [ { kind: KIND_CPU, count: 1 } ]\n")
