"""The test-only Cython probe parsers (tests/probe/probe_parser.pyx), compiled against
proxy/_framing.pxd: once per checkout and source, into the venv (.venv/frametap-probe/<key>,
the key a hash of the sources, Cython and Python), shared by every test process under a
file lock. Compiling took ~6 s, once in every pytest-xdist worker of make test-fast."""

import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
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
    out = _compiled()
    sys.path.insert(0, str(out))
    try:
        import probe_parser
    finally:
        sys.path.remove(str(out))
    return probe_parser


def _key():
    import Cython
    h = hashlib.sha256()
    h.update(("%s %s %s" % (sys.version, Cython.__version__, sys.executable)).encode())
    sources = [HERE / "probe" / "probe_parser.pyx"] + sorted(HERE.parent.glob("proxy/**/*.pxd"))
    for path in sources:
        h.update(str(path.relative_to(HERE.parent)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _compiled():
    """The directory holding probe_parser's extension for these sources, built when missing
    (in a temporary directory, renamed into place: a crashed build leaves nothing behind)."""
    cache = Path(sys.prefix) / "frametap-probe"
    if not os.access(sys.prefix, os.W_OK):
        cache = Path(tempfile.gettempdir()) / ("frametap-probe-%d" % os.getuid())
    cache.mkdir(parents=True, exist_ok=True)
    out = cache / _key()
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)          # one build at a time; the others wait
        if out.is_dir():
            return out
        work = Path(tempfile.mkdtemp(prefix="build-", dir=cache))
        try:
            shutil.copy(HERE / "probe" / "probe_parser.pyx", work / "probe_parser.pyx")
            script = ("from setuptools import setup, Extension; "
                      "from Cython.Build import cythonize; "
                      "setup(script_args=['build_ext', '--inplace', '-q'], ext_modules=cythonize("
                      "[Extension('probe_parser', ['probe_parser.pyx'])], include_path=[%r], "
                      "quiet=True))" % str(HERE.parent))
            res = subprocess.run([sys.executable, "-c", script], cwd=work, capture_output=True,
                                 text=True)
            assert res.returncode == 0, res.stderr[-3000:]
            os.rename(work, out)
            for old in cache.iterdir():           # builds of other sources, a day old
                if old.is_dir() and old != out and time.time() - old.stat().st_mtime > 86400:
                    shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return out
