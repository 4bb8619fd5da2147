"""The build really produced the compiled parsers (no silent pure-Python fallback)."""

import os

import pytest

import proxy.framing


@pytest.mark.skipif(bool(os.environ.get("FRAMETAP_NO_EXTENSIONS")),
                    reason="FRAMETAP_NO_EXTENSIONS=1 selects the pure-Python twin on purpose")
def test_compiled_extensions_are_selected():
    from proxy.protocols.flymq import FlyMQParser
    assert proxy.framing.HAVE_EXTENSIONS
    assert proxy.framing.RouteStats.__module__ == "proxy._framing"
    assert FlyMQParser.__module__ == "proxy.protocols.flymq._parser"
    assert proxy.framing.RouteStats.__init__.__class__.__name__ != "function"


def test_twin_selected_by_environment(tmp_path):
    import subprocess
    import sys
    code = ("import proxy.framing, proxy.protocols.flymq as f;"
            "print(proxy.framing.RouteStats.__module__, f.FlyMQParser.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "FRAMETAP_NO_EXTENSIONS": "1"}, check=True)
    assert out.stdout.split() == ["proxy.framing_py", "proxy.protocols.flymq.parser_py"]
