"""What every reference server shares: listeners, the read loop, the service-time model.

Each of the five reference servers (FlyMQ, fleximq, RabbitMQ Stream, RocketMQ and the
Thrift service of ``ttheader``) is a :class:`ReferenceServer` subclass holding the
protocol's state, plus a :class:`ServerConnection` subclass saying how to cut frames off
the received bytes (:meth:`ServerConnection.split_frame`, the same hook as the sync
clients' :meth:`loadgen.clientbase.SocketClient.split_frame`) and what to do with each.
Everything else lives here, once:

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

Bounded memory per connection (backpressure)
    Answers not yet sent — in the socket's write buffer or held back by the service time —
    are counted per connection (:meth:`ServerConnection.unsent_bytes`). Once they exceed
    :attr:`~ReferenceServer.write_high_water` (4 MiB), the read loop stops handling frames
    and reading from that client until they are below it again, so a client that pipelines
    large FETCHes and never reads costs at most that bound plus one answer plus one read.

Logs a remote peer can trigger (:meth:`ReferenceServer.log_peer`)
    Bad frames, failed authentications, handler errors: one line each, never a traceback,
    and at most :attr:`~ReferenceServer.log_lines_per_second` lines per second per server;
    the lines suppressed beyond that are counted and reported in one line when the second
    is over ("N similar lines suppressed").
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Awaitable

from loadgen.servicetime import ServiceTime, as_service_time
from proxy.addresses import format_peer

__all__ = ["ReferenceServer", "ServerConnection", "READ_SIZE", "describe_exception"]

#: Bytes asked of the socket per read.
READ_SIZE = 256 * 1024


def describe_exception(exc: BaseException) -> str:
    """One line for a log: type, message and where it was raised (no traceback)."""
    tb = exc.__traceback__
    where = ""
    if tb is not None:
        while tb.tb_next is not None:
            tb = tb.tb_next
        code = tb.tb_frame.f_code
        where = f" at {code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno} in {code.co_name}"
    return f"{type(exc).__name__}: {exc}{where}"


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
            self.peer = format_peer(peer)
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
        self._held_bytes = 0            # bytes of the frames in _held
        self._released: asyncio.Future | None = None  # set when held frames are written

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
        self.server.log_peer(logging.WARNING, "%s: closing connection from %s: %s",
                             self.name, self.peer, exc)
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
        self._held_bytes += len(frame)
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
        frame = heapq.heappop(self._held)[2]
        self._held_bytes -= len(frame)
        self._write(frame)
        while self._held and self._held[0][0] <= now:
            frame = heapq.heappop(self._held)[2]
            self._held_bytes -= len(frame)
            self._write(frame)
        if self._released is not None and not self._released.done():
            self._released.set_result(None)
        if self._held:
            self._arm_timer()
        elif self._flushed is not None and not self._flushed.done():
            self._flushed.set_result(None)

    async def _wait_held(self) -> None:
        """Until every held frame has been written."""
        if self._held:
            self._flushed = self._loop.create_future()
            await self._flushed

    def unsent_bytes(self) -> int:
        """Answers not sent yet: the socket's write buffer plus the held frames."""
        transport = self.writer.transport
        buffered = 0 if transport is None else transport.get_write_buffer_size()
        return buffered + self._held_bytes

    async def drain(self) -> None:
        """Flow control: wait while the unsent answers (:meth:`unsent_bytes`) are over
        the server's :attr:`~ReferenceServer.write_high_water`."""
        high_water = self.server.write_high_water
        while not self.closed and self.unsent_bytes() > high_water:
            transport = self.writer.transport
            if transport is None or transport.is_closing():
                return
            if self._held_bytes and transport.get_write_buffer_size() <= high_water:
                # what is over the bound waits for the service time: wait for the timer
                self._released = self._loop.create_future()
                await self._released
            else:
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
        self._held_bytes = 0
        if self._released is not None and not self._released.done():
            self._released.set_result(None)
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
                    if self.unsent_bytes() > self.server.write_high_water:
                        # backpressure: no more answers until the client reads these
                        await self.drain()
                del buf[:pos]
                await self.drain()
        except (ConnectionError, OSError, asyncio.IncompleteReadError) as exc:
            clean = False
            self.server.log.debug("%s: connection from %s: %s", self.name, self.peer, exc)
        except asyncio.CancelledError:
            clean = False
        except Exception as exc:  # a bug in a handler must not take the server down
            clean = False
            self.server.log_peer(logging.ERROR, "%s: error on connection from %s: %s",
                                 self.name, self.peer, describe_exception(exc))
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
    #: Unsent answer bytes per connection above which its frames are no longer read.
    write_high_water = 4 * 1024 * 1024
    #: Log lines a remote peer can cause, per second and server (see :meth:`log_peer`).
    log_lines_per_second = 10

    def __init__(self, service_time: ServiceTime | str | None = None):
        self.service_time = as_service_time(service_time)
        self.connections: set[ServerConnection] = set()
        self.connections_total = 0
        self.frames_received = 0
        self._listeners: list[asyncio.base_events.Server] = []
        self._roles: dict[asyncio.base_events.Server, str] = {}   # listener -> its role
        self._connection_tasks: set[asyncio.Task] = set()
        self._log_window = 0.0           # start of the current one-second window
        self._log_lines = 0              # lines written in it
        self._log_suppressed = 0         # lines dropped in it
        self._log_flush: asyncio.TimerHandle | None = None
        self.log_lines_suppressed = 0    # total, for tests and curiosity

    def log_peer(self, level: int, message: str, *args) -> None:
        """Log a line that a remote peer can trigger, at most
        :attr:`log_lines_per_second` per second; the excess is counted and reported in
        one line when the second ends (a timer), so a flood of bad clients cannot flood
        the log or slow the server with logging."""
        if not self.log.isEnabledFor(level):
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        if now - self._log_window >= 1.0:
            self._flush_suppressed()
            self._log_window, self._log_lines = now, 0
        if self._log_lines < self.log_lines_per_second:
            self._log_lines += 1
            self.log.log(level, message, *args)
            return
        self._log_suppressed += 1
        self.log_lines_suppressed += 1
        if self._log_flush is None:
            self._log_flush = loop.call_at(self._log_window + 1.0, self._flush_suppressed)

    def _flush_suppressed(self) -> None:
        if self._log_flush is not None:
            self._log_flush.cancel()
            self._log_flush = None
        if self._log_suppressed:
            self.log.warning("%s: %d similar log lines suppressed (more than %d a second)",
                             self.what, self._log_suppressed, self.log_lines_per_second)
            self._log_suppressed = 0

    @property
    def listening(self) -> bool:
        return bool(self._listeners)

    #: an ``ssl.SSLContext``: every listener speaks TLS (``frametap serve P --tls-cert``)
    ssl_context = None

    async def listen(self, host: str, port: int, role: str = "") -> int:
        """Start accepting on ``host:port``; returns the bound port."""
        listener = await asyncio.start_server(
            lambda r, w: self._serve_connection(r, w, role), host, port,
            ssl=self.ssl_context)
        self._listeners.append(listener)
        self._roles[listener] = role
        return listener.sockets[0].getsockname()[1]

    def bound_addresses(self) -> list[tuple[str, str]]:
        """``(role, address)`` of every listener in bind order, as bound (a port 0 shows
        the port the kernel chose): ``host:port``, ``[v6]:port`` or ``unix:/path``
        (what ``frametap serve --ready-file`` writes)."""
        out = []
        for listener in self._listeners:
            for sock in listener.sockets[:1]:
                name = sock.getsockname()
                address = ("unix:" + name) if isinstance(name, str) else format_peer(name)
                out.append((self._roles.get(listener, ""), address))
        return out

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
        self._roles = {}
        self._flush_suppressed()
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
