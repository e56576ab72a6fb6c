"""The documentation points at what exists: links, anchors, repository paths, modules and make targets.

README.md, docs/*.md, bench/studies/README.md and deploy/**/README.md are read as GitHub renders them.
A relative link must name a file of the checkout, and an anchor a heading of the page it names (GitHub's
slugs). A path of the checkout written in backticks (`backend/runner.py`, `bench/reports/...`,
`tests/unit/test_deploy_*.py`) must exist, as must a file a table row names alone under a folder of its
first cell (`backend/`: `runner.py`), a module run with `python -m` or written as `tritonnx.commands.serve`, a `make`
target, and an environment variable (`TRITONNX_*`) in the code, so a page cannot point at a moved module
or a renamed setting. Build outputs (`build/`, `bench/results/`, generated models and protobuf code) and
placeholders (`<model>`, `...`) are not checked. docs/configuration.md lists every environment variable of
the serve and facade settings with its flag. A page that links a report states its conclusion: a figure
of the report (a range or a decimal with its unit) copied onto the page fails, so each lives in one place.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import pytest
import tomllib

from bench.peers.claims import latest_rounds, read_summaries, speed_sentence
from tritonnx.client.facade.settings import FacadeSettings
from tritonnx.commands.serve import ServeSettings
from tritonnx.common.settings import env_name, env_of

CHECKOUT = Path(__file__).resolve().parents[2]
README = CHECKOUT / "README.md"
README_MAX_LINES = 250
CONFIGURATION = CHECKOUT / "docs" / "configuration.md"
REPORTS = CHECKOUT / "bench" / "reports"
PAGES = sorted(
    [README, *CHECKOUT.glob("docs/*.md"), CHECKOUT / "bench/studies/README.md", *CHECKOUT.glob("deploy/**/README.md")]
)

# Folders and files of the checkout that a path in the docs starts with.
SOURCE_FOLDERS = ("backend", "client", "tritonnx", "bench", "tests", "deploy", "docs")
CHECKED_FOLDERS = (*SOURCE_FOLDERS, "model_repository", ".ci")
TOP_FILES = r"Makefile|Dockerfile|pyproject\.toml|requirements[\w*-]*\.txt|\.pre-commit-config\.yaml"
PATH = re.compile(rf"(?:\./)?(?:(?:{'|'.join(map(re.escape, CHECKED_FOLDERS))})/\S*|{TOP_FILES})")
# In code blocks, paths of the source folders only: examples there create folders in model_repository/.
BLOCK_PATH = re.compile(rf"(?<![\w/.$-])(?:{'|'.join(SOURCE_FOLDERS)})/[\w./*-]*")
PLACEHOLDER = re.compile(r"[<>{}$]|\.\.\.|…")
IMAGE = re.compile(r"[\w.-]+/[\w.-]+:[\w.-]+")  # `tritonnx/debian:bookworm`, an image, not a path
GENERATED_PREFIXES = ("bench/results",)
GENERATED_SUFFIXES = (".onnx", "_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
# A file or folder named alone in a table row whose first cell names folders (`backend/`: `runner.py`).
BARE_NAME = re.compile(r"[\w-]+\.(?:py|pyi|sh|ya?ml|txt|json|md|proto|pbtxt)|[\w-]+/")
PACKAGES = ("tritonnx", "bench", "tests")
PACKAGE_DIRS = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
# tritonnx's subpackages: `tritonnx.<other>` is a name of another kind (a span attribute, a config parameter).
MODULE = re.compile(
    r"(?<![\w.])(?:tritonnx\.(?:backend|client|server|commands|offline|common)|bench|tests)(?:\.[A-Za-z_]\w*)*"
)
CODE_FOLDERS = ("backend", "client", "tritonnx", "bench")
RUN_MODULE = re.compile(r"python\s+-m\s+([A-Za-z_][\w.]*)")
MAKE_TARGET = re.compile(r"\bmake\s+([a-z][\w-]*)")
ENV_VARIABLE = re.compile(r"\bTRITON(?:NX)?_[A-Z0-9_]*[A-Z0-9]\b")
# A measured figure as reports write them: a range or a decimal, with its unit ("2.9-3.3 s", "0.82x", "1.7%").
FIGURE = re.compile(
    r"(?<![\w.,-])(?:\d[\d,]*(?:\.\d+)?-\d[\d,]*(?:\.\d+)?|\d[\d,]*\.\d+) ?(?:req/s|img/s|ms|s|MiB|MB|GiB|KB|%|x)(?![\w/])"
)
# The project's goals, which the reports restate beside what they measured: not figures of theirs.
GOALS = {"0.75x", "0.95x", "1.6x", "1.5x"}  # the last two: the INT8 goals its report restates

FENCE = re.compile(r"^ *(```|~~~).*?^ *\1 *$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *#* *$", re.MULTILINE)


def prose(text: str) -> str:
    """The page without its fenced code blocks."""
    return FENCE.sub("", text)


def code_blocks(text: str) -> list[str]:
    return [match.group(0) for match in FENCE.finditer(text)]


def code_spans(text: str) -> list[str]:
    return [match.group(2).strip() for match in CODE_SPAN.finditer(prose(text))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lower-cased, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor on the page; repeated headings get -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for heading in HEADING.findall(prose(page.read_text())):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(page: Path) -> Iterator[str]:
    text = CODE_SPAN.sub("", prose(page.read_text()))
    for target in LINK.findall(text):
        if not re.match(r"[a-z][a-z+.-]*:", target):  # http:, https:, mailto: ...
            yield target


def looks_like_a_file_path(path: str) -> bool:
    """In a code block, `deploy/tritonnx` is kubectl's kind/name: a path there has a suffix, a final /, or depth."""
    return path.endswith("/") or "." in path.rsplit("/", 1)[-1] or path.count("/") >= 2


def repository_paths(page: Path) -> set[str]:
    """Paths of the checkout the page names: in code spans, and source paths in code blocks."""
    text = page.read_text()
    paths = {t for span in code_spans(text) for t in span.split() if PATH.fullmatch(t) and not IMAGE.fullmatch(t)}
    paths |= {
        match.group(0)
        for block in code_blocks(text)
        for match in BLOCK_PATH.finditer(block)
        if looks_like_a_file_path(match.group(0))
    }
    # `tests/x.py::test_y` names a test: its path is the file's (test_every_test_it_names_exists checks the test).
    return {path.split("::")[0].rstrip(".,;:)").removeprefix("./") for path in paths}


def table_row_names(page: Path) -> set[tuple[str, str]]:
    """(folder, name) for each name a table row gives alone, under a folder its first cell names."""
    found: set[tuple[str, str]] = set()
    for line in prose(page.read_text()).splitlines():
        if not line.startswith("|"):
            continue
        first, _, rest = line.strip("| ").partition("|")
        folders = [token for span in code_spans(first) for token in span.split() if (CHECKOUT / token).is_dir()]
        names = {token for span in code_spans(rest) for token in span.split() if BARE_NAME.fullmatch(token)}
        found |= {(folder, name) for folder in folders for name in names}
    return found


def checked(path: str) -> bool:
    return not (
        PLACEHOLDER.search(path) or path.startswith(GENERATED_PREFIXES) or path.rstrip("/").endswith(GENERATED_SUFFIXES)
    )


def modules(page: Path) -> set[str]:
    text = page.read_text()
    named = {token for span in code_spans(text) for token in span.split() if MODULE.fullmatch(token)}
    return named | {module for module in RUN_MODULE.findall(text) if module.split(".")[0] in PACKAGES}


def is_module(name: str) -> bool:
    for package, folder in PACKAGE_DIRS.items():  # tritonnx.client.x is client/x.py
        if name == package or name.startswith(package + "."):
            name = folder + name[len(package) :]
    base = CHECKOUT.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def make_targets(page: Path) -> set[str]:
    text = page.read_text()
    code = [*code_spans(text), *code_blocks(text)]
    return {target for snippet in code for target in MAKE_TARGET.findall(snippet)}


def defined_make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][\w-]*) *:", (CHECKOUT / "Makefile").read_text(), re.MULTILINE))


def variables_the_code_reads() -> set[str]:
    """The TRITONNX_* (and TRITON_*) names in the sources, those built with env_name, and the facade's settings'."""
    text = "\n".join(path.read_text() for folder in CODE_FOLDERS for path in (CHECKOUT / folder).rglob("*.py"))
    built = {env_name(name) for name in re.findall(r"env_name\(\"(\w+)\"\)", text)}  # env_name("triton_http_url")
    return set(ENV_VARIABLE.findall(text)) | built | settings_variables()


def linked_reports(page: Path) -> list[Path]:
    """The folders under bench/reports/ that the page links into."""
    folders = {(page.parent / target.partition("#")[0]).resolve().parent for target in relative_links(page)}
    return sorted(folder for folder in folders if folder.parent == REPORTS)


def settings_variables() -> set[str]:
    return {env for settings in (FacadeSettings, ServeSettings) for item in fields(settings) if (env := env_of(item))}


def page_id(page: Path) -> str:
    return str(page.relative_to(CHECKOUT))


def test_the_readme_fits_a_few_screens():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/ (at most {README_MAX_LINES})"


def test_the_readme_links_every_docs_page():
    linked = {(README.parent / target.split("#")[0]).resolve() for target in relative_links(README)}
    unlinked = [page_id(p) for p in CHECKOUT.glob("docs/*.md") if p.resolve() not in linked]
    assert not unlinked, f"docs pages the README's table does not link: {unlinked}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_relative_link_resolves_to_a_file_and_heading(page: Path):
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.is_relative_to(CHECKOUT) or not resolved.exists():
            broken.append(f"{target}: no such file in the checkout")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading '#{anchor}' in {page_id(resolved)}")
    assert not broken, f"{page_id(page)}: " + "; ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_repository_path_it_names_exists(page: Path):
    missing = []
    for path in sorted(filter(checked, repository_paths(page))):
        found = any(CHECKOUT.glob(path)) if "*" in path else (CHECKOUT / path).exists()
        if not found or (path.endswith("/") and not (CHECKOUT / path).is_dir()):
            missing.append(path)
    assert not missing, f"{page_id(page)} names paths the checkout does not have: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_file_a_table_row_names_under_its_folder_exists(page: Path):
    rows: dict[str, set[str]] = {}
    for folder, name in table_row_names(page):
        rows.setdefault(name, set()).add(folder)
    missing = sorted(
        f"{name} (under {' or '.join(sorted(folders))})"
        for name, folders in rows.items()
        if checked(name) and not any(any(CHECKOUT.glob(f"{f.rstrip('/')}/**/{name.rstrip('/')}")) for f in folders)
    )
    assert not missing, f"{page_id(page)} names files its table rows' folders do not have: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_module_and_make_target_it_names_exists(page: Path):
    missing = sorted(m for m in modules(page) if not is_module(m))
    missing += sorted(f"make {t}" for t in make_targets(page) - defined_make_targets())
    assert not missing, f"{page_id(page)} names modules or targets that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_environment_variable_it_names_is_read_by_the_code(page: Path):
    unknown = sorted(set(ENV_VARIABLE.findall(page.read_text())) - variables_the_code_reads())
    assert not unknown, f"{page_id(page)} names environment variables no process reads: {unknown}"


@pytest.mark.parametrize("command", ["tritonnx.commands.serve", "tritonnx.client.facade"])
def test_help_lists_every_settings_variable_with_its_flag(command: str):
    """docs/configuration.md sends readers to --help for the settings: it must name each flag's variable."""
    helped = subprocess.run([sys.executable, "-m", command, "--help"], capture_output=True, text=True, check=True)
    settings = ServeSettings if command.endswith("serve") else FacadeSettings
    text = " ".join(helped.stdout.split())
    missing = [
        f"{env} ({flag})"
        for item in fields(settings)
        if (env := env_of(item)) and ((flag := "--" + item.name.replace("_", "-")) not in text or env not in text)
    ]
    assert not missing, f"{command} --help does not name these variables and flags: {missing}"


def test_the_configuration_page_lists_every_variable_no_help_lists():
    page = CONFIGURATION.read_text()
    unlisted = {v for v in variables_the_code_reads() - settings_variables() if v.startswith("TRITONNX_")}
    missing = sorted(v for v in unlisted if f"`{v}`" not in page)
    assert not missing, f"docs/configuration.md does not list {missing}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_it_states_a_linked_reports_conclusion_without_copying_its_figures(page: Path):
    reports = "\n".join(path.read_text() for folder in linked_reports(page) for path in folder.glob("*.md"))
    # The speed sentence's figures are the latest rounds' medians, held to them by tests/unit/test_speed_claims.py.
    claimed = set(FIGURE.findall(speed_sentence(read_summaries(latest_rounds()))))
    copied = sorted({f for f in FIGURE.findall(prose(page.read_text())) if f in reports} - GOALS - claimed)
    assert not copied, f"{page_id(page)} repeats figures of the reports it links (state the conclusion): {copied}"


TEST_NAME = re.compile(r"^(tests/[\w/]+\.py)::(test_\w+)$")


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_test_it_names_exists(page: Path):
    """A parity row names the test that shows it: `tests/<file>.py::test_<name>`."""
    named = [TEST_NAME.match(span) for span in code_spans(page.read_text())]
    missing = [m.group(0) for m in named if m and f"def {m.group(2)}(" not in (CHECKOUT / m.group(1)).read_text()]
    assert not missing, f"{page_id(page)} names tests that do not exist: {missing}"


def test_the_checks_see_what_they_should():
    """The extraction itself: a slug, a path in a span, a source path in a block, a placeholder left alone."""
    assert slug("Tracing (OpenTelemetry)") == "tracing-opentelemetry"
    assert slug("The gRPC facade: `client/facade/`") == "the-grpc-facade-clientfacade"
    assert slug("Tuning a model's policy") == "tuning-a-models-policy"
    text = "see `backend/runner.py` and `python -m tritonnx.commands.serve`\n```\nmkdir model_repository/x\nbackend/triton_model.py\n```\n"
    assert not looks_like_a_file_path("deploy/tritonnx") and looks_like_a_file_path("deploy/k8s/overlays/dev")
    assert code_spans(text) == ["backend/runner.py", "python -m tritonnx.commands.serve"]
    assert [m.group(0) for b in code_blocks(text) for m in BLOCK_PATH.finditer(b)] == ["backend/triton_model.py"]
    assert not checked("model_repository/<model>/1/model.py") and not checked("bench/results/x/report.md")
    assert checked("bench/reports/2026-11-24-peers/report.md")
    assert not is_module("client.no_such_module") and is_module("tritonnx.commands.serve")
    assert {"TRITONNX_MAX_IN_FLIGHT", "TRITONNX_MODEL_REPOSITORY"} <= variables_the_code_reads()
    assert ENV_VARIABLE.findall("`TRITONNX_<SETTING>`, `TRITONNX_*`, `TRITONNX_TRITON_URL`") == ["TRITONNX_TRITON_URL"]
    assert "TRITONNX_SUPERVISOR_METRICS_PORT" in variables_the_code_reads()  # a ServeSettings field's
    figures = "p99 2.9-3.3 s, 0.82x of it, +1.7%, 77-80% refused; 64 MiB, 3x overload, 640 x 480, v1.2 s"
    assert FIGURE.findall(figures) == ["2.9-3.3 s", "0.82x", "1.7%", "77-80%"]
    assert REPORTS / "2026-11-24-cache" in linked_reports(CHECKOUT / "docs" / "facade.md")


def test_the_readmes_address_table_says_the_ports_of_backend_server_ports():
    from tritonnx.common import ports

    table = {line.split("|")[1].strip(): line.split("|")[2] for line in README.read_text().splitlines()
             if line.startswith("| ") and "127.0.0.1:" in line}  # fmt: skip
    said = {row: re.findall(r"127\.0\.0\.1:(\d+)", addresses) for row, addresses in table.items()}
    assert said == {
        "Triton HTTP, gRPC (KServe v2), metrics": [
            str(p) for p in (ports.TRITON_HTTP, ports.TRITON_GRPC, ports.TRITON_METRICS)
        ],
        "facade gRPC (`inference.InferenceService`, `grpc.health.v1`, reflection)": [str(ports.FACADE_GRPC)],
        "facade HTTP": [str(ports.FACADE_HTTP)] * 2,
        "supervisor metrics": [str(ports.SUPERVISOR_METRICS)],
    }


# The user pages speak to a user: measurement history goes to a report (figures measured once: bench/reports/2026-11-26-design-notes).
LAB_NOTEBOOK = re.compile(
    r"this\s+machine|these\s+machines|this\s+CPU|\b2\s+(?:shared\s+)?cores\b|\bissue\s+\d+|(?:live|kept)\s+here\s+only",
    re.I,
)
MAX_CELL_CHARS = 300


@pytest.mark.parametrize("page", [README, *sorted(CHECKOUT.glob("docs/*.md"))], ids=page_id)
def test_it_speaks_to_a_user_not_of_the_test_host_or_an_issue(page: Path):
    found = sorted({match.group(0) for match in LAB_NOTEBOOK.finditer(page.read_text())})
    assert not found, f"{page_id(page)} reads as a lab notebook ({found}): state the conclusion, link the report"


def test_the_lab_notebook_check_sees_across_a_line_break():
    assert LAB_NOTEBOOK.search("measured on\nthis machine") and LAB_NOTEBOOK.search("on 2\n  cores")


@pytest.mark.parametrize("page", [README, *sorted(CHECKOUT.glob("docs/*.md"))], ids=page_id)
def test_no_table_cell_is_a_paragraph(page: Path):
    cells = [cell.strip() for line in prose(page.read_text()).splitlines() if line.startswith("|")
             for cell in line.strip().strip("|").split(" | ")]  # fmt: skip
    long = [f"{cell[:60]}... ({len(cell)} characters)" for cell in cells if len(cell) > MAX_CELL_CHARS]
    assert not long, f"{page_id(page)}: a table cell over {MAX_CELL_CHARS} characters belongs in prose: {long}"
