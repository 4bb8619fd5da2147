"""The test-only Cython probe parsers (tests/probe/probe_parser.pyx), compiled against
proxy/_framing.pxd once per test session in a temporary directory."""

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@functools.lru_cache(maxsize=None)
def probe_module():
    """The compiled probe_parser module (skips under FRAMETAP_NO_EXTENSIONS=1)."""
    if os.environ.get("FRAMETAP_NO_EXTENSIONS"):
        pytest.skip("FRAMETAP_NO_EXTENSIONS=1: the twin probe covers this run")
    try:
        import Cython.Build  # noqa: F401
    except ImportError:
        pytest.fail("Cython is a test dependency (pip install -e '.[test]')")
    out = Path(tempfile.mkdtemp(prefix="frametap-probe-"))
    shutil.copy(HERE / "probe" / "probe_parser.pyx", out / "probe_parser.pyx")
    script = ("from setuptools import setup, Extension; from Cython.Build import cythonize; "
              "setup(script_args=['build_ext', '--inplace', '-q'], ext_modules=cythonize("
              "[Extension('probe_parser', ['probe_parser.pyx'])], include_path=[%r], quiet=True))"
              % str(HERE.parent))
    res = subprocess.run([sys.executable, "-c", script], cwd=out, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    sys.path.insert(0, str(out))
    try:
        import probe_parser
    finally:
        sys.path.remove(str(out))
    return probe_parser
