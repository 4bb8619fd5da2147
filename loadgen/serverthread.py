"""A reference server on its own event loop in a background thread (tests, ``frametap
demo``): :class:`ServerThread`, and :func:`new_event_loop` (uvloop when installed).

    with FlyMQServerThread(FlyMQServer()) as thread:   # started on enter, stopped on exit
        client = FlyMQClient("127.0.0.1", thread.port)

Standard library only (no Locust, so no gevent patching).
"""

from __future__ import annotations

import asyncio
import threading

__all__ = ["new_event_loop", "ServerThread"]


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop when uvloop is installed, else the default asyncio loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class ServerThread:
    """Run an asyncio server (``start()`` / ``close()`` coroutines) on its own event loop
    in a background thread; a context manager (start on enter, stop on exit).

    Subclasses set :attr:`thread_name` and :attr:`what` (used in the start-up error) and
    pass the server object to ``__init__``. :attr:`cancel_pending_tasks`: on stop, cancel
    the tasks still running after ``server.close()`` before waiting for them (up to 2 s);
    False only waits for them to see their closed sockets and finish.
    """

    thread_name = "server"
    what = "server"
    cancel_pending_tasks = True

    def __init__(self, server):
        self.server = server
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def port(self) -> int:
        """The bound port (of a server with ``host`` / ``port`` attributes)."""
        return self.server.port

    @property
    def address(self) -> str:
        """``host:port`` of a server with ``host`` / ``port`` attributes."""
        return f"{self.server.host}:{self.server.port}"

    def call(self, fn, *args, timeout: float = 10.0):
        """Run ``fn(*args)`` on the server's loop (to inspect state safely)."""
        async def _call():
            return fn(*args)
        return asyncio.run_coroutine_threadsafe(_call(), self._loop).result(timeout)

    def start(self, timeout: float = 10.0):
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"{self.what} thread did not start in time")
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        loop = new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            try:
                loop.run_until_complete(self.server.start())
            except BaseException as exc:
                self._error = exc
                return
            finally:
                self._ready.set()
            loop.run_forever()
            loop.run_until_complete(self.server.close())
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            if self.cancel_pending_tasks:
                for t in pending:
                    t.cancel()
            if pending:
                loop.run_until_complete(asyncio.wait(pending, timeout=2))
        finally:
            loop.close()

    def stop(self, timeout: float = 10.0) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
