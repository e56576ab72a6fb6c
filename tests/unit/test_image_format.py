"""Recognizing image formats by their first bytes (backend/image_format.py), on files Pillow writes."""

import pytest

from tests.images import image_file
from tritonnx.backend.image_format import format_problem, sniff


@pytest.mark.parametrize(
    ("kind", "name"),
    [("JPEG", "JPEG"), ("PNG", "PNG"), ("GIF", "GIF"), ("WEBP", "WebP"), ("BMP", "BMP"), ("TIFF", "TIFF"),
     ("ICO", "ICO"), ("JPEG2000", "JPEG 2000")],
)  # fmt: skip
def test_files_pillow_writes_are_recognized(kind, name):
    assert sniff(image_file(48, 48, kind)) == name


@pytest.mark.parametrize(
    ("head", "name"),
    [
        (b"\x00\x00\x00\x1cftypheic\x00\x00\x00\x00", "HEIC"),
        (b"\x00\x00\x00\x1cftypavif\x00\x00\x00\x00", "AVIF"),
        (b"%PDF-1.7\n", "PDF"),
        (b"\xff\x0a\x00", "JPEG XL"),
    ],
)
def test_other_formats_are_named_from_their_signature(head, name):
    assert sniff(head) == name
    assert f"the image is {name}, which is not accepted" in format_problem(head)


def test_only_jpeg_and_png_pass():
    assert format_problem(image_file(16, 16, "JPEG")) is None
    assert format_problem(memoryview(image_file(16, 16, "PNG"))) is None
    assert format_problem(image_file(16, 16, "GIF")) == (
        "the image is GIF, which is not accepted: send JPEG or PNG (convert the image first)"
    )


def test_unknown_bytes_say_how_they_start_and_what_is_expected():
    problem = format_problem(b"iVBORw0KGgo=")  # a PNG in base64
    assert problem.startswith("the bytes are not a JPEG or PNG image (they start with 69 56 42 4f 52 77 30 4b")
    assert "not base64" in problem
    assert format_problem(b"") == "the image is empty: send the bytes of a JPEG or PNG file"
    assert sniff(b"\xff") is None and sniff(b"") is None
