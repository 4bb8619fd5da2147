"""A test fails when an event loop reported an error the test did not expect.

asyncio and uvloop hand what they cannot raise anywhere — an exception in a callback or a
protocol method, a task destroyed while pending, a future whose exception nobody
retrieved — to ``loop.call_exception_handler``, whose default only logs it; a test that
checks an end state can then pass while the loop was failing underneath. As uvloop's own
test base does, every loop the tests run in-process gets an exception handler that
collects those contexts (:func:`install`: tests/support.py ``run()``, ``LoopThread``),
and the conftest fixture ``loop_errors`` fails the test at teardown when any were
collected. Loops the tests do not create themselves (a reference server's thread, an
``asyncio.run`` in a test) still go through the default handler, which logs on the
``asyncio`` logger at ERROR: a logging handler collects those too.

A test that provokes such an error on purpose says which, by a regular expression
matched against the context's message and exception::

    @pytest.mark.loop_errors(r"ConnectionResetError")
    def test_...

or at run time: ``loop_errors.expect(r"...")`` (the fixture).
"""

import logging
import re
import sys
import threading

__all__ = ["LoopErrors", "install", "begin", "current", "describe"]

_local = threading.local()        # .in_handler: our handler is logging the context itself

#: Reports that are the interpreter's noise, not the code's: on Python < 3.12 the done
#: callback of a ``start_server`` handler task raises CancelledError when the handler was
#: cancelled (loop shutdown), which only logs noise (python/cpython gh-113538, fixed in
#: 3.12 by closing the transport quietly).
KNOWN_NOISE = [re.compile(r"StreamReaderProtocol\.connection_made\.<locals>\.callback.*"
                          r"\| CancelledError")] if sys.version_info < (3, 12) else []


def describe(context):
    """One line for a loop error context: its message and its exception."""
    message = context.get("message") or ""
    exc = context.get("exception")
    parts = [message]
    if exc is not None:
        parts.append(f"{type(exc).__name__}: {exc}")
    for key in ("task", "future", "handle", "protocol", "transport"):
        if key in context:
            parts.append(f"{key}={context[key]!r}"[:300])
            break
    return " | ".join(p for p in parts if p)


class LoopErrors:
    """The loop errors of one test: ``errors`` (descriptions), ``allowed`` (patterns)."""

    def __init__(self, allowed=()):
        self.errors = []
        self.allowed = [re.compile(p) for p in allowed]
        self.hooked = 0               # loops given our handler during the test

    def expect(self, *patterns):
        """Declare loop errors matching any of ``patterns`` expected in this test."""
        self.allowed += [re.compile(p) for p in patterns]

    def unexpected(self):
        return [e for e in self.errors
                if not any(p.search(e) for p in self.allowed + KNOWN_NOISE)]


_current = LoopErrors()


def current():
    return _current


def begin(allowed=()):
    """A fresh collector for the test that starts now."""
    global _current
    _current = LoopErrors(allowed)
    return _current


def _handler(loop, context):
    _current.errors.append(describe(context))
    _local.in_handler = True
    try:
        loop.default_exception_handler(context)      # still logged, as without us
    finally:
        _local.in_handler = False


def install(loop):
    """Give ``loop`` the collecting exception handler; returns the loop."""
    loop.set_exception_handler(_handler)
    _current.hooked += 1
    return loop


class _AsyncioLogWatcher(logging.Handler):
    """ERROR records of the ``asyncio`` logger from loops without our handler."""

    def __init__(self):
        super().__init__(logging.ERROR)

    def emit(self, record):
        if getattr(_local, "in_handler", False):
            return                                   # already collected by _handler
        text = record.getMessage().splitlines()[0] if record.getMessage() else ""
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            text += f" | {type(exc).__name__}: {exc}"
        _current.errors.append(text)


_watcher = None


def watch_asyncio_log():
    """Attach the ``asyncio`` logger watcher (once per process)."""
    global _watcher
    if _watcher is None:
        _watcher = _AsyncioLogWatcher()
        logging.getLogger("asyncio").addHandler(_watcher)
