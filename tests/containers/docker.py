"""Containers of the project's images, for the tests: run on the host's network, on free ports."""

from __future__ import annotations

import ipaddress
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers import wait_until
from tritonnx.server.process import free_ports


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done


@dataclass
class Container:
    name: str
    image: str
    ports: dict[str, int] = field(default_factory=dict)

    def logs(self) -> str:
        done = docker("logs", self.name, check=False)
        return done.stdout + done.stderr

    def exec(self, *command: str) -> str:
        return docker("exec", self.name, *command).stdout

    def python(self, code: str) -> str:
        return self.exec("python3", "-c", code).strip()

    def running(self) -> bool:
        return docker("inspect", "-f", "{{.State.Running}}", self.name, check=False).stdout.strip() == "true"

    def stop(self, grace: int = 30) -> tuple[float, int]:
        """`docker stop`: seconds it took and the exit code."""
        started = time.monotonic()
        docker("stop", "-t", str(grace), self.name, timeout=grace + 30)
        code = int(docker("inspect", "-f", "{{.State.ExitCode}}", self.name).stdout.strip())
        return time.monotonic() - started, code

    def remove(self) -> None:
        docker("rm", "-f", self.name, check=False)

    def copy_out(self, path: str, dest: Path) -> Path:
        docker("cp", f"{self.name}:{path}", str(dest))
        return dest


def run(image: str, *command: str, env: dict[str, str] | None = None, options: tuple[str, ...] = (),
        shm: str = "512m") -> Container:  # fmt: skip
    """`docker run -d` on the host's network; the container's name is unique per call."""
    name = f"tritonnx-test-{free_ports(1)[0]}"
    flags = [f"--env={key}={value}" for key, value in (env or {}).items()]
    docker("run", "-d", "--name", name, "--network", "host", f"--shm-size={shm}", *flags, *options, image, *command)
    return Container(name, image)


def run_triton(image: str, admin_key: str, options: tuple[str, ...] = (), shm: str = "512m") -> Container:
    """The image's default command (Triton under the supervisor) on free loopback ports."""
    http, grpc, metrics, supervisor = free_ports(4)
    env = {  # no host: the image's default, loopback
        "TRITONNX_ADMIN_KEY": admin_key,
        "TRITONNX_TRITON_HTTP_PORT": str(http),
        "TRITONNX_TRITON_GRPC_PORT": str(grpc),
        "TRITONNX_TRITON_METRICS_PORT": str(metrics),
        "TRITONNX_SUPERVISOR_METRICS_PORT": str(supervisor),
    }
    container = run(image, env=env, options=options, shm=shm)
    container.ports = {"http": http, "grpc": grpc, "metrics": metrics, "supervisor": supervisor}
    return container


def listening_addresses(port: int) -> set[str]:
    """The addresses a TCP socket listens on at `port`, in this network namespace (the containers' too: they run on
    the host's network), read from /proc/net/tcp and tcp6."""
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                raw = bytes.fromhex(address)
                # The kernel prints each 32-bit word of the address in host (little-endian) order.
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, width // 2, 4))
                ip = ipaddress.ip_address(words)
                # gRPC listens on an IPv6 socket with the IPv4 address mapped into it (::ffff:127.0.0.1).
                found.add(str(getattr(ip, "ipv4_mapped", None) or ip))
    return found


def wait_http(url: str, container: Container, timeout: float = 120) -> float:
    """Poll `url` until it answers 200; the seconds it took. Fails with the container's log."""
    started = time.monotonic()

    def answered() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                return response.status == 200
        except OSError:
            if not container.running():
                raise AssertionError(f"{container.image} exited") from None
            return False

    try:
        wait_until(answered, timeout, f"{url} answering 200", interval=0.1)
    except AssertionError as error:
        raise AssertionError(f"{error}:\n{container.logs()[-4000:]}") from None
    return time.monotonic() - started
