"""Shared fixtures: both parser implementations, the loop-error check, a loop in a thread,
and the rules that mark tests: the pure-Python tier (``twins``) and the tests that start
a real service (``slow``).

The helpers themselves live in tests/_support/ (see its docstring for the one way to
start a proxy, a server, a Locust run or Prometheus).
"""

import asyncio
import gc
import threading
import types

import pytest

from proxy import framing_py
from tests._support import loopcheck
from tests.parsers import TRACER_ERRORS, impl_fixture

flymq_impl, IMPLS = impl_fixture("flymq")   # (RouteStats, FlyMQParser), compiled and twin


class LoopThread:
    """An event loop (uvloop) running in a background thread, for sync tests; errors it
    reports to its exception handler fail the test (tests/_support/loopcheck.py)."""

    def __init__(self):
        import uvloop
        self.loop = loopcheck.install(uvloop.new_event_loop())
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout=30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn, *args):
        async def _call():
            return fn(*args)
        return self.run(_call())

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def loop_thread():
    lt = LoopThread()
    yield lt
    lt.stop()


# --------------------------------------------------------------------- loop errors

def pytest_configure(config):
    loopcheck.watch_asyncio_log()


@pytest.fixture(autouse=True)
def loop_errors(request):
    """Fails the test when an event loop reported an error it did not declare with
    ``@pytest.mark.loop_errors(pattern, ...)`` or ``loop_errors.expect(pattern)``."""
    allowed = [p for m in request.node.iter_markers("loop_errors") for p in m.args]
    errors = loopcheck.begin(allowed)
    del TRACER_ERRORS[:]
    yield errors
    if TRACER_ERRORS:     # the parsers swallow what a tracer raises (tests/parsers.py)
        raised, TRACER_ERRORS[:] = list(TRACER_ERRORS), []
        pytest.fail("a parser tracer raised (the parser swallowed it):\n  "
                    + "\n  ".join(raised), pytrace=False)
    if errors.hooked:
        gc.collect()      # a future nobody awaited reports its exception when collected
    unexpected = errors.unexpected()
    if unexpected:
        pytest.fail("the event loop reported errors this test did not expect "
                    "(declare them with @pytest.mark.loop_errors(pattern)):\n  "
                    + "\n  ".join(unexpected), pytrace=False)


# --------------------------------------------------------------------- test tiers

#: Modules in the pure-Python tier besides those found by :func:`tests_parser_twins`
#: (.ci/run runs ``FRAMETAP_NO_EXTENSIONS=1 pytest -m twins``).
TWINS_MODULES = {"test_cli_config"}


def tests_parser_twins(module):
    """True when ``module`` tests the parsers through their twins: it imports the
    pure-Python core (``proxy.framing_py``) or a helper that parametrizes over both
    implementations (tests/parsers.py, tests/test_conformance.py), or marks itself
    ``pytestmark = pytest.mark.twins`` (a test using the ``flymq_impl`` fixture is in
    too). A new parser test file is in the tier as soon as
    it uses those helpers; nothing lists it by hand."""
    for value in vars(module).values():
        if value is framing_py:
            return True
        if isinstance(value, (types.FunctionType, type)) and getattr(
                value, "__module__", "") in ("tests.parsers", "tests.test_conformance"):
            return True
        if isinstance(value, types.ModuleType) and value.__name__ in (
                "tests.parsers", "tests.test_conformance"):
            return True
    return module.__name__.rpartition(".")[2] in TWINS_MODULES


#: Fixtures that start a real service (a Spark session or any other JVM, a RabbitMQ node,
#: Prometheus): a test using one, even indirectly, is ``slow`` (``make test-fast`` leaves
#: it out).
SLOW_FIXTURES = {"spark", "java", "rabbitmq_node", "prometheus"}


@pytest.fixture(scope="session")
def java():
    """A Java runtime for a test that starts Spark itself (``frametap analyze`` as a
    process, a session of its own): such a test is slow, as one using ``spark``."""
    from tests.test_analyze import require_java
    require_java()


def pytest_collection_modifyitems(config, items):
    verdicts = {}
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        module = getattr(item, "module", None)
        if module is None or module.__name__ == __name__:
            continue
        if module not in verdicts:
            verdicts[module] = tests_parser_twins(module)
        if verdicts[module] or "flymq_impl" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.twins)

