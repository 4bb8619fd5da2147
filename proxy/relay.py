"""The uvloop relay: one listener per route, two asyncio Protocols per connection.

Bytes are forwarded as they arrive (the parser only reads headers and never holds a
frame back).  Each side's write buffer drives the other side's reading: when the
upstream's buffer passes its high-water mark the client is paused, and vice versa,
so a slow reader bounds memory instead of growing it.  EOF on one side becomes
write_eof on the other while the opposite direction keeps flowing; a reset on one
side aborts the other.
"""

import asyncio
import collections
import itertools
import logging
import os
import random
import socket
import time
import weakref

from proxy import protocols, websocket
from proxy.protocols import advertise
from proxy.acceptor import Acceptor, connect_upstream, listen_sockets
from proxy.addresses import (UnixAddress, format_address, format_peer, remove_unix_socket,
                             unix_listener)
from proxy.framing import NO_EXTENSIONS, RouteStats, now_ns
from proxy.framing_common import DIRECTIONS
from proxy.tls import connection_attrs, route_tls

# The per-read path (data_received, _relay's fast path, the yield check after a full read)
# is compiled: ClientSide and UpstreamSide subclass its C bases (proxy/_relaycore.pyx,
# which says why); FRAMETAP_NO_EXTENSIONS=1 takes the pure-Python twin, as proxy.framing.
if NO_EXTENSIONS:
    from proxy.relaycore_py import (FULL_READ, YIELD_FRAMES,  # noqa: F401
                                    ClientCore, UpstreamCore)
else:
    from proxy._relaycore import (FULL_READ, YIELD_FRAMES,  # noqa: F401
                                  ClientCore, UpstreamCore)

_conn_ids = itertools.count(1)            # conn_id of the frame log (docs/design.md, "Frame log")

log = logging.getLogger("frametap.relay")


class LogLimiter:
    """At most ``per_second`` lines a second; the rest are counted and reported in one line
    (``"<prefix>: N similar <what> suppressed"``), flushed by the next line's second or by
    an explicit flush() (a route's sweeper calls it even when no warning follows), so a
    flood of bad connections or requests cannot flood the log (the counters still count
    them all).  A route's limiter warns on this module's logger; the API server's logs at
    INFO on its own."""

    def __init__(self, route="", per_second=10, logger=None, level=logging.WARNING,
                 prefix=None, what="warnings"):
        self.prefix = prefix if prefix is not None else "route %s" % route
        self.per_second = per_second
        self.logger = logger or log
        self.level = level
        self.what = what
        self.window = 0
        self.used = 0
        self.suppressed = 0

    def warning(self, msg, *args):
        now = int(time.monotonic())
        if now != self.window:
            self.flush(now)
        if self.used < self.per_second:
            self.used += 1
            self.logger.log(self.level, msg, *args)
        else:
            self.suppressed += 1

    info = warning                         # the level is the limiter's, not the call's

    def flush(self, now=None):
        """Report what was suppressed in a finished one-second window."""
        now = int(time.monotonic()) if now is None else now
        if now == self.window:
            return
        if self.suppressed:
            self.logger.log(self.level, "%s: %d similar %s suppressed", self.prefix,
                            self.suppressed, self.what)
        self.window, self.used, self.suppressed = now, 0, 0


WRITE_HIGH = 256 * 1024      # pause the peer's reading above this many buffered bytes
WRITE_LOW = 64 * 1024
# Connections a route sets up at once (accepted, upstream not yet connected); beyond it the
# listener stops accepting and clients wait in the kernel's listen backlog, so a burst
# faster than the loop or the upstream can take costs no proxy memory (docs/design.md,
# "File descriptors").
SETUP_LIMIT = 256
# FULL_READ and YIELD_FRAMES (when a read makes its side yield to the loop: ClientSide._yield)
# are defined with the per-read path that tests them (proxy/_relaycore.pyx, its twin).
# Fairness across connections (docs/design.md, "Fairness"): one feed() parses up to
# FRAME_CAP frames + pending requests; a read holding more is parsed and forwarded that
# much at a time, its direction's reading paused, the rest queued in the loop's Backlog,
# which runs TURNS queued slices per loop iteration.  A read of fewer frames (every read
# of big frames) is never cut: nothing per byte, one Python call per slice.
FRAME_CAP = 128
TURNS = 2
#: how often a half-closed client's TLS upstream checks for its last answers
EOF_POLL = 0.01
SWEEP_SLICE = 2048         # timeouts counted between two yields of the sweep (~0.2 ms)


class Backlog:
    """The loop's queue of read slices cut at the frame cap, first in, first out.

    ``run`` is a ready callback: it runs TURNS slices, then lets the loop poll (the reads
    of every other connection) before the next TURNS.  A connection with a slice queued
    reads nothing more in that direction until the slice has run, so a flood waits in
    the kernel's socket buffer (and then the sender's), not in proxy memory, and a loop
    iteration costs at most ~TURNS + (connections read in it) slices of FRAME_CAP
    however many connections flood at once."""

    __slots__ = ("loop", "queue", "scheduled", "slices")

    def __init__(self, loop):
        self.loop = loop
        self.queue = collections.deque()
        self.scheduled = False
        self.slices = 0                    # slices queued since start (tests, soak)

    def add(self, conn, d, data):
        self.queue.append((conn, d, data))
        self.slices += 1
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self.run)

    def run(self):
        self.scheduled = False
        queue = self.queue
        for _ in range(min(TURNS, len(queue))):
            conn, d, data = queue.popleft()
            conn._run_slice(d, data)
        if queue and not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self.run)


_backlogs = weakref.WeakKeyDictionary()


def backlog_for(loop):
    """The one Backlog of ``loop``, shared by every route on it."""
    backlog = _backlogs.get(loop)
    if backlog is None:
        backlog = _backlogs[loop] = Backlog(loop)
    return backlog


class Route:
    """One listener, its upstream, its counters and its live connections."""

    def __init__(self, cfg, loop=None, reserve=None):
        self.cfg = cfg
        self.reserve = reserve         # proxy.acceptor.FdReserve kept for the admin endpoint
        self.acceptors = []
        self.accept_errors = {}        # reason -> accepts that ran out of descriptors
        self._accept_logged = -1e9     # monotonic time of the last such log line
        self.loop = loop or asyncio.get_event_loop()
        if cfg.protocol == "tcp":   # undecoded: a Toxiproxy proxy made through the API
            from proxy.passthrough import SPEC as undecoded
            self.protocol = undecoded
        else:
            self.protocol = protocols.load(cfg.protocol)
        self.parser_class = self.protocol.load_parser()
        self.stats = RouteStats(cfg.name, cfg.protocol)
        self.max_frame_bytes = cfg.max_frame_bytes or self.protocol.max_frame_bytes
        self.connections = set()
        self._sweeper = None
        self.log = LogLimiter(cfg.name)
        self.closed_counts = {}        # (by, reason) -> connections closed that way
        self.framelog = None           # (FrameLogBuffer, route index, source, sample)
        self.half_close_timeout = getattr(cfg, "half_close_timeout", 60.0)
        self.idle_timeout = getattr(cfg, "idle_timeout", 3600.0)   # 0: never
        self.unix_inode = None         # a unix: listener's socket file, removed on close
        self.setting_up = 0            # accepted, upstream not connected yet (SETUP_LIMIT)
        # [routes.tls] (proxy.tls.RouteTLS) or None; passthrough relays without decoding
        self.tls = route_tls(cfg, cfg.name, self.log.warning)
        if self.tls is not None and self.tls.passthrough:
            self.parser_class = self.tls.parser_class()
        self.faults = None             # proxy.faults.RouteFaults (start_faults)
        self.backlog = backlog_for(self.loop)
        # a route whose parser counts frames cuts its reads at FRAME_CAP (Backlog); not a
        # WebSocket route, whose layer feeds its parser whole messages
        self.frame_cap = (FRAME_CAP if hasattr(self.parser_class, "frame_cap")
                          and not isinstance(cfg.listen, websocket.WsAddress) else 0)

    def start_faults(self, seed=None):
        """The route's fault engine, when its config has a FaultSet (docs/design.md,
        "Faults"); a connection's parser is armed when it is made, its pipes when its
        upstream is up."""
        faultset = getattr(self.cfg, "faults", None)
        if faultset is not None:
            from proxy.faults import RouteFaults
            self.faults = RouteFaults(self, faultset, seed)

    @property
    def address(self):
        """(host, port) actually bound (port 0 in the config picks a free one); the path
        (a UnixAddress) for a unix: listener."""
        if isinstance(self.cfg.listen, UnixAddress):
            return self.cfg.listen
        return self.acceptors[0].sock.getsockname()[:2]

    async def start(self):
        # frametap accepts by itself so that running out of descriptors pauses and counts
        # instead of dropping clients (docs/design.md, "File descriptors")
        if isinstance(self.cfg.listen, UnixAddress):
            sock, self.unix_inode = unix_listener(self.cfg.listen)
            socks = [sock]
        else:
            host, port = self.cfg.listen
            socks = listen_sockets(host, port)
        self.acceptors = [Acceptor(self.loop, sock, self._accepted, self._accept_error,
                                   self.reserve, spare=True, name=f"route {self.cfg.name}")
                          for sock in socks]
        self._sweeper = self.loop.create_task(self._sweep())

    def _accepted(self, sock, spare_fd):
        self.setting_up += 1
        if self.setting_up >= SETUP_LIMIT:
            for acceptor in self.acceptors:
                acceptor.hold()
        self.loop.create_task(self._attach(sock, [spare_fd]))

    def setup_done(self):
        """One accepted connection has its upstream (or is gone): accept again."""
        self.setting_up -= 1
        if self.setting_up == SETUP_LIMIT // 2:
            for acceptor in self.acceptors:
                acceptor.release()

    async def _attach(self, sock, spare):
        """Hand an accepted socket to the loop; ``spare`` holds the descriptor reserved
        for its upstream side (ClientSide takes it)."""
        made = []

        def client():
            made.append(ClientSide(self, spare.pop()))
            return made[0]
        try:
            if self.tls is not None and self.tls.terminates:   # counted by proxy.tls
                await self.tls.accept(self.loop, client, sock)
            else:
                await self.loop.connect_accepted_socket(client, sock)
        except Exception as exc:           # the client reset before it was set up
            log.debug("route %s: accepted connection lost: %s", self.cfg.name, exc)
            if made and not made[0].setup_owned:   # a failed TLS handshake
                made[0].drop_spare()
            sock.close()
        finally:
            while spare:
                os.close(spare.pop())
            if not (made and made[0].setup_owned):   # no ClientSide to call setup_done
                self.setup_done()

    def _accept_error(self, reason):
        self.accept_errors[reason] = self.accept_errors.get(reason, 0) + 1
        now = time.monotonic()
        if now - self._accept_logged >= 10.0:  # the listener retries every 0.1 s: one line
            self._accept_logged = now          # per 10 s, the counter has every one
            log.warning("route %s: out of file descriptors (%s): clients wait in the "
                        "backlog (%d such accepts so far)", self.cfg.name, reason,
                        sum(self.accept_errors.values()))

    def new_parser(self, local_address, client=None):
        parser = self.parser_class(self.stats, self.max_frame_bytes, self.cfg.request_timeout,
                                   self.cfg.options)
        parser.conn_id = next(_conn_ids)            # frame-log conn_id, unique per process
        if self.frame_cap:
            parser.frame_cap = self.frame_cap
        if self.protocol.advertise:                 # the advertise hook (descriptor)
            parser.local_address = advertise.local_address(local_address)
            parser.upstream_address = self.cfg.upstream
        if isinstance(self.cfg.listen, websocket.WsAddress):
            # fleximq over WebSocket: a layer with the parser's interface decodes the
            # frames and feeds the parser; it answers a bad upgrade on ``client``
            parser = websocket.wrap(parser, self.cfg.listen, self.cfg.upstream,
                                    client.write if client is not None else None,
                                    self.log, self.cfg.name)
        return parser

    def log_to(self, buffer, index, source, sample):
        """Write frame logs of (a ``sample`` fraction of) this route's connections."""
        self.framelog = (buffer, index, source, sample)

    def start_logging(self, parser, peer, transport=None):
        """Sampling is by connection: a sampled connection is logged whole.  A TLS
        connection's version and cipher go to its rows' ``attrs``."""
        if self.framelog is None:
            return
        buffer, index, source, sample = self.framelog
        if sample >= 1.0 or (sample > 0 and random.random() < sample):
            if self.tls is not None:
                source.connection(parser.conn_id, peer, connection_attrs(transport))
            else:
                source.connection(parser.conn_id, peer)
            parser.attach_log(buffer, index)

    def upstream_attrs(self, parser, transport):
        """The upstream side's TLS version and cipher (``upstream_tls_*``) in the rows'
        ``attrs``, once that side is connected."""
        if self.framelog is not None and parser.recording:
            attrs = connection_attrs(transport, "upstream_")
            if attrs:
                self.framelog[2].add_attrs(parser.conn_id, attrs)

    def stop_logging(self, parser):
        if self.framelog is not None and parser.recording:
            self.framelog[2].forget(parser.conn_id)

    async def _sweep(self):
        """Count requests that waited longer than request_timeout (FIFO heads only), in
        slices: at most SWEEP_SLICE timeouts per expire() call and about SWEEP_SLICE of
        them between two yields to the loop, so an upstream that stopped answering
        (hundreds of thousands of requests due at once) never holds up the other
        connections' reads (docs/design.md, "Pending requests")."""
        period = min(1.0, self.cfg.request_timeout / 4)
        while True:
            await asyncio.sleep(period)
            try:
                await self.sweep_once()
            except asyncio.CancelledError:
                raise
            except Exception:                  # never let the sweeper die silently
                log.exception("route %s: timeout sweep failed", self.cfg.name)

    async def sweep_once(self, limit=None):
        """One sweep over this route's connections; yields to the loop between slices."""
        limit = SWEEP_SLICE if limit is None else limit
        now = now_ns()
        self.log.flush()
        mono = time.monotonic()
        done = 0                               # timeouts counted since the last yield
        for conn in list(self.connections):
            while not conn.closed:
                budget = limit - done          # >= 1: a slice spans connections
                n = conn.parser.expire(now, budget)
                done += n + 1
                if done >= limit:
                    done = 0
                    await asyncio.sleep(0)     # let the other connections' reads run
                if n < budget:
                    break                      # this connection is done
            if not conn.closed:
                conn.check_timeouts(mono)

    def stop_accepting(self):
        for acceptor in self.acceptors:
            acceptor.close()
        if self.unix_inode is not None:    # fleximq §6.3.1: the socket file goes too
            remove_unix_socket(self.cfg.listen, self.unix_inode)
            self.unix_inode = None

    async def drain(self, timeout, force=None):
        """Wait for open connections to finish, up to ``timeout`` (or until ``force``,
        an asyncio.Event, is set); then abort the rest."""
        deadline = time.monotonic() + timeout
        while (self.connections and time.monotonic() < deadline
               and not (force is not None and force.is_set())):
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            conn.abort()
        if self._sweeper is not None:
            self._sweeper.cancel()

    def count_close(self, by, reason):
        key = (by, reason)
        self.closed_counts[key] = self.closed_counts.get(key, 0) + 1

    def forget(self, conn):
        if conn in self.connections:
            self.connections.discard(conn)
            self.stats.conn_active -= 1


class ClientSide(ClientCore, asyncio.Protocol):
    """The accepted client connection; owns the upstream side and the parser.  Its reads
    (data_received, _relay) are ClientCore's (proxy/_relaycore.pyx)."""

    def __init__(self, route, spare_fd=None):
        self.route = route
        self.spare_fd = spare_fd     # held for the upstream socket (proxy.acceptor)
        self.transport = None
        self.upstream = None         # UpstreamSide once connected
        self.parser = None
        self.connect_task = None
        self.peer = "?"
        self.client_eof = False
        self.upstream_eof = False
        self.closed = False
        self.paused_by_peer = False  # upstream's write buffer is full
        self.early = []              # client bytes that arrived before upstream was up
        self.half_closed_at = None   # monotonic time of the first FIN (either side)
        self.last_bytes = -1         # parser's byte count at the last sweep
        self.last_active = time.monotonic()
        self.setup_owned = False     # setup_done() is this side's to call (Route.SETUP_LIMIT)
        self.yielding = 0            # bit d: direction d's reading paused until the next
                                     # loop iteration after a big read (_yield)
        self.client_full = False     # our write buffer to the client is over its mark
        self.deferred = 0            # bit d: direction d's reading paused while the rest
                                     # of a read cut at FRAME_CAP waits in the Backlog

    # -- client events ---------------------------------------------------------

    def connection_made(self, transport):
        route = self.route
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = format_peer(peer, transport.get_extra_info("sockname"))
        if len(route.connections) >= route.cfg.max_connections:
            self.drop_spare()
            route.stats.conn_rejected += 1
            route.log.warning("route %s: connection from %s rejected: %d connections open "
                        "(max_connections)", route.cfg.name, self.peer, len(route.connections))
            self.closed = True
            route.count_close("proxy", "limit")
            transport.abort()
            self.setup_owned = True
            route.setup_done()
            return
        self.parser = route.new_parser(transport.get_extra_info("sockname"), transport)
        route.start_logging(self.parser, self.peer, transport)
        if route.faults is not None:       # rules apply from the first byte (proxy.faults)
            route.faults.attach(self)
        route.connections.add(self)
        route.stats.conn_total += 1
        route.stats.conn_active += 1
        transport.set_write_buffer_limits(high=WRITE_HIGH, low=WRITE_LOW)
        transport.pause_reading()          # nothing to relay to until upstream is up
        self.connect_task = route.loop.create_task(self._connect())
        self.connect_task.add_done_callback(self._connect_done)
        self.setup_owned = True

    def _connect_done(self, _task):
        """However _connect() ended (even cancelled before it ran): the route may accept
        again, and the task is dropped: a cancelled one holds its CancelledError, whose
        traceback holds _connect()'s frame and so this object, a cycle only the cyclic GC
        would free."""
        self.connect_task = None
        self.route.setup_done()

    def drop_spare(self):
        """Give back the descriptor held for the upstream socket."""
        if self.spare_fd is not None:
            os.close(self.spare_fd)
            self.spare_fd = None

    def take_spare(self):
        fd, self.spare_fd = self.spare_fd, None
        return fd

    async def _connect(self):
        route = self.route
        target = route.cfg.upstream
        started = time.perf_counter()
        hs = None                          # proxy.tls: the upstream handshake, when TLS
        try:
            if isinstance(target, UnixAddress):
                self.drop_spare()              # the descriptor held since accept
                connect = route.loop.create_unix_connection(lambda: UpstreamSide(self), target)
            elif route.tls is not None and route.tls.originates:
                hs = route.tls.upstream_handshake(lambda: UpstreamSide(self), target[0])
                connect = connect_upstream(route.loop, hs.factory, *target, self.take_spare(),
                                           **hs.kwargs)
            else:
                connect = connect_upstream(route.loop, lambda: UpstreamSide(self), *target,
                                           self.take_spare())   # held since accept
            _, upstream = await asyncio.wait_for(
                connect, route.cfg.connect_timeout + (hs.timeout if hs is not None else 0))
        except asyncio.CancelledError:
            return
        except (OSError, asyncio.TimeoutError) as exc:
            if hs is not None:
                hs.failed(exc, self.peer)
            route.stats.connect_failures += 1
            why = "timed out" if isinstance(exc, asyncio.TimeoutError) else (
                exc.strerror or exc.__class__.__name__)
            route.log.warning("route %s: upstream %s unreachable for client %s: %s",
                        route.cfg.name, format_address(target), self.peer, why)
            self.parser.abandon()          # never reached a server: not request timeouts
            self._finish(abort=False, by="proxy", reason="connect_failed")
            return
        if hs is not None:
            hs.done()
            route.upstream_attrs(self.parser, upstream.transport)
        route.stats.observe_connect(time.perf_counter() - started)
        if self.closed:                    # client gone or broke the protocol meanwhile:
            if self.early:                 # its valid bytes still reach the server
                upstream.transport.write(b"".join(x for x in self.early
                                                  if isinstance(x, bytes)))
            upstream.transport.close()
            return
        self.upstream = upstream
        if route.faults is not None:       # toxics and held frames from here on
            route.faults.connected(self)
        if self.early:
            upstream.transport.writelines(self.early)   # (with faults: markers too)
            self.early = None
            if self.closed:                # a fault rule closed it
                return
        if self.client_eof:
            self._pass_client_eof()
        elif not self.paused_by_peer and not self.deferred & 1:
            self.transport.resume_reading()

    def _yield(self, d):
        """After a read that filled uvloop's buffer with many frames, stop reading
        direction d until the loop's next iteration: libuv reads a readable socket up to
        32 times in a row, so one connection flooding small frames would otherwise hold
        every other connection's reads for milliseconds of parsing.  The read itself was
        relayed whole (its parse cost grows with its frames, not its bytes), so this costs
        two calls per 250 KB of small frames, nothing per byte, and nothing at all for
        big frames (docs/design.md, "Performance principles")."""
        if self.closed or self.yielding & (1 << d):
            return
        if d == 0:
            transport = self.transport
        elif self.upstream is not None:
            transport = self.upstream.transport
        else:
            return
        self.yielding |= 1 << d
        transport.pause_reading()
        self.route.loop.call_soon(self._resume, d)

    def _resume(self, d):
        self.yielding &= ~(1 << d)
        if self.closed or self.upstream is None or self.deferred & (1 << d):
            return                         # _connect() resumes the client once connected;
        if d == 0:                         # _run_slice() after the rest of a cut read
            if not self.paused_by_peer:
                self.transport.resume_reading()
        elif not self.client_full:
            self.upstream.transport.resume_reading()

    def _relay_slow(self, d, data, ok):
        """Rewritten or held bytes, a protocol error, or client bytes before upstream."""
        parser = self.parser
        if d == 0 and self.upstream is None:
            # uvloop may deliver a first read before our pause takes effect: keep it
            # (one read at most, since reading is paused again) until upstream is up.
            self.transport.pause_reading()
            if parser.output is not None:
                self.early.extend(parser.output)
            elif ok:
                self.early.append(data[:ok] if ok < len(data) else data)
        else:
            dest = self.upstream.transport if d == 0 else self.transport
            if parser.output is not None:      # the parser held back or rewrote bytes
                dest.writelines(parser.output)
            elif ok == len(data):
                dest.write(data)
            elif ok:
                dest.write(data[:ok])
        if parser.error is not None:
            self._protocol_error()
        elif parser.more:                  # cut at the frame cap: the rest waits its turn
            self._defer(d, data, ok)

    def _defer(self, d, data, ok):
        """Pause direction d and queue the rest of its read in the loop's Backlog."""
        if self.closed:
            return
        transport = self.transport if d == 0 else self.upstream.transport
        self.deferred |= 1 << d
        transport.pause_reading()
        self.route.backlog.add(self, d, memoryview(data)[ok:])

    def _run_slice(self, d, data):
        """The Backlog's turn for direction d: feed the next slice of the cut read; once
        it is all parsed, direction d reads again (unless something else holds it)."""
        self.deferred &= ~(1 << d)
        if self.closed:
            return
        # as a read would be: through the fault engine's relay_hook while it has one
        (self.relay_hook or self._relay)(d, data)
        if self.deferred & (1 << d) or self.closed or self.upstream is None:
            return                         # cut again, or _connect() resumes it
        if self.yielding & (1 << d):
            return                         # _resume() does
        if d == 0:
            if not self.paused_by_peer:
                self.transport.resume_reading()
        elif not self.client_full:
            self.upstream.transport.resume_reading()

    def eof_received(self):
        self.client_eof = True
        if self.half_closed_at is None:
            self.half_closed_at = time.monotonic()
        if self.upstream is None:
            return _can_half_close(self.transport)  # _connect() passes the EOF on
        if not self.upstream.transport.is_closing():
            self._pass_client_eof()
        if self.upstream_eof:
            self._finish(abort=False, by="client", reason="eof")
            return False
        return _can_half_close(self.transport)  # keep our write side open for the responses

    def _pass_client_eof(self):
        """The client's FIN, passed upstream.  A TLS upstream cannot half-close (uvloop's
        SSL transport has no write_eof), and closing it at once would lose the answers
        to the requests already sent: it is closed once they are answered, or after the
        route's request_timeout."""
        transport = self.upstream.transport
        if transport.can_write_eof() or not self.parser.pending:
            _pass_eof(transport)
            return
        self.eof_deadline = time.monotonic() + self.route.cfg.request_timeout
        self.route.loop.call_later(EOF_POLL, self._deferred_eof)

    def _deferred_eof(self):
        if self.closed or self.upstream is None or self.upstream.transport.is_closing():
            return
        if self.parser.pending and time.monotonic() < self.eof_deadline:
            self.route.loop.call_later(EOF_POLL, self._deferred_eof)
            return
        _pass_eof(self.upstream.transport)

    def connection_lost(self, exc):
        if self.closed:
            return
        self._finish(abort=exc is not None, by="client",
                     reason="reset" if exc is not None else "close")

    def pause_writing(self):               # client is slow to read: stop reading upstream
        self.client_full = True
        if self.upstream is not None:
            self.upstream.transport.pause_reading()

    def resume_writing(self):
        self.client_full = False
        if self.upstream is not None and not (self.yielding | self.deferred) & 2:
            self.upstream.transport.resume_reading()

    # -- upstream events (called by UpstreamSide) ------------------------------

    def upstream_eof_received(self):
        self.upstream_eof = True
        if self.half_closed_at is None:
            self.half_closed_at = time.monotonic()
        if not self.transport.is_closing():
            _pass_eof(self.transport)
        if self.client_eof:
            self._finish(abort=False, by="upstream", reason="eof")
            return False
        return _can_half_close(self.upstream.transport if self.upstream else None)

    def upstream_lost(self, exc):
        if self.closed:
            return
        self._finish(abort=exc is not None, by="upstream",
                     reason="reset" if exc is not None else "close")

    def upstream_pause_writing(self):      # upstream is slow to read: stop reading client
        self.paused_by_peer = True
        self.transport.pause_reading()

    def upstream_resume_writing(self):
        self.paused_by_peer = False
        if not self.closed and not (self.yielding | self.deferred) & 1:
            self.transport.resume_reading()

    # -- teardown ---------------------------------------------------------------

    def parser_crashed(self, d, exc):
        """The parser raised: count it (reason parser_error), one rate-limited line, and
        close this connection; the process and the other connections carry on."""
        route = self.route
        route.stats.count_error(DIRECTIONS[d], "parser_error")
        route.log.warning("route %s: closing connection from %s: the %s parser raised %s: %s",
                          route.cfg.name, self.peer, route.cfg.protocol,
                          type(exc).__name__, str(exc)[:200])
        self._finish(abort=True, by="proxy", reason="parser_error")

    def _protocol_error(self):
        err = self.parser.error
        self.route.log.warning("route %s: closing connection from %s: %s", self.route.cfg.name,
                               self.peer, err)
        self._finish(abort=False, by="proxy", reason="protocol_error")

    def abort(self, reason="shutdown"):
        self._finish(abort=True, by="proxy", reason=reason)

    def check_timeouts(self, now):
        """From the route's sweeper (never per read): a half-closed connection whose other
        side has not closed within half_close_timeout, or one that moved no byte for
        idle_timeout, is closed by the proxy."""
        route = self.route
        if self.half_closed_at is not None and now - self.half_closed_at >= \
                route.half_close_timeout:
            route.log.warning("route %s: closing half-closed connection from %s after %gs",
                              route.cfg.name, self.peer, route.half_close_timeout)
            self.abort("half_close")
            return
        seen = self.parser.bytes_fed
        if seen != self.last_bytes:
            self.last_bytes, self.last_active = seen, now
        elif route.idle_timeout and now - self.last_active >= route.idle_timeout:
            self.abort("idle")

    def _finish(self, abort, by="proxy", reason="close"):
        """Close both sides once: flush buffered bytes unless ``abort`` (a reset)."""
        if self.closed:
            return
        self.closed = True
        self.drop_spare()
        self.route.count_close(by, reason)
        if self.connect_task is not None and not self.connect_task.done() and (
                abort or not self.early):
            self.connect_task.cancel()     # else _connect() delivers the early bytes
        for t in (self.transport, self.upstream.transport if self.upstream else None):
            if t is not None and not t.is_closing():
                t.abort() if abort else t.close()
            elif t is not None and abort:
                t.abort()
        if self.parser is not None:
            try:
                self.parser.close()
            except Exception as exc:       # a broken parser must not break the close
                self.route.log.warning("route %s: parser close failed: %s: %s",
                                       self.route.cfg.name, type(exc).__name__, exc)
            self.route.stop_logging(self.parser)
        self.route.forget(self)


def _pass_eof(transport):
    """A FIN from the other side: half-close ``transport``; a TLS transport cannot
    (uvloop), so it is closed once its buffered bytes are written (proxy.tls)."""
    if transport.can_write_eof():
        transport.write_eof()
    else:
        transport.close()


def _can_half_close(transport):
    """What eof_received returns: keep the transport open for the other direction
    (plain TCP); a TLS transport closes after close_notify whatever it returns."""
    return transport is None or transport.can_write_eof()


class UpstreamSide(UpstreamCore, asyncio.Protocol):
    """The connection to the upstream server; forwards every event to its ClientSide (its
    reads through UpstreamCore.data_received, proxy/_relaycore.pyx)."""

    def __init__(self, client):
        self.client = client
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH, low=WRITE_LOW)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def eof_received(self):
        return self.client.upstream_eof_received()

    def connection_lost(self, exc):
        client = self.client
        client.upstream_lost(exc)
        if client.closed:
            # break the ClientSide <-> UpstreamSide cycle: both go by reference counting
            # instead of waiting for the cyclic GC (tens of MB at thousands of connections)
            client.upstream = None

    def pause_writing(self):
        self.client.upstream_pause_writing()

    def resume_writing(self):
        self.client.upstream_resume_writing()
