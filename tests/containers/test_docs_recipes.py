"""The docs' `<!-- test: containers -->` blocks, run against the images as a user runs them from the checkout.

A page's blocks run in order in one bash session, as pasted into one terminal (a python block through the venv's
interpreter, with the session's environment), from a scratch folder laid out as the checkout: `.venv` and
`deploy/` linked, the files the recipes name. The well-known ports become free ones: in the addresses a block
names, in what `docker run` passes the containers (an env file) and in Compose's variables. The containers get
names of their own, and they and the Compose project are removed after the page.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.docs_blocks import ADDRESS, CHECKOUT, PAGES, blocks, write_recipe_files
from tritonnx.server.process import free_ports

PAGES_WITH_CONTAINERS = [page for page in PAGES if any(block.marker == "containers" for block in blocks(page))]
NAMED = re.compile(r"(--name |container:)([\w-]+)")
REMOVED = re.compile(r"^(docker rm -f) ([\w -]+?)(\s*(?:#.*)?)$", re.MULTILINE)
PORTS = ("8000", "8001", "8002", "8003", "50051", "3000")
# The variables of the processes in the images (and of Compose's file) that move each well-known port.
PORT_VARIABLES = {
    "8000": "TRITONNX_TRITON_HTTP_PORT",
    "8001": "TRITONNX_TRITON_GRPC_PORT",
    "8002": "TRITONNX_TRITON_METRICS_PORT",
    "8003": "TRITONNX_SUPERVISOR_METRICS_PORT",
    "50051": "TRITONNX_PORT",
    "3000": "TRITONNX_HTTP_PORT",
}


def session_script(page: Path, ports: dict[str, str], env_file: Path, suffix: str) -> tuple[str, set[str]]:
    """The page's blocks as one bash script, on `ports`, its containers named with `suffix`; and those names."""
    names: set[str] = set()

    def rename(match: re.Match) -> str:
        names.add(f"{match.group(2)}-{suffix}")
        return f"{match.group(1)}{match.group(2)}-{suffix}"

    parts = ["set -euo pipefail"]
    for block in (b for b in blocks(page) if b.marker == "containers"):
        text = ADDRESS.sub(lambda m: f"127.0.0.1:{ports[m.group(1)]}", block.text)
        text = NAMED.sub(rename, text).replace("docker run ", f"docker run --env-file {env_file} ")
        text = REMOVED.sub(lambda m: f"{m.group(1)} {' '.join(f'{n}-{suffix}' for n in m.group(2).split())}", text)
        if block.kind == "python":
            text = f"{CHECKOUT}/.venv/bin/python - <<'__BLOCK__'\n{text}__BLOCK__\n"
        parts.append(f"# {block.id}\n{text}")
    return "\n".join(parts), names


@pytest.mark.parametrize("page", PAGES_WITH_CONTAINERS, ids=lambda page: str(page.relative_to(CHECKOUT)))
def test_a_pages_container_recipes_run_as_written(images, page: Path, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".venv").symlink_to(CHECKOUT / ".venv")
    (home / "deploy").symlink_to(CHECKOUT / "deploy")
    write_recipe_files(home)
    ports = dict(zip(PORTS, map(str, free_ports(len(PORTS))), strict=True))
    moved = {PORT_VARIABLES[port]: value for port, value in ports.items()}
    moved["TRITONNX_TRITON_URL"] = f"127.0.0.1:{ports['8001']}"
    env_file = tmp_path / "ports.env"
    env_file.write_text("".join(f"{name}={value}\n" for name, value in moved.items()))
    suffix = uuid.uuid4().hex[:8]
    script, names = session_script(page, ports, env_file, suffix)
    variables = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TRITONNX_")},
        **moved,
        "COMPOSE_PROJECT_NAME": f"tnx{suffix}",
        "TRITONNX_BUILD_DIR": str(tmp_path / "build"),  # empty: no admin key file to fall back on
    }
    try:
        done = subprocess.run(["bash", "-c", script], cwd=home, env=variables, capture_output=True, text=True,
                              timeout=1500, check=False)  # fmt: skip
        if done.returncode != 0:
            logs = "".join(f"--- docker logs {name}\n{container_log(name)[-2000:]}\n" for name in sorted(names))
            pytest.fail(f"{script}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}\n{logs}")
    finally:
        subprocess.run(["docker", "rm", "-f", *sorted(names)], capture_output=True, check=False)
        down = ["docker-compose", "-f", "deploy/compose.yaml", "-f", "deploy/compose.own.yaml", "down", "-t", "30"]
        leftover = {**variables, "TRITONNX_MODEL_REPOSITORY": str(home), "TRITONNX_ADMIN_KEY": "-"}
        subprocess.run(down, cwd=home, env=leftover, capture_output=True, timeout=120, check=False)


def container_log(name: str) -> str:
    done = subprocess.run(["docker", "logs", name], capture_output=True, text=True, check=False)
    return done.stdout + done.stderr
