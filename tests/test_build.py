"""The build really produced the compiled parsers (no silent pure-Python fallback), for
every protocol package found in proxy/protocols/, and setup.py builds every .pyx."""

import os
import runpy
import subprocess
import sys
import types
from unittest import mock

import pytest

import proxy.framing
from proxy import protocols
from tests._support.processes import ROOT

SPECS = protocols.specs()
compiled_only = pytest.mark.skipif(
    bool(os.environ.get("FRAMETAP_NO_EXTENSIONS")),
    reason="FRAMETAP_NO_EXTENSIONS=1 selects the pure-Python twin on purpose")


@compiled_only
def test_compiled_core_is_selected():
    assert proxy.framing.HAVE_EXTENSIONS
    assert proxy.framing.RouteStats.__module__ == "proxy._framing"
    assert proxy.framing.RouteStats.__init__.__class__.__name__ != "function"


@compiled_only
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_compiled_parser_is_selected(spec):
    cls = spec.load_parser()
    assert cls.__module__ == spec.extension
    assert not sys.modules[cls.__module__].__file__.endswith((".py", ".pyc"))
    # the old module attributes still work, lazily
    package = sys.modules[spec.package]
    assert package.Parser is cls and getattr(package, spec.parser_class) is cls


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_twin_selected_by_environment(spec):
    code = (f"import proxy.framing, proxy.protocols as p; s = p.load({spec.name!r}); "
            "print(proxy.framing.RouteStats.__module__, s.load_parser().__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "FRAMETAP_NO_EXTENSIONS": "1"}, check=True)
    assert out.stdout.split() == ["proxy.framing_py", spec.twin]


def test_every_package_has_its_role_files():
    """Same file names for the same role in every protocol folder."""
    for spec in SPECS:
        folder = ROOT.joinpath(*spec.package.split("."))
        for name in ("__init__.py", "_parser.pyx", "parser_py.py", "codec.py", "samples.py"):
            assert (folder / name).is_file(), f"{spec.name}: {folder / name} missing"
        assert spec.codec == spec.package + ".codec"
        assert spec.samples == spec.package + ".samples"


def test_setup_builds_every_pyx():
    """setup.py finds its extensions by glob: each protocol's _parser.pyx and the core."""
    captured = {}
    # stand-ins: Cython and setuptools live in pip's isolated build environment only
    fake_setuptools = types.SimpleNamespace(
        Extension=lambda name, sources: types.SimpleNamespace(name=name, sources=sources),
        setup=lambda **kw: captured.update(kw))
    fake_build = types.SimpleNamespace(cythonize=lambda exts, **kw: exts)
    with mock.patch.dict(sys.modules, {"setuptools": fake_setuptools, "Cython": types.ModuleType(
            "Cython"), "Cython.Build": fake_build}):
        runpy.run_path(str(ROOT / "setup.py"))
    names = {ext.name for ext in captured["ext_modules"]}
    assert names == set(protocols.extension_modules())
    assert "proxy._framing" in names
    assert {spec.extension for spec in SPECS} <= names
    for ext in captured["ext_modules"]:
        assert (ROOT / ext.sources[0]).is_file()


@compiled_only
def test_build_check_imports_every_extension():
    r = subprocess.run([sys.executable, "-m", "proxy.protocols", "--check-build"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for module in protocols.extension_modules():
        assert module in r.stdout
