"""The stale-metadata rule, its one home: a request refused against metadata held a while is tried once more.

The predictor's inferences and the health probe's go through it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from tritonclient.grpc import service_pb2

from tritonnx.client.facade.errors import InvalidArgument
from tritonnx.client.facade.gateway import Gateway
from tritonnx.client.facade.translate import ModelInfo

# A request refused against model metadata older than this makes the metadata be asked of Triton again
# (a version with another signature may have gone live): at most once a second per model.
METADATA_RECHECK_S = 1.0
Answered = tuple[ModelInfo, service_pb2.ModelInferResponse]  # a model's metadata and its answer


async def with_current_metadata(
    gateway: Gateway, name: str, version: str, attempt: Callable[[], Awaitable[Answered]]
) -> Answered:
    """The stale-metadata rule, its one home: `attempt` (which reads the model's metadata from `gateway` and infers).

    A request is built from metadata held for the TTL, while a version with another signature may have gone live.
    Refused (InvalidArgument, by the facade's checks or by Triton) against metadata held longer than
    METADATA_RECHECK_S, the metadata is dropped and `attempt` runs once more with Triton's; an answer from a version
    the held metadata does not list drops it too, for the next request.
    """
    try:
        info, response = await attempt()
    except InvalidArgument:
        renewed = gateway.forget(name, older_than=METADATA_RECHECK_S)
        if not renewed and gateway.knows(name, version):
            raise
        info, response = await attempt()
    if response.model_version and response.model_version not in info.versions:
        gateway.forget(name)
    return info, response
