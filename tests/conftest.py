"""Shared fixtures: both parser implementations, free ports, a running proxy."""

import asyncio
import socket
import threading

import pytest

from tests.parsers import impl_fixture

flymq_impl, IMPLS = impl_fixture("flymq")   # (RouteStats, FlyMQParser), compiled and twin


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def locust_processes_args(n=2):
    """``--processes n`` on a free master port: Locust's parent binds 5557 by default, and
    two such runs at once (tests in parallel, a load run beside them) would collide."""
    port = str(free_port())
    return ["--processes", str(n), "--master-bind-port", port, "--master-port", port]


class LoopThread:
    """An event loop (uvloop) running in a background thread, for sync tests."""

    def __init__(self):
        import uvloop
        self.loop = uvloop.new_event_loop()
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
