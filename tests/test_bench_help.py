"""Every benchmark script answers --help with a usage text and exit 0 (and so imports
cleanly on a machine without valgrind, matplotlib or a C compiler)."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py"))


def test_the_bench_folder_has_scripts():
    assert "run_bench.py" in SCRIPTS and "callgrind_writer.py" in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_script_help(script):
    run = subprocess.run([sys.executable, str(BENCH / script), "--help"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "usage:" in run.stdout and "Traceback" not in run.stderr
