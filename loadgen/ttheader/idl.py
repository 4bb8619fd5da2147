"""The service's IDL (``frametap_demo.thrift``), compiled to Python with Apache's
``thrift`` compiler (Debian ``thrift-compiler``) on first use and cached.

The generated modules are not shipped: ``load()`` runs ``thrift --gen py`` into a cache
directory keyed by the IDL's hash (``$FRAMETAP_THRIFT_CACHE``, default
``~/.cache/frametap/thrift``) and imports ``frametap_demo`` from there.
"""

import hashlib
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

IDL = Path(__file__).with_name("frametap_demo.thrift")


class IDLError(RuntimeError):
    """The IDL could not be compiled (no ``thrift`` compiler, or it failed)."""


def compiler():
    """Path of the ``thrift`` compiler, or None."""
    return shutil.which("thrift")


def cache_dir():
    base = os.environ.get("FRAMETAP_THRIFT_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "frametap", "thrift")
    digest = hashlib.sha256(IDL.read_bytes()).hexdigest()[:16]
    return Path(base) / digest


def generate():
    """Compile the IDL (once per IDL version); returns the directory on sys.path."""
    out = cache_dir()
    if (out / "frametap_demo" / "UserService.py").exists():
        return out
    thrift = compiler()
    if thrift is None:
        raise IDLError("the Apache Thrift compiler `thrift` is not installed "
                       "(Debian: apt-get install thrift-compiler)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".gen-", dir=out.parent))
    try:
        r = subprocess.run([thrift, "--gen", "py", "-out", str(tmp), str(IDL)],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise IDLError("thrift --gen py failed: %s" % (r.stderr.strip() or r.stdout))
        try:
            tmp.rename(out)
        except OSError:                      # another process won the race
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def load():
    """The generated package: ``frametap_demo`` (``.ttypes``, ``.UserService``,
    ``.LegacyUserService``)."""
    path = str(generate())
    if path not in sys.path:
        sys.path.insert(0, path)
    pkg = importlib.import_module("frametap_demo")
    for sub in ("ttypes", "UserService", "LegacyUserService"):
        importlib.import_module("frametap_demo." + sub)
    return pkg
