"""The FastAPI baseline as a load target: POST {url}/predict with raw float32 bytes."""

from __future__ import annotations

import asyncio

import numpy as np

from bench.load.targets import CALL_TIMEOUT_S, IMAGE_CLASSES, IMAGE_SHAPE, VerificationError, random_tensor


class HttpTarget:
    """POST {url}/predict, body the raw little-endian float32 bytes of a [batch, 3, 224, 224] array, header `x-shape`.

    Expects 200 and batch * 1000 float32 bytes. One aiohttp session for all workers.
    """

    name = "fastapi"

    def __init__(
        self, url: str, batch: int = 1, *, model: str = "resnet50", seed: int = 0, timeout_s: float = CALL_TIMEOUT_S
    ) -> None:
        if batch < 1:
            raise ValueError(f"batch must be at least 1, got {batch}")
        url = url.rstrip("/")
        self.url = url if "://" in url else f"http://{url}"
        self.endpoint = f"{self.url}/predict"
        self.model, self.batch, self.seed, self.timeout_s = model, batch, seed, timeout_s
        shape = [batch, *IMAGE_SHAPE]
        self.payload = random_tensor("input", "FP32", shape, np.random.default_rng(seed)).tobytes()
        self.headers = {"x-shape": ",".join(map(str, shape)), "content-type": "application/octet-stream"}
        self.expected_bytes = batch * IMAGE_CLASSES * 4
        self._session = None
        self._post = None

    @property
    def is_open(self) -> bool:
        return self._session is not None

    async def open(self, concurrency: int = 1) -> None:
        import aiohttp  # only this target needs it

        self._aiohttp = aiohttp
        connector = aiohttp.TCPConnector(limit=max(concurrency, 1), limit_per_host=max(concurrency, 1))
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            skip_auto_headers=("User-Agent",),
        )
        self._post = self._session.post

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        self._session = self._post = None

    async def call(self) -> str | None:
        """One POST: None on a 200, else the HTTP status (or the exception's class name)."""
        try:
            async with self._post(self.endpoint, data=self.payload, headers=self.headers) as response:
                await response.read()
                return None if response.status == 200 else str(response.status)
        except (self._aiohttp.ClientError, asyncio.TimeoutError) as error:
            return type(error).__name__

    async def verify(self) -> None:
        where = f"fastapi {self.endpoint} batch {self.batch}"
        try:
            async with self._post(self.endpoint, data=self.payload, headers=self.headers) as response:
                body = await response.read()
                status = response.status
        except (self._aiohttp.ClientError, asyncio.TimeoutError) as error:
            raise VerificationError(f"{where}: first call failed: {type(error).__name__}: {error}") from None
        if status != 200:
            raise VerificationError(f"{where}: first call answered HTTP {status}: {body[:200]!r}")
        if len(body) != self.expected_bytes:
            raise VerificationError(
                f"{where}: body of {len(body)} bytes, expected {self.expected_bytes} "
                f"({self.batch} x {IMAGE_CLASSES} float32)"
            )
