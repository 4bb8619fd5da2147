"""Every frame-log row is written or counted as dropped, under every disk fault, on the
proxy's side and on the Locust side (issue 20; docs/design.md, "Frame log"):

    records + dropped == rows produced

for a directory deleted while a file is open (noticed within one flush, not at
rotation), made read-only (a file that cannot be renamed or removed: its rows are
counted, the temporary file removed once it can be), a full disk (a 1 MiB tmpfs), and
exceptions in the writer (the encoder, the conversion of a batch, the writer loop).
Each case runs tests/framelog_faults_child.py in a process of its own: the client side
under gevent's monkey-patching as Locust runs it, the read-only case as uid 65534 (root
ignores permissions), the full disk on a tmpfs this test mounts (root only: skipped
elsewhere, except in CI, FRAMETAP_CI=1, where it must run).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from tests._support.processes import ROOT, frametap_env

CHILD = os.path.join(ROOT, "tests", "framelog_faults_child.py")
IS_ROOT = os.geteuid() == 0

CASES = [(side, fault, fmt) for side in ("proxy", "client")
         for fault in ("deleted", "readonly", "full", "exception")
         for fmt in ("parquet", "jsonl")]


def run_child(side, fault, directory, fmt, as_nobody=False):
    env = frametap_env()
    cmd = [sys.executable, CHILD, side, fault, str(directory), fmt]
    if as_nobody:
        cmd.append("--as-nobody")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.fixture
def fault_dir():
    """(base, logs): the directory the child writes into, reachable by uid 65534."""
    base = tempfile.mkdtemp(prefix="frametap-faults-")
    os.chmod(base, 0o755)
    logs = os.path.join(base, "logs")
    os.mkdir(logs)
    yield base, logs
    shutil.rmtree(base, ignore_errors=True)


def _prepare(fault, logs):
    """(extra child options, cleanup) for the fault, or pytest.skip."""
    if fault == "readonly":
        if IS_ROOT:
            os.chown(logs, 65534, 65534)
            return {"as_nobody": True}, None
        return {}, None
    if fault == "full":
        if not IS_ROOT:
            if os.environ.get("FRAMETAP_CI"):
                pytest.fail("the disk-full case needs root to mount a tmpfs, and CI "
                            "(FRAMETAP_CI) must run it")
            pytest.skip("the disk-full case mounts a 1 MiB tmpfs: needs root")
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", logs],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            if os.environ.get("FRAMETAP_CI"):
                pytest.fail("cannot mount a tmpfs: " + proc.stderr.strip())
            pytest.skip("cannot mount a tmpfs here: " + proc.stderr.strip())
        return {}, lambda: subprocess.run(["umount", "-l", logs], check=False)
    return {}, None


@pytest.mark.parametrize("side,fault,fmt", CASES,
                         ids=["-".join(c) for c in CASES])
def test_every_row_is_written_or_counted(side, fault, fmt, fault_dir):
    base, logs = fault_dir
    options, cleanup = _prepare(fault, logs)
    try:
        result, stderr = run_child(side, fault, logs, fmt, **options)
    finally:
        if cleanup is not None:
            cleanup()
    produced, records, dropped = result["produced"], result["records"], result["dropped"]
    print(side, fault, fmt, json.dumps(result))
    # the invariant: nothing vanished without a count
    assert records + dropped == produced, result
    # the counts are the files' rows, and nothing half-written is left behind
    assert result["disk_rows"] == records, result
    assert result["leftover"] == [], result
    assert result["write_errors"] >= 1 and dropped > 0, result
    assert records > 0, result                # the writer recovered and went on
    seen = result["seen"]
    phase = seen["phase1"]["produced"]        # rows produced per phase
    if fault == "deleted":
        # noticed within one flush: the open file's rows are counted at once
        assert seen["after_one_flush"]["write_errors"] == 1, seen
        assert seen["after_one_flush"]["dropped"] == phase, seen
        assert dropped == phase and records == 2 * phase, result
    elif fault == "readonly":
        assert seen["rename_failed"]["dropped"] == 2 * phase, seen
        assert seen["stale_tmp"], seen       # the unfinished file could not be removed ...
        assert seen["open_failed"]["dropped"] == 3 * phase, seen
        assert seen["tmp_after_recovery"] == [], seen   # ... and is, once it can be
        assert records == phase, result
    elif fault == "full":
        assert seen["while_full"]["write_errors"] >= 1, seen
        assert records == phase, result      # the rows written once space is back
    elif fault == "exception":
        assert seen["encoder_failed"]["dropped"] == 2 * phase, seen
        assert seen["conversion_failed"]["dropped"] == 3 * phase, seen
        assert seen["thread_alive_after_failure"] is True, seen
        assert records == 2 * phase, result
    if fault != "full":
        assert "Traceback" not in stderr, stderr[-3000:]
