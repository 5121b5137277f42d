"""scripts/install_llama_cpp.sh: its symlink step (scripts/llama_cpp_symlinks.py) on fake `_symlinks.json`
manifests, and the script itself when the server is already built or cannot be built."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parents[2] / "scripts"
spec = importlib.util.spec_from_file_location("llama_cpp_symlinks", SCRIPTS / "llama_cpp_symlinks.py")
assert spec and spec.loader
symlinks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(symlinks)


def wheel_bin(tmp_path: Path, links: dict) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "llama-server").write_text("")
    (bin_dir / "libggml.so.0.9.4").write_text("the library")
    (bin_dir / "_symlinks.json").write_text(json.dumps(links))
    return bin_dir


def test_chained_links_are_made_in_any_order_and_a_second_run_changes_nothing(tmp_path):
    bin_dir = wheel_bin(tmp_path, {"libggml.so": "libggml.so.0", "libggml.so.0": "libggml.so.0.9.4"})
    assert sorted(symlinks.create_symlinks(bin_dir)) == ["libggml.so", "libggml.so.0"]
    assert os.readlink(bin_dir / "libggml.so") == "libggml.so.0"  # relative: the bin dir can move
    assert (bin_dir / "libggml.so").read_text() == "the library"
    assert symlinks.create_symlinks(bin_dir) == []


def test_a_stale_file_or_wrong_link_is_replaced(tmp_path):
    bin_dir = wheel_bin(tmp_path, {"libggml.so.0": "libggml.so.0.9.4", "libggml.so": "libggml.so.0"})
    (bin_dir / "libggml.so.0").write_text("a copy, not a link")
    (bin_dir / "libggml.so").symlink_to("elsewhere")
    assert sorted(symlinks.create_symlinks(bin_dir)) == ["libggml.so", "libggml.so.0"]
    assert os.readlink(bin_dir / "libggml.so.0") == "libggml.so.0.9.4"


def test_no_manifest_means_nothing_to_do(tmp_path):
    assert symlinks.create_symlinks(tmp_path) == []


@pytest.mark.parametrize("links", [{"libx.so": "../outside"}, {"../libx.so": "libggml.so.0.9.4"}, {"libx.so": "/abs"}])
def test_a_link_leaving_the_bin_dir_is_refused(tmp_path, links):
    bin_dir = wheel_bin(tmp_path, links)
    with pytest.raises(symlinks.SymlinkError, match="plain file name"):
        symlinks.create_symlinks(bin_dir)
    assert not (tmp_path / "outside").exists()


def test_a_link_to_a_missing_library_is_an_error_and_the_cli_exits_non_zero(tmp_path):
    bin_dir = wheel_bin(tmp_path, {"libllama.so.0": "libllama.so.0.0.1"})
    with pytest.raises(symlinks.SymlinkError, match=r"libllama.so.0 -> libllama.so.0.0.1"):
        symlinks.create_symlinks(bin_dir)
    cli = [sys.executable, str(SCRIPTS / "llama_cpp_symlinks.py"), str(bin_dir)]
    done = subprocess.run(cli, capture_output=True, text=True)
    assert done.returncode == 1 and "do not exist" in done.stderr


def fake_server(cache: Path, version_rc: int) -> None:
    server = cache / "llama.cpp" / "llama-server"
    server.parent.mkdir(parents=True)
    server.write_text(f"#!/bin/sh\necho 'version: 1 (fake)'\nexit {version_rc}\n")
    server.chmod(0o755)


def install(cache: Path, **env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FLUIDPD_CACHE": str(cache), **env}
    return subprocess.run(["bash", str(SCRIPTS / "install_llama_cpp.sh")], capture_output=True, text=True, env=env)


def test_install_does_nothing_when_the_server_runs(tmp_path):
    fake_server(tmp_path, version_rc=0)
    done = install(tmp_path, PYTHON="/nonexistent/python")  # would fail if it tried to build
    assert done.returncode == 0, done.stderr
    assert f"already built: {tmp_path}/llama.cpp/llama-server" in done.stdout
    assert not (tmp_path / "llama.cpp" / "venv").exists()


def test_install_failing_early_says_why_and_exits_non_zero(tmp_path):
    fake_server(tmp_path, version_rc=1)  # built but broken: the script rebuilds, and here cannot
    done = install(tmp_path, PYTHON="/nonexistent/python")
    assert done.returncode != 0
    assert "install_llama_cpp: error: cannot create a venv with /nonexistent/python" in done.stderr
