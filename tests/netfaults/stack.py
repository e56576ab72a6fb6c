"""Triton in a network namespace of its own, two facades outside it, and the four faults put between them.

`NetStack` serves mobilenet_v3_small from a tritonserver inside a `Link`'s namespace. The `direct` facade calls it
across the veth pair, where the kernel's faults act (loss, reset, partition: link.py); the `proxied` facade calls
it through a `DelayProxy` (proxy.py), the user-space stand-in for the delay netem would add. Both send inputs
through system shared memory: the namespace changes the network only, so Triton maps the same /dev/shm.

The network-fault tests (tests/slow/test_network_faults.py) drive it: `inject`, load with a 2 s deadline
per call (`FaultTarget`), `heal`, `recovery` (seconds to the first right answer), `leaks` (in-flight calls,
shared-memory slots and regions left behind).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc as grpcclient

from bench import REPOSITORY
from bench.load.stats import OK, Tally
from bench.load.targets import FacadeTarget, close_enough
from bench.overload import checked_images
from tests.netfaults.link import Link
from tests.netfaults.proxy import DelayProxy
from tritonnx.client.facade.shm import SHM_DIR, region_prefix
from tritonnx.client.proto import inference_pb2
from tritonnx.server.facade import FacadeProcess, start_facade
from tritonnx.server.prometheus import scrape
from tritonnx.server.repository import link_models
from tritonnx.server.stack import ServingStack

MODEL = "mobilenet_v3_small"
DEADLINE_S = 2.0  # every call's gRPC deadline: the caller the issue speaks of
DEADLINE = grpc.StatusCode.DEADLINE_EXCEEDED.name
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.name


@dataclass(frozen=True)
class Fault:
    name: str
    how: str  # what is done, and where: the kernel's packet filter or the proxy
    facade: str  # the facade whose path it breaks: "direct" or "proxied"
    allowed: frozenset[str]  # the failure statuses it may cause; any other one is a bug


FAULTS = {
    fault.name: fault
    for fault in (
        Fault("delay", "50 ms added to every chunk, each way (user-space proxy: no netem)", "proxied", frozenset()),
        Fault("loss", "5% of packets dropped at random, each way (kernel: nftables)", "direct", frozenset({DEADLINE})),
        Fault(
            "reset",
            "every TCP segment answered with a reset, new connections refused (kernel: nftables)",
            "direct",
            frozenset({UNAVAILABLE, DEADLINE}),
        ),
        Fault(
            "partition",
            "every packet dropped, either way, sockets left open (kernel: nftables)",
            "direct",
            frozenset({DEADLINE, UNAVAILABLE}),
        ),
    )
}
DELAY_S = 0.05
LOSS = 0.05


class FaultTarget(FacadeTarget):
    """The facade's Predict with checked images and a 2 s deadline; every call's status and duration tallied."""

    def __init__(self, url: str, images: list[np.ndarray], expected: list[np.ndarray]) -> None:
        super().__init__(url, MODEL, 1, images=images, expected=expected, timeout_s=DEADLINE_S)
        self.tally = Tally()

    async def call(self) -> str | None:
        started = time.perf_counter()
        status = await super().call()
        self.tally.add(status or OK, time.perf_counter() - started)
        return status

    @property
    def slowest_s(self) -> float:
        """The longest any call took, answered or failed: what the deadline bounds."""
        return max((max(series) for series in self.tally.latencies.values() if series), default=0.0)


@dataclass
class NetStack:
    workdir: Path
    facade_args: list[str] = field(default_factory=list)
    link: Link = field(init=False)
    serving: ServingStack = field(init=False)
    proxy: DelayProxy = field(init=False)
    facades: dict[str, FacadeProcess] = field(init=False, default_factory=dict)
    images: list[np.ndarray] = field(init=False, default_factory=list)
    expected: list[np.ndarray] = field(init=False, default_factory=list)

    def __enter__(self) -> NetStack:
        self.images, self.expected = checked_images(MODEL, count=4)
        self.link = Link().__enter__()
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self) -> None:
        repository = link_models(self.workdir / "repository", {MODEL: REPOSITORY / MODEL})
        self.serving = ServingStack(
            repository, self.workdir, with_facade=False, host=self.link.inner, triton_netns=self.link.name
        )
        self.serving.start()
        triton = self.serving.triton
        self.proxy = DelayProxy((self.link.inner, triton.ports.grpc)).__enter__()
        args = ["--default-model", MODEL, "--health-interval", "1", *self.facade_args]
        for name, url in (("direct", triton.grpc_url), ("proxied", self.proxy.address)):
            self.facades[name] = start_facade(url, triton.admin_key, self.workdir / f"facade-{name}.log", args)

    def __exit__(self, *exc_info: object) -> None:
        for facade in self.facades.values():
            facade.stop()
        if hasattr(self, "proxy"):
            self.proxy.__exit__()
        if hasattr(self, "serving"):
            self.serving.stop()
        self.link.close()

    def target(self, facade: str) -> FaultTarget:
        return FaultTarget(self.facades[facade].grpc_url, self.images, self.expected)

    def inject(self, fault: Fault) -> None:
        if fault.name == "delay":
            self.proxy.delayed = 0
            self.proxy.delay = DELAY_S
        elif fault.name == "loss":
            self.link.loss(LOSS)
        elif fault.name == "reset":
            self.link.reset()
        elif fault.name == "partition":
            self.link.partition()
        else:
            raise ValueError(f"no fault {fault.name!r}: {', '.join(FAULTS)}")

    def acted(self, fault: Fault) -> int:
        """What the fault did since it was injected: chunks the proxy delayed, or packets the kernel dropped or reset."""
        return self.proxy.delayed if fault.name == "delay" else self.link.packets()

    def heal(self) -> None:
        self.proxy.delay = 0.0
        self.link.clear()

    def answer(self, facade: str, index: int = 0) -> bool:
        """One call with a 2 s deadline: whether it came back, and right."""
        with grpc.insecure_channel(self.facades[facade].grpc_url) as channel:
            image = self.images[index]
            request = inference_pb2.PredictRequest(raw_data=image.tobytes(), shape=list(image.shape), model_name=MODEL)
            try:
                predict = channel.unary_unary(
                    FacadeTarget.method_path,
                    request_serializer=inference_pb2.PredictRequest.SerializeToString,
                    response_deserializer=inference_pb2.PredictResponse.FromString,
                )
                reply = predict(request, timeout=DEADLINE_S)
            except grpc.RpcError:
                return False
        return close_enough(np.array(reply.predictions, np.float32), self.expected[index])

    def recovery(self, facade: str, timeout: float = 60.0) -> float | None:
        """Seconds from now to the first right answer on `facade`'s path (None: none within `timeout`)."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.answer(facade):
                return time.monotonic() - started
            time.sleep(0.05)
        return None

    def regions(self) -> set[str]:
        """The system shared-memory regions Triton holds registered."""
        triton = self.serving.triton
        with grpcclient.InferenceServerClient(triton.grpc_url) as client:
            status: Any = client.get_system_shared_memory_status(headers=triton.admin_headers, as_json=True)
        return set(status.get("regions", {}))

    def leaks(self) -> list[str]:
        """What the calls left behind; empty when nothing leaked.

        In-flight calls or held shared-memory slots in a facade, regions in Triton that are not a running facade's, a
        facade's region missing from /dev/shm.
        """
        problems = []
        ours = {name for facade in self.facades.values() for name in facade_regions(facade.pid)}
        for name, facade in self.facades.items():
            page = scrape(f"{facade.http_url}/metrics")
            if in_flight := page.value("tritonnx_facade_in_flight_requests"):
                problems.append(f"{name} facade: {in_flight:.0f} calls still in flight")
            if slots := page.value("tritonnx_facade_shm_slots_in_use"):
                problems.append(f"{name} facade: {slots:.0f} shared-memory slots still held")
            if not facade_regions(facade.pid):
                problems.append(f"{name} facade: its region is gone from /dev/shm")
        if extra := self.regions() - ours:
            problems.append(f"Triton holds regions of no running facade: {sorted(extra)}")
        return problems

    def settled(self, timeout: float = 10.0) -> list[str]:
        """`leaks()` once it is empty, or what is still left after `timeout` (handlers end after their callers)."""
        deadline = time.monotonic() + timeout
        while (problems := self.leaks()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return problems


def facade_regions(pid: int) -> list[str]:
    """The names of the shared-memory regions in /dev/shm of the facade with process id `pid`."""
    return sorted(path.name for path in SHM_DIR.glob(f"{region_prefix(pid)}*"))


def left_in_dev_shm(pids: list[int]) -> list[str]:
    """The regions of stopped facades still in /dev/shm (each facade unlinks its own when it stops)."""
    return [name for pid in pids for name in facade_regions(pid)]
