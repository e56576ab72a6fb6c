"""The soak's version publishes: the same graph, published again as a model's next version, model after model.

Into the soak's scratch copy of the repository (its version files symlinked), through tritonnx.server.versions.publish
as `tritonnx-models publish` does: Triton loads the new version beside the serving one and unloads the old one once
the new one is READY. The answers stay the same, so the load's checks hold across the swap.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from tritonnx.client.model_control import ControlError, TritonControl
from tritonnx.server.versions import ModelFolder, VersionError, publish


@dataclass
class Published:
    """One publish: when (seconds into the paced load), which model, the version it became, how long it took."""

    t_s: float
    model: str
    version: int | None
    seconds: float
    error: str = ""
    serving: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


class Publisher:
    """Publishes `models` in turn into `repository` (a scratch copy), each from `source`'s version 1."""

    def __init__(self, repository: Path, source: Path, models: Sequence[str], triton_url: str, admin_key: str) -> None:
        if not models:
            raise ValueError("no model to publish")
        self.repository, self.source, self.models = repository, source, list(models)
        self.triton_url, self.admin_key = triton_url, admin_key
        self.done: list[Published] = []

    def next_model(self) -> str:
        return self.models[len(self.done) % len(self.models)]

    def publish_next(self, t_s: float) -> Published:
        """Publish the next model of the rotation (blocking: run it in a thread beside the load)."""
        model = self.next_model()
        started = time.perf_counter()
        lines: list[str] = []
        try:
            with TritonControl(self.triton_url, self.admin_key) as control:
                outcome = publish(
                    ModelFolder.find(self.repository, model),
                    self.source / model / "1" / "model.onnx",
                    control,
                    log=lines.append,
                )
            done = Published(t_s, model, outcome.version, time.perf_counter() - started, serving=outcome.serving)
        except (VersionError, ControlError, OSError) as error:
            done = Published(t_s, model, None, time.perf_counter() - started, error=f"{error} ({'; '.join(lines)})")
        self.done.append(done)
        return done
