"""Build the Cython extensions; everything else lives in pyproject.toml.

Every ``.pyx`` under ``proxy/`` is an extension named after its path (so a new
protocol's ``proxy/protocols/<pkg>/_parser.pyx`` needs no line here).
"""

from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup

ROOT = Path(__file__).resolve().parent


def find_extensions():
    """One Extension per proxy/**/*.pyx, e.g. proxy/protocols/flymq/_parser.pyx ->
    proxy.protocols.flymq._parser (sources relative to setup.py, as setuptools wants), and
    one per proxy/**/*_c.py with a .pxd beside it: a pure-Python source compiled with the
    C types its .pxd gives (e.g. ttheader/walk_c.py, a link to walk_py.py)."""
    sources = [p for p in (ROOT / "proxy").rglob("*.pyx")]
    sources += [p for p in (ROOT / "proxy").rglob("*_c.py") if p.with_suffix(".pxd").exists()]
    return [Extension(".".join(src.with_suffix("").parts), [src.as_posix()])
            for src in sorted(p.relative_to(ROOT) for p in sources)]


setup(
    ext_modules=cythonize(
        find_extensions(),
        compiler_directives={"language_level": "3", "embedsignature": True},
    ),
)
