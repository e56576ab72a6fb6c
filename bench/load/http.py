"""HTTP servers as load targets: a POST per call, its body in the server's own payload format.

The FastAPI baseline and the HTTP peers (LitServe, Ray Serve, BentoML) differ only in where they
listen and how an image travels: a `Payload` turns an array of images into a body and an answer's
body back into the first output, so every HTTP server is driven by the same loop and every answer
can be compared with in-process ONNX Runtime.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    import aiohttp

from bench.load.targets import (
    CALL_TIMEOUT_S,
    IMAGE_CLASSES,
    IMAGE_SHAPE,
    VerificationError,
    close_enough,
    random_tensor,
)
from tritonnx.backend.tensors import RAW_DTYPES, datatype_name

# A pooled connection idle longer than this is not reused. Servers close idle connections (gunicorn's keep-alive, which
# uvicorn workers take, is 2 s): reusing one the server is closing fails the call (ServerDisconnectedError,
# ClientOSError), the client's doing, not the server's: it did so after overloaded steps of the goodput study.
IDLE_REUSE_S = 1.0


class Payload(Protocol):
    """How one server carries an image batch in and its first output back."""

    def encode(self, images: np.ndarray) -> tuple[bytes, dict[str, str]]:
        """The request body and its headers for a float32 batch."""
        ...

    def decode(self, body: bytes) -> np.ndarray:
        """The first output of an answer, flat float32; ValueError if the body is not one."""
        ...

    def encode_named(self, inputs: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
        """The request body and its headers for named inputs of any type (the text models)."""
        ...


class RawFloat32:
    """Raw little-endian float32 bytes both ways, the shape in an `x-shape` header (the FastAPI baseline, Ray Serve)."""

    def encode(self, images: np.ndarray) -> tuple[bytes, dict[str, str]]:
        headers = {"x-shape": ",".join(map(str, images.shape)), "content-type": "application/octet-stream"}
        return images.astype("<f4", copy=False).tobytes(), headers

    def decode(self, body: bytes) -> np.ndarray:
        if len(body) % 4:
            raise ValueError(f"{len(body)} bytes are not float32 values")
        return np.frombuffer(body, "<f4")

    def encode_named(self, inputs: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
        return named_raw(inputs)


def named_raw(inputs: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    """Named inputs of any type: `x-inputs: name:DATATYPE:d0,d1;...`, raw bytes in that order.

    `bench.peers.common.decode_named` reads them. How the text models (two INT64 inputs) travel to the FastAPI baseline and Ray Serve; each other payload wraps it.
    """
    parts, chunks = [], []
    for name, array in inputs.items():
        datatype = datatype_name(array.dtype)
        parts.append(f"{name}:{datatype}:{','.join(map(str, array.shape))}")
        chunks.append(array.astype(RAW_DTYPES[datatype], copy=False).tobytes())
    return b"".join(chunks), {"x-inputs": ";".join(parts), "content-type": "application/octet-stream"}


class Base64Json:
    """JSON carrying the raw float32 bytes as base64: `{"input": ..., "shape": [...]}` in, `{"output": ...}` out.

    The way LitServe's examples carry images in JSON, without a number per value.
    """

    def encode(self, images: np.ndarray) -> tuple[bytes, dict[str, str]]:
        data = base64.b64encode(images.astype("<f4", copy=False).tobytes()).decode("ascii")
        return json.dumps({"input": data, "shape": list(images.shape)}).encode(), {"content-type": "application/json"}

    def decode(self, body: bytes) -> np.ndarray:
        try:
            return np.frombuffer(base64.b64decode(json.loads(body)["output"], validate=True), "<f4")
        except (KeyError, TypeError, json.JSONDecodeError, ValueError) as error:
            raise ValueError(f"not a base64 float32 answer: {error}") from None

    def encode_named(self, inputs: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
        """`{"inputs": <named_raw's x-inputs>, "data": <its raw bytes, base64>}`."""
        raw, headers = named_raw(inputs)
        data = base64.b64encode(raw).decode("ascii")
        return json.dumps({"inputs": headers["x-inputs"], "data": data}).encode(), {"content-type": "application/json"}


class FileUpload:
    """The raw float32 bytes as a file in multipart/form-data (field `input`) in, a JSON array out (BentoML's files)."""

    boundary = "tritonnx-bench-boundary"

    def encode(self, images: np.ndarray) -> tuple[bytes, dict[str, str]]:
        return self._file(images.astype("<f4", copy=False).tobytes()), self._headers()

    def encode_named(self, inputs: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
        """`named_raw`'s bytes as the file, its `x-inputs` header beside the form's."""
        raw, headers = named_raw(inputs)
        return self._file(raw), {**self._headers(), "x-inputs": headers["x-inputs"]}

    def _file(self, content: bytes) -> bytes:
        head = (
            f'--{self.boundary}\r\nContent-Disposition: form-data; name="input"; filename="input.bin"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        return head + content + f"\r\n--{self.boundary}--\r\n".encode()

    def _headers(self) -> dict[str, str]:
        return {"content-type": f"multipart/form-data; boundary={self.boundary}"}

    def decode(self, body: bytes) -> np.ndarray:
        try:
            return np.asarray(json.loads(body), np.float32).ravel()
        except (TypeError, json.JSONDecodeError, ValueError) as error:
            raise ValueError(f"not a JSON array answer: {error}") from None


class HttpTarget:
    """POST {url}{path} with a float32 batch of [batch, 3, 224, 224] images in `payload`'s format.

    Expects 200 and batch x 1000 float32 outputs. `images` (arrays of `batch` images) replace the random data, or
    `inputs` (each request's arrays by name, in the payload's `encode_named`: the text models); `expected` (the
    flat first output each should get) makes every answer decoded and compared, a mismatch counted in `wrong`, and
    sets the output size checked. One aiohttp session for all workers.
    """

    def __init__(
        self,
        url: str,
        batch: int = 1,
        *,
        name: str = "fastapi",
        path: str = "/predict",
        payload: Payload | None = None,
        images: Sequence[np.ndarray] | None = None,
        expected: Sequence[np.ndarray] | None = None,
        inputs: Sequence[dict[str, np.ndarray]] | None = None,
        model: str = "resnet50",
        seed: int = 0,
        timeout_s: float = CALL_TIMEOUT_S,
    ) -> None:
        if batch < 1:
            raise ValueError(f"batch must be at least 1, got {batch}")
        if images is not None and any(len(image) != batch for image in images):
            raise ValueError(f"every array of images must hold a batch of {batch}")
        if images is not None and inputs is not None:
            raise ValueError("give images or inputs, not both")
        requests = images if images is not None else inputs
        if expected is not None and (requests is None or len(expected) != len(requests)):
            raise ValueError("expected outputs need one array of images each (or one request's inputs)")
        url = url.rstrip("/")
        self.url = url if "://" in url else f"http://{url}"
        self.endpoint = f"{self.url}{path}"
        self.name, self.model, self.batch, self.seed, self.timeout_s = name, model, batch, seed, timeout_s
        self.payload = payload or RawFloat32()
        if inputs is not None:
            self.requests = [self.payload.encode_named(named) for named in inputs]
        else:
            if images is None:
                images = [random_tensor("input", "FP32", [batch, *IMAGE_SHAPE], np.random.default_rng(seed))]
            self.requests = [self.payload.encode(image) for image in images]
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
        import aiohttp  # only this target needs it

        self._aiohttp = aiohttp
        connector = aiohttp.TCPConnector(limit=max(concurrency, 1), limit_per_host=max(concurrency, 1),
                                         keepalive_timeout=IDLE_REUSE_S)  # fmt: skip
        session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            skip_auto_headers=("User-Agent",),
        )
        self._session, self._post = session, session.post

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        self._session = self._post = None

    async def call(self) -> str | None:
        """One POST with the next prepared body: None on a 200, else the HTTP status (or the exception's class name)."""
        index = self._next
        self._next = (index + 1) % len(self.requests)
        body, headers = self.requests[index]
        assert self._post is not None, "open() first"
        try:
            async with self._post(self.endpoint, data=body, headers=headers) as response:
                answer = await response.read()
                if response.status != 200:
                    return str(response.status)
        except (self._aiohttp.ClientError, asyncio.TimeoutError) as error:
            return type(error).__name__
        if self.expected is not None and not self.matches(answer, self.expected[index]):
            self.wrong += 1
        return None

    def matches(self, answer: bytes, expected: np.ndarray) -> bool:
        """The answer's body decodes to `expected` (up to float noise)."""
        try:
            return close_enough(self.payload.decode(answer), expected)
        except ValueError:
            return False

    async def verify(self) -> None:
        where = f"{self.name} {self.endpoint} batch {self.batch}"
        body, headers = self.requests[0]
        assert self._post is not None, "open() first"
        try:
            async with self._post(self.endpoint, data=body, headers=headers) as response:
                answer = await response.read()
                status = response.status
        except (self._aiohttp.ClientError, asyncio.TimeoutError) as error:
            raise VerificationError(f"{where}: first call failed: {type(error).__name__}: {error}") from None
        if status != 200:
            raise VerificationError(f"{where}: first call answered HTTP {status}: {answer[:200]!r}")
        try:
            output = self.payload.decode(answer)
        except ValueError as error:
            raise VerificationError(f"{where}: {error}; body starts {answer[:200]!r}") from None
        if output.size != self.expected_values:
            raise VerificationError(
                f"{where}: {output.size} output values, expected {self.expected_values} "
                f"({self.batch} x {IMAGE_CLASSES} float32)"
            )
