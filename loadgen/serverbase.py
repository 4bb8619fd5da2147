"""What every reference server shares: listeners, the read loop, the service-time model.

A reference server (FlyMQ, RabbitMQ Stream, RocketMQ) is a :class:`ReferenceServer`
subclass holding the protocol's state, plus a :class:`ServerConnection` subclass saying
how to cut frames off the received bytes and what to do with each. Everything else lives
here, once:

Connection lifecycle
    :meth:`ReferenceServer.listen` binds a listener (a server may have several, each with
    a ``role`` its connections see); every accepted socket becomes one
    ``connection_class`` object in :attr:`ReferenceServer.connections` for its lifetime
    (:attr:`~ReferenceServer.connections_total` counts them all), runs
    :meth:`ServerConnection.run` and is cleaned up (:meth:`ServerConnection.connection_lost`)
    however it ends. :meth:`ReferenceServer.close` stops listening and closes them all.

The read loop (:meth:`ServerConnection.run`)
    Reads up to :attr:`~ReferenceServer.read_size` bytes at a time and cuts whole frames
    with :meth:`ServerConnection.split_frame`, which checks the declared length against
    the limit as soon as the length field is there (so an oversized frame is refused
    before its payload is buffered) and raises the codec's ``FrameError`` on garbage.
    EOF ends the connection quietly (replies still held back by the service time leave
    first); a reset likewise (nothing more can leave); garbage or an oversized frame
    writes one log line and closes that connection only
    (:meth:`ServerConnection.bad_frame`; a protocol may answer first instead, as
    RabbitMQ Stream does). Never a traceback for bad input, never a hang.

The service-time model (:mod:`loadgen.servicetime`)
    :meth:`ServerConnection.reply_due` turns the loop time a request was read into the time
    its answer may leave (read time + one sample of the server's ``service_time``), and
    :meth:`ServerConnection.send` holds the answer back until then. With
    :attr:`~ReferenceServer.ordered_replies` (FIFO protocols, or ones whose handshake relies
    on order) every frame also waits for the frames sent before it on that connection;
    without it (answers carry a correlation id) each frame leaves at its own time.
    Frames sent without a due time (server-initiated ones) leave at once, or behind the
    held ones when replies are ordered.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Awaitable

from loadgen.common import format_address
from loadgen.servicetime import ServiceTime, as_service_time

__all__ = ["ReferenceServer", "ServerConnection", "READ_SIZE"]

#: Bytes asked of the socket per read.
READ_SIZE = 256 * 1024


class ServerConnection:
    """One accepted client socket of a :class:`ReferenceServer`.

    Subclasses implement :meth:`split_frame` and :meth:`frame_received` and may override
    :meth:`bad_frame`, :meth:`read_timeout` and :meth:`connection_lost`. Attributes:
    ``server``, ``role`` (the listener's), ``peer`` (``ip:port`` text), ``peer_address``
    (``(ip, port)``), ``closed``, ``last_read`` / ``last_write`` (loop times).
    """

    def __init__(self, server: "ReferenceServer", reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, role: str = ""):
        self.server = server
        self.reader = reader
        self.writer = writer
        self.role = role
        peer = writer.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.peer_address: tuple[str, int] = (peer[0], peer[1])
            self.peer = format_address(peer)
        else:
            self.peer_address = ("127.0.0.1", 0)
            self.peer = str(peer or "?")
        self.closed = False
        self.tasks: set[asyncio.Task] = set()
        self._loop = asyncio.get_running_loop()
        self.last_read = self.last_write = self._loop.time()
        # Frames held back by the service time: heap of (due, sequence, frame).
        self._held: list[tuple[float, int, bytes]] = []
        self._held_until = 0.0          # due time of the last frame held (ordered replies)
        self._sequence = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_when = 0.0
        self._flushed: asyncio.Future | None = None

    @property
    def name(self) -> str:
        """``<server what>[ <role>]`` for log lines (``rocketmq broker``)."""
        return f"{self.server.what} {self.role}" if self.role else self.server.what

    # ------------------------------------------------------------------ protocol hooks

    def split_frame(self, buf: memoryview):
        """Cut one frame off the start of ``buf``: ``(frame, bytes consumed)``, or None when
        ``buf`` does not hold a whole frame yet. Raise the codec's error (a ``FrameError``
        / ``ValueError``) for garbage or a length over the limit, as soon as the header
        shows it. ``frame`` must not keep a reference to ``buf`` (copy what you keep)."""
        raise NotImplementedError

    def frame_received(self, frame, received: float) -> None:
        """Handle one frame; ``received`` is the loop time its last bytes were read (pass
        it to :meth:`reply_due`)."""
        raise NotImplementedError

    def bad_frame(self, exc: Exception) -> bool:
        """:meth:`split_frame` refused the bytes: True closes the connection (after one log
        line, the default), False drops what was received and keeps reading."""
        self.server.log.warning("%s: closing connection from %s: %s", self.name, self.peer,
                                exc)
        return True

    def read_timeout(self) -> float | None:
        """Seconds to wait for the next bytes before giving up on the client (None =
        forever; 0 or less ends the connection now)."""
        return None

    def connection_lost(self) -> None:
        """The connection is over (whatever the reason): forget its protocol state."""

    # ------------------------------------------------------------------ output

    def reply_due(self, received: float) -> float | None:
        """When the answer to a request read at ``received`` may leave (loop time), or
        None when the server has no service time."""
        service_time = self.server.service_time
        return None if service_time is None else received + service_time.sample()

    def send(self, frame: bytes, due: float | None = None) -> None:
        """Write ``frame`` now, or hold it back until loop time ``due`` (see the module
        docstring for the order). Frames for a closed connection are dropped."""
        if self.closed:
            return
        ordered = self.server.ordered_replies
        if ordered and self._held:
            # FIFO: never before a frame sent earlier on this connection
            due = self._held_until if due is None else max(due, self._held_until)
        elif due is None or due <= self._loop.time():
            self._write(frame)
            return
        heapq.heappush(self._held, (due, next(self._sequence), frame))
        self._held_until = max(self._held_until, due) if ordered else 0.0
        self._arm_timer()

    def _write(self, frame: bytes) -> None:
        if self.closed or self.writer.is_closing():
            return
        self.writer.write(frame)
        self.last_write = self._loop.time()

    def _arm_timer(self) -> None:
        due = self._held[0][0]
        if self._timer is not None:
            if self._timer_when <= due:
                return
            self._timer.cancel()
        self._timer_when = due
        self._timer = self._loop.call_at(due, self._release_held)

    def _release_held(self) -> None:
        """Timer callback: the first held frame is due (the timer was set for it; the
        loop may run it a clock tick early), and so is every other one whose time came."""
        self._timer = None
        now = self._loop.time()
        self._write(heapq.heappop(self._held)[2])
        while self._held and self._held[0][0] <= now:
            self._write(heapq.heappop(self._held)[2])
        if self._held:
            self._arm_timer()
        elif self._flushed is not None and not self._flushed.done():
            self._flushed.set_result(None)

    async def _wait_held(self) -> None:
        """Until every held frame has been written."""
        if self._held:
            self._flushed = self._loop.create_future()
            await self._flushed

    async def drain(self) -> None:
        """Flow control: wait while the socket's write buffer is over the server's
        :attr:`~ReferenceServer.write_high_water`."""
        transport = self.writer.transport
        if transport.get_write_buffer_size() > self.server.write_high_water:
            await self.writer.drain()

    def spawn(self, coro: Awaitable) -> asyncio.Task:
        """Run ``coro`` as a task that is cancelled when the connection ends."""
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def abort(self) -> None:
        """Close now: held frames are dropped, the read loop ends, tasks are cancelled."""
        if self.closed:
            return
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._held.clear()
        if self._flushed is not None and not self._flushed.done():
            self._flushed.set_result(None)
        current = asyncio.current_task()
        for task in list(self.tasks):
            if task is not current:
                task.cancel()
        self.writer.close()

    # ------------------------------------------------------------------ read loop

    async def run(self) -> None:
        """Read, split and hand on frames until EOF, an error or :meth:`abort`."""
        buf = bytearray()
        loop = self._loop
        read_size = self.server.read_size
        clean = True  # EOF: let the replies still held back leave before closing
        try:
            while not self.closed:
                timeout = self.read_timeout()
                if timeout is None:
                    data = await self.reader.read(read_size)
                elif timeout <= 0:
                    break
                else:
                    try:
                        data = await asyncio.wait_for(self.reader.read(read_size), timeout)
                    except asyncio.TimeoutError:
                        break
                if not data:
                    break
                received = self.last_read = loop.time()
                buf += data
                pos = 0
                while not self.closed:
                    try:
                        split = self.split_frame(memoryview(buf)[pos:])
                    except ValueError as exc:  # the codecs' FrameErrors are ValueErrors
                        if self.bad_frame(exc):
                            clean = False
                            return
                        pos = len(buf)  # drop what arrived, keep reading
                        break
                    if split is None:
                        break
                    frame, size = split
                    pos += size
                    self.server.frames_received += 1
                    self.frame_received(frame, received)
                del buf[:pos]
                await self.drain()
        except (ConnectionError, OSError, asyncio.IncompleteReadError) as exc:
            clean = False
            self.server.log.debug("%s: connection from %s: %s", self.name, self.peer, exc)
        except asyncio.CancelledError:
            clean = False
        except Exception:  # a bug in a handler must not take the server down
            clean = False
            self.server.log.exception("%s: error on connection from %s", self.name, self.peer)
        finally:
            await self._finish(clean)

    async def _finish(self, clean: bool) -> None:
        if clean and not self.closed:
            try:
                await self._wait_held()
            except asyncio.CancelledError:
                pass
        self.abort()
        try:
            self.connection_lost()
        except Exception:  # pragma: no cover - defensive
            self.server.log.exception("%s: cleaning up after %s failed", self.name, self.peer)
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass


class ReferenceServer:
    """Base of the reference servers: listeners, live connections, counters, service time.

    Class attributes a subclass sets: :attr:`what` (log name), :attr:`log`,
    :attr:`connection_class`, :attr:`ordered_replies`. ``service_time`` is a
    :class:`~loadgen.servicetime.ServiceTime`, its text (``"2ms±1ms"``) or None; a zero
    distribution is stored as None (no delay machinery at all).
    """

    what = "server"
    log = logging.getLogger("frametap.server")
    connection_class: type[ServerConnection] = ServerConnection
    #: True: frames leave each connection in the order they were sent (FIFO protocols).
    ordered_replies = True
    read_size = READ_SIZE
    write_high_water = 1024 * 1024

    def __init__(self, service_time: ServiceTime | str | None = None):
        self.service_time = as_service_time(service_time)
        self.connections: set[ServerConnection] = set()
        self.connections_total = 0
        self.frames_received = 0
        self._listeners: list[asyncio.base_events.Server] = []
        self._connection_tasks: set[asyncio.Task] = set()

    @property
    def listening(self) -> bool:
        return bool(self._listeners)

    async def listen(self, host: str, port: int, role: str = "") -> int:
        """Start accepting on ``host:port``; returns the bound port."""
        listener = await asyncio.start_server(
            lambda r, w: self._serve_connection(r, w, role), host, port)
        self._listeners.append(listener)
        return listener.sockets[0].getsockname()[1]

    async def start(self) -> None:
        """Bind the server's listeners (subclasses)."""
        raise NotImplementedError

    async def serve_forever(self) -> None:
        if not self._listeners:
            await self.start()
        await asyncio.gather(*(listener.serve_forever() for listener in self._listeners))

    async def close(self) -> None:
        """Stop listening and close every connection (held replies are dropped)."""
        listeners, self._listeners = self._listeners, []
        for listener in listeners:
            listener.close()
        for conn in list(self.connections):
            conn.abort()
        pending = [t for t in self._connection_tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=2)
        for listener in listeners:
            try:
                await asyncio.wait_for(listener.wait_closed(), 5)
            except asyncio.TimeoutError:  # pragma: no cover - defensive
                pass

    async def _serve_connection(self, reader: asyncio.StreamReader,
                                writer: asyncio.StreamWriter, role: str) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connection_tasks.add(task)
        conn = self.connection_class(self, reader, writer, role)
        self.connections.add(conn)
        self.connections_total += 1
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)
            if task is not None:
                self._connection_tasks.discard(task)
