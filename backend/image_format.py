"""Which image format a byte string holds, from its first bytes, and whether it is one the pipeline takes.

Pure Python with no dependencies: the facade checks an image with it before sending it to Triton,
and the pre-processing model checks it again for callers that reach Triton directly. Only JPEG
and PNG are decoded; the other common formats are recognized so that a caller is told which
format it sent instead of "not an image".
"""

from __future__ import annotations

ACCEPTED = ("JPEG", "PNG")

# (offset, magic bytes, format): the files' own signatures.
_SIGNATURES: tuple[tuple[int, bytes, str], ...] = (
    (0, b"\xff\xd8\xff", "JPEG"),
    (0, b"\x89PNG\r\n\x1a\n", "PNG"),
    (0, b"GIF87a", "GIF"),
    (0, b"GIF89a", "GIF"),
    (0, b"BM", "BMP"),
    (0, b"II*\x00", "TIFF"),
    (0, b"MM\x00*", "TIFF"),
    (0, b"\x00\x00\x01\x00", "ICO"),
    (0, b"\x00\x00\x00\x0cjP  \r\n\x87\n", "JPEG 2000"),
    (0, b"\xff\x4f\xff\x51", "JPEG 2000"),
    (0, b"\xff\x0a", "JPEG XL"),
    (0, b"\x00\x00\x00\x0cJXL \r\n\x87\n", "JPEG XL"),
    (0, b"8BPS", "PSD"),
    (0, b"%PDF", "PDF"),
)
# ISO base media files (HEIF, AVIF) carry `ftyp` at offset 4, then their brand.
_FTYP_BRANDS = {b"avif": "AVIF", b"avis": "AVIF", b"heic": "HEIC", b"heix": "HEIC", b"mif1": "HEIF", b"msf1": "HEIF"}


def sniff(data: bytes | memoryview) -> str | None:
    """The format the bytes start like (JPEG, PNG, GIF, WebP, ...), or None when none is recognized."""
    head = bytes(data[:16])
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WebP"
    if head[4:8] == b"ftyp" and head[8:12] in _FTYP_BRANDS:
        return _FTYP_BRANDS[head[8:12]]
    for offset, magic, name in _SIGNATURES:
        if head[offset : offset + len(magic)] == magic:
            return name
    return None


def format_problem(data: bytes | memoryview) -> str | None:
    """What is wrong with the bytes as an image to classify, for the caller; None when they are JPEG or PNG."""
    if len(data) == 0:
        return "the image is empty: send the bytes of a JPEG or PNG file"
    found = sniff(data)
    if found in ACCEPTED:
        return None
    if found is not None:
        return f"the image is {found}, which is not accepted: send JPEG or PNG (convert the image first)"
    start = bytes(data[:8]).hex(" ")
    return (
        f"the bytes are not a JPEG or PNG image (they start with {start}; JPEG starts with ff d8 ff, "
        "PNG with 89 50 4e 47): send the file's bytes as they are, not base64 or a decoded array"
    )
