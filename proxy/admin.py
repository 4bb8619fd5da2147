"""Admin HTTP on the event loop: GET /metrics, /healthz, /readyz.

Served by the proxy's own loop, which also relays every route's bytes, so nothing here
may hold that loop for long, and no admin client may make the proxy keep memory or
descriptors for it without bound:

* at most ``max_connections`` (``[admin] max_connections``, default 64) admin connections
  at a time; beyond that the listener stops accepting and new clients wait in the
  kernel's listen backlog (no work on the loop for them) until one closes;
* a request head must arrive whole within :data:`READ_TIMEOUT` seconds (also how long an
  idle keep-alive connection stays) and be at most :data:`MAX_REQUEST` bytes;
* a response must be taken by the client within :data:`WRITE_TIMEOUT` seconds of its
  request, or the connection is aborted and everything buffered for it is freed. The
  body is handed to the transport as the client reads it: at most :data:`WRITE_HIGH`
  bytes wait in the process per connection, and the socket's send buffer is capped at
  :data:`SNDBUF`;
* a /metrics body is rendered on the loop in slices of about :data:`SLICE` seconds
  (:meth:`proxy.metrics.FrametapCollector.render`; each route's counters are read in one
  step of its own, ~0.7 ms at 256 opcodes), one render at a time, shared by every
  request that arrived before it began: every body holds counters read after its
  request arrived (so a scrape sees what happened before it, and counters never go
  backwards), and concurrent scrapes cost one render, not one each. Renders asked for
  back to back are spaced (:data:`GAP_FACTOR`) so that they take at most a quarter of
  the loop's time;
* client errors (resets, timeouts, malformed requests, the connection limit) are one
  warning line without a traceback; further ones are counted and summarised in one line
  at most every :data:`LOG_INTERVAL` seconds.
"""

import asyncio
import collections
import logging
import socket
import time

from proxy.acceptor import Acceptor, listen_sockets

from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = logging.getLogger("frametap.admin")

MAX_REQUEST = 16384       # bytes of a request head
READ_TIMEOUT = 10.0       # seconds for a whole request head; idle keep-alive connections too
WRITE_TIMEOUT = 10.0      # seconds from a request to its response taken by the client
MAX_CONNECTIONS = 64      # admin connections open at once (default of [admin] max_connections)
WRITE_HIGH = 64 * 1024    # bytes a connection's transport buffers before we stop writing
SNDBUF = 256 * 1024       # socket send buffer of an admin connection (no autotuning to MBs)
SLICE = 0.0005            # seconds of rendering between two returns to the event loop
GAP_FACTOR = 3.0          # back-to-back renders: idle this many times the last one's duration
MAX_GAP = 1.0             # ... but at most this long (seconds)
LOG_INTERVAL = 10.0       # seconds between two summary lines of client errors

REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           431: "Request Header Fields Too Large", 500: "Internal Server Error",
           503: "Service Unavailable"}

# what each kind of client error is called in the log
CLIENT_ERRORS = {
    "reset": "connection lost",
    "read_timeout": "no complete request within the read timeout",
    "write_timeout": "response not taken within the write timeout (dropped)",
    "bad_request": "malformed request",
    "limit": "max_connections reached (new clients wait in the listen backlog)",
}


class ClientErrorLog:
    """Client errors as warning lines without tracebacks: the first one whole, then,
    while they keep coming, one line per ``interval`` counting the ones not logged."""

    def __init__(self, logger, loop, interval=LOG_INTERVAL):
        self.logger = logger
        self.loop = loop
        self.interval = interval
        self.window = None                 # TimerHandle while errors are being summarised
        self.suppressed = collections.Counter()
        self.total = collections.Counter()  # every error noted, by kind (tests, debugging)

    def note(self, kind, peer=None, detail=None):
        """One client error of ``kind`` (a key of CLIENT_ERRORS); ``peer`` None: not one
        client's doing (the connection limit)."""
        self.total[kind] += 1
        if self.window is not None:
            self.suppressed[kind] += 1
            return
        what = CLIENT_ERRORS[kind] + (f": {detail}" if detail else "")
        self.logger.warning("admin%s: %s (further admin client errors are counted, one line "
                            "every %gs)", f" client {peer}" if peer else "", what, self.interval)
        self.window = self.loop.call_later(self.interval, self._flush)

    def _flush(self, final=False):
        self.window = None
        if not self.suppressed:
            return
        counts = ", ".join(f"{n} {CLIENT_ERRORS[kind].split(' (')[0]}"
                           for kind, n in self.suppressed.most_common())
        self.logger.warning("admin: %d more client errors since the last line: %s",
                            sum(self.suppressed.values()), counts)
        self.suppressed.clear()
        if not final:
            self.window = self.loop.call_later(self.interval, self._flush)

    def close(self):
        """Log what is still counted (at shutdown)."""
        if self.window is not None:
            self.window.cancel()
        self._flush(final=True)


class MetricsRenderer:
    """/metrics bodies: one render at a time, each shared by every request that arrived
    before it began, so every body holds counters read after its request arrived.

    ``source.pieces()`` yields the body's UTF-8 pieces in bounded steps; after
    ``slice_seconds`` of steps, and wherever it yields ``None``, the render returns to
    the event loop before going on. ``source.process_text()``, when there is one, is
    blocking and runs in a thread; its text ends the body. When scrapes come back to
    back, a render starts no sooner than :data:`GAP_FACTOR` times the previous one's
    duration after it ended (at most :data:`MAX_GAP`), so rendering takes at most a
    quarter of the loop's time however hard the endpoint is hit."""

    def __init__(self, loop, source, slice_seconds=SLICE):
        self.loop = loop
        self.source = source
        self.slice = slice_seconds
        self.waiting = None                # Future of the next render's body
        self.task = None                   # runs renders while requests wait for one
        self.not_before = 0.0              # loop.time() the next render may start
        self.renders = 0
        self.busy = 0.0                    # seconds spent in renders, begin to end

    def get(self):
        """A future of a body whose counters are all read after this call."""
        if self.waiting is None:
            self.waiting = self.loop.create_future()
            if self.task is None:
                self.task = self.loop.create_task(self._run())
        return asyncio.shield(self.waiting)

    def close(self):
        if self.task is not None:
            self.task.cancel()

    async def _run(self):
        try:
            while self.waiting is not None:
                delay = self.not_before - self.loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                # requests from here on wait for the render after this one
                body, self.waiting = self.waiting, None
                started = self.loop.time()
                try:
                    body.set_result(await self._render())
                except asyncio.CancelledError:
                    body.cancel()
                    raise
                except Exception as exc:
                    body.set_exception(exc)
                    body.exception()       # retrieved: every requester may be gone
                ended = self.loop.time()
                self.busy += ended - started
                self.not_before = ended + min(MAX_GAP, GAP_FACTOR * (ended - started))
        finally:
            self.task = None
            if self.waiting is not None:   # cancelled (shutdown)
                self.waiting.cancel()
                self.waiting = None

    async def _render(self):
        pieces = []
        clock = time.perf_counter
        until = clock() + self.slice
        for piece in self.source.pieces():
            if piece is None:              # the next step is a big one: a slice of its own
                until = 0.0
            else:
                pieces.append(piece)
            if clock() >= until:
                await asyncio.sleep(0)
                until = clock() + self.slice
        process_text = getattr(self.source, "process_text", None)
        if process_text is not None:
            pieces.append(await self.loop.run_in_executor(None, process_text))
        self.renders += 1
        return tuple(pieces)


class AdminConnection(asyncio.Protocol):
    """One admin HTTP/1.1 connection: requests one at a time, keep-alive."""

    def __init__(self, server, peer):
        self.server = server
        self.peer = peer
        self.transport = None
        self.buffer = bytearray()
        self.scanned = 0                   # bytes of buffer searched for a head's end
        self.busy = False                  # a response is being made or written
        self.out = collections.deque()     # pieces not yet handed to the transport
        self.paused = False                # transport above its high-water mark
        self.close_after = False
        self.timer = None
        self.task = None                   # waiting for a /metrics body
        self.aborted = False

    # ---- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport):
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH)
        self.server.connections.add(self)
        self._arm(self.server.read_timeout, "read_timeout")

    def data_received(self, data):
        self.buffer += data
        if self.busy:
            if len(self.buffer) > MAX_REQUEST:   # pipelined requests wait their turn
                self.transport.pause_reading()
            return
        self._serve_next()

    def eof_received(self):
        if self.busy:
            self.close_after = True            # answer this one, then close
            return True
        return False                           # the transport closes itself

    def pause_writing(self):
        self.paused = True

    def resume_writing(self):
        self.paused = False
        self._pump()

    def connection_lost(self, exc):
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.task is not None:
            self.task.cancel()
            self.task = None
        self.out.clear()
        if exc is not None and not self.aborted:
            self.server.errors.note("reset", self.peer, _describe(exc))
        self.server.lost(self)

    # ---- requests ---------------------------------------------------------------------

    def _arm(self, seconds, kind):
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.server.loop.call_later(seconds, self._expired, kind)

    def _expired(self, kind):
        self.timer = None
        self.server.errors.note(kind, self.peer)
        self.abort()

    def abort(self):
        """Drop the connection and whatever is buffered for it."""
        self.aborted = True
        self.out.clear()
        if self.task is not None:
            self.task.cancel()
            self.task = None
        self.transport.abort()

    def _serve_next(self):
        """Answer the next request if its head is complete."""
        try:
            self._next_request()
        except Exception:                        # a bug: never a traceback per request
            self.server.failed("handling an admin request")
            self.abort()

    def _next_request(self):
        # a head arriving a byte at a time is searched once, not once per byte
        end = self.buffer.find(b"\r\n\r\n", max(0, self.scanned - 3))
        if end < 0 or end + 4 > MAX_REQUEST:
            if end >= 0 or len(self.buffer) > MAX_REQUEST:
                self._refuse(431, b"request header too large\n")
            self.scanned = len(self.buffer)
            return
        head = bytes(self.buffer[:end + 4])
        del self.buffer[:end + 4]
        self.scanned = 0
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split()
        if len(parts) != 3:
            self._refuse(400, b"bad request line\n")
            return
        method, target, version = parts
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        close = version == "HTTP/1.0" or headers.get("connection", "").lower() == "close"
        if method not in ("GET", "HEAD"):
            self._refuse(405, b"only GET\n")
            return
        head_only = method == "HEAD"
        path = target.split("?", 1)[0]
        self.busy = True
        self._arm(self.server.write_timeout, "write_timeout")
        if path == "/metrics":
            self.task = self.server.loop.create_task(self._metrics(close, head_only))
        elif path == "/healthz":
            self._respond(200, (b"ok\n",), close=close, head_only=head_only)
        elif path == "/readyz":
            ready = self.server.is_ready()
            self._respond(200 if ready else 503, (b"ready\n" if ready else b"not ready\n",),
                          close=close, head_only=head_only)
        else:
            self._respond(404, (b"not found: try /metrics, /healthz, /readyz\n",),
                          close=close, head_only=head_only)

    async def _metrics(self, close, head_only):
        try:
            body = await self.server.metrics.get()
        except asyncio.CancelledError:
            raise
        except Exception:
            self.task = None
            self.server.failed("rendering /metrics")
            self._respond(500, (b"rendering /metrics failed (see the proxy's log)\n",),
                          close=True)
            return
        self.task = None
        self._respond(200, body, CONTENT_TYPE_LATEST, close, head_only)

    def _refuse(self, status, body):
        self.server.errors.note("bad_request", self.peer, f"{status} {REASONS[status]}")
        self.busy = True
        self.transport.pause_reading()
        self._arm(self.server.write_timeout, "write_timeout")
        self._respond(status, (body,), close=True)

    def _respond(self, status, pieces, ctype="text/plain; charset=utf-8", close=False,
                 head_only=False):
        close = close or self.close_after
        self.close_after = close
        length = sum(map(len, pieces))
        head = (f"HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {length}\r\n"
                f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n").encode()
        self.out.append(head)
        if not head_only:
            self.out.extend(pieces)
        self._pump()

    def _pump(self):
        """Hand pieces to the transport while it is below its high-water mark."""
        if not self.busy or self.transport.is_closing():
            return
        while self.out and not self.paused:
            self.transport.write(self.out.popleft())
        if self.out or self.task is not None:
            return
        # all of it handed over; at most WRITE_HIGH (plus a piece) is still buffered
        if self.close_after:
            self.transport.close()           # flushes; the write timer runs until it has
            return
        self.busy = False
        self._arm(self.server.read_timeout, "read_timeout")
        self.transport.resume_reading()
        if self.buffer:
            self._serve_next()


def _describe(exc):
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    return repr(exc)


class AdminServer:
    """``metrics``: what /metrics serves (:class:`proxy.metrics.Exposition`, anything
    with ``pieces()``). ``reserve`` (proxy.acceptor.FdReserve): descriptors the routes
    leave alone, spent here when an accept hits the fd limit so that /metrics still
    answers there."""

    def __init__(self, metrics, is_ready, host="127.0.0.1", port=9400, reserve=None,
                 max_connections=MAX_CONNECTIONS):
        self.source = metrics
        self.is_ready = is_ready       # callable -> bool
        self.host, self.port = host, port
        self.reserve = reserve
        self.max_connections = max_connections
        self.read_timeout = READ_TIMEOUT
        self.write_timeout = WRITE_TIMEOUT
        self.acceptors = []
        self.loop = None
        self.metrics = None            # MetricsRenderer
        self.errors = None             # ClientErrorLog
        self.open = 0                  # accepted and not yet closed
        self.connections = set()       # AdminConnection
        self.connecting = set()        # tasks handing accepted sockets to the loop
        self.held = False
        self.failures = 0              # errors that were frametap's own (see failed())
        self._failure_logged = None

    @property
    def address(self):
        return self.acceptors[0].sock.getsockname()[:2]

    async def start(self):
        self.loop = asyncio.get_running_loop()
        self.metrics = MetricsRenderer(self.loop, self.source)
        self.errors = ClientErrorLog(log, self.loop)
        self.acceptors = [Acceptor(self.loop, sock, self._accepted, reserve=self.reserve,
                                   name="admin")
                          for sock in listen_sockets(self.host, self.port)]

    def close(self):
        for acceptor in self.acceptors:
            acceptor.close()
        for conn in list(self.connections):
            conn.abort()
        if self.metrics is not None:
            self.metrics.close()
        if self.errors is not None:
            self.errors.close()

    def _accepted(self, sock):
        self.open += 1
        if self.open >= self.max_connections and not self.held:
            self.held = True
            for acceptor in self.acceptors:
                acceptor.hold()
            self.errors.note("limit", None, f"{self.open} open")
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF)
        except OSError:
            pass
        task = self.loop.create_task(self._connect(sock))
        self.connecting.add(task)          # the loop holds tasks weakly
        task.add_done_callback(self.connecting.discard)

    async def _connect(self, sock):
        peer = _peer(sock)
        try:
            await self.loop.connect_accepted_socket(lambda: AdminConnection(self, peer), sock)
        except (OSError, RuntimeError):
            sock.close()
            self.lost(None)

    def lost(self, conn):
        """A connection is gone (``None``: it never got a transport)."""
        self.connections.discard(conn)
        self.open -= 1
        if self.reserve is not None:
            self.reserve.fill()        # what a scrape at the limit spent comes back
        if self.held and self.open < self.max_connections:
            self.held = False
            for acceptor in self.acceptors:
                acceptor.release()

    def failed(self, what):
        """Called in an ``except`` block for an error that is frametap's bug, not the
        client's: logged with its traceback once per LOG_INTERVAL, counted otherwise."""
        self.failures += 1
        now = self.loop.time()
        if self._failure_logged is None or now - self._failure_logged >= LOG_INTERVAL:
            self._failure_logged = now
            log.exception("admin: %s failed (%d failures so far; a traceback is logged "
                          "once per %gs)", what, self.failures, LOG_INTERVAL)


def _peer(sock):
    try:
        host, port = sock.getpeername()[:2]
    except (OSError, ValueError):
        return "?"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
