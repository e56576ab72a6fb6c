"""The pipeline's pre-processing (backend/image_preprocess.py) against the reference written out in tests/images.py."""

import io

import numpy as np
import pytest
from PIL import Image

from tests.images import MEAN, STD, encode, image_file, pattern, reference_pixels, truncated
from tritonnx.backend.errors import InvalidInputError
from tritonnx.backend.image_preprocess import MAX_PIXELS, decode, preprocess, preprocess_request, preprocess_requests

# Made when a test asks (not at collection): name -> the file.
CASES = {
    "jpeg rgb 640x480": lambda: image_file(640, 480),
    "jpeg rgb portrait 301x457 odd": lambda: image_file(301, 457, seed=1),
    "jpeg grey": lambda: image_file(320, 240, mode="L", seed=2),
    "jpeg large 2048x1536 (decoded at 1/4)": lambda: image_file(2048, 1536, seed=3, quality=90),
    "jpeg cmyk": lambda: image_file(300, 300, mode="CMYK", seed=4),
    "png rgb 225x224": lambda: image_file(225, 224, "PNG", seed=5),
    "png grey": lambda: image_file(400, 300, "PNG", mode="L", seed=6),
    "png rgba": lambda: image_file(256, 300, "PNG", mode="RGBA", seed=7),
    "png palette": lambda: image_file(300, 200, "PNG", mode="P", seed=8),
    "png tiny 1x1": lambda: image_file(1, 1, "PNG", seed=9),
    "png small 7x3 (upscaled)": lambda: image_file(7, 3, "PNG", seed=10),
    "png panorama 2000x100": lambda: image_file(2000, 100, "PNG", seed=11),
}


def uniform_png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("L", (width, height), 128).save(buffer, "PNG")
    return buffer.getvalue()


BAD = {
    "empty": (lambda: b"", "the image is empty"),
    "text": (lambda: b"hello, this is text", "not a JPEG or PNG image (they start with 68 65 6c 6c 6f 2c 20 74"),
    "gif": (lambda: image_file(64, 64, "GIF"), "the image is GIF, which is not accepted: send JPEG or PNG"),
    "webp": (lambda: image_file(64, 64, "WEBP"), "the image is WebP, which is not accepted"),
    "bmp": (lambda: image_file(64, 64, "BMP"), "the image is BMP, which is not accepted"),
    "tiff": (lambda: image_file(64, 64, "TIFF"), "the image is TIFF, which is not accepted"),
    "truncated jpeg": (
        lambda: truncated(image_file(640, 480)),
        "the JPEG image cannot be decoded: image file is truncated",
    ),
    "truncated png": (lambda: truncated(image_file(640, 480, "PNG")), "the PNG image cannot be decoded:"),
    "jpeg magic only": (lambda: b"\xff\xd8\xff" + b"\x00" * 100, "the JPEG image cannot be decoded"),
    "png magic only": (lambda: b"\x89PNG\r\n\x1a\n" + b"garbage" * 10, "the PNG image cannot be decoded"),
    "48 megapixels": (
        lambda: uniform_png(8000, 6000),
        f"8000 x 6000 pixels, above the limit of {MAX_PIXELS // 10**6} megapixels",
    ),
    "5000x40 strip": (lambda: uniform_png(5000, 40), "a side more than 100 times the other"),
}


@pytest.mark.parametrize("name", CASES)
def test_preprocess_equals_the_reference(name):
    data = CASES[name]()
    pixels = preprocess(data)
    assert pixels.shape == (3, 224, 224) and pixels.dtype == np.float32 and pixels.flags.c_contiguous
    # The same steps: only the float rounding of the normalization differs.
    np.testing.assert_allclose(pixels, reference_pixels(data), rtol=0, atol=1e-5)


def test_a_256_square_png_is_only_cropped_and_normalized():
    picture = pattern(256, 256, seed=12)
    expected = ((picture[16:240, 16:240].astype(np.float32) / 255 - MEAN) / STD).transpose(2, 0, 1)
    np.testing.assert_allclose(preprocess(encode(picture, "PNG")), expected, rtol=0, atol=1e-5)


def test_a_sixteen_bit_grey_png_is_scaled_to_eight_bits_not_clipped():
    levels = (np.linspace(0, 65535, 300 * 300).reshape(300, 300)).astype(np.uint16)
    buffer = io.BytesIO()
    Image.fromarray(levels).save(buffer, "PNG")
    pixels = preprocess(buffer.getvalue())
    np.testing.assert_allclose(pixels, reference_pixels(buffer.getvalue()), rtol=0, atol=1e-5)
    grey = pixels[0] * STD[0] + MEAN[0]
    assert grey.min() < 0.2 and grey.max() > 0.8  # clipping at 255 would leave everything near 1.0


def test_the_exif_orientation_is_applied():
    picture = pattern(320, 200, seed=13)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    rotated = encode(picture, "JPEG", exif=exif.tobytes())
    assert decode(rotated).size == (200, 320)
    np.testing.assert_allclose(preprocess(rotated), reference_pixels(rotated), rtol=0, atol=1e-5)


def test_a_large_jpeg_is_decoded_at_a_reduced_scale():
    assert decode(CASES["jpeg large 2048x1536 (decoded at 1/4)"]()).size == (512, 384)
    assert decode(CASES["png rgb 225x224"]()).size == (225, 224)


@pytest.mark.parametrize("name", BAD)
def test_bad_files_are_refused_with_the_reason(name):
    make, message = BAD[name]
    with pytest.raises(InvalidInputError) as caught:
        preprocess(make())
    assert message in str(caught.value)
    assert "BytesIO" not in str(caught.value)


def test_a_request_of_several_rows_names_the_row_that_failed():
    good = np.frombuffer(image_file(300, 300, "PNG", seed=14), np.uint8)
    two = np.stack([good, good])
    assert preprocess_request(two).shape == (2, 3, 224, 224)
    broken = two.copy()
    broken[1, 100:] = 0
    with pytest.raises(InvalidInputError, match="image 1 of the request: the PNG image cannot be decoded"):
        preprocess_request(broken)
    with pytest.raises(InvalidInputError, match="send UINT8 \\[batch, n\\]"):
        preprocess_request(good.astype(np.int8)[None])


def test_each_request_of_a_batch_gets_its_own_result():
    good = [image_file(300 + i, 280, seed=20 + i) for i in range(3)]
    requests = [
        np.frombuffer(good[0], np.uint8)[None],
        np.frombuffer(truncated(good[1]), np.uint8)[None],
        np.frombuffer(good[1], np.uint8)[None],
        np.frombuffer(image_file(32, 32, "GIF"), np.uint8)[None],
        np.frombuffer(good[2], np.uint8)[None],
    ]
    results = preprocess_requests(requests)
    assert [type(r).__name__ for r in results] == [
        "ndarray",
        "InvalidInputError",
        "ndarray",
        "InvalidInputError",
        "ndarray",
    ]
    for result, data in zip((results[0], results[2], results[4]), good, strict=True):
        np.testing.assert_allclose(result[0], reference_pixels(data), rtol=0, atol=1e-5)
    assert "truncated" in str(results[1]) and "GIF" in str(results[3])


def test_a_large_sixteen_bit_png_is_converted_a_band_at_a_time():
    """A 16-bit grey PNG of 16 megapixels compresses to kilobytes; converted at once it took numpy 0.25 GB."""
    import tracemalloc

    levels = np.tile(np.linspace(0, 65535, 4000).astype(np.uint16), (4000, 1))
    buffer = io.BytesIO()
    Image.fromarray(levels).save(buffer, "PNG")
    del levels
    tracemalloc.start()  # numpy's arrays are traced (Pillow's own image memory is not)
    try:
        pixels = preprocess(buffer.getvalue())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert pixels.shape == (3, 224, 224)
    assert peak < 16 * 2**20, f"numpy held {peak / 2**20:.0f} MiB at once"


def test_an_image_too_large_once_decoded_is_refused_by_its_bytes():
    from tritonnx.backend.image_preprocess import MAX_DECODED_BYTES

    side = int((MAX_DECODED_BYTES / 4) ** 0.5) + 1  # RGBA: 4 bytes a pixel, fewer pixels than MAX_PIXELS
    buffer = io.BytesIO()
    Image.new("RGBA", (side, side)).save(buffer, "PNG")
    with pytest.raises(InvalidInputError, match="pixels of RGBA, .* MB once decoded, above the limit of 120 MB"):
        decode(buffer.getvalue())
