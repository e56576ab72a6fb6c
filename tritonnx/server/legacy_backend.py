"""`backend`, the stub side's import path before the `tritonnx` namespace, kept for one release.

`install_legacy_backend` puts this file as `backend/__init__.py` into the Python backend's folder,
which Triton's stub puts on `sys.path` (and nothing else does), so a published version whose
model.py says `from backend.triton_model import OnnxRuntimeModel` still loads: each
`backend.<module>` is the module `tritonnx.backend.<module>` itself, and the server's log warns.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence

OLD = "backend"
NEW = "tritonnx.backend"
WARNING = (
    f"this model.py imports `{OLD}`, tritonnx's module path before the `tritonnx` namespace: import "
    f"`{NEW}` instead (e.g. `from {NEW}.triton_model import OnnxRuntimeModel`); the old path goes in the next release"
)


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`backend.<name>` found as the already imported `tritonnx.backend.<name>`, never loaded twice."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.startswith(OLD + "."):
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return importlib.import_module(NEW + spec.name[len(OLD) :])

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the module is `tritonnx.backend`'s, already executed."""


def _warn() -> None:
    """On the stub's stderr, which is tritonserver's: its Logger is not set up while model.py is imported."""
    print(f"W tritonnx: {WARNING}", file=sys.stderr, flush=True)


if __name__ == OLD:
    __path__: list[str] = []  # a package, so `backend.<name>` is looked up
    sys.meta_path.insert(0, _Alias())
    _warn()
