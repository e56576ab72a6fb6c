"""The code blocks of README.md and docs/*.md, as the docs tests read them.

A fence's info string says what a block is: `text` an illustration (a layout, a log line, an
output), `protobuf` a model config or part of one, `bash` and `python` what a user runs. A `bash` or
`python` block follows a marker comment saying how the tests treat it:

    <!-- test: run -->         executed against a serving stack (tests/integration/test_docs_recipes.py)
    <!-- test: run exit=1 -->  the same, and its last command exits 1 (a recipe showing a failure)
    <!-- test: check -->       each command checked without running it (tests/unit/test_docs_recipes.py):
                               what cannot run beside a test server (make serve, docker, kubectl)
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
PAGES = sorted([CHECKOUT / "README.md", *CHECKOUT.glob("docs/*.md")])
KINDS = ("bash", "python", "protobuf", "text")
RUNNABLE = ("bash", "python")
MARKER = re.compile(r"^\s*<!-- test: (run|check)(?: exit=(\d+))? -->\s*$")
FENCE = re.compile(r"^(\s*)(```|~~~)(.*)$")


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
