"""The facade's calls to Triton: `Gateway`, what the servicer asks of Triton, and `TritonGateway`, its one real form.

TritonGateway calls one or more replicas (see replicas.py), with the model-metadata cache, the shared-memory slots
inputs travel in when Triton is one server next to the facade (shm.py), and the one retry of a call (an inference,
a model's metadata) whose replica went away. The unit tests' stand-ins (tests/unit/fakes.py) satisfy `Gateway` too, checked by mypy.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import grpc
from tritonclient.grpc import service_pb2

from tritonnx.client.facade.errors import (
    FacadeError,
    NotFound,
    from_triton,
    may_be_unloaded_version,
    may_follow_a_restart,
    means_reloading,
    model_not_served,
    not_served,
    on_tritons_side,
    reloading,
    replica_may_be_gone,
    restarted,
    version_not_served,
)
from tritonnx.client.facade.replicas import Replica, Replicas, channel_options
from tritonnx.client.facade.shm import REGION_PREFIX, SHM_DIR, SharedInputPool, shared_pool
from tritonnx.client.facade.translate import InferCall, ModelInfo
from tritonnx.common.admin import GRPC_ADMIN_HEADER

log = logging.getLogger("tritonnx.facade")
# After a failed registration (Triton down, or on another machine), wait before asking again;
# inputs use the socket meanwhile.
_REGISTRATION_RETRY_SECONDS = 1.0
# How long Triton's list of served models answers "not served" for a name it does not hold, without asking Triton:
# a flood of requests for names that do not exist costs the facade a set lookup each, and Triton nothing.
SERVED_NAMES_TTL_S = 1.0
T = TypeVar("T")


class Gateway(Protocol):
    """What the servicer, the predictor, the classifier and the health monitor ask of Triton.

    Every failure comes out as a `FacadeError`.
    """

    @property
    def last_failure(self) -> tuple[float, str] | None:
        """When and how Triton last failed a request on its side (a dead stub, a restart): a health signal."""
        ...

    async def model_info(self, name: str, version: str, timeout: float | None = None) -> ModelInfo:
        """Inputs, outputs and max_batch_size of a model version ("": the latest), held for a while."""
        ...

    def knows(self, name: str, version: str) -> bool:
        """Whether Triton confirmed lately that it serves the model version (its metadata is held)."""
        ...

    def forget(self, name: str, older_than: float = 0.0) -> bool:
        """Drop the held metadata of `name` older than `older_than` seconds; whether any was dropped."""
        ...

    async def repository_index(
        self, ready_only: bool, timeout: float | None = None
    ) -> list[service_pb2.RepositoryIndexResponse.ModelIndex]:
        """Every model version of Triton's repository."""
        ...

    async def infer(
        self, call: InferCall, timeout: float | None, metadata: tuple[tuple[str, str], ...] = ()
    ) -> service_pb2.ModelInferResponse:
        """ModelInfer; `metadata` goes along (a trace's traceparent)."""
        ...

    async def close(self) -> None:
        """Release what the gateway holds (channels, the shared-memory region)."""
        ...


class TritonGateway:
    """The `Gateway` over Triton's KServe v2 gRPC API."""

    def __init__(
        self,
        url: str,
        max_message_bytes: int,
        model_info_ttl: float,
        metadata_entries: int = 1024,
        shm_slots: int = 0,
        shm_slot_bytes: int = 0,
        admin_key: str = "",
        on_retry: Callable[[], None] = lambda: None,
    ) -> None:
        self.url = url
        # Shared memory and the repository index are Triton's restricted APIs (sent with the key).
        self._admin = ((GRPC_ADMIN_HEADER, admin_key),) if admin_key else ()
        self._replicas = Replicas(url, channel_options(max_message_bytes))
        # Shared memory needs Triton to map this machine's /dev/shm: one server at a fixed address.
        self._pool = shared_pool(shm_slots, shm_slot_bytes) if self._replicas.fixed_single else None
        if shm_slots and not self._replicas.fixed_single:
            log.info("inputs go over the socket: shared memory is for one Triton next to the facade, not %s", url)
        self._registered = False
        self._next_registration = 0.0
        self._on_retry = on_retry
        self._ttl = model_info_ttl
        # (name, canonical version) -> (fetched, info), least recently used first: versions are decimal numbers
        # (wire.canonical_version), and the entries at most `metadata_entries`, whatever callers ask for.
        self._models: OrderedDict[tuple[str, str], tuple[float, ModelInfo]] = OrderedDict()
        self._max_models = metadata_entries
        # The names in Triton's repository index and its ready (name, version)s, and when they were read.
        self._served: tuple[float, frozenset[str], list[tuple[str, str]]] | None = None
        # The last request Triton failed on its side (a dead stub, a restart): a health signal.
        self.last_failure: tuple[float, str] | None = None

    def shm_slots_in_use(self) -> int:
        """Shared-memory slots held by calls now (0 without a pool)."""
        return self._pool.in_use if self._pool is not None else 0

    def metadata_entries(self) -> int:
        """Model versions whose metadata is held now."""
        return len(self._models)

    async def model_info(self, name: str, version: str, timeout: float | None = None) -> ModelInfo:
        """Inputs, outputs and max_batch_size of a model, cached for the TTL."""
        key = (name, version)
        cached = self._models.get(key)
        now = time.monotonic()
        if cached and cached[0] + self._ttl > now:
            self._models.move_to_end(key)
            return cached[1]
        if self._served is not None and now - self._served[0] < SERVED_NAMES_TTL_S and name not in self._served[1]:
            raise not_served(name, version, self._served[2])

        async def ask(replica: Replica, left: float | None) -> tuple[Any, Any]:
            return await asyncio.gather(
                replica.stub.ModelMetadata(service_pb2.ModelMetadataRequest(name=name, version=version), timeout=left),
                replica.stub.ModelConfig(
                    service_pb2.ModelConfigRequest(name=name, version=version), timeout=left, metadata=self._admin
                ),
            )

        try:
            # A replica stopping for a restart has unloaded its models already: its NOT_FOUND is not the answer.
            metadata, config = await self._on_replicas(ask, timeout)
        except grpc.aio.AioRpcError as error:
            failure = (
                await self._not_found(name, version)
                if model_not_served(error.code()) or await self._version_not_served(error, name, version)
                else from_triton(error, name, version)
            )
            try:
                raise failure from None
            finally:
                del failure  # the traceback holds this frame: no reference cycle through it
        info = ModelInfo.from_triton(metadata, config, version)
        self._models[key] = (time.monotonic(), info)
        self._models.move_to_end(key)
        self._evict(time.monotonic())
        return info

    def _evict(self, now: float) -> None:
        """Drop the expired entries, then the least recently used beyond the bound."""
        for key in [key for key, (fetched, _) in self._models.items() if fetched + self._ttl <= now]:
            del self._models[key]
        while len(self._models) > self._max_models:
            self._models.popitem(last=False)

    def forget(self, name: str, older_than: float = 0.0) -> bool:
        """Drop the cached metadata of every version of `name` fetched more than `older_than` seconds ago.

        Whether any was dropped. For a model whose served versions changed (a new version went live, a rollback), so
        that the next request asks Triton.
        """
        now = time.monotonic()
        stale = [key for key, (fetched, _) in self._models.items() if key[0] == name and now - fetched > older_than]
        for key in stale:
            del self._models[key]
        return bool(stale)

    async def repository_index(
        self, ready_only: bool, timeout: float | None = None
    ) -> list[service_pb2.RepositoryIndexResponse.ModelIndex]:
        """Every model version of Triton's repository (an administrative API: sent with the key)."""
        try:
            index = await self._index(ready_only, timeout)
        except grpc.aio.AioRpcError as error:
            raise from_triton(error, "", "") from None
        return list(index.models)

    async def _index(self, ready_only: bool, timeout: float | None) -> service_pb2.RepositoryIndexResponse:
        async def ask(replica: Replica, left: float | None) -> service_pb2.RepositoryIndexResponse:
            request = service_pb2.RepositoryIndexRequest(ready=ready_only)
            return await replica.stub.RepositoryIndex(request, timeout=left, metadata=self._admin)

        return await self._on_replicas(ask, timeout)

    def knows(self, name: str, version: str) -> bool:
        """Whether the model's metadata is cached, i.e. Triton confirmed it serves it within the TTL."""
        cached = self._models.get((name, version))
        return cached is not None and cached[0] + self._ttl > time.monotonic()

    async def _not_found(self, name: str, version: str) -> NotFound:
        """NotFound, with the models (and versions) Triton serves when it says; their names are held a moment."""
        try:
            index = await self._index(ready_only=True, timeout=2.0)
        except grpc.aio.AioRpcError:
            self._served = None
            return not_served(name, version)
        ready = [(m.name, m.version) for m in index.models]
        self._served = (time.monotonic(), frozenset(model for model, _ in ready), ready)
        return not_served(name, version, ready)

    async def _version_not_served(self, error: grpc.aio.AioRpcError, name: str, version: str) -> bool:
        """Whether Triton's answer means the version asked for is not loaded (see `may_be_unloaded_version`)."""
        if not may_be_unloaded_version(error.code(), version):
            return False
        # A Triton shutting down is not live (its models are unloading for a restart, not retired).
        if not await self._replicas.pick().live():
            return False
        try:
            index = await self._index(ready_only=False, timeout=2.0)
        except grpc.aio.AioRpcError:
            return False
        return version_not_served(index.models, name, version)

    async def _shared_pool(self) -> SharedInputPool | None:
        """The pool when Triton knows its region; registers it when needed (at most every few seconds)."""
        pool = self._pool
        if pool is None or self._registered:
            return pool
        if time.monotonic() < self._next_registration:
            return None
        try:
            await self._unregister_stale_regions(pool)
            await self._replicas.pick().stub.SystemSharedMemoryRegister(
                service_pb2.SystemSharedMemoryRegisterRequest(
                    name=pool.region, key=pool.key, offset=0, byte_size=pool.byte_size
                ),
                timeout=2.0,
                metadata=self._admin,
            )
        except grpc.aio.AioRpcError as error:
            self._next_registration = time.monotonic() + _REGISTRATION_RETRY_SECONDS
            log.warning("inputs go over the socket: Triton did not register shared memory (%s)", error.code().name)
            return None
        self._registered = True
        log.info("inputs go to Triton through shared memory (%d MiB region)", pool.byte_size >> 20)
        return pool

    async def _unregister_stale_regions(self, pool: SharedInputPool) -> None:
        """Have Triton forget the regions of facades that are gone (their /dev/shm name is), which it keeps mapped."""
        stub = self._replicas.pick().stub
        status = await stub.SystemSharedMemoryStatus(
            service_pb2.SystemSharedMemoryStatusRequest(), timeout=2.0, metadata=self._admin
        )
        stale = [
            name
            for name in status.regions
            if name.startswith(REGION_PREFIX) and name != pool.region and not (SHM_DIR / name).exists()
        ]
        forgotten = 0
        for name in stale:
            try:
                await stub.SystemSharedMemoryUnregister(
                    service_pb2.SystemSharedMemoryUnregisterRequest(name=name), timeout=2.0, metadata=self._admin
                )
                forgotten += 1
            except grpc.aio.AioRpcError:
                pass  # requests still queued in Triton read it: Triton keeps it mapped until it restarts
        if forgotten:
            log.warning("Triton forgot %d shared-memory region(s) of facades that are gone", forgotten)

    async def _region_lost(self, pool: SharedInputPool) -> bool:
        """After a failed call on shared memory: whether Triton forgot the region (it restarted)."""
        try:
            await self._replicas.pick().stub.SystemSharedMemoryStatus(
                service_pb2.SystemSharedMemoryStatusRequest(name=pool.region), timeout=2.0, metadata=self._admin
            )
            return False
        except grpc.aio.AioRpcError:
            self._registered = False
            return True

    async def infer(
        self, call: InferCall, timeout: float | None, metadata: tuple[tuple[str, str], ...] = ()
    ) -> service_pb2.ModelInferResponse:
        """ModelInfer; `metadata` goes along (a trace's traceparent)."""
        slot = None
        sizes = [len(payload) for payload in call.payloads]
        # An empty tensor goes in the message: Triton takes no zero-byte shared-memory input.
        pool = await self._shared_pool() if all(sizes) else None
        if pool is not None:
            slot = pool.acquire(sum(sizes))
        if pool is None or slot is None:
            body = call.serialize()
        else:
            offset = 0
            for tensor, payload in zip(call.header.inputs, call.payloads, strict=True):
                pool.write(slot, offset, payload)
                tensor.parameters["shared_memory_region"].string_param = pool.region
                tensor.parameters["shared_memory_byte_size"].int64_param = len(payload)
                tensor.parameters["shared_memory_offset"].int64_param = slot.offset + offset
                offset += len(payload)
            body = call.header.SerializeToString()
        model, version = call.header.model_name, call.header.model_version
        try:
            return await self._infer_on_replicas(body, timeout, metadata)
        except grpc.aio.AioRpcError as error:
            failure: FacadeError
            code = error.code()
            if pool is not None and slot is not None and may_follow_a_restart(code) and await self._region_lost(pool):
                failure = restarted(model)
            elif means_reloading(code, served_moments_ago=self.knows(model, version)):
                failure = reloading(model)
            elif await self._version_not_served(error, model, version):
                failure = await self._not_found(model, version)
            else:
                failure = from_triton(error, model, version)
            if on_tritons_side(failure):
                self.last_failure = (time.monotonic(), f"{failure.code.name}: {failure.message}")
            try:
                raise failure from None
            finally:
                del failure  # the traceback holds this frame, and the frame the request: no cycle to keep them
        finally:
            # A call that ended early may still be queued in Triton and read this slot later: its
            # answer goes nowhere, and the next request's bytes are its own.
            if pool is not None and slot is not None:
                pool.release(slot)

    async def _on_replicas(self, call: Callable[[Replica, float | None], Awaitable[T]], timeout: float | None) -> T:
        """`call` on the next replica; once more on another if the first went away meanwhile.

        `call` is given the replica and the seconds left of `timeout`.
        """
        await self._replicas.refresh()
        started = time.monotonic()
        replica = self._replicas.pick()
        try:
            return await call(replica, timeout)
        except grpc.aio.AioRpcError as error:
            if len(self._replicas) < 2 or not replica_may_be_gone(error.code()) or await replica.live():
                raise  # one server, or a replica that answered (a full queue): its answer stands
            left = None if timeout is None else timeout - (time.monotonic() - started)
            if left is not None and left <= 0:
                raise
            replica.rest()
            other = self._replicas.pick(avoid=replica)
            log.warning(
                "replica %s went away (%s); the call goes to %s", replica.address, error.code().name, other.address
            )
            self._on_retry()
            return await call(other, left)

    async def _infer_on_replicas(
        self, body: bytes, timeout: float | None, metadata: tuple[tuple[str, str], ...] = ()
    ) -> service_pb2.ModelInferResponse:
        """ModelInfer on the replicas (see `_on_replicas`)."""

        async def infer(replica: Replica, left: float | None) -> service_pb2.ModelInferResponse:
            return await replica.model_infer(body, timeout=left, metadata=metadata or None)

        return await self._on_replicas(infer, timeout)

    async def close(self) -> None:
        if self._pool is not None:
            if self._registered:
                try:
                    await self._replicas.pick().stub.SystemSharedMemoryUnregister(
                        service_pb2.SystemSharedMemoryUnregisterRequest(name=self._pool.region),
                        timeout=2.0,
                        metadata=self._admin,
                    )
                except grpc.aio.AioRpcError:
                    pass  # Triton is gone, and the region with it
            self._pool.close()
        await self._replicas.close()
