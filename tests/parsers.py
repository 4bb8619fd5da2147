"""Both implementations of a protocol's parser, for the per-protocol parser tests."""

import os

import pytest

from proxy import framing_py, protocols

NO_EXTENSIONS = bool(os.environ.get("FRAMETAP_NO_EXTENSIONS"))


def parser_impls(protocol):
    """{"py-parser": (RouteStats, Parser), "c-parser": ...} (compiled when built)."""
    spec = protocols.load(protocol)
    impls = {"py-parser": (framing_py.RouteStats, spec.load_parser(pure_python=True))}
    if not NO_EXTENSIONS:
        from proxy import _framing
        impls["c-parser"] = (_framing.RouteStats, spec.load_parser(pure_python=False))
    return impls


def impl_fixture(protocol):
    """A fixture parametrized over both implementations, and the implementations."""
    impls = parser_impls(protocol)

    @pytest.fixture(params=sorted(impls))
    def impl(request):
        return impls[request.param]
    return impl, impls


def make(impl, protocol, route="route", **kw):
    """(stats, parser) of one implementation on a fresh route."""
    RouteStats, Parser = impl
    stats = RouteStats(route, protocol)
    return stats, Parser(stats, **kw)


#: Exceptions raised inside tracers made by :func:`checked_tracer` (the conftest fixture
#: ``loop_errors`` fails the test when any are left here).
TRACER_ERRORS = []


def checked_tracer(fn):
    """``fn`` as a parser ``tracer`` whose exceptions still fail the test.

    Both twins re-raise what a tracer raised when feed()/expire()/close() returns; the
    wrapper also keeps it for the test's teardown, so a test that catches the exception
    (or a caller that swallows it) still fails."""
    def tracer(row):
        try:
            return fn(row)
        except BaseException as exc:
            TRACER_ERRORS.append(f"{type(exc).__name__}: {exc} (row {row!r})"[:500])
            raise
    return tracer
