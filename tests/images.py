"""Encoded test images made with Pillow, and the reference pre-processing the served pipeline is compared with.

The reference is written out step by step with Pillow and numpy, as torchvision's classic
evaluation transform does it (decode, EXIF orientation, RGB, shorter side to 256 bilinear, center
crop 224, scale, ImageNet mean and std, channels first), independently of backend/image_preprocess.py.
"""

from __future__ import annotations

import io
from types import ModuleType
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from PIL import Image, ImageOps

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def pattern(width: int, height: int, seed: int) -> np.ndarray:
    """A smooth RGB picture with some noise: JPEG keeps it close, and its classes differ by seed."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    phase = rng.uniform(0, 6.28, size=3)
    freq = rng.uniform(0.01, 0.08, size=3)
    channels = [127 + 100 * np.sin(freq[c] * (x + 0.7 * y) + phase[c]) for c in range(3)]
    picture = np.stack(channels, axis=-1) + rng.normal(0, 12, size=(height, width, 3))
    return picture.clip(0, 255).astype(np.uint8)


def encode(array: np.ndarray, kind: str, mode: str | None = None, **options) -> bytes:
    """`array` (H x W x 3 uint8) as a JPEG or PNG file, converted to `mode` first (L, RGBA, P, ...)."""
    image = Image.fromarray(array)
    if mode == "RGBA":
        alpha = Image.fromarray(
            (np.arange(array.shape[1]) * 255 // max(1, array.shape[1] - 1))
            .astype(np.uint8)[None]
            .repeat(array.shape[0], 0)
        )
        image = image.convert("RGBA")
        image.putalpha(alpha)
    elif mode is not None:
        image = image.convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, kind, **options)
    return buffer.getvalue()


def image_file(width: int, height: int, kind: str = "JPEG", mode: str | None = None, seed: int = 0, **options) -> bytes:
    return encode(pattern(width, height, seed), kind, mode, **options)


def reference_pixels(data: bytes) -> np.ndarray:
    """[3, 224, 224] float32, by torchvision's steps written out with Pillow and numpy."""
    image = Image.open(io.BytesIO(data))
    image.draft("RGB", (256, 256))  # JPEG: decode at the smallest DCT scale keeping both sides >= 256
    image = ImageOps.exif_transpose(image)
    if image.mode in ("I;16", "I"):  # 16-bit grey: scale to 8 bits
        image = Image.fromarray((np.asarray(image, dtype=np.uint32) // 257).astype(np.uint8))
    image = image.convert("RGB")
    width, height = image.size
    if width <= height:
        size = (256, int(256 * height / width))
    else:
        size = (int(256 * width / height), 256)
    if size != image.size:
        image = image.resize(size, Image.Resampling.BILINEAR)
    left, top = int(round((size[0] - 224) / 2.0)), int(round((size[1] - 224) / 2.0))
    image = image.crop((left, top, left + 224, top + 224))
    pixels = np.asarray(image, dtype=np.float32) / 255.0
    return ((pixels - MEAN) / STD).transpose(2, 0, 1).astype(np.float32)


def truncated(data: bytes) -> bytes:
    """The first half of a file: its magic bytes are right, its data is cut."""
    return data[: len(data) // 2]


def image_input(data: bytes, module: ModuleType = grpcclient) -> Any:
    """The image ensembles' `image` input holding the file `data`, for tritonclient's gRPC (or HTTP) `module`."""
    tensor = module.InferInput("image", [1, len(data)], "UINT8")
    tensor.set_data_from_numpy(np.frombuffer(data, np.uint8)[None])
    return tensor
