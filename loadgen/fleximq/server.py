"""The fleximq reference broker: ``frametap serve fleximq --listen ADDR [--listen ADDR]``.

No fleximq implementation exists to copy, so this broker follows the fleximq document to
the letter, and docs/design.md ("fleximq") where the document contradicts itself.  Every
other choice the document leaves open is made here, and listed here:

Transport (§6)
    TCP (``host:port``), Unix stream sockets (``unix:/path``; IPC, §6.1) and WebSocket
    (``ws://host:port/path``; ``wss://`` with ``--tls-cert``/``--tls-key``, which make
    only the wss:// listeners TLS), any number of ``--listen``.  A relative Unix path is
    resolved under /tmp (§6.3.1's example).  A Unix listener creates its socket's parent
    directory when only that one level is missing (more missing: a start-up error),
    replaces a stale socket file, refuses a live one, and removes its socket file on
    shutdown (§6.3.1).  WebSocket (loadgen/wsstream.py, the ``websockets`` library's
    protocol): an upgrade to another path than the listener's gets 404 (a listener on
    ``/`` takes any path); no extension is negotiated; each frame the broker sends is one
    binary message, and what it receives is the concatenation of the binary messages'
    payloads, so frames may be packed several to a message or split across messages;
    text messages are ignored.  STDIO is not offered.

Framing and limits (§2.1, §7.1)
    The 34-byte prefix with payload_length in it (docs/design.md).  A header over 64 KiB
    or a frame over ``--max-frame-bytes`` (default 1 GiB) is refused on its prefix: one
    log line and the connection is closed (nothing can be answered without reading it).
    Reserved bytes are ignored (§7.3.1).  Payloads are never decoded: they are
    application data and are forwarded byte for byte.

JOIN (§3.2, §4)
    The first message must be a JOIN; anything else before it gets REP 400 and the
    connection is closed; a second JOIN gets REP 400 (connection kept).  A JOIN that
    breaks a header rule (a non-zero ClientID, a forbidden key) gets REP 400 and is not
    accepted (the connection may JOIN again).  A JOIN may carry ``reqrep``
    (``type: "request"``); the answer then echoes it as ``correlation``.
    Authentication: with no credentials configured, ``auth`` is ignored and everyone
    joins.  With credentials (``--token``, ``--user NAME:PASSWORD``, ``--api-key``), a
    JOIN without ``auth`` or with credentials that match none of the configured ones of
    its type gets REP 401 and a close; an ``auth`` that is not a map, has no or an
    unsupported ``type``, or lacks / mistypes the fields of its type gets REP 604 and a
    close.  Credentials are never logged.
    Success: a REP whose base-header ClientID is the assigned id, header
    ``{"status": 200}`` (+ reqrep), payload ``{"client_id": id}``.  ClientIDs are given
    out increasing from 1000 and never reused while the broker runs; after 4294967294
    they wrap to 1000, skipping ids in use (§4.1.2).  Every later frame must carry the
    assigned ClientID; one that does not gets REP 400 and is dropped.

Frames the broker makes
    Its own frames (JOIN answers aside) carry ClientID 1 (BROKER); frames it forwards
    (REQ, REP, NOTIF, BCAST, PUB) go out byte for byte, the sender's ClientID kept.  Error
    answers are REPs routed to the sender with the offending frame's ``reqrep.id`` echoed
    when it had one, and payload ``{"error": "<reason>"}``.

Validation (§2.2.3, §7.3.1, §7.4)
    Every frame is checked against its type's required and forbidden keys, the routing
    counts (exactly one entry on REQ/REP, at least one on NOTIF, every entry with an
    unsigned 32-bit ``client_id``; ``path`` is optional), ``reqrep.type`` ("request" on
    REQ and JOIN, "correlation" on REP) and ``reqrep.id`` (a string), the
    ``keepalive.timestamp``, and value types.  A breach is answered with REP 602 when it
    concerns ``routing`` (missing, forbidden, empty, wrong count, wrong type, no
    client_id) and REP 400 otherwise; the frame is dropped and the connection stays
    open.  A header that is not a MessagePack map gets REP 400; version != 1 gets REP 400;
    an unknown message type gets REP 501 (§5.1.3: "unrecognized message type").  A PING
    that breaks a rule still gets its PONG (timestamp echoed; 0 when it had none) after
    the REP.

Routing
    REQ: forwarded to ``routing[0].client_id``; REP 600 to the requester when that client
    is not joined (never was, or left).  A REQ addressed to the broker (ClientID 1) gets
    REP 501: the broker offers no request handlers.  REP: forwarded to
    ``routing[0].client_id`` (the requester); when that client is gone, the responder gets
    a NOTIF with status 600 listing it (a REP never answers a REP).  The broker does not
    check that a REP answers a REQ it forwarded: correlation is the clients' business.
    NOTIF: delivered once to every distinct joined target; the targets that are not
    joined are reported back to the sender in one NOTIF (status 600, ``routing`` = those
    entries as sent).  BCAST: to every other joined client.  PUB: to every subscriber of
    the topic (the publisher too, when subscribed), or with ``routing``, only to the
    subscribers it lists; a PUB nobody receives is dropped silently (601 is never sent).
    SUB/UNSUB: silent, idempotent, effective at once (no delivery after UNSUB is read);
    topic names are case-sensitive strings, the empty name included, no wildcards
    (§7.3.3).  A target whose unsent bytes exceed 16 MiB is not written to: a REQ for it
    gets REP 503, other frames for it are dropped and counted (``dropped``).

Keepalive (§3.7)
    A PING gets a PONG with the same timestamp.  The broker pings a client that sent
    nothing for ``--ping-interval`` seconds (default 30, 0: never; the PING suggests that
    interval) and closes a connection that sends nothing for ``--pong-timeout`` seconds
    after such a PING (default 3 x the interval, §7.3.2).  Any frame counts as a sign of
    life (so a PONG's timestamp is not checked against the broker's PINGs).

Service time
    ``--service-time`` delays the broker's own answers (JOIN answers, errors, PONGs);
    forwarded frames leave at once (their latency is the clients').
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from loadgen.servecli import CommandLineError, serve_main, service_time_arg, user_arg
from loadgen.serverthread import ServerThread
from loadgen.serverbase import ReferenceServer, ServerConnection
from proxy.addresses import (UnixAddress, format_address, parse_address,
                             remove_unix_socket, unix_listener)
from loadgen.wsstream import server_streams
from proxy import websocket
from proxy.errors import ConfigError
from proxy.protocols.fleximq import codec, header as hdr
from proxy.protocols.fleximq.codec import JOIN, REQ, REP, NOTIF, PING, PONG
from proxy.protocols.fleximq.constants import PREFIX, MAX_FRAME_BYTES, VERSION, BROKER_ID

log = logging.getLogger("frametap.fleximq")

FIRST_ID = 1000
LAST_ID = 4294967294
TARGET_HIGH_WATER = 16 * 1024 * 1024
AUTH_FIELDS = {"token": ("token",), "basic": ("username", "password"),
               "api_key": ("api_key",)}


class _Raw:
    """A received frame: prefix fields, the raw header and the whole frame's bytes."""

    __slots__ = ("version", "type", "client_id", "header_raw", "data", "summary", "_header")

    def __init__(self, version, mtype, client_id, header_raw, data):
        self.version = version
        self.type = mtype
        self.client_id = client_id
        self.header_raw = header_raw
        self.data = data
        self.summary = None
        self._header = None

    @property
    def header(self) -> dict:
        if self._header is None:
            frame, _ = codec.decode(self.data)
            self._header = frame.header
        return self._header


class FlexiMQConnection(ServerConnection):
    """One client connection: its ClientID once joined, its subscriptions."""

    def __init__(self, server, reader, writer, role=""):
        super().__init__(server, reader, writer, role)
        self.client_id: int | None = None
        self.topics: set[str] = set()
        self.pings: dict[int, float] = {}     # the broker's unanswered PINGs: ts -> sent
        if self.peer == "?" and role:
            self.peer = role

    def split_frame(self, buf):
        if len(buf) < PREFIX:
            return None
        v, t, cid, _res, hlen, plen = codec.decode_prefix(buf, self.server.max_frame_bytes)
        end = PREFIX + hlen + plen
        if len(buf) < end:
            return None
        data = bytes(buf[:end])
        return _Raw(v, t, cid, data[PREFIX:PREFIX + hlen], data), end

    def frame_received(self, frame, received: float) -> None:
        self.server.handle(self, frame, received)

    def joined(self, client_id: int) -> None:
        self.client_id = client_id
        if self.server.ping_interval:
            self.spawn(self._keepalive())

    async def _keepalive(self) -> None:
        """Ping when idle for ping_interval; close when a ping stays unanswered (no frame
        at all) for pong_timeout."""
        srv = self.server
        while not self.closed:
            now = self._loop.time()
            if self.pings:
                left = srv.pong_timeout - (now - min(self.pings.values()))
                if left <= 0:
                    srv.log_peer(logging.INFO, "%s: closing %s: no answer to a ping in "
                                 "%.1fs", srv.what, self.peer, srv.pong_timeout)
                    self.abort()
                    return
                await asyncio.sleep(left)
                continue
            idle = now - self.last_read
            if idle >= srv.ping_interval:
                ts = codec.now_ms()
                self.pings[ts] = now
                self.send(codec.ping(BROKER_ID, ts, max(1, round(srv.ping_interval))))
                continue
            await asyncio.sleep(srv.ping_interval - idle)

    def connection_lost(self) -> None:
        self.server.forget(self)

    @property
    def unsent(self) -> int:
        return self.unsent_bytes()


class FlexiMQBroker(ReferenceServer):
    """The broker's state: joined clients by ClientID, subscribers by topic."""

    what = "fleximq broker"
    log = log
    connection_class = FlexiMQConnection
    ordered_replies = False

    def __init__(self, listen=(("127.0.0.1", 7890),), tokens=(), users=None, api_keys=(),
                 ping_interval=30.0, pong_timeout=None, service_time=None,
                 max_frame_bytes=MAX_FRAME_BYTES):
        super().__init__(service_time)
        self.listen_addresses = [a if isinstance(a, (UnixAddress, tuple)) else
                                 websocket.parse_url(a, "--listen", listen=True) if websocket.is_url(a) else
                                 parse_address(a, "--listen", True, True) for a in listen]
        self.tokens = set(tokens)
        self.users = dict(users or {})
        self.api_keys = set(api_keys)
        self.ping_interval = float(ping_interval or 0)
        self.pong_timeout = (float(pong_timeout) if pong_timeout else
                             3 * self.ping_interval)
        self.max_frame_bytes = max_frame_bytes
        self.clients: dict[int, FlexiMQConnection] = {}
        self.topics: dict[str, set[FlexiMQConnection]] = {}
        self.next_id = FIRST_ID
        self.bound: list = []                 # (host, port) or UnixAddress, as bound
        self._unix: list = []                 # (path, inode) to remove on close
        self.dropped = 0
        self.errors_sent: dict[int, int] = {}   # status -> error REPs sent

    @property
    def auth_required(self) -> bool:
        return bool(self.tokens or self.users or self.api_keys)

    # ---------------------------------------------------------------- listeners

    async def start(self) -> None:
        try:
            for addr in self.listen_addresses:
                await self.listen_on(addr)
        except BaseException:
            await self.close()
            raise

    async def listen_on(self, addr):
        if isinstance(addr, websocket.WsAddress):     # fleximq over WebSocket (§6.1)
            path, size = addr.path, self.max_frame_bytes
            if addr.scheme == "wss" and self.ssl_context is None:
                raise CommandLineError("--listen %s: wss:// needs --tls-cert and --tls-key"
                                       % addr.url())
            listener = await asyncio.start_server(
                lambda r, w: self._serve_connection(*server_streams(r, w, path, size),
                                                    role=addr.url()), addr[0], addr[1],
                ssl=self.ssl_context if addr.scheme == "wss" else None)
            self._listeners.append(listener)
            bound = websocket.WsAddress(addr[0], listener.sockets[0].getsockname()[1],
                                        addr.scheme, addr.path)
            self._roles[listener] = bound.url()
            self.bound.append(bound)
            return bound
        if isinstance(addr, UnixAddress):
            sock, inode = unix_listener(addr)
            self._unix.append((str(addr), inode))
            role = format_address(addr)
            listener = await asyncio.start_unix_server(
                lambda r, w: self._serve_connection(r, w, role), sock=sock)
            self._listeners.append(listener)
            self.bound.append(addr)
            return addr
        port = await self.listen(addr[0], addr[1])
        self.bound.append((addr[0], port))
        return (addr[0], port)

    async def close(self) -> None:
        await super().close()
        for path, inode in self._unix:
            remove_unix_socket(path, inode)
        self._unix = []

    @property
    def addresses(self) -> list[str]:
        return [a.url() if isinstance(a, websocket.WsAddress) else format_address(a)
                for a in self.bound]

    # ---------------------------------------------------------------- output helpers

    def _error(self, conn, status, why, rid=None, due=None):
        """A REP routed to the sender: the broker's answer to a frame it refuses."""
        h = {"routing": [{"client_id": conn.client_id or 0}], "status": status}
        if rid is not None:
            h["reqrep"] = {"type": "correlation", "id": rid}
        self.errors_sent[status] = self.errors_sent.get(status, 0) + 1
        conn.send(codec.encode(REP, BROKER_ID, h, {"error": why}), due)

    def _close_after(self, conn, status, why, rid=None):
        self._error(conn, status, why, rid)
        self.log_peer(logging.INFO, "%s: closing %s: %s", self.what, conn.peer, why)
        conn.abort()                           # the REP is in the transport: it leaves

    def _deliver(self, target, data) -> bool:
        if target.closed:
            return False
        if target.unsent > TARGET_HIGH_WATER:
            self.dropped += 1
            return False
        target.send(data)
        return True

    # ---------------------------------------------------------------- frames

    def handle(self, conn: FlexiMQConnection, f: _Raw, received: float) -> None:
        due = conn.reply_due(received)
        conn.pings.clear()                     # any frame is a sign of life
        s = f.summary = hdr.summarize(f.header_raw)
        rid = s.rr_id.decode() if s.rr_id is not None else None
        if conn.client_id is None and f.type != JOIN:
            self._close_after(conn, 400, "the first message must be a JOIN", rid)
            return
        if f.version != VERSION:
            self._error(conn, 400, "unsupported version %d" % f.version, rid, due)
            return
        if f.type > PONG:
            self._error(conn, 501, "unknown message type %d" % f.type, rid, due)
            return
        if s.malformed:
            self._error(conn, 400, "the header is not a MessagePack map", None, due)
            return
        if f.type == JOIN:
            self._join(conn, f, s, rid, due)
            return
        if f.client_id != conn.client_id:
            self._error(conn, 400, "ClientID %d is not this connection's %d" % (
                f.client_id, conn.client_id), rid, due)
            return
        status = self._check(f.type, f.client_id, s)
        if status:
            self._error(conn, status, "the %s header breaks a rule of §2.2.3/§7.3.1" %
                        hdr.TYPE_NAMES[f.type], rid, due)
            if f.type == PING:
                conn.send(codec.pong(BROKER_ID, s.ts if s.has_ts else 0), due)
            return
        getattr(self, "_on_" + hdr.TYPE_NAMES[f.type].lower())(conn, f, s, rid, due)

    @staticmethod
    def _check(mtype, client_id, s) -> int:
        """0, or the status of the broken rule: 602 routing, 400 anything else."""
        p = s.present
        routing_bad = (
            s.badtype & hdr.ROUTING
            or (p & hdr.ROUTING and not hdr.ALLOWED[mtype] & hdr.ROUTING)
            or (hdr.REQUIRED[mtype] & hdr.ROUTING and not p & hdr.ROUTING)
            or (s.nroute >= 0 and (s.noid or (mtype in (REQ, REP) and s.nroute != 1)
                                   or (mtype == NOTIF and s.nroute == 0))))
        if routing_bad:
            return 602
        if s.badtype or hdr.rule_violation(mtype, client_id, s):
            return 400
        return 0

    def _join(self, conn, f, s, rid, due):
        if conn.client_id is not None:
            self._error(conn, 400, "already joined", rid, due)
            return
        if s.badtype & ~hdr.AUTH or hdr.rule_violation(JOIN, f.client_id, s):
            self._error(conn, 400, "the JOIN breaks a header rule (ClientID must be 0; "
                                   "only auth and reqrep are allowed)", rid, due)
            return
        if self.auth_required:
            verdict = self._authenticate(f.header.get("auth") if s.present & hdr.AUTH
                                         else None)
            if verdict:
                self._close_after(conn, verdict[0], verdict[1], rid)
                return
        cid = self._assign()
        self.clients[cid] = conn
        conn.joined(cid)
        h = {"status": 200}
        if rid is not None:
            h["reqrep"] = {"type": "correlation", "id": rid}
        conn.send(codec.encode(REP, cid, h, {"client_id": cid}), due)

    def _authenticate(self, auth):
        """None when the credentials are accepted, else (status, reason)."""
        if auth is None:
            return 401, "authentication required"
        if not isinstance(auth, dict) or auth.get("type") not in AUTH_FIELDS:
            return 604, "malformed auth object or unsupported auth type"
        kind = auth["type"]
        values = [auth.get(k) for k in AUTH_FIELDS[kind]]
        if not all(isinstance(v, str) for v in values):
            return 604, "auth type %s needs %s (strings)" % (kind, ", ".join(AUTH_FIELDS[kind]))
        ok = (values[0] in self.tokens if kind == "token" else
              values[0] in self.api_keys if kind == "api_key" else
              values[0] in self.users and self.users[values[0]] == values[1])
        return None if ok else (401, "invalid credentials")

    def _assign(self) -> int:
        while True:
            cid = self.next_id
            self.next_id = FIRST_ID if cid >= LAST_ID else cid + 1
            if cid not in self.clients:
                return cid

    def _targets(self, f):
        routing = f.header.get("routing") or []
        return routing

    def _on_req(self, conn, f, s, rid, due):
        target = s.targets[0]
        if target == BROKER_ID:
            self._error(conn, 501, "the broker offers no request handlers", rid, due)
            return
        dest = self.clients.get(target)
        if dest is None:
            self._error(conn, 600, "client %d not found" % target, rid, due)
            return
        if not self._deliver(dest, f.data):
            self._error(conn, 503, "client %d is not reading" % target, rid, due)

    def _on_rep(self, conn, f, s, rid, due):
        target = s.targets[0]
        dest = self.clients.get(target)
        if dest is None:
            self._gone(conn, [e for e in self._targets(f)], due)
            return
        self._deliver(dest, f.data)

    def _gone(self, conn, entries, due):
        conn.send(codec.encode(NOTIF, BROKER_ID, {"routing": entries, "status": 600},
                               {"error": "client not found"}), due)

    def _on_notif(self, conn, f, s, rid, due):
        missing, seen = [], set()
        for e in self._targets(f):
            cid = e["client_id"]
            dest = self.clients.get(cid)
            if dest is None:
                missing.append(e)
            elif cid not in seen:
                seen.add(cid)
                self._deliver(dest, f.data)
        if missing:
            self._gone(conn, missing, due)

    def _on_bcast(self, conn, f, s, rid, due):
        for dest in list(self.clients.values()):
            if dest is not conn:
                self._deliver(dest, f.data)

    def _on_pub(self, conn, f, s, rid, due):
        subs = self.topics.get(s.topic.decode())
        if not subs:
            return
        if s.present & hdr.ROUTING:
            wanted = {e["client_id"] for e in self._targets(f)}
            subs = [c for c in subs if c.client_id in wanted]
        for dest in list(subs):
            self._deliver(dest, f.data)

    def _on_sub(self, conn, f, s, rid, due):
        topic = s.topic.decode()
        self.topics.setdefault(topic, set()).add(conn)
        conn.topics.add(topic)

    def _on_unsub(self, conn, f, s, rid, due):
        topic = s.topic.decode()
        subs = self.topics.get(topic)
        if subs is not None:
            subs.discard(conn)
            if not subs:
                del self.topics[topic]
        conn.topics.discard(topic)

    def _on_ping(self, conn, f, s, rid, due):
        conn.send(codec.pong(BROKER_ID, s.ts), due)

    def _on_pong(self, conn, f, s, rid, due):
        pass                                   # handle() already took it as a sign of life

    def forget(self, conn) -> None:
        if conn.client_id is not None and self.clients.get(conn.client_id) is conn:
            del self.clients[conn.client_id]
        for topic in conn.topics:
            subs = self.topics.get(topic)
            if subs is not None:
                subs.discard(conn)
                if not subs:
                    del self.topics[topic]
        conn.topics.clear()


class FlexiMQBrokerThread(ServerThread):
    """A :class:`FlexiMQBroker` on its own event loop in a background thread (tests, the
    demo)::

        with FlexiMQBrokerThread(listen=["127.0.0.1:0", "unix:/tmp/fx/b.sock"]) as b:
            FlexiMQClient(b.address)
    """

    thread_name = "fleximq-broker"
    what = "fleximq broker"
    cancel_pending_tasks = False

    def __init__(self, **kwargs):
        kwargs.setdefault("listen", ["127.0.0.1:0"])
        super().__init__(FlexiMQBroker(**kwargs))

    @property
    def address(self) -> str:
        return self.server.addresses[0]

    @property
    def addresses(self) -> list[str]:
        return self.server.addresses

    @property
    def port(self) -> int:
        return next(a[1] for a in self.server.bound if isinstance(a, tuple))


# ---------------------------------------------------------------- command line

def _listen_arg(text: str):
    try:
        if websocket.is_url(text):
            return websocket.parse_url(text, "--listen", listen=True)
        return parse_address(text, "--listen", allow_port_zero=True, allow_unix=True)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--listen ")) from None


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = -1
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of seconds >= 0")
    return v


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < PREFIX:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= {PREFIX}")
    return int(text)


def build_parser(prog: str = "frametap serve fleximq") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run the in-memory reference fleximq broker until SIGINT/SIGTERM.",
        epilog="examples:\n  frametap serve fleximq --listen 127.0.0.1:7890 "
               "--listen unix:/tmp/fleximq/broker.sock\n"
               "  frametap serve fleximq --token s3cret --user alice:pw --ping-interval 10")
    p.add_argument("--listen", type=_listen_arg, action="append", default=None,
                   metavar="ADDR", help="HOST:PORT, unix:/path or ws[s]://HOST:PORT/PATH "
                                        "(repeatable; default 127.0.0.1:7890)")
    p.add_argument("--token", action="append", default=[], metavar="TOKEN",
                   help="accept this bearer token in JOIN (repeatable)")
    p.add_argument("--user", type=user_arg, action="append", default=[],
                   metavar="NAME:PASSWORD", help="accept this basic-auth user (repeatable)")
    p.add_argument("--api-key", action="append", default=[], metavar="KEY",
                   help="accept this API key (repeatable)")
    p.add_argument("--ping-interval", type=_seconds, default=30.0, metavar="S",
                   help="ping a client idle this long (default 30; 0: never)")
    p.add_argument("--pong-timeout", type=_seconds, default=None, metavar="S",
                   help="close a client silent this long after a ping (default 3 x interval)")
    p.add_argument("--service-time", type=service_time_arg, default=None, metavar="DIST",
                   help="delay the broker's own answers: '0', '500us', '2ms±1ms', 'exp:2ms'")
    p.add_argument("--max-frame-bytes", type=_positive_int, default=MAX_FRAME_BYTES,
                   metavar="N", help=f"largest frame accepted (default {MAX_FRAME_BYTES})")
    p.add_argument("--log-level", default="INFO",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def _make_server(args):
    listen = args.listen or [("127.0.0.1", 7890)]
    if args.pong_timeout is not None and args.ping_interval == 0:
        raise CommandLineError("--pong-timeout needs --ping-interval > 0")
    broker = FlexiMQBroker(listen=listen, tokens=args.token, users=dict(args.user),
                           api_keys=args.api_key, ping_interval=args.ping_interval,
                           pong_timeout=args.pong_timeout, service_time=args.service_time,
                           max_frame_bytes=args.max_frame_bytes)
    return broker, ", ".join(a.url() if isinstance(a, websocket.WsAddress)
                             else format_address(a) for a in listen)


def main(argv: list[str] | None = None) -> int:
    """``frametap serve fleximq`` entry point; returns the exit status."""
    return serve_main(build_parser(), argv, _make_server,
                      lambda b: "fleximq: listening on " + ", ".join(b.addresses))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
