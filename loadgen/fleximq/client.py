"""A synchronous fleximq client over a plain socket (TCP, ``unix:/path`` or WebSocket
``ws://host:port/path``, one frame per binary message; ``wss://`` verifies the server
as the ``--tls-*`` options / ``FRAMETAP_TLS_*`` say, the system's CAs by default);
gevent can patch it, so the Locust users use it too.

    c = FlexiMQClient("127.0.0.1:7890")          # or "unix:/tmp/fleximq/broker.sock"
    c.join(auth={"type": "token", "token": "t"})  # -> the assigned ClientID
    rep = c.request(1001, "/api/users", {"id": 7})
    req = c.next_request(); c.reply(req, {"name": "x"})

Frames that arrive while the client waits for something else are kept, in order, for
the next :meth:`recv` / :meth:`wait`.  PINGs from the broker are answered at once (a PONG
with the same timestamp) unless ``auto_pong=False``.  Request ids are ULIDs.
"""

from __future__ import annotations

import socket
import time
from collections import deque

from loadgen.clientbase import SocketClient, connect_tcp
from loadgen.wsstream import ClientWebSocket
from proxy import websocket
from proxy.addresses import UnixAddress, parse_address
from proxy.protocols.fleximq import codec
from proxy.protocols.fleximq.codec import JOIN, REQ, REP, PUB, PING, PONG
from proxy.protocols.fleximq.constants import MAX_FRAME_BYTES, log_correlation_id


class FlexiMQError(Exception):
    """The broker (or a peer) answered with an error status."""

    def __init__(self, status, message="", frame=None):
        super().__init__("status %s%s" % (status, ": " + message if message else ""))
        self.status = status
        self.frame = frame


def _error_text(frame) -> str:
    try:
        body = frame.body()
    except Exception:
        return ""
    return body.get("error", "") if isinstance(body, dict) else ""


class FlexiMQClient(SocketClient):
    """One fleximq connection (see the module docstring); the read loop is
    :class:`~loadgen.clientbase.SocketClient`'s, the framing the codec's ``decode``."""

    what = "fleximq"

    def __init__(self, address, timeout: float = 10.0, auto_pong: bool = True,
                 max_frame_bytes: int = MAX_FRAME_BYTES):
        self.ws = None              # loadgen.wsstream.ClientWebSocket for a ws:// address
        url = address if websocket.is_url(address) else None
        if url is not None:
            address = websocket.parse_url(address, "address")
        elif isinstance(address, str):
            address = parse_address(address, "address", allow_unix=True)
        self.address = address
        self.timeout = timeout
        self.auto_pong = auto_pong
        if isinstance(address, UnixAddress):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            try:
                sock.connect(address)
            except OSError:
                sock.close()
                raise
        elif url is not None:           # the scheme says TLS or not; --tls-* say how
            from loadgen.tlsopts import ClientTLS, default
            tls = (default() or ClientTLS()) if address.scheme == "wss" else None
            sock = connect_tcp(address[0], address[1], timeout, tls=tls)
        else:
            sock = connect_tcp(address[0], address[1], timeout)
        self._sock = sock
        self._connected(sock)
        self.max_frame_bytes = max_frame_bytes
        self.inbox: deque = deque()
        self.client_id = 0
        self.pongs_sent = 0
        if url is not None:             # fleximq over WebSocket (§6.1): one frame a message
            self.ws = ClientWebSocket(sock, url, max_frame_bytes)
            try:
                self.ws.handshake()
            except (OSError, ValueError):
                self.close()
                raise
            self._rbuf += self.ws.take_pending()
            self._frames_in()

    def _connected(self, sock) -> None:
        if sock.family == socket.AF_UNIX:
            SocketClient._connected(self, _UnixName())
            # the proxy logs a Unix client as unix:<the path it listens on>
            self.local_address = "unix:" + self.address
            self.remote_address = "unix:" + self.address
        else:
            SocketClient._connected(self, sock)

    def close(self) -> None:
        """Close the connection (idempotent); over WebSocket a close frame goes first."""
        if self.ws is not None and self._sock is not None:
            self.ws.close()
        super().close()

    # ---------------------------------------------------------------- raw frames

    def send(self, data: bytes) -> None:
        if self._sock is None:
            raise ConnectionError("fleximq client is closed")
        if self.ws is not None:
            self.ws.send(data)
        else:
            self._send_frame(data)

    def split_frame(self, buf):
        return codec.decode(buf, self.max_frame_bytes)

    def bytes_in(self, data: bytes) -> bytes:
        return self.ws.receive(data) if self.ws is not None else data

    def _read(self, deadline) -> None:
        frame = self._read_frame(deadline)
        if frame is None:
            raise TimeoutError("fleximq: no answer in %.1fs" % self.timeout)
        self._frame_in(frame)
        self._frames_in()

    def _frames_in(self) -> None:
        """Handle the frames that arrived with the last read (PINGs are answered now)."""
        frame = self.take_frame()
        while frame is not None:
            self._frame_in(frame)
            frame = self.take_frame()

    def _frame_in(self, f) -> None:
        if f.type == PING and self.auto_pong and isinstance(f.header.get("keepalive"), dict):
            self.send(codec.pong(self.client_id, f.header["keepalive"].get("timestamp", 0)))
            self.pongs_sent += 1
            return
        self.inbox.append(f)

    def wait(self, match, timeout: float | None = None):
        """The first frame (kept or arriving) for which ``match(frame)`` is true; the
        others stay for later, in order."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        checked = 0
        while True:
            while checked < len(self.inbox):
                f = self.inbox[checked]
                if match(f):
                    del self.inbox[checked]
                    return f
                checked += 1
            if self._sock is None:
                raise ConnectionError("fleximq client is closed")
            self._read(deadline)

    def recv(self, timeout: float | None = None):
        """The next frame (PINGs answered and skipped when auto_pong)."""
        return self.wait(lambda f: True, timeout)

    # ---------------------------------------------------------------- the protocol

    def join(self, auth=None, rid=None, check=True):
        """JOIN (§4.2), with a reqrep id (a ULID unless given) that the answer echoes;
        returns the assigned ClientID.  FlexiMQError on a refusal."""
        rid = rid or codec.ulid()
        self.send(codec.join(auth, rid))
        sent = self._sent(log_correlation_id(rid), JOIN, "JOIN")
        f = self.wait(lambda f: f.type == REP)
        status = f.status if f.status is not None else 200
        sent.status = str(status)
        if check and not 200 <= status <= 299:
            raise FlexiMQError(status, _error_text(f), f)
        self.client_id = f.client_id
        return f.client_id

    def send_request(self, target: int, path=None, payload=None, rid=None) -> str:
        """Send a REQ without waiting; returns its reqrep.id."""
        rid = rid or codec.ulid()
        self.send(codec.req(self.client_id, target, rid, path, payload))
        self._sent(log_correlation_id(rid), REQ, "REQ")
        return rid

    def wait_reply(self, rid: str, timeout=None, check=True):
        f = self.wait(lambda f: f.type == REP and f.rid == rid, timeout)
        status = f.status if f.status is not None else 200
        if self.recent and self.recent[-1].correlation_id == log_correlation_id(rid):
            self.recent[-1].status = str(status)
        if check and not 200 <= status <= 299:
            raise FlexiMQError(status, _error_text(f), f)
        return f

    def request(self, target: int, path=None, payload=None, timeout=None, check=True):
        """REQ to ``target``, then its REP (FlexiMQError for a non-2xx status)."""
        return self.wait_reply(self.send_request(target, path, payload), timeout, check)

    def next_request(self, timeout=None):
        return self.wait(lambda f: f.type == REQ, timeout)

    def discard(self, keep=None):
        """Drop the frames kept in the inbox, except those ``keep(frame)`` is true for
        (a responder keeps the REQs that arrived with the one it answered)."""
        self.inbox = deque(f for f in self.inbox if keep is not None and keep(f))

    def reply(self, req, payload=None, status=None):
        """Answer a REQ frame: a REP routed back to its sender, same reqrep.id."""
        entry = (req.header.get("routing") or [{}])[0]
        self.send(codec.rep(self.client_id, req.client_id, req.rid, status, payload,
                            entry.get("path") if isinstance(entry, dict) else None))

    def notify(self, targets, path=None, payload=None, status=None):
        self.send(codec.notif(self.client_id, targets, path, payload, status))

    def broadcast(self, payload=None, status=None):
        self.send(codec.bcast(self.client_id, payload, status))

    def publish(self, topic: str, payload=None, routing=None):
        self.send(codec.pub(self.client_id, topic, payload, routing))
        self._sent(None, PUB, "PUB", "oneway")

    def subscribe(self, topic: str):
        self.send(codec.sub(self.client_id, topic))

    def unsubscribe(self, topic: str):
        self.send(codec.unsub(self.client_id, topic))

    def send_ping(self, ts=None) -> int:
        ts = codec.now_ms() if ts is None else ts
        self.send(codec.ping(self.client_id, ts))
        self._sent(log_correlation_id(ping_ts=ts), PING, "PING")
        return ts

    def ping(self, ts=None, timeout=None) -> float:
        """PING, then its PONG (same timestamp); returns the round trip in seconds."""
        start = time.perf_counter()
        ts = self.send_ping(ts)
        self.wait(lambda f: f.type == PONG and
                  (f.header.get("keepalive") or {}).get("timestamp") == ts, timeout)
        if self.recent:
            self.recent[-1].status = "200"
        return time.perf_counter() - start


class _UnixName:
    """What SocketClient._connected reads of a socket, for a Unix one (the local address
    it derives is replaced right after)."""

    @staticmethod
    def getsockname():
        return ("unix", 0)
