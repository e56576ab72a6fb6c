"""The code blocks of README.md and docs/*.md, as the docs tests read them.

A fence's info string says what a block is: `text` an illustration (a layout, a log line, an
output), `protobuf` a model config or part of one, `bash` and `python` what a user runs. A `bash` or
`python` block follows a marker comment saying how the tests treat it:

    <!-- test: run -->         executed against a serving stack (tests/slow/test_docs_recipes.py)
    <!-- test: run exit=1 -->  the same, and its last command exits 1 (a recipe showing a failure)
    <!-- test: containers -->  executed against the images in a real Docker engine, a page's blocks in one
                               shell session (tests/containers/test_docs_recipes.py)
    <!-- test: check -->       each command checked without running it (tests/unit/test_docs_recipes.py):
                               what no test can run (make serve, kubectl, a build on NVIDIA's image)
"""

from __future__ import annotations

import re
import shutil
import textwrap
from dataclasses import dataclass
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
PAGES = sorted([CHECKOUT / "README.md", *CHECKOUT.glob("docs/*.md")])
KINDS = ("bash", "python", "protobuf", "text")
RUNNABLE = ("bash", "python")
MARKER = re.compile(r"^\s*<!-- test: (run|containers|check)(?: exit=(\d+))? -->\s*$")
FENCE = re.compile(r"^(\s*)(```|~~~)(.*)$")
# The well-known addresses of `make serve` in a block; the tests that run blocks put their own ports there.
ADDRESS = re.compile(r"\b(?:127\.0\.0\.1|localhost):(8000|8001|8002|8003|50051|3000)\b")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # the opening fence's, from 1
    kind: str  # the info string
    marker: str  # "run", "check" or "" (none)
    exit_code: int  # the status a run block ends with
    text: str  # dedented, without the fences

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(CHECKOUT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    found: list[Block] = []
    lines = page.read_text().splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        indent, fence, info = opening.groups()
        end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == fence)
        previous = next((lines[i] for i in range(index - 1, -1, -1) if lines[i].strip()), "")
        marker = MARKER.match(previous)
        found.append(
            Block(
                page=page,
                line=index + 1,
                kind=info.strip(),
                marker=marker.group(1) if marker else "",
                exit_code=int(marker.group(2) or 0) if marker else 0,
                text=textwrap.dedent("\n".join(lines[index + 1 : end])) + "\n",
            )
        )
        index = end + 1
    return found


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in blocks(page)]


def commands(block: Block) -> list[str]:
    """A bash block's commands: continuation lines joined, blank lines and comment lines dropped."""
    joined = block.text.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def write_recipe_files(home: Path) -> None:
    """The files the recipes name: a user's model, a new version of the demo model, samples, an image."""
    import numpy as np
    from PIL import Image

    from tests.graphs import small_classifier
    from tests.serving import onnx_file

    small_classifier(home / "my.onnx")
    small_classifier(home / "path" / "to" / "my.onnx")
    shutil.copyfile(onnx_file("mobilenet_v3_small"), home / "path" / "to" / "new.onnx")
    rng = np.random.default_rng(0)
    (home / "samples").mkdir()
    np.save(home / "samples" / "a.npy", rng.standard_normal((20, 3, 16, 16), dtype=np.float32))
    np.save(home / "image.npy", rng.standard_normal((1, 3, 224, 224), dtype=np.float32))
    pixels = rng.integers(0, 256, (240, 320, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(home / "cat.jpg", quality=90)
