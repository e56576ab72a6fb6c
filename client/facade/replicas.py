"""The Triton servers behind the facade: one long-lived channel each, taken in turn, call by call.

`--triton-url` names one server or several, comma-separated (`10.0.0.1:8001,10.0.0.2:8001`); a
host name that resolves to several addresses (a Kubernetes headless Service) stands for all of
them and is resolved again every `RESOLVE_SECONDS`, so the facade follows replicas that come and
go. Each call goes to the next replica whose connection is not known to be down. A call that fails
because its replica went away, which the facade learns by asking that replica whether it is ready,
is sent once more to another replica; a replica that answers (a full queue, say) has the last word.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

log = logging.getLogger("tritonnx.facade")
RESOLVE_SECONDS = 10.0
# A replica found gone is left out this long, then tried again (a restart takes a few seconds).
REST_SECONDS = 1.0
_LIVE_SECONDS = 1.0


def channel_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        # Find Triton again within a fraction of a second after it restarts, instead of gRPC's
        # default backoff of up to 2 min (a refused connect costs nothing).
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 250),
        # A connection that went quiet (a replica's host gone without a reset) is noticed in seconds.
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_timeout_ms", 5_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]


@dataclass
class Replica:
    """One Triton server: its address and channel."""

    address: str  # host:port
    channel: grpc.aio.Channel
    resting_until: float = 0.0  # found gone: other replicas take the calls until then
    stub: service_pb2_grpc.GRPCInferenceServiceStub = field(init=False)
    model_infer: Callable = field(init=False)  # ModelInfer taking the request already serialised

    def __post_init__(self) -> None:
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.model_infer = self.channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=None,
            response_deserializer=service_pb2.ModelInferResponse.FromString,
        )

    @property
    def down(self) -> bool:
        """Found gone lately, or its connection failed and gRPC is waiting to try again."""
        return time.monotonic() < self.resting_until or (
            self.channel.get_state() == grpc.ChannelConnectivity.TRANSIENT_FAILURE
        )

    def rest(self) -> None:
        """Leave it out of the turns for `REST_SECONDS`: it did not answer live (stopping, or gone)."""
        self.resting_until = time.monotonic() + REST_SECONDS

    async def live(self) -> bool:
        """Whether the server answers live now (a server stopping or gone does not).

        Not ServerReady: with strict readiness it is false while any version loads or unloads (a publish).
        """
        try:
            reply = await self.stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=_LIVE_SECONDS)
        except grpc.aio.AioRpcError:
            return False
        return bool(reply.live)


def _split(entry: str) -> tuple[str, int]:
    host, _, port = entry.strip().rpartition(":")
    return host.strip("[]"), int(port)


def _is_literal(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _addresses(entries: list[tuple[str, int]], found: dict[tuple[str, int], list]) -> list[str]:
    """Every entry's address: itself when it is one, else what its name resolved to (`found`, IPv4 first)."""
    addresses = []
    for host, port in entries:
        if _is_literal(host):
            addresses.append(_join(host, port))
            continue
        ips = sorted({info[4][0] for info in found[(host, port)]}, key=lambda ip: (":" in ip, ip))
        addresses += [_join(ip, port) for ip in ips]
    return addresses


class Replicas:
    """The replicas named by `urls`, picked round-robin; names are resolved again now and then."""

    def __init__(self, urls: str, options: Sequence[tuple[str, int]]) -> None:
        self._entries = [_split(entry) for entry in urls.split(",") if entry.strip()]
        if not self._entries:
            raise ValueError(f"no Triton address in {urls!r}")
        self._options = list(options)
        self._replicas: dict[str, Replica] = {}
        self._next = 0
        self._resolved_at = 0.0
        # The entries that are names, found once: telling a name from an address parses it (each call refreshes).
        self._names = [(host, port) for host, port in self._entries if not _is_literal(host)]
        found = {entry: socket.getaddrinfo(*entry, type=socket.SOCK_STREAM) for entry in self._names}
        self._update(_addresses(self._entries, found))

    @property
    def fixed_single(self) -> bool:
        """One server at a fixed address: the only layout where inputs may go through shared memory."""
        return len(self._entries) == 1 and _is_literal(self._entries[0][0])

    def __len__(self) -> int:
        return len(self._replicas)

    def _update(self, addresses: list[str]) -> None:
        self._resolved_at = time.monotonic()
        for address in addresses:
            if address not in self._replicas:
                self._replicas[address] = Replica(address, grpc.aio.insecure_channel(address, options=self._options))
        gone = [address for address in self._replicas if address not in addresses]
        for address in gone:
            replica = self._replicas.pop(address)
            asyncio.get_running_loop().create_task(replica.channel.close(grace=5.0))
        if gone:
            log.info("Triton replicas now: %s (gone: %s)", ", ".join(self._replicas), ", ".join(gone))

    async def refresh(self) -> None:
        """Resolve the names again when `RESOLVE_SECONDS` have passed (a no-op for addresses)."""
        if not self._names or time.monotonic() - self._resolved_at < RESOLVE_SECONDS:
            return
        loop = asyncio.get_running_loop()
        try:
            found = {entry: await loop.getaddrinfo(*entry, type=socket.SOCK_STREAM) for entry in self._names}
        except OSError as error:  # keep the replicas known so far
            log.warning("cannot resolve the Triton address again (%s); keeping %s", error, ", ".join(self._replicas))
            self._resolved_at = time.monotonic()
            return
        self._update(_addresses(self._entries, found))

    def pick(self, avoid: Replica | None = None) -> Replica:
        """The next replica in turn, skipping those known down (and `avoid`) while others are left."""
        if len(self._replicas) == 1:  # the only one, down or not: the common layout skips the turn's checks
            return next(iter(self._replicas.values()))
        replicas = list(self._replicas.values())
        for _ in range(len(replicas)):
            replica = replicas[self._next % len(replicas)]
            self._next += 1
            if replica is not avoid and not replica.down:
                return replica
        others = [r for r in replicas if r is not avoid]
        return others[self._next % len(others)] if others else replicas[0]

    async def close(self) -> None:
        await asyncio.gather(*(replica.channel.close(None) for replica in self._replicas.values()))
