"""Errors a request can end with, as types; `triton_model` maps each to a Triton status code."""


class RequestError(Exception):
    """A single request cannot be served; the rest of its batch is unaffected."""


class InvalidInputError(RequestError):
    """The request's tensors do not fit the model (name, dtype, rank, dims, batch size)."""


class ModelExecutionError(RequestError):
    """ONNX Runtime failed on input that passed validation, and not because of that input."""


class ModelConfigError(Exception):
    """The model configuration or the ONNX file cannot be served as configured."""
