"""Run a real tritonserver 2.51 from the `nvidia-pytriton` wheel, no container needed.

The wheel carries the server binary, the Python backend and one stub per Python minor version;
the server wants them assembled as `<backend dir>/python/`. The stub embeds the system
libpython, which finds this venv's site-packages when the venv's `bin/` comes first on PATH
(`environment()` puts it there); it ignores PYTHONPATH. So the `backend` package is found
because it is installed in the venv (`make venv` installs this checkout editable), wherever the
server is started from.

`python -m backend.tritonserver --help` serves a model repository until Ctrl-C; the tests use
`TritonServer` the same way with free ports.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import secrets
import socket
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from backend.process import ManagedProcess, ServerError, StopRequest

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_REPOSITORY = PROJECT_ROOT / "model_repository"
DEFAULT_BACKEND_DIR = PROJECT_ROOT / "build" / "backends"
# Triton's administrative APIs answer only requests carrying this header with the server's key
# (its restricted-protocol options); inference, health and metadata stay open.
ADMIN_HEADER = "tritonnx-admin-key"
GRPC_ADMIN_HEADER = f"triton-grpc-protocol-{ADMIN_HEADER}"  # Triton's gRPC server adds the prefix
ADMIN_KEY_ENV = "TRITONNX_ADMIN_KEY"
ADMIN_KEY_FILE = PROJECT_ROOT / "build" / "admin-key"  # written by `make serve` when it made the key up
RESTRICTED_PROTOCOLS = "model-repository,model-config,shared-memory,statistics,trace,logging"


@dataclass(frozen=True)
class TritonInstall:
    """Where the pieces of Triton live inside the installed wheel."""

    root: Path

    @classmethod
    def find(cls) -> "TritonInstall":
        # Located, not imported: only the wheel's files are used, and its Python API would
        # need dependencies this project does not install.
        spec = importlib.util.find_spec("pytriton")
        if spec is None or spec.origin is None:
            raise ServerError("nvidia-pytriton is not installed in this venv: run `make venv`")
        return cls(Path(spec.origin).resolve().parent / "tritonserver")

    @property
    def binary(self) -> Path:
        return self.root / "bin" / "tritonserver"

    @property
    def library_dir(self) -> Path:
        return self.root.parent.parent / "nvidia_pytriton.libs"

    def python_backend_files(self) -> list[Path]:
        minor = f"{sys.version_info.major}.{sys.version_info.minor}"
        return [
            self.root / "backends" / "python" / "libtriton_python.so",
            self.root / "backends" / "python" / "triton_python_backend_utils.py",
            self.root / "python_backend_stubs" / minor / "triton_python_backend_stub",
        ]


def assemble_backend_dir(dest: Path, install: TritonInstall) -> Path:
    """Make `dest/python/` hold the Python backend (symlinks into the wheel); return `dest`."""
    python_dir = dest / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for source in install.python_backend_files():
        if not source.exists():
            raise ServerError(f"{source} is missing from the nvidia-pytriton wheel")
        link = python_dir / source.name
        if link.is_symlink() or link.exists():
            if link.resolve() == source.resolve():
                continue
            link.unlink()
        link.symlink_to(source)
    return dest


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Ports the OS has just handed out as free, for servers started next to `make serve`."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def known_admin_key() -> str:
    """The restricted-API key for local tools: $TRITONNX_ADMIN_KEY, else the one `make serve` wrote, else ""."""
    if os.environ.get(ADMIN_KEY_ENV):
        return os.environ[ADMIN_KEY_ENV]
    try:
        return ADMIN_KEY_FILE.read_text().strip()
    except OSError:
        return ""


def share_admin_key(key: str) -> str:
    """Where local tools find the key: $TRITONNX_ADMIN_KEY when it came from there, else the file
    `make serve` writes readable by this user only (for `perf_analyzer -H` and the client scripts)."""
    if os.environ.get(ADMIN_KEY_ENV):
        return "$" + ADMIN_KEY_ENV
    ADMIN_KEY_FILE.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(ADMIN_KEY_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(key + "\n")
    return str(ADMIN_KEY_FILE)


@dataclass(frozen=True)
class Ports:
    http: int = 8000
    grpc: int = 8001
    metrics: int = 8002


def _get(url: str, timeout: float = 1.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


@dataclass
class TritonServer(ManagedProcess):
    """One tritonserver process on loopback, started in its own process group."""

    model_repository: Path = DEFAULT_REPOSITORY
    ports: Ports = field(default_factory=Ports)
    backend_dir: Path = DEFAULT_BACKEND_DIR
    extra_args: list[str] = field(default_factory=list)
    host: str = "127.0.0.1"
    http: bool = True  # Triton's HTTP endpoint; the facade and the supervisor need only gRPC
    startup_models: tuple[str, ...] = ("*",)  # loaded at start; () starts empty (load through model control)
    cwd: Path | None = None  # the server's working directory; None: this process's
    extra_env: dict[str, str] = field(default_factory=dict)  # on top of this process's environment
    admin_key: str = field(default_factory=lambda: os.environ.get(ADMIN_KEY_ENV) or secrets.token_urlsafe(24))

    @property
    def admin_headers(self) -> dict[str, str]:
        """gRPC metadata that opens the restricted APIs: model control, config, shared memory, statistics."""
        return {GRPC_ADMIN_HEADER: self.admin_key}

    @property
    def http_admin_headers(self) -> dict[str, str]:
        """The same for HTTP requests."""
        return {ADMIN_HEADER: self.admin_key}

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.ports.http}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.ports.metrics}/metrics"

    def command(self, install: TritonInstall) -> list[str]:
        return [
            str(install.binary),
            f"--model-repository={self.model_repository}",
            f"--backend-directory={self.backend_dir}",
            *self._http_args(),
            f"--grpc-address={self.host}",
            f"--grpc-port={self.ports.grpc}",
            f"--metrics-address={self.host}",
            f"--metrics-port={self.ports.metrics}",
            # Whole batches travel through the stub's shared memory: start big enough for a
            # 16-image batch of 224x224 FP32 (9.6 MB) so the region does not grow request by request.
            "--backend-config=python,shm-default-byte-size=16777216",
            "--backend-config=python,shm-growth-byte-size=16777216",
            "--exit-timeout-secs=10",
            # Explicit model control, behind the admin key: the supervisor reloads a model whose
            # stub died; clients cannot load or unload models.
            "--model-control-mode=explicit",
            *(f"--load-model={model}" for model in self.startup_models),
            # A model that fails to load (a graph Triton cannot carry, say) is UNAVAILABLE with its
            # reason while the others serve; Triton's default would stop the whole server.
            "--exit-on-error=false",
            f"--grpc-restricted-protocol={RESTRICTED_PROTOCOLS}:{ADMIN_HEADER}={self.admin_key}",
            *self.extra_args,
        ]

    def _http_args(self) -> list[str]:
        if not self.http:
            return ["--allow-http=false"]
        return [
            f"--http-address={self.host}",
            f"--http-port={self.ports.http}",
            f"--http-restricted-api={RESTRICTED_PROTOCOLS}:{ADMIN_HEADER}={self.admin_key}",
        ]

    def environment(self, install: TritonInstall) -> dict[str, str]:
        env = {**os.environ, **self.extra_env}
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(install.library_dir), env.get("LD_LIBRARY_PATH")]))
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        return env

    def start(self) -> None:
        install = TritonInstall.find()
        assemble_backend_dir(self.backend_dir, install)
        self.spawn(self.command(install), env=self.environment(install), cwd=self.cwd)

    def wait_ready(self, timeout: float = 120.0, all_models: bool = True) -> None:
        """Block until the server answers, which it does once its start-up models are loaded or
        have failed; raise if it exits or times out, and (with `all_models`) if a model failed."""
        if self.http:
            self.wait_until(lambda: _get(f"http://{self.http_url}/v2/health/live") == 200, "tritonserver", timeout)
        else:
            self.wait_until(self._grpc_live, "tritonserver", timeout)
        if all_models:
            failed = [s for s in self.model_states() if s.get("state") != "READY"]
            if failed:
                raise ServerError(f"tritonserver is up, but not every model is ready:\n{format_model_states(failed)}")

    def _grpc_live(self) -> bool:
        import tritonclient.grpc as grpcclient  # not needed where the model runs

        with grpcclient.InferenceServerClient(self.grpc_url) as client:
            try:
                return client.is_server_live(client_timeout=1.0)
            except Exception:  # noqa: BLE001 - any failure means: not up yet
                return False

    def model_states(self) -> list[dict]:
        """The repository index: name, version, state and reason of every model."""
        import tritonclient.grpc as grpcclient

        with grpcclient.InferenceServerClient(self.grpc_url) as client:
            index = client.get_model_repository_index(headers=self.admin_headers, as_json=True, client_timeout=5)
        return index.get("models", [])

    def __enter__(self) -> "TritonServer":
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def format_model_states(states: list[dict]) -> str:
    rows = [(s.get("name", ""), s.get("version", ""), s.get("state", ""), s.get("reason", "")) for s in states]
    width = max([len("model")] + [len(r[0]) for r in rows])
    lines = [f"{'model':<{width}}  version  state"]
    lines += [f"{n:<{width}}  {v:<7}  {st}{'  (' + why + ')' if why else ''}" for n, v, st, why in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m backend.tritonserver",
        description="Serve a model repository with tritonserver 2.51 on loopback until Ctrl-C (no supervisor and no "
        "facade: `python -m client.serve` runs all three).",
        epilog="Example: python -m backend.tritonserver --model-repository model_repository --log-file build/tritonserver.log",
    )
    parser.add_argument("--model-repository", type=Path, default=DEFAULT_REPOSITORY, help="default: %(default)s")
    parser.add_argument("--http-port", type=int, default=8000, help="default: %(default)s")
    parser.add_argument("--grpc-port", type=int, default=8001, help="default: %(default)s")
    parser.add_argument("--metrics-port", type=int, default=8002, help="default: %(default)s")
    parser.add_argument("--backend-dir", type=Path, default=DEFAULT_BACKEND_DIR, help="assembled here; default: %(default)s")
    parser.add_argument("--log-file", type=Path, help="server log (default: this terminal)")
    parser.add_argument("--ready-timeout", type=float, default=180.0, help="seconds to wait for READY; default: %(default)s")
    parser.add_argument("extra", nargs="*", help="more tritonserver flags, after `--`")
    args = parser.parse_args(argv)

    server = TritonServer(
        model_repository=args.model_repository.resolve(),
        ports=Ports(args.http_port, args.grpc_port, args.metrics_port),
        backend_dir=args.backend_dir.resolve(),
        log_file=args.log_file,
        extra_args=args.extra,
    )
    key_place = share_admin_key(server.admin_key)
    stop = StopRequest()
    started = time.monotonic()
    print(f"starting tritonserver with {server.model_repository} ...", flush=True)
    server.start()
    try:
        server.wait_ready(args.ready_timeout, all_models=False)
        print(f"tritonserver up in {time.monotonic() - started:.1f}s", flush=True)
        print(format_model_states(server.model_states()), flush=True)
        print(
            f"HTTP {server.http_url}  gRPC {server.grpc_url}  metrics {server.metrics_url}\n"
            f"restricted APIs: header {GRPC_ADMIN_HEADER} (gRPC) or {ADMIN_HEADER} (HTTP), key in {key_place}\n"
            "Ctrl-C stops it.",
            flush=True,
        )
        if not stop.wait(server):
            print("error: tritonserver exited on its own", file=sys.stderr)
    except ServerError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        code = server.stop()
        print(f"tritonserver stopped (exit code {code})", flush=True)
    return 0 if stop.requested else 1


if __name__ == "__main__":
    sys.exit(main())
