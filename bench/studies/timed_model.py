"""The lone-request study's model.py: the stock model with each request's steps timed (bench/studies/lone.py).

Copied as `model.py` into the study's own repository, never into a served one. Each instance appends, per `execute`,
one line to `timings-<pid>.tsv` beside this file: milliseconds spent reading the inputs, in the runner (validation,
grouping, ONNX Runtime), in ONNX Runtime's `run` alone, and building the responses.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from backend.triton_model import OnnxRuntimeModel


class TritonPythonModel(OnnxRuntimeModel):
    def initialize(self, args: dict) -> None:
        super().initialize(args)
        self._timings = (Path(__file__).parent / f"timings-{os.getpid()}.tsv").open("a", buffering=1)
        self._run_ms = 0.0
        run = self.runner._run

        def timed_run(feeds: Any) -> Any:
            started = time.perf_counter()
            try:
                return run(feeds)
            finally:
                self._run_ms += (time.perf_counter() - started) * 1000

        self.runner._run = timed_run  # type: ignore[method-assign]

    def execute(self, requests: list) -> list:
        # The stock execute's two steps, with a clock between them.
        started = time.perf_counter()
        feeds = [{tensor.name(): tensor.as_numpy() for tensor in request.inputs()} for request in requests]
        read = time.perf_counter()
        self._run_ms = 0.0
        results = self.runner.infer(feeds)
        inferred = time.perf_counter()
        responses = [self._response(result) for result in results]
        done = time.perf_counter()
        self._timings.write(
            f"{(read - started) * 1000:.4f}\t{(inferred - read) * 1000:.4f}\t{self._run_ms:.4f}\t"
            f"{(done - inferred) * 1000:.4f}\n"
        )
        return responses

    def finalize(self) -> None:
        self._timings.close()
        super().finalize()
