"""Where the model repository and the build outputs are: the environment, else this checkout.

The build outputs are Triton's backend directory, logs and the admin key.
`TRITONNX_MODEL_REPOSITORY` and `TRITONNX_BUILD_DIR` name them; `TRITONNX_HOME` is the folder
both default to (`<home>/model_repository`, `<home>/build`). Without it, the home is the checkout
this package runs from, or, installed elsewhere (an image's site-packages), the working directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

HOME_ENV = "TRITONNX_HOME"
REPOSITORY_ENV = "TRITONNX_MODEL_REPOSITORY"
BUILD_ENV = "TRITONNX_BUILD_DIR"


def checkout_root() -> Path | None:
    """The checkout holding this package, or None when it is installed on its own."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "model_repository").is_dir() else None


@dataclass(frozen=True)
class Paths:
    model_repository: Path
    build: Path

    @classmethod
    def from_environment(cls) -> Paths:
        home = Path(os.environ[HOME_ENV]) if os.environ.get(HOME_ENV) else checkout_root() or Path.cwd()
        return cls(
            model_repository=Path(os.environ.get(REPOSITORY_ENV) or home / "model_repository"),
            build=Path(os.environ.get(BUILD_ENV) or home / "build"),
        )

    @property
    def backends(self) -> Path:
        """Where Triton's Python backend is assembled (see tritonnx.server.triton)."""
        return self.build / "backends"

    @property
    def admin_key_file(self) -> Path:
        return self.build / "admin-key"
