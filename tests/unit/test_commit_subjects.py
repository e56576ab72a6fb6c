"""Commit subjects of at most 72 characters: the commit-msg hook and the history check of `make lint`."""

import subprocess
import sys
from pathlib import Path

HOOK = Path(__file__).resolve().parents[2] / ".githooks" / "commit-msg"


def run_hook(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(HOOK), *args], capture_output=True, text=True, cwd=cwd)


def test_the_hook_takes_a_subject_of_72_characters_and_refuses_73(tmp_path):
    message = tmp_path / "COMMIT_EDITMSG"
    body = "\nWhy, at any length: " + "x" * 200 + "\n# Please enter the commit message ... " + "y" * 100 + "\n"
    message.write_text("\n" + "s" * 72 + "\n" + body)
    assert run_hook(str(message)).returncode == 0
    message.write_text("é" * 73 + "\n" + body)  # characters, not bytes
    refused = run_hook(str(message))
    assert refused.returncode == 1
    assert "73 characters, at most 72" in refused.stderr


def test_comment_lines_before_the_subject_are_not_the_subject(tmp_path):
    message = tmp_path / "COMMIT_EDITMSG"
    message.write_text("# " + "c" * 100 + "\nShort subject\n")
    assert run_hook(str(message)).returncode == 0


def test_the_history_check_names_each_long_subject_after_the_anchor(tmp_path):
    def git(*args: str) -> str:
        identity = ["-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "core.hooksPath=/dev/null"]
        return subprocess.run(
            ["git", *identity, *args], cwd=tmp_path, capture_output=True, text=True, check=True
        ).stdout

    git("init", "-q")
    git("commit", "-q", "--allow-empty", "-m", "Before the rule: " + "a" * 100)
    anchor = git("rev-parse", "HEAD").strip()
    git("commit", "-q", "--allow-empty", "-m", "A short subject")
    assert run_hook("--history", anchor, cwd=tmp_path).returncode == 0
    git("commit", "-q", "--allow-empty", "-m", "After the rule: " + "b" * 100)
    refused = run_hook("--history", anchor, cwd=tmp_path)
    assert refused.returncode == 1
    assert "After the rule" in refused.stderr and "Before the rule" not in refused.stderr
    missing = run_hook("--history", "0" * 40, cwd=tmp_path)
    assert missing.returncode == 1 and "not in this clone" in missing.stderr


def test_this_checkouts_history_passes_from_the_anchor():
    checked = run_hook("--history", cwd=HOOK.parents[1])
    assert checked.returncode == 0, checked.stderr
