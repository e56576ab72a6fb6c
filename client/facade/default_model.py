"""The model of a request that names none, and the model /health probes.

`--default-model` names it. Unset, it follows what Triton serves, so that any repository serves without naming
one of its models in the facade's settings: `resnet50` while Triton serves it (the demo repository's), else the
one model Triton serves; with several, a request must name its model (INVALID_ARGUMENT lists the models served),
and /health probes the first of them, by name, whose inputs are all numbers.
"""

from __future__ import annotations

import time

from tritonnx.client.facade.errors import FacadeError, InvalidArgument, NotFound, Unavailable
from tritonnx.client.facade.gateway import Gateway

# The demo repository's default, kept while Triton serves it.
DEMO_MODEL = "resnet50"
# How long a default that follows what Triton serves is kept before Triton is asked again (a model loaded or
# unloaded meanwhile changes it).
FOLLOW_TTL_S = 2.0


class DefaultModel:
    """The default model: the one set, or the one that follows what Triton serves (see the module's rule)."""

    def __init__(self, gateway: Gateway, configured: str) -> None:
        self.gateway = gateway
        self.configured = configured
        # (when resolved, the default or "" for none, the ready models by name)
        self._followed: tuple[float, str, tuple[str, ...]] | None = None

    @property
    def name(self) -> str:
        """The default as last resolved ("" for none yet): for metric labels and logs, which ask Triton nothing."""
        if self.configured:
            return self.configured
        return self._followed[1] if self._followed is not None else ""

    def describe(self) -> str:
        return self.configured or "none set: follows what Triton serves"

    async def for_request(self, timeout: float | None) -> str:
        """The model of a request that names none; InvalidArgument, naming the models served, when there is none."""
        if self.configured:
            return self.configured
        default, served = await self._follow(timeout)
        if not served:
            raise NotFound("the request names no model, and Triton serves none")
        if not default:
            raise InvalidArgument(
                "the request names no model and the facade has no default model (--default-model) while Triton "
                f"serves several: name one of {', '.join(served)}"
            )
        return default

    async def to_probe(self, timeout: float | None) -> str:
        """The model /health probes: the default, else the first model served whose inputs are all numbers."""
        if self.configured:
            return self.configured
        default, served = await self._follow(timeout)
        if default:
            return default
        for name in served:
            info = await self.gateway.model_info(name, "", timeout)
            if all(tensor.datatype != "BYTES" for tensor in info.inputs):
                return name
        if not served:
            raise Unavailable("no model to probe: Triton serves none")
        raise Unavailable(f"no model to probe: of the models Triton serves ({', '.join(served)}), none takes numbers")

    async def _follow(self, timeout: float | None) -> tuple[str, tuple[str, ...]]:
        now = time.monotonic()
        if self._followed is not None and now - self._followed[0] < FOLLOW_TTL_S:
            return self._followed[1], self._followed[2]
        try:
            await self.gateway.model_info(DEMO_MODEL, "", timeout)  # held for the metadata TTL: rarely a call
            default, served = DEMO_MODEL, (DEMO_MODEL,)
        except NotFound:
            try:
                entries = await self.gateway.repository_index(ready_only=True, timeout=timeout)
            except FacadeError as error:
                raise type(error)(
                    f"the facade has no default model (--default-model) and cannot list Triton's models to follow "
                    f"what it serves: {error.message}"
                ) from None
            served = tuple(sorted({entry.name for entry in entries}))
            default = served[0] if len(served) == 1 else ""
        self._followed = (time.monotonic(), default, served)
        return default, served
