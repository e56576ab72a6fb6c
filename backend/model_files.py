"""Where a model's files are, as the Python stub serving it finds them: its version folder, ONNX file and config.pbtxt.

One `model.py` (backend/stock_model.py) serves every ONNX model, from two places:
- the Python-based backends `onnxruntime` and `tritonnx`, `<backend directory>/<name>/model.py`, which Triton
  runs for a model whose config says `platform: "onnxruntime_onnx"`, `backend: "onnxruntime"` or
  `backend: "tritonnx"`, or which has no config and a `<version>/model.onnx`. The graph is the version folder's
  `default_model_filename` (`model.onnx` unless the config names another file, or a folder holding `model.onnx`), as
  Triton's own onnxruntime backend reads it;
- a copy in each version folder of a `backend: "python"` model, beside its `model.onnx`.

During auto-complete Triton hands the model only its config, without its path; the stub's own command line has it:
Triton's stub launcher starts `triton_python_backend_stub <model folder>/<version>/<file> ...`, where the file is
`default_model_filename` (`model.py` for the Python backend). The instances get the model's folder and version as
`initialize` arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tritonnx.backend.errors import ModelConfigError

ONNX_BACKENDS = ("onnxruntime", "tritonnx")  # the Python-based backends that serve a version folder's ONNX file
DEFAULT_ONNX_FILE = "model.onnx"
PYTHON_MODEL_FILE = "model.py"
CONFIG_FILE = "config.pbtxt"
STUB_EXECUTABLE = "triton_python_backend_stub"


@dataclass(frozen=True)
class ModelFiles:
    version_folder: Path
    onnx_file: Path

    @property
    def model_folder(self) -> Path:
        return self.version_folder.parent

    @property
    def config_file(self) -> Path:
        return self.model_folder / CONFIG_FILE

    @classmethod
    def of_version(cls, version_folder: Path, config: dict) -> ModelFiles:
        """The files of one version, by the served config (`default_model_filename` for the named backends)."""
        named = _served_file(config)
        path = version_folder / (named or DEFAULT_ONNX_FILE)
        if named and path.is_dir():
            path = path / DEFAULT_ONNX_FILE  # as Triton's onnxruntime backend: a folder holds model.onnx
        if not path.is_file():
            what = f"default_model_filename '{named}'" if named else f"'{DEFAULT_ONNX_FILE}'"
            raise ModelConfigError(f"unable to find {path} ({what} in the version folder)")
        return cls(version_folder, path)

    @classmethod
    def of_stub(cls, config: dict, command_line: list[str] | None = None) -> ModelFiles:
        """The files of the version this stub process loads, from its command line (this process's by default)."""
        args = _own_command_line() if command_line is None else command_line
        if len(args) < 2 or not args[1]:
            raise ModelConfigError(
                "cannot tell which model folder to serve: the stub's command line names none "
                f"({' '.join(args)[:200] or 'empty'})"
            )
        # argv[1] is <model folder>/<version>/<default_model_filename, or model.py for the Python backend>.
        depth = len(Path(_served_file(config) or PYTHON_MODEL_FILE).parts)
        return cls.of_version(Path(args[1]).parents[depth - 1], config)


def is_python_model(config: dict) -> bool:
    """A `backend: "python"` model: a model.py in each version folder, the graph `model.onnx` beside it.

    Any other config of an ONNX model (`platform: "onnxruntime_onnx"`, `backend: "onnxruntime"` or `"tritonnx"`,
    or none: Triton picks onnxruntime for a folder with a model.onnx) is served by a named backend.
    """
    return config.get("backend") == "python"


def onnx_file_name(config: dict) -> str:
    """The name of a version's ONNX file under `config` (a file or a folder holding model.onnx)."""
    return _served_file(config) or DEFAULT_ONNX_FILE


def _served_file(config: dict) -> str:
    """`default_model_filename` when it names the ONNX file (the named backends); else "" (Python: it names model.py)."""
    return "" if is_python_model(config) else str(config.get("default_model_filename") or "")


def backend_config(backend: str, stub_command_line: list[str] | None = None) -> dict[str, str]:
    """Tritonserver's `--backend-config` settings for `backend`: its own over the global ones (`--backend-config=k=v`).

    Triton hands a Python-based backend the `python` backend's settings, not its own, so they are read from the
    server's command line: the stub's sixth argument is the server's process id.
    """
    args = _own_command_line() if stub_command_line is None else stub_command_line
    if not args or not args[0].endswith(STUB_EXECUTABLE):
        return {}  # not in a stub (a test, a tool): no server to ask
    try:
        server = _command_line(f"/proc/{int(args[5])}/cmdline")
    except (IndexError, ValueError, OSError):
        return {}
    settings: dict[str, dict[str, str]] = {}
    for option in _backend_config_options(server[1:]):
        parsed = parse_backend_config(option)
        if parsed is not None:
            name, key, value = parsed
            settings.setdefault(name, {})[key] = value
    return {**settings.get("", {}), **settings.get(backend, {})}


def _backend_config_options(args: list[str]) -> list[str]:
    """The values of `--backend-config`, written `--backend-config=V` or `--backend-config V` (getopt takes both)."""
    options = []
    taking = False
    for arg in args:
        if taking:
            options.append(arg)
            taking = False
        elif arg == "--backend-config":
            taking = True
        elif arg.startswith("--backend-config="):
            options.append(arg.removeprefix("--backend-config="))
        elif arg == "--":
            break  # getopt stops reading options there
    return options


def parse_backend_config(option: str) -> tuple[str, str, str] | None:
    """(backend, key, value) of one `--backend-config` value, split as tritonserver 2.51 splits it; None if malformed.

    The backend's name ends at the first comma (none: a global setting, backend ""), the key at the first "=" after
    it; the value is the rest, commas and "=" included. Tritonserver refuses to start on a malformed value (no key,
    no value, nothing before the comma), so a running server has none.
    """
    comma = option.find(",")
    equals = option.find("=", comma + 1)
    key, value = option[comma + 1 : equals], option[equals + 1 :]
    if comma == 0 or equals < 0 or not key or not value:
        return None
    return (option[:comma] if comma > 0 else ""), key, value


def _own_command_line() -> list[str]:
    return _command_line("/proc/self/cmdline")


def _command_line(path: str) -> list[str]:
    with open(path, "rb") as handle:
        return [part.decode(errors="replace") for part in handle.read().split(b"\0") if part]
