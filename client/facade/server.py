"""Assemble and run the facade: gRPC (inference, health, reflection) and HTTP (/metrics, /health)."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import json
import logging
import os
import signal
import time
from pathlib import Path

import grpc
from aiohttp import web
from grpc_health.v1 import health, health_pb2_grpc
from grpc_health.v1._async import HealthServicer  # health.aio's, behind a version check mypy cannot follow
from grpc_reflection.v1alpha import reflection
from prometheus_client import CONTENT_TYPE_LATEST

from tritonnx.client.facade.admission import Admission
from tritonnx.client.facade.auth import BearerTokenInterceptor
from tritonnx.client.facade.cache import ResultCache
from tritonnx.client.facade.classifier import Classifier
from tritonnx.client.facade.connections import REFLECTION_STREAMS, ConnectionGuard
from tritonnx.client.facade.default_model import DefaultModel
from tritonnx.client.facade.gateway import Gateway, TritonGateway
from tritonnx.client.facade.health import HealthMonitor
from tritonnx.client.facade.metrics import FacadeMetrics
from tritonnx.client.facade.predictor import Predictor
from tritonnx.client.facade.service import SERVICE_NAME, InferenceServicer
from tritonnx.client.facade.settings import FacadeSettings, priority_lanes
from tritonnx.client.facade.tracing import Tracing
from tritonnx.common.ports import is_loopback

log = logging.getLogger("tritonnx.facade")


# A burst of large messages leaves gRPC's freed receive buffers in glibc's heaps, and the
# process would keep that peak as its size; returning free pages to the OS when the facade is
# idle brings it back to its idle level.
_TRIM_SECONDS = 5.0
_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
# glibc's mallopt parameters.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
# Messages are up to megabytes: allocations from this size on get pages of their own, which go back to the OS when
# freed. (glibc raises its threshold to the largest block freed, up to 32 MiB, and then serves such blocks from heaps
# that keep the peak.)
_MMAP_THRESHOLD_BYTES = 1 << 20
# Setting the threshold above fixes glibc's trim threshold at 128 KiB: each call that freed its buffers at the top of
# the heap gave their pages back, and the next call faulted them in again. Free pages are kept up to this while calls
# come; the idle trim (_TRIM_SECONDS) returns them.
_TRIM_THRESHOLD_BYTES = 32 << 20
# gRPC's threads would each get a heap of their own, each keeping its own peak.
_ARENAS = 2


def tune_allocator() -> None:
    """Make freed message buffers go back to the OS (the heap's when idle); before the first threads start."""
    if hasattr(_LIBC, "mallopt"):
        _LIBC.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)
        _LIBC.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES)
        _LIBC.mallopt(_M_ARENA_MAX, _ARENAS)


async def release_free_memory(admission: Admission) -> None:
    while True:
        await asyncio.sleep(_TRIM_SECONDS)
        if admission.in_flight == 0 and admission.receiving == 0 and hasattr(_LIBC, "malloc_trim"):
            # A trim walks the heap (a tenth of a second after a burst): in a thread, as ctypes lets go of the GIL.
            await asyncio.to_thread(_LIBC.malloc_trim, 0)


async def bound_receive_memory(admission: Admission, message_bytes: int) -> None:
    """Admission's bound on the bytes of bodies on their way, checked every _RECEIVE_SWEEP_S."""
    trimmed = 0.0
    while True:
        await asyncio.sleep(_RECEIVE_SWEEP_S)
        now = time.monotonic()
        if (
            admission.places.sweep(message_bytes)
            and now - trimmed >= _TRIM_SECONDS / 5
            and hasattr(_LIBC, "malloc_trim")
        ):
            # The cut bodies' pages back to the OS, where the next check reads them; a trim walks the heap, so at
            # most once a second, and in a thread.
            await asyncio.to_thread(_LIBC.malloc_trim, 0)
            trimmed = now


_RECEIVE_SWEEP_S = 0.05
# Quick calls no pool counts (health checks, ListModels, answers not read yet) that may be open at once besides the
# pools' calls; an answer left unread closes its connection after --send-timeout.
OTHER_CALLS = 1024
_MS = 1000


def _connection_lifetime(idle: float, age: float, grace: float) -> list[tuple[str, int]]:
    """The channel arguments that send idle and aged connections GOAWAY (0 seconds: never)."""
    options = [("grpc.max_connection_idle_ms", int(idle * _MS))] if idle > 0 else []
    if age > 0:
        options += [
            ("grpc.max_connection_age_ms", int(age * _MS)),
            ("grpc.max_connection_age_grace_ms", int(grace * _MS)),
        ]
    return options


class StartupError(RuntimeError):
    """The facade cannot start, e.g. its port is taken."""


def report_ports(path: Path, grpc_port: int, http_port: int) -> None:
    """Write the ports bound to `path` as JSON; a reader sees the whole file or none (a rename)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        partial.write_text(json.dumps({"grpc": grpc_port, "http": http_port}))
        os.replace(partial, path)
    except OSError:
        partial.unlink(missing_ok=True)
        raise


class Facade:
    """The facade's servers.

    Ports 0 bind free ports; `grpc_port` and `http_port` are the ones bound, once `start()` returned.
    """

    def __init__(self, settings: FacadeSettings, gateway: Gateway | None = None) -> None:
        """A facade with its gateway to Triton, the one given or one built from the settings.

        Tests give a stand-in (tests/unit/fakes.py). The facade owns it: `stop()` closes it.
        """
        self.settings = settings
        if not (settings.auth_token or settings.allow_unauthenticated or is_loopback(settings.host)):
            raise StartupError(
                f"the facade would serve inference on {settings.host} to anyone who reaches it: set its token "
                "(TRITONNX_AUTH_TOKEN), listen on loopback (--host 127.0.0.1), or say that something else "
                "authenticates callers (--allow-unauthenticated 1)"
            )
        self.metrics = FacadeMetrics()
        self.guard = ConnectionGuard(
            self.metrics,
            send_timeout=settings.send_timeout,
            max_resets=settings.max_resets_per_second,
            max_watches=settings.max_health_watches,
            watch_seconds=settings.health_watch_seconds,
            max_predict_streams=settings.max_predict_streams,
            retry_after_ms=settings.retry_after_ms,
            max_per_address=settings.max_connections_per_address,
        )
        try:
            self.tracing = Tracing(settings.otlp_endpoint, settings.trace_ratio, settings.trace_caller_rate)
        except ValueError as error:
            raise StartupError(f"tracing: {error}") from None
        try:
            lanes = priority_lanes(settings.priority_lane)
        except ValueError as error:
            raise StartupError(str(error)) from None
        if gateway is None:
            gateway = TritonGateway(
                settings.triton_url,
                settings.max_message_bytes,
                settings.model_info_ttl,
                metadata_entries=settings.metadata_cache_size,
                shm_slots=settings.shm_slots,
                shm_slot_bytes=settings.shm_slot_bytes,
                admin_key=settings.admin_key,
                on_retry=self.metrics.retries.inc,
            )
        self.gateway = gateway
        if isinstance(gateway, TritonGateway):
            self.metrics.shm_slots_in_use.set_function(gateway.shm_slots_in_use)
            self.metrics.metadata_entries.set_function(gateway.metadata_entries)
        self.health_servicer = HealthServicer()
        self.default_model = DefaultModel(self.gateway, settings.default_model)
        self.monitor = HealthMonitor(
            self.gateway,
            self.default_model,
            settings.health_timeout,
            settings.health_interval,
            [SERVICE_NAME],
            self.health_servicer,
        )
        self.servicer = InferenceServicer(
            Predictor(
                self.gateway,
                self.default_model,
                ResultCache(
                    frozenset(filter(None, settings.cache_models.split(","))), settings.cache_bytes, self.metrics
                )
                if settings.cache_models
                else None,
                lanes,
                settings.request_timeout,
            ),
            Classifier(
                self.gateway,
                self.default_model,
                settings.max_image_bytes,
                settings.request_timeout,
                settings.max_image_pixels,
            ),
            Admission(
                settings.max_in_flight,
                settings.retry_after_ms,
                self.metrics,
                max_bytes=settings.max_in_flight_bytes,
                max_receiving=settings.max_receiving,
                max_receiving_per_connection=settings.max_receiving_per_connection,
                max_receiving_bytes=settings.max_receiving_bytes,
                on_reset=self.guard.reset,
            ),
            self.metrics,
            body_timeout=settings.body_timeout,
            tracing=self.tracing,
            stream_max_in_flight=settings.stream_max_in_flight,
            request_timeout=settings.request_timeout,
        )
        self._grpc: grpc.aio.Server | None = None
        self._http: web.AppRunner | None = None
        self._monitor_task: asyncio.Task | None = None
        self._tasks: list[asyncio.Task] = []
        self.grpc_port = 0
        self.http_port = 0

    async def start(self) -> None:
        s = self.settings
        limits = s.max_receiving + s.max_in_flight + s.max_predict_streams + s.max_health_watches
        self._grpc = grpc.aio.server(
            interceptors=[*([BearerTokenInterceptor(s.auth_token)] if s.auth_token else []), self.guard],
            # Every call at once: the pools' (receive places, slots, streams) and room for quick calls; past it gRPC
            # answers RESOURCE_EXHAUSTED before a handler runs. The pools refuse first.
            maximum_concurrent_rpcs=limits + REFLECTION_STREAMS + OTHER_CALLS,
            options=[
                ("grpc.max_receive_message_length", s.max_message_bytes),
                ("grpc.max_send_message_length", s.max_message_bytes),
                ("grpc.max_concurrent_streams", s.max_streams_per_connection),
                ("grpc.max_allowed_incoming_connections", s.max_connections),
                *_connection_lifetime(s.max_connection_idle, s.max_connection_age, s.max_connection_age_grace),
                # Without it gRPC widens each call's HTTP/2 window to what the link carries, and takes that much
                # of a body the facade has not asked for yet (an unread stream, a call waiting for its slot): a
                # call's body then arrives only once the facade reads it, and the window opens to its size.
                ("grpc.http2.bdp_probe", 0),
                # gRPC shares ports between processes by default: a second facade would silently
                # split the traffic instead of failing to start.
                ("grpc.so_reuseport", 0),
                # Images arrive as ~600 KB messages: read them in large pieces, not 16 KB frames
                # (larger socket reads: kernel time per request 0.72-0.78 -> 0.60-0.66 ms).
                ("grpc.http2.max_frame_size", 4 * 1024 * 1024),
                ("grpc.experimental.tcp_min_read_chunk_size", 256 * 1024),
                ("grpc.experimental.tcp_read_chunk_size", 1024 * 1024),
                ("grpc.experimental.tcp_max_read_chunk_size", 4 * 1024 * 1024),
            ],
        )
        self._grpc.add_generic_rpc_handlers((self.servicer.handler(),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health_servicer, self._grpc)
        if s.reflection:
            reflection.enable_server_reflection(
                [SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME], self._grpc
            )
        address = f"{s.host}:{s.port}"
        credentials = None
        if s.tls_cert or s.tls_key:
            try:
                credentials = grpc.ssl_server_credentials(
                    [(Path(s.tls_key).read_bytes(), Path(s.tls_cert).read_bytes())]
                )
            except OSError as error:
                await self.gateway.close()
                raise StartupError(f"cannot read the TLS key and certificate: {error}") from None
        try:
            bound = (
                self._grpc.add_secure_port(address, credentials)
                if credentials
                else self._grpc.add_insecure_port(address)
            )
        except RuntimeError:
            bound = 0
        if bound == 0:
            await self.gateway.close()  # removes the shared-memory region it created
            raise StartupError(f"cannot listen on {address} for gRPC (is the port taken?)")
        self.grpc_port = bound
        await self._grpc.start()

        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        # aiohttp's keep-alive timer runs from the connect and closes a connection whose request is incomplete when
        # it fires: with it short, it is also the deadline for slow headers.
        self._http = web.AppRunner(app, access_log=None, keepalive_timeout=s.http_request_timeout)
        await self._http.setup()
        try:
            await web.TCPSite(self._http, s.host, s.http_port, reuse_address=False).start()
        except OSError as error:
            await self.stop(0)
            raise StartupError(f"cannot listen on {s.host}:{s.http_port} for HTTP: {error.strerror}") from None
        self.http_port = self._http.addresses[0][1]
        if s.port_file:
            try:
                report_ports(Path(s.port_file), self.grpc_port, self.http_port)
            except OSError as error:
                await self.stop(0)
                raise StartupError(f"cannot write the port file {s.port_file}: {error.strerror}") from None
        self.guard.port = self.grpc_port
        self._monitor_task = asyncio.create_task(self.monitor.run())
        self._tasks = [
            asyncio.create_task(release_free_memory(self.servicer.admission)),
            asyncio.create_task(bound_receive_memory(self.servicer.admission, s.max_message_bytes)),
            asyncio.create_task(self.guard.run()),
        ]
        log.info(
            "facade listening: gRPC %s (%s; inference.InferenceService%s, grpc.health.v1%s), HTTP %s:%d "
            "(/metrics, /health); Triton at %s, default model %s, max in flight %d%s",
            f"{s.host}:{self.grpc_port}",
            "TLS" if s.tls_cert else "plaintext",
            " with bearer token" if s.auth_token else "",
            ", reflection" if s.reflection else "",
            s.host,
            self.http_port,
            s.triton_url,
            self.default_model.describe(),
            s.max_in_flight,
            f"; ports written to {s.port_file}" if s.port_file else "",
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _health(self, request: web.Request) -> web.Response:
        report = await self.monitor.current(max_age=1.0)
        return web.json_response(report.as_json(), status=200 if report.serving else 503)

    async def stop(self, grace: float) -> None:
        """Drain: NOT_SERVING first, then let in-flight calls finish within `grace` seconds."""
        await self.monitor.drain()
        for task in (self._monitor_task, *self._tasks):
            if task:
                task.cancel()
        if self._grpc:
            await self._grpc.stop(grace)
        if self._http:
            await self._http.cleanup()
        await self.gateway.close()
        # Last: the drained calls' spans are sent too (a blocking post of at most the exporter's timeout).
        await asyncio.to_thread(self.tracing.shutdown)


async def run_until_signalled(settings: FacadeSettings) -> None:
    """Serve until SIGTERM or SIGINT, then drain and return."""
    facade = Facade(settings)
    await facade.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    log.info("stopping: draining in-flight calls for up to %.1fs", settings.drain_seconds)
    await facade.stop(settings.drain_seconds)
    log.info("facade stopped")
