"""HTTP servers as load targets (the FastAPI baseline, Ray Serve): a POST of raw bytes per call.

An image batch travels as raw little-endian float32 with its shape in `x-shape`; named inputs of any type (the text
models) as raw bytes described by `x-inputs` (`named_raw`). The answer is the first output's raw float32 bytes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
import numpy as np

from bench.load.targets import CALL_TIMEOUT_S, IMAGE_CLASSES, IMAGE_SHAPE, Request, VerificationError, close_enough
from tritonnx.backend.tensors import RAW_DTYPES, datatype_name

# A pooled connection idle longer than this is not reused. Servers close idle connections (gunicorn's keep-alive, which
# uvicorn workers take, is 2 s): reusing one the server is closing fails the call (ServerDisconnectedError,
# ClientOSError), the client's doing, not the server's: it did so after overloaded steps of the goodput study.
IDLE_REUSE_S = 1.0


def named_raw(inputs: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    """Named inputs of any type: `x-inputs: name:DATATYPE:d0,d1;...`, raw bytes in that order (`decode_named`)."""
    parts, chunks = [], []
    for name, array in inputs.items():
        datatype = datatype_name(array.dtype)
        parts.append(f"{name}:{datatype}:{','.join(map(str, array.shape))}")
        chunks.append(array.astype(RAW_DTYPES[datatype], copy=False).tobytes())
    return b"".join(chunks), {"x-inputs": ";".join(parts), "content-type": "application/octet-stream"}


def encode(request: Request) -> tuple[bytes, dict[str, str]]:
    """A request's body and headers: an image batch in `x-shape`, or named inputs in `x-inputs`."""
    if isinstance(request, dict):
        return named_raw(request)
    headers = {"x-shape": ",".join(map(str, request.shape)), "content-type": "application/octet-stream"}
    return request.astype("<f4", copy=False).tobytes(), headers


class HttpTarget:
    """POST {url}/predict with random images or the requests given (as `GrpcTarget`'s); one aiohttp session."""

    def __init__(
        self,
        url: str,
        batch: int = 1,
        *,
        name: str = "fastapi",
        images: Sequence[Request] | None = None,
        expected: Sequence[np.ndarray] | None = None,
        model: str = "resnet50",
        timeout_s: float = CALL_TIMEOUT_S,
    ) -> None:
        if expected is not None and (images is None or len(expected) != len(images)):
            raise ValueError("expected outputs need one array of images each (or one request's inputs)")
        self.endpoint = f"{url.rstrip('/') if '://' in url else f'http://{url}'}/predict"
        self.name, self.model, self.batch, self.timeout_s = name, model, batch, timeout_s
        if images is None:
            images = [np.random.default_rng(0).standard_normal((batch, *IMAGE_SHAPE), dtype=np.float32)]
        self.requests = [encode(request) for request in images]
        self.expected = expected
        self.expected_values = expected[0].size if expected else batch * IMAGE_CLASSES
        self.wrong = 0  # answers unlike `expected`
        self._next = 0
        self._session: aiohttp.ClientSession | None = None
        self._post: Callable[..., Any] | None = None  # the open session's post

    @property
    def is_open(self) -> bool:
        return self._session is not None

    async def open(self, concurrency: int = 1) -> None:
        connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency, keepalive_timeout=IDLE_REUSE_S)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout_s), skip_auto_headers=("User-Agent",)
        )
        self._post = self._session.post

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        self._session = self._post = None

    async def _send(self, index: int) -> tuple[int, bytes]:
        body, headers = self.requests[index]
        assert self._post is not None, "open() first"
        async with self._post(self.endpoint, data=body, headers=headers) as response:
            return response.status, await response.read()

    async def call(self) -> str | None:
        """One POST with the next prepared body: None on a 200, else the HTTP status (or the exception's class name)."""
        index = self._next
        self._next = (index + 1) % len(self.requests)
        try:
            status, answer = await self._send(index)
        except (aiohttp.ClientError, asyncio.TimeoutError) as error:
            return type(error).__name__
        if status != 200:
            return str(status)
        if self.expected is not None and not close_enough(_floats(answer), self.expected[index]):
            self.wrong += 1
        return None

    async def verify(self) -> None:
        where = f"{self.name} {self.endpoint} batch {self.batch}"
        try:
            status, answer = await self._send(0)
        except (aiohttp.ClientError, asyncio.TimeoutError) as error:
            raise VerificationError(f"{where}: first call failed: {type(error).__name__}: {error}") from None
        if status != 200:
            raise VerificationError(f"{where}: first call answered HTTP {status}: {answer[:200]!r}")
        if _floats(answer).size != self.expected_values:
            raise VerificationError(
                f"{where}: {_floats(answer).size} output values, expected {self.expected_values} "
                f"({self.batch} x {IMAGE_CLASSES} float32)"
            )


def _floats(body: bytes) -> np.ndarray:
    """An answer's float32 values; none when the body is not whole values."""
    return np.frombuffer(body, "<f4") if len(body) % 4 == 0 else np.empty(0, np.float32)
