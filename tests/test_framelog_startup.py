"""The proxy refuses an unusable frame-log directory at start-up (issue 20): one line
naming the flag or key, exit 2, nothing bound - as ``frametap load`` does for
``--frametap-framelog``.  A missing directory is created (docs/design.md, "Frame log")."""

import os
import subprocess
import sys

import pytest
from tests._support.processes import ROOT, frametap_env


def frametap(*args, cwd=None):
    env = frametap_env()
    return subprocess.run([sys.executable, "-m", "proxy", *args], cwd=cwd or ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def single(directory):
    return ["proxy", "--protocol", "flymq", "--listen", "127.0.0.1:0",
            "--upstream", "127.0.0.1:1", "--framelog", str(directory)]


def assert_one_line(proc, *words):
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_a_file_is_refused(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert_one_line(frametap(*single(blocker)), "--framelog", str(blocker),
                    "not a directory")
    assert_one_line(frametap(*single(blocker / "sub")), "--framelog", "not a directory")


def test_config_key_is_named(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cfg = tmp_path / "f.toml"
    cfg.write_text(f'[framelog]\ndir = "{blocker}"\n[[routes]]\nprotocol = "flymq"\n'
                   f'listen = "127.0.0.1:0"\nupstream = "127.0.0.1:1"\n')
    assert_one_line(frametap("proxy", "-c", str(cfg)), "framelog.dir", str(blocker))
    # --framelog overriding the file's dir is named as the flag
    assert_one_line(frametap("proxy", "-c", str(cfg), "--framelog", str(blocker)),
                    "--framelog", str(blocker))


def test_an_unwritable_directory_is_refused(tmp_path):
    target = tmp_path / "ro"
    target.mkdir()
    if os.geteuid() != 0:
        target.chmod(0o555)
        try:
            assert_one_line(frametap(*single(target)), "--framelog", "cannot write")
        finally:
            target.chmod(0o755)
        return
    # root ignores permissions: a read-only file system refuses root too
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs",
                            str(target)], capture_output=True, text=True)
    if mount.returncode != 0:
        if os.environ.get("FRAMETAP_CI"):
            pytest.fail("cannot mount a read-only tmpfs: " + mount.stderr.strip())
        pytest.skip("cannot mount a read-only tmpfs: " + mount.stderr.strip())
    try:
        assert_one_line(frametap(*single(target)), "--framelog", str(target),
                        "cannot write files there", "Read-only file system")
    finally:
        subprocess.run(["umount", str(target)], check=False)


def test_unusable_directory_reasons(tmp_path):
    from proxy.framelog import unusable_directory
    assert unusable_directory(str(tmp_path / "new" / "deeper")) is None   # created
    assert os.path.isdir(tmp_path / "new" / "deeper")
    assert os.listdir(tmp_path / "new" / "deeper") == []                # probe removed
    (tmp_path / "f").write_text("x")
    assert unusable_directory(str(tmp_path / "f")) == "not a directory"
