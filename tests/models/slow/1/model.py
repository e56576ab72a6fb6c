"""Sleeps for the requested milliseconds (capped at 30 s), then answers them: a model that hangs.

A negative duration holds the request instead, while the file `hold` exists in the model's folder (at most 30 s),
and marks that it holds it by creating `holding` there: a test can occupy the one instance, arrange the queue
behind it and release it, without guessing how long any of that takes on a busy machine.
"""

import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

LONGEST_SLEEP_MS = 30_000


class TritonPythonModel:
    def initialize(self, args):
        self.folder = Path(args["model_repository"])

    def execute(self, requests):
        responses = []
        for request in requests:
            milliseconds = pb_utils.get_input_tensor_by_name(request, "milliseconds").as_numpy()
            if float(milliseconds.max()) < 0:
                self._hold()
            else:
                time.sleep(min(float(milliseconds.max()), LONGEST_SLEEP_MS) / 1000)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("slept", milliseconds.astype(np.float32))]))
        return responses

    def _hold(self):
        (self.folder / "holding").touch()
        deadline = time.monotonic() + LONGEST_SLEEP_MS / 1000
        while (self.folder / "hold").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        (self.folder / "holding").unlink(missing_ok=True)
