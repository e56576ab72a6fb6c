import os
import stat

from tritonnx.common import admin
from tritonnx.common.paths import Paths, checkout_root


def test_paths_default_to_the_checkout_and_follow_the_environment(monkeypatch, tmp_path):
    for name in ("TRITONNX_HOME", "TRITONNX_MODEL_REPOSITORY", "TRITONNX_BUILD_DIR"):
        monkeypatch.delenv(name, raising=False)
    root = checkout_root()
    assert root is not None and (root / "tritonnx" / "common" / "paths.py").is_file()
    assert Paths.from_environment() == Paths(root / "model_repository", root / "build")

    monkeypatch.setenv("TRITONNX_HOME", str(tmp_path))
    assert Paths.from_environment() == Paths(tmp_path / "model_repository", tmp_path / "build")
    monkeypatch.setenv("TRITONNX_MODEL_REPOSITORY", "/models")
    monkeypatch.setenv("TRITONNX_BUILD_DIR", str(tmp_path / "out"))
    paths = Paths.from_environment()
    assert paths.model_repository.as_posix() == "/models"
    assert paths.backends == tmp_path / "out" / "backends" and paths.admin_key_file == tmp_path / "out" / "admin-key"


def test_the_admin_key_is_shared_in_a_file_only_its_user_reads(monkeypatch, tmp_path):
    monkeypatch.delenv(admin.ADMIN_KEY_ENV, raising=False)
    paths = Paths(tmp_path / "models", tmp_path / "build")
    assert admin.known_admin_key(paths) == ""
    key = admin.new_admin_key()
    assert len(key) >= 24 and admin.new_admin_key() != key
    assert admin.share_admin_key(key, paths) == str(paths.admin_key_file)
    assert stat.S_IMODE(os.stat(paths.admin_key_file).st_mode) == 0o600
    assert admin.known_admin_key(paths) == key

    monkeypatch.setenv(admin.ADMIN_KEY_ENV, "from-the-environment")
    assert admin.new_admin_key() == admin.known_admin_key(paths) == "from-the-environment"
    assert admin.share_admin_key("from-the-environment", paths) == "$TRITONNX_ADMIN_KEY"
