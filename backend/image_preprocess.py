"""JPEG or PNG bytes to the [3, 224, 224] float tensor an ImageNet classifier takes, with Pillow and numpy.

The steps are torchvision's classic evaluation transform: decode, turn by the EXIF orientation,
RGB, resize the shorter side to 256 (bilinear, antialiased as Pillow does), crop the center
224 x 224, scale to [0, 1], normalize with ImageNet's mean and std, channels first. A JPEG is
decoded at the smallest DCT scale (1/2, 1/4, 1/8) that still leaves both sides at least 256
(Pillow's draft mode): much cheaper for photos, and the resize then starts from that.

Each request is checked on its own (`preprocess_requests`): one image that cannot be decoded
fails its request with the reason, never the others of the batch. Nothing here touches Triton.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageOps

from tritonnx.backend.errors import InvalidInputError
from tritonnx.backend.image_format import ACCEPTED, format_problem, sniff

INPUT_NAME = "image"  # UINT8 [-1]: the file's bytes, one image per row
OUTPUT_NAME = "pixels"  # FP32 [3, 224, 224]
RESIZE = 256
CROP = 224
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
# Decoded pixels beyond this are refused before they are decoded (a small PNG can unpack to gigabytes).
MAX_PIXELS = 40_000_000
# And decoded bytes beyond an RGB image at MAX_PIXELS: images of 4 bytes a pixel (RGBA, CMYK) have fewer pixels.
MAX_DECODED_BYTES = 3 * MAX_PIXELS
# Bytes a pixel takes decoded, by Pillow mode; another mode counts as the largest.
_PIXEL_BYTES = {"1": 1, "L": 1, "P": 1, "LA": 2, "La": 2, "PA": 2, "RGB": 3, "YCbCr": 3, "LAB": 3, "HSV": 3}
_PIXEL_BYTES |= {mode: 2 for mode in ("I;16", "I;16B", "I;16L", "I;16N")}
_MAX_PIXEL_BYTES = 4
# Resizing the shorter side to 256 makes the longer side 256 x this at most (a 1 x 100,000 strip
# would otherwise become gigabytes).
MAX_ASPECT = 100
_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N", "I")
# 16-bit grey levels to 8 bits by rounding down level / 257 (65535 -> 255), as a table.
_SIXTEEN_TO_EIGHT = (np.arange(65536) // 257).astype(np.uint8)
# Rows converted at once from 16 to 8 bits: the whole image converted at once would hold it twice more.
_ROWS_AT_ONCE = 256
# (x / 255 - mean) / std as one multiply-add per value.
_SCALE = (1.0 / (255.0 * STD)).astype(np.float32)
_OFFSET = (MEAN / STD).astype(np.float32)


def _to_eight_bits(image: Image.Image) -> Image.Image:
    """A 16-bit grey image as 8-bit grey (L), scaled, a band of rows at a time.

    Pillow's own conversion would clip at 255 instead of scaling; numpy on the whole image would hold it in
    32-bit integers, several times over (a 40-megapixel PNG took 0.6 GB).
    """
    width, height = image.size
    grey = Image.new("L", image.size)
    for top in range(0, height, _ROWS_AT_ONCE):
        band = image.crop((0, top, width, min(height, top + _ROWS_AT_ONCE)))
        levels = np.asarray(band)
        levels = np.clip(levels, 0, 65535) if levels.dtype != np.uint16 else levels
        grey.paste(Image.fromarray(_SIXTEEN_TO_EIGHT[levels]), (0, top))
    return grey


def _to_rgb(image: Image.Image) -> Image.Image:
    return image if image.mode == "RGB" else image.convert("RGB")


def decode(data: bytes) -> Image.Image:
    """The image, turned upright, in RGB or 8-bit grey (L), at least 256 per side where the file has it.

    InvalidInputError with the reason. Grey stays grey until it is resized (`preprocess`): a third of the memory.
    """
    problem = format_problem(data)
    if problem:
        raise InvalidInputError(problem)
    kind = sniff(data)
    try:
        image: Image.Image = Image.open(io.BytesIO(data), formats=ACCEPTED)
        image.draft("RGB", (RESIZE, RESIZE))  # JPEG only; a no-op for PNG
        width, height = image.size
        if width * height > MAX_PIXELS:
            raise InvalidInputError(
                f"the {kind} image is {width} x {height} pixels, above the limit of {MAX_PIXELS // 1_000_000} "
                "megapixels: send a smaller image"
            )
        if max(width, height) > MAX_ASPECT * min(width, height):
            raise InvalidInputError(
                f"the {kind} image is {width} x {height} pixels, a side more than {MAX_ASPECT} times the other: "
                "crop it first"
            )
        decoded = width * height * _PIXEL_BYTES.get(image.mode, _MAX_PIXEL_BYTES)
        if decoded > MAX_DECODED_BYTES:
            raise InvalidInputError(
                f"the {kind} image is {width} x {height} pixels of {image.mode}, {decoded // 1_000_000} MB once "
                f"decoded, above the limit of {MAX_DECODED_BYTES // 1_000_000} MB: send a smaller image"
            )
        if image.mode in _SIXTEEN_BIT:
            image = _to_eight_bits(image)
        elif image.mode not in ("L", "RGB"):
            image = _to_rgb(image)  # before resizing: a palette image would be resized by its nearest entries
        return ImageOps.exif_transpose(image)
    except InvalidInputError:
        raise
    except Image.DecompressionBombError:
        raise InvalidInputError(f"the {kind} image has too many pixels to decode: send a smaller image") from None
    except Exception as error:  # noqa: BLE001 - a decoder fails on bad data with many exception types
        raise InvalidInputError(f"the {kind} image cannot be decoded: {_reason(error)}") from None


def _reason(error: Exception) -> str:
    if isinstance(error, Image.UnidentifiedImageError):  # its message names a BytesIO object
        return "its header is not valid"
    return str(error) or type(error).__name__


def resize_and_crop(image: Image.Image) -> Image.Image:
    """The shorter side to 256 (the longer in proportion, truncated as torchvision does), then the center 224."""
    width, height = image.size
    if width <= height:
        size = (RESIZE, int(RESIZE * height / width))
    else:
        size = (int(RESIZE * width / height), RESIZE)
    if size != (width, height):
        image = image.resize(size, Image.Resampling.BILINEAR)
    left = int(round((size[0] - CROP) / 2.0))
    top = int(round((size[1] - CROP) / 2.0))
    return image.crop((left, top, left + CROP, top + CROP))


def normalize(image: Image.Image) -> np.ndarray:
    """[3, 224, 224] float32: scaled to [0, 1], minus ImageNet's mean, over its std, channels first."""
    pixels = np.asarray(image, dtype=np.float32)  # [224, 224, 3]
    return np.ascontiguousarray((pixels * _SCALE - _OFFSET).transpose(2, 0, 1))


def preprocess(data: bytes) -> np.ndarray:
    """One image file's bytes to the classifier's input [3, 224, 224]."""
    return normalize(_to_rgb(resize_and_crop(decode(data))))


def preprocess_request(images: np.ndarray) -> np.ndarray:
    """A request's UINT8 [batch, bytes] tensor (one file per row) to FP32 [batch, 3, 224, 224]."""
    if images.ndim != 2 or images.dtype != np.uint8:
        raise InvalidInputError(
            f"input '{INPUT_NAME}' has shape {list(images.shape)} and type {images.dtype}: send UINT8 [batch, n], "
            "each row the n bytes of a JPEG or PNG file"
        )
    rows = []
    for index, row in enumerate(images):
        try:
            rows.append(preprocess(row.tobytes()))
        except InvalidInputError as error:
            where = f"image {index} of the request: " if len(images) > 1 else ""
            raise InvalidInputError(where + str(error)) from None
    return np.stack(rows)


def preprocess_requests(requests: Sequence[np.ndarray]) -> list[np.ndarray | InvalidInputError]:
    """Each request's pixels, or the error that ends that request alone."""
    results: list[np.ndarray | InvalidInputError] = []
    for images in requests:
        try:
            results.append(preprocess_request(images))
        except InvalidInputError as error:
            results.append(error)
    return results
