"""Sleeps for the requested milliseconds (capped at 30 s), then answers them: a model that hangs."""

import time

import numpy as np
import triton_python_backend_utils as pb_utils

LONGEST_SLEEP_MS = 30_000


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            milliseconds = pb_utils.get_input_tensor_by_name(request, "milliseconds").as_numpy()
            time.sleep(min(float(milliseconds.max()), LONGEST_SLEEP_MS) / 1000)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("slept", milliseconds.astype(np.float32))]))
        return responses
