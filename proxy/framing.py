"""The framing core, compiled unless FRAMETAP_NO_EXTENSIONS=1 selects the pure-Python twin.

A missing compiled module is an error, not a silent fallback: a proxy that quietly
runs 20x slower would ruin every load test it sits in.
"""

import os

NO_EXTENSIONS = bool(os.environ.get("FRAMETAP_NO_EXTENSIONS"))

if NO_EXTENSIONS:
    from proxy.framing_py import RouteStats, FrameParser, FrameLogBuffer, now_ns  # noqa: F401
    from proxy.framing_py import (set_pending_budget, pending_bytes,  # noqa: F401
                                  pending_budget)
else:
    try:
        from proxy._framing import (RouteStats, FrameParser, FrameLogBuffer,  # noqa: F401
                                     now_ns, set_pending_budget, pending_bytes,
                                     pending_budget)
    except ImportError as exc:  # pragma: no cover - build problem
        raise ImportError(
            "frametap's compiled extensions are missing (%s); build them with "
            "`pip install .` or `python setup.py build_ext --inplace`, or set "
            "FRAMETAP_NO_EXTENSIONS=1 for the pure-Python parsers" % exc) from exc

HAVE_EXTENSIONS = not NO_EXTENSIONS

__all__ = ["RouteStats", "FrameParser", "FrameLogBuffer", "now_ns", "NO_EXTENSIONS",
           "HAVE_EXTENSIONS", "set_pending_budget", "pending_bytes", "pending_budget"]
