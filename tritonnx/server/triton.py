"""Run a real tritonserver 2.51 from the `nvidia-pytriton` wheel, no container needed.

The wheel carries the server binary, the Python backend and one stub per Python minor version;
the server wants them assembled as `<backend dir>/python/`. The stub embeds the system
libpython, which finds this venv's site-packages when the venv's `bin/` comes first on PATH
(`environment()` puts it there, or another venv's: `stub_venv`); it ignores PYTHONPATH. So the
`tritonnx` package is found because it is installed in the venv (`make venv` installs this checkout
editable), wherever the server is started from.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tritonnx.backend.model_files import ONNX_BACKENDS, PYTHON_MODEL_FILE
from tritonnx.client.model_control import ControlError, TritonControl
from tritonnx.common.admin import ADMIN_HEADER, GRPC_ADMIN_HEADER, RESTRICTED_PROTOCOLS, new_admin_key
from tritonnx.common.ports import TRITON_GRPC, TRITON_HTTP, TRITON_METRICS
from tritonnx.server import legacy_backend
from tritonnx.server.process import ManagedProcess, ServerError
from tritonnx.server.repository import STOCK_MODEL_PY
from tritonnx.server.shm import STUB_REGION_BYTES

TRITON_HOME_ENV = "TRITONNX_TRITON_HOME"
LEGACY_BACKEND = Path(legacy_backend.__file__)
NGC_HOME = Path("/opt/tritonserver")


@dataclass(frozen=True)
class TritonInstall:
    """Where tritonserver and its Python backend are.

    Either the `nvidia-pytriton` wheel, or a Triton in the NGC container's layout
    (`bin/tritonserver`, `lib/`, `backends/python/`).
    """

    binary: Path
    library_dir: Path
    backends: Path | None  # a ready backend directory (NGC layout); None: assembled from the wheel's files
    python_backend_files: tuple[Path, ...] = ()

    @classmethod
    def find(cls) -> TritonInstall:
        """$TRITONNX_TRITON_HOME, else the wheel in this environment, else /opt/tritonserver."""
        if os.environ.get(TRITON_HOME_ENV):
            return cls.ngc_layout(Path(os.environ[TRITON_HOME_ENV]))
        # Located, not imported: only the wheel's files are used, and its Python API would
        # need dependencies this project does not install.
        spec = importlib.util.find_spec("pytriton")
        if spec is not None and spec.origin is not None:
            return cls.wheel(Path(spec.origin).resolve().parent / "tritonserver")
        if (NGC_HOME / "bin" / "tritonserver").exists():
            return cls.ngc_layout(NGC_HOME)
        raise ServerError("no tritonserver: install nvidia-pytriton (make venv) or set $TRITONNX_TRITON_HOME")

    @classmethod
    def wheel(cls, root: Path) -> TritonInstall:
        minor = f"{sys.version_info.major}.{sys.version_info.minor}"
        return cls(
            binary=root / "bin" / "tritonserver",
            library_dir=root.parent.parent / "nvidia_pytriton.libs",
            backends=None,
            python_backend_files=(
                root / "backends" / "python" / "libtriton_python.so",
                root / "backends" / "python" / "triton_python_backend_utils.py",
                root / "python_backend_stubs" / minor / "triton_python_backend_stub",
            ),
        )

    @classmethod
    def ngc_layout(cls, home: Path) -> TritonInstall:
        return cls(binary=home / "bin" / "tritonserver", library_dir=home / "lib", backends=home / "backends")


def assemble_backend_dir(dest: Path, install: TritonInstall) -> Path:
    """Make `dest` a backend directory: `python/` (the Python backend) and tritonnx's Python-based backends; `dest`.

    `python/` links the wheel's stub and utilities; its library is a copy, because Triton refuses a
    Python-based backend whose `libtriton_python.so` lies outside the backend directory. The backends
    `onnxruntime` and `tritonnx` are the stock model.py each (backend/model_files.py says which models
    they serve).
    """
    python_dir = dest / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for source in install.python_backend_files:
        if not source.exists():
            raise ServerError(f"{source} is missing from the nvidia-pytriton wheel")
        target = python_dir / source.name
        if source.suffix == ".so":
            _copy_if_changed(source, target)
        elif not (target.is_symlink() and target.resolve() == source.resolve()):
            target.unlink(missing_ok=True)
            target.symlink_to(source)
    install_onnx_backends(dest)
    install_legacy_backend(python_dir)
    return dest


def install_onnx_backends(dest: Path, names: tuple[str, ...] = ONNX_BACKENDS) -> None:
    """`dest/<name>/model.py` for each of `names`: the Python-based backends serving ONNX files.

    Where NVIDIA's native onnxruntime backend is installed (the NGC image), only `tritonnx` goes in: Triton takes
    a backend's library before a model.py of the same name.
    """
    for name in names:
        (dest / name).mkdir(parents=True, exist_ok=True)
        _copy_if_changed(STOCK_MODEL_PY, dest / name / PYTHON_MODEL_FILE)


def install_legacy_backend(python_dir: Path) -> None:
    """`python_dir/backend/`: the stub side's import path before the `tritonnx` namespace, for one release.

    The stub puts the Python backend's folder on its `sys.path`; tritonnx/server/legacy_backend.py says the rest.
    """
    package = python_dir / legacy_backend.OLD
    package.mkdir(exist_ok=True)
    _copy_if_changed(LEGACY_BACKEND, package / "__init__.py")


def _copy_if_changed(source: Path, target: Path) -> None:
    """A copy of `source` at `target`, replaced in one rename: a server started earlier may have the old one loaded."""
    if target.is_file() and not target.is_symlink() and target.read_bytes() == source.read_bytes():
        return
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    shutil.copyfile(source, partial)
    os.replace(partial, target)


@dataclass(frozen=True)
class Ports:
    http: int = TRITON_HTTP
    grpc: int = TRITON_GRPC
    metrics: int = TRITON_METRICS


def _get(url: str, timeout: float = 1.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


@dataclass
class TritonServer(ManagedProcess):
    """One tritonserver process on loopback, started in its own process group."""

    model_repository: Path = Path("model_repository")
    ports: Ports = field(default_factory=Ports)
    backend_dir: Path = Path("build/backends")
    extra_args: list[str] = field(default_factory=list)
    host: str = "127.0.0.1"  # Triton's gRPC address, and its HTTP and metrics addresses unless those are given
    http: bool = True  # Triton's HTTP endpoint; the facade and the supervisor need only gRPC
    http_host: str | None = None  # None: `host`
    metrics_host: str | None = None  # None: `host`
    startup_models: tuple[str, ...] = ("*",)  # loaded at start; () starts empty (load through model control)
    cwd: Path | None = None  # the server's working directory; None: this process's
    extra_env: dict[str, str] = field(default_factory=dict)  # on top of this process's environment
    log_verbose: int = 0  # tritonserver's --log-verbose
    admin_key: str = field(default_factory=new_admin_key)
    # The venv whose packages the Python stub runs with (its bin/ goes first on PATH); None: this interpreter's.
    stub_venv: Path | None = None
    # A network namespace to run in (`ip netns exec`; `host` is then an address of it): the network-fault tests
    # put Triton behind a link they can break. "": this process's namespace.
    netns: str = ""

    @property
    def admin_headers(self) -> dict[str, str]:
        """GRPC metadata that opens the restricted APIs: model control, repository index, shared memory, trace, logging."""
        return {GRPC_ADMIN_HEADER: self.admin_key}

    @property
    def http_admin_headers(self) -> dict[str, str]:
        """The same for HTTP requests."""
        return {ADMIN_HEADER: self.admin_key}

    @property
    def http_address(self) -> str:
        return self.http_host or self.host

    @property
    def metrics_address(self) -> str:
        return self.metrics_host or self.host

    @property
    def http_url(self) -> str:
        return f"{self.http_address}:{self.ports.http}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.metrics_address}:{self.ports.metrics}/metrics"

    def command(self, install: TritonInstall, backends: Path) -> list[str]:
        return [
            str(install.binary),
            f"--model-repository={self.model_repository}",
            f"--backend-directory={backends}",
            *self._http_args(),
            f"--grpc-address={self.host}",
            f"--grpc-port={self.ports.grpc}",
            f"--metrics-address={self.metrics_address}",
            f"--metrics-port={self.ports.metrics}",
            # Whole batches travel through the stub's shared memory: start big enough for a
            # 16-image batch of 224x224 FP32 (9.6 MB) so the region does not grow request by request.
            f"--backend-config=python,shm-default-byte-size={STUB_REGION_BYTES}",
            f"--backend-config=python,shm-growth-byte-size={STUB_REGION_BYTES}",
            "--exit-timeout-secs=10",
            # Explicit model control, behind the admin key: the supervisor reloads a model whose
            # stub died; clients cannot load or unload models.
            "--model-control-mode=explicit",
            *(f"--load-model={model}" for model in self.startup_models),
            # A model that fails to load (a graph Triton cannot carry, say) is UNAVAILABLE with its
            # reason while the others serve; Triton's default would stop the whole server.
            "--exit-on-error=false",
            f"--log-verbose={self.log_verbose}",
            f"--grpc-restricted-protocol={RESTRICTED_PROTOCOLS}:{ADMIN_HEADER}={self.admin_key}",
            *self.extra_args,
        ]

    def _http_args(self) -> list[str]:
        if not self.http:
            return ["--allow-http=false"]
        return [
            f"--http-address={self.http_address}",
            f"--http-port={self.ports.http}",
            f"--http-restricted-api={RESTRICTED_PROTOCOLS}:{ADMIN_HEADER}={self.admin_key}",
        ]

    def environment(self, install: TritonInstall) -> dict[str, str]:
        env = {**os.environ, **self.extra_env}
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(install.library_dir), env.get("LD_LIBRARY_PATH")]))
        stub_bin = self.stub_venv / "bin" if self.stub_venv is not None else Path(sys.executable).parent
        env["PATH"] = os.pathsep.join([str(stub_bin), env.get("PATH", "")])
        return env

    def start(self) -> None:
        install = TritonInstall.find()
        backends = install.backends or assemble_backend_dir(self.backend_dir, install)
        command = self.command(install, backends)
        if self.netns:
            command = ["ip", "netns", "exec", self.netns, *command]  # ip execs the server: the PID stays its own
        self.spawn(command, env=self.environment(install), cwd=self.cwd)

    def wait_ready(self, timeout: float = 120.0, all_models: bool = True) -> None:
        """Block until the server answers, which it does once its start-up models are loaded or have failed.

        Raise if it exits or times out, and (with `all_models`) if a model failed.
        """
        if self.http:
            self.wait_until(lambda: _get(f"http://{self.http_url}/v2/health/live") == 200, "tritonserver", timeout)
        else:
            self.wait_until(self._grpc_live, "tritonserver", timeout)
        if all_models:
            failed = [s for s in self.model_states() if s.get("state") != "READY"]
            if failed:
                raise ServerError(f"tritonserver is up, but not every model is ready:\n{format_model_states(failed)}")

    def _grpc_live(self) -> bool:
        with TritonControl(self.grpc_url, self.admin_key, timeout_s=1.0) as control:
            try:
                return control.server_live()
            except ControlError:  # not up yet
                return False

    def model_states(self) -> list[dict]:
        """The repository index: name, version, state and reason of every model."""
        with TritonControl(self.grpc_url, self.admin_key, timeout_s=5) as control:
            return control.index()

    def __enter__(self) -> TritonServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def format_model_states(states: list[dict], repository: Path | None = None) -> str:
    """The models' table; with none, what to do (tritonnx:cpu ships no models: a repository is mounted)."""
    if not states:
        where = f" in {repository}" if repository else ""
        return (
            f"no models{where}: mount a model repository there (docker run -v $PWD/models:/models:ro) "
            "or give --model-repository"
        )
    rows = [(s.get("name", ""), s.get("version", ""), s.get("state", ""), s.get("reason", "")) for s in states]
    width = max([len("model")] + [len(r[0]) for r in rows])
    lines = [f"{'model':<{width}}  version  state"]
    lines += [f"{n:<{width}}  {v:<7}  {st}{'  (' + why + ')' if why else ''}" for n, v, st, why in rows]
    return "\n".join(lines)
