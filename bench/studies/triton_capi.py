"""Triton in this process, through its C API: libtritonserver of the nvidia-pytriton wheel, loaded with ctypes.

The wheel has no Python bindings of the C API for 2.51; these are declared here against Triton's tritonserver.h
(triton-inference-server/core, include/triton/core/tritonserver.h). `InProcessTriton.start` starts a server with the
options TritonServer gives the tritonserver binary, the same backend directory and the stubs' environment; `infer`
awaits one inference from an asyncio program. The study that uses it: bench/studies/inprocess.py.
"""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import json
import os
import re
from collections.abc import Callable
from ctypes import POINTER, byref, c_bool, c_char_p, c_int, c_int64, c_size_t, c_uint, c_uint32, c_uint64, c_void_p
from pathlib import Path

import numpy as np

from bench.load.targets import CALL_TIMEOUT_S
from tritonnx.backend.tensors import RAW_DTYPES
from tritonnx.server.shm import STUB_REGION_BYTES
from tritonnx.server.triton import TritonInstall, TritonServer, assemble_backend_dir

# The C API (triton-inference-server/core, include/triton/core/tritonserver.h), declared for ctypes. ERROR marks the
# functions returning a TRITONSERVER_Error*: NULL is success, anything else raises TritonError (and is deleted).
ERROR = "error"
_P, _PP = c_void_p, POINTER(c_void_p)
ALLOC_FN = ctypes.CFUNCTYPE(_P, _P, c_char_p, c_size_t, c_int, c_int64, _P, _PP, _PP, POINTER(c_int), POINTER(c_int64))
RELEASE_FN = ctypes.CFUNCTYPE(_P, _P, _P, _P, c_size_t, c_int, c_int64)
COMPLETE_FN = ctypes.CFUNCTYPE(None, _P, c_uint32, _P)  # a response's, and a request's release
SIGNATURES: dict[str, tuple[object, tuple]] = {
    "ApiVersion": (ERROR, (POINTER(c_uint32), POINTER(c_uint32))),
    "ErrorCodeString": (c_char_p, (_P,)),
    "ErrorMessage": (c_char_p, (_P,)),
    "ErrorDelete": (None, (_P,)),
    "ErrorNew": (_P, (c_int, c_char_p)),
    "DataTypeString": (c_char_p, (c_int,)),
    "StringToDataType": (c_int, (c_char_p,)),
    "MessageSerializeToJson": (ERROR, (_P, _PP, POINTER(c_size_t))),
    "MessageDelete": (ERROR, (_P,)),
    "ServerOptionsNew": (ERROR, (_PP,)),
    "ServerOptionsDelete": (ERROR, (_P,)),
    "ServerOptionsSetModelRepositoryPath": (ERROR, (_P, c_char_p)),
    "ServerOptionsSetBackendDirectory": (ERROR, (_P, c_char_p)),
    "ServerOptionsSetBackendConfig": (ERROR, (_P, c_char_p, c_char_p, c_char_p)),
    "ServerOptionsSetModelControlMode": (ERROR, (_P, c_int)),
    "ServerOptionsSetStartupModel": (ERROR, (_P, c_char_p)),
    "ServerOptionsSetStrictModelConfig": (ERROR, (_P, c_bool)),
    "ServerOptionsSetExitOnError": (ERROR, (_P, c_bool)),
    "ServerOptionsSetExitTimeout": (ERROR, (_P, c_uint)),
    "ServerOptionsSetLogFile": (ERROR, (_P, c_char_p)),
    "ServerOptionsSetModelLoadRetryCount": (ERROR, (_P, c_uint)),
    "ServerOptionsSetModelLoadThreadCount": (ERROR, (_P, c_uint)),
    "ServerNew": (ERROR, (_PP, _P)),
    "ServerStop": (ERROR, (_P,)),
    "ServerDelete": (ERROR, (_P,)),
    "ServerModelIsReady": (ERROR, (_P, c_char_p, c_int64, POINTER(c_bool))),
    "ServerModelMetadata": (ERROR, (_P, c_char_p, c_int64, _PP)),
    "ResponseAllocatorNew": (ERROR, (_PP, ALLOC_FN, RELEASE_FN, _P)),
    "ResponseAllocatorDelete": (ERROR, (_P,)),
    "InferenceRequestNew": (ERROR, (_PP, _P, c_char_p, c_int64)),
    "InferenceRequestDelete": (ERROR, (_P,)),
    "InferenceRequestAddInput": (ERROR, (_P, c_char_p, c_int, POINTER(c_int64), c_uint64)),
    "InferenceRequestAppendInputData": (ERROR, (_P, c_char_p, _P, c_size_t, c_int, c_int64)),
    "InferenceRequestSetReleaseCallback": (ERROR, (_P, COMPLETE_FN, _P)),
    "InferenceRequestSetResponseCallback": (ERROR, (_P, _P, _P, COMPLETE_FN, _P)),
    "ServerInferAsync": (ERROR, (_P, _P, _P)),
    "InferenceResponseError": (_P, (_P,)),  # owned by the response: not deleted
    "InferenceResponseOutputCount": (ERROR, (_P, POINTER(c_uint32))),
    "InferenceResponseOutput": (
        ERROR,
        (_P, c_uint32, POINTER(c_char_p), POINTER(c_int), POINTER(POINTER(c_int64)), POINTER(c_uint64), _PP)
        + (POINTER(c_size_t), POINTER(c_int), POINTER(c_int64), _PP),
    ),
    "InferenceResponseDelete": (ERROR, (_P,)),
}
MEMORY_CPU, CONTROL_EXPLICIT, RESPONSE_FINAL = 0, 2, 1
# A library found by name (no "/": not the path given) that is nowhere the loader looks.
_MISSING = re.compile(r"^([^/\s:]+\.so[\w.-]*): cannot open shared object file: No such file or directory")


class TritonError(RuntimeError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


def missing_library(message: str) -> str | None:
    """The library a failed dlopen could not find, from its message; None when it failed otherwise."""
    found = _MISSING.match(message)
    return found[1] if found else None


def open_library(path: Path, folder: Path, opened: set[str] | None = None) -> ctypes.CDLL:
    """`path` loaded, after the libraries it lacks from `folder` (each once).

    The wheel's libraries find one another by RUNPATH, which reaches one level: libtritonserver finds libcurl, and
    libcurl not its own (libnghttp2, ...). Once loaded by their full path, they are found by their names.
    """
    opened = set() if opened is None else opened
    while True:
        try:
            return ctypes.CDLL(str(path))
        except OSError as error:
            missing = missing_library(str(error))
            if missing is None or missing in opened or not (folder / missing).is_file():
                raise
            opened.add(missing)
            open_library(folder / missing, folder, opened)


class CApi:
    """The functions of SIGNATURES, as attributes without their TRITONSERVER_ prefix."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self.library = library
        for name, (restype, argtypes) in SIGNATURES.items():
            function = getattr(library, f"TRITONSERVER_{name}")
            function.argtypes = argtypes
            function.restype = _P if restype == ERROR else restype
            if restype == ERROR:
                function.errcheck = self.check
            setattr(self, name, function)

    def check(self, error: int | None, function: object, arguments: tuple) -> None:
        if error:
            code, message = self.ErrorCodeString(error), self.ErrorMessage(error)
            self.ErrorDelete(error)
            raise TritonError(code.decode(), message.decode(errors="replace"))

    def __getattr__(self, name: str) -> Callable:  # the SIGNATURES set in __init__, for mypy
        raise AttributeError(name)


class InProcessTriton:
    """A Triton server in this process serving `model`; `infer` awaits one inference.

    Triton calls back on its own threads: ctypes takes the GIL for each callback (the allocator's, per output; the
    response's; the request's release) and gives it up during every call into the library. A response is read on
    Triton's thread (its outputs are the arrays the allocator handed out: no copy) and handed to the caller's event
    loop with call_soon_threadsafe.
    """

    def __init__(self, api: CApi, server: int, model: str, log: Path) -> None:
        self.api, self.server, self.model, self.log = api, server, model, log
        self._name = model.encode()
        self._keys = itertools.count(1)
        self._buffers: dict[int, np.ndarray] = {}  # the allocator's, until Triton releases them
        self._inputs: dict[int, list[np.ndarray]] = {}  # a request's, until Triton releases it
        self._calls: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._callbacks = (ALLOC_FN(self._allocate), RELEASE_FN(self._release), COMPLETE_FN(self._complete))
        self._released = COMPLETE_FN(self._request_released)
        allocator = c_void_p()
        api.ResponseAllocatorNew(byref(allocator), self._callbacks[0], self._callbacks[1], None)
        self.allocator = allocator.value
        message = c_void_p()
        api.ServerModelMetadata(server, self._name, -1, byref(message))
        try:
            base, size = c_void_p(), c_size_t()
            api.MessageSerializeToJson(message, byref(base), byref(size))
            self.metadata = json.loads(ctypes.string_at(base, size.value))
        finally:
            api.MessageDelete(message)
        self.inputs: list[dict] = self.metadata["inputs"]
        self._types = {spec["datatype"]: api.StringToDataType(spec["datatype"].encode()) for spec in self.inputs}

    @classmethod
    def start(cls, repository: Path, model: str, backend_dir: Path, log: Path) -> InProcessTriton:
        """Triton of the wheel serving `model` of `repository`, with the options TritonServer gives the binary."""
        install = TritonInstall.find()
        backends = install.backends or assemble_backend_dir(backend_dir, install)
        # The stubs Triton starts inherit this environment: the venv's bin/ first on PATH, as for the binary.
        os.environ.update(TritonServer().environment(install))
        api = CApi(open_library(next(install.library_dir.glob("libtritonserver*.so")), install.library_dir))
        # Triton opens the backend's library, a copy in `backends`; what it needs is loaded first, from the wheel.
        open_library(backends / "python" / "libtriton_python.so", install.library_dir)
        options, server = c_void_p(), c_void_p()
        api.ServerOptionsNew(byref(options))
        try:
            api.ServerOptionsSetModelRepositoryPath(options, str(repository.resolve()).encode())
            api.ServerOptionsSetBackendDirectory(options, str(backends.resolve()).encode())
            for setting in ("shm-default-byte-size", "shm-growth-byte-size"):
                api.ServerOptionsSetBackendConfig(options, b"python", setting.encode(), str(STUB_REGION_BYTES).encode())
            api.ServerOptionsSetModelControlMode(options, CONTROL_EXPLICIT)
            api.ServerOptionsSetStartupModel(options, model.encode())
            api.ServerOptionsSetStrictModelConfig(options, False)  # the configs leave inputs to auto-complete
            api.ServerOptionsSetExitOnError(options, False)
            api.ServerOptionsSetExitTimeout(options, 10)
            # The binary's defaults, which the library's own do not match: unset, a failed load is retried forever.
            api.ServerOptionsSetModelLoadRetryCount(options, 0)
            api.ServerOptionsSetModelLoadThreadCount(options, 4)
            api.ServerOptionsSetLogFile(options, str(log).encode())
            api.ServerNew(byref(server), options)  # returns once the start-up models are loaded or have failed
        finally:
            api.ServerOptionsDelete(options)
        ready = c_bool()
        api.ServerModelIsReady(server, model.encode(), -1, byref(ready))
        if not ready.value:
            api.ServerDelete(server)
            raise TritonError("UNAVAILABLE", f"{model} did not load; see {log}")
        return cls(api, server.value or 0, model, log)

    def stop(self) -> None:
        self.api.ServerStop(self.server)
        self.api.ServerDelete(self.server)
        self.api.ResponseAllocatorDelete(self.allocator)

    async def infer(self, inputs: dict[str, np.ndarray], timeout: float = CALL_TIMEOUT_S) -> dict[str, np.ndarray]:
        """The outputs of one inference of `inputs` (by name, their datatype the model's), as arrays by name."""
        api, key = self.api, next(self._keys)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        request = c_void_p()
        api.InferenceRequestNew(byref(request), self.server, self._name, -1)
        try:
            arrays = []
            for spec in self.inputs:
                array = np.ascontiguousarray(inputs[spec["name"]], dtype=RAW_DTYPES[spec["datatype"]])
                name, shape = spec["name"].encode(), (c_int64 * array.ndim)(*array.shape)
                api.InferenceRequestAddInput(request, name, self._types[spec["datatype"]], shape, array.ndim)
                api.InferenceRequestAppendInputData(request, name, array.ctypes.data, array.nbytes, MEMORY_CPU, 0)
                arrays.append(array)
            api.InferenceRequestSetReleaseCallback(request, self._released, key)
            api.InferenceRequestSetResponseCallback(request, self.allocator, None, self._callbacks[2], key)
            self._inputs[key], self._calls[key] = arrays, (loop, future)
            api.ServerInferAsync(self.server, request, None)
        except BaseException:
            self._inputs.pop(key, None), self._calls.pop(key, None)
            api.InferenceRequestDelete(request)
            raise
        return await asyncio.wait_for(future, timeout)

    def _allocate(
        self,
        allocator: int | None,
        tensor: bytes,
        size: int,
        memory: int,
        memory_id: int,
        userp: int | None,
        buffer: ctypes._Pointer[c_void_p],
        buffer_key: ctypes._Pointer[c_void_p],
        actual: ctypes._Pointer[c_int],
        actual_id: ctypes._Pointer[c_int64],
    ) -> int | None:
        """An output's buffer: a numpy array in CPU memory (whatever Triton prefers), kept until Triton releases it."""
        try:
            array, key = np.empty(max(size, 1), np.uint8), next(self._keys)
            self._buffers[key] = array
            buffer[0], buffer_key[0], actual[0], actual_id[0] = array.ctypes.data, key, MEMORY_CPU, 0
            return None
        except BaseException as error:  # an exception must not cross into C: Triton fails the response
            return self.api.ErrorNew(1, f"output allocation failed: {error!r}".encode())

    def _release(
        self, allocator: int | None, buffer: int | None, buffer_key: int | None, size: int, memory: int, memory_id: int
    ) -> int | None:
        self._buffers.pop(buffer_key or 0, None)  # the answer's outputs keep the array for the caller
        return None

    def _request_released(self, request: int | None, flags: int, key: int) -> None:
        self._inputs.pop(key, None)
        self.api.InferenceRequestDelete(request)

    def _complete(self, response: int | None, flags: int, key: int) -> None:
        result: dict[str, np.ndarray] | BaseException = {}
        if response:
            try:
                result = self._outputs(response)
            except BaseException as error:
                result = error
            finally:
                self.api.InferenceResponseDelete(response)
        if flags & RESPONSE_FINAL:
            loop, future = self._calls.pop(key)
            if not loop.is_closed():  # else the caller's loop ended while Triton still computed: nobody waits
                loop.call_soon_threadsafe(_settle, future, result)

    def _outputs(self, response: int) -> dict[str, np.ndarray]:
        api = self.api
        error = api.InferenceResponseError(response)
        if error:
            raise TritonError(api.ErrorCodeString(error).decode(), api.ErrorMessage(error).decode(errors="replace"))
        count, outputs = c_uint32(), {}
        api.InferenceResponseOutputCount(response, byref(count))
        name, datatype, shape, dims = c_char_p(), c_int(), POINTER(c_int64)(), c_uint64()
        base, size, memory, memory_id, key = c_void_p(), c_size_t(), c_int(), c_int64(), c_void_p()
        for index in range(count.value):
            places = (name, datatype, shape, dims, base, size, memory, memory_id, key)
            api.InferenceResponseOutput(response, index, *map(byref, places))
            dtype = RAW_DTYPES[api.DataTypeString(datatype).decode()]
            array = self._buffers[key.value or 0][: size.value].view(dtype)
            outputs[(name.value or b"").decode()] = array.reshape([shape[d] for d in range(dims.value)])
        return outputs


def _settle(future: asyncio.Future, result: dict[str, np.ndarray] | BaseException) -> None:
    if future.done():
        return  # the caller gave up (its timeout)
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)
