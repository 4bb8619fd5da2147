"""What every sync client shares (the Locust users' clients over a plain ``socket``,
which gevent can patch): :class:`SocketClient`, their base, with the one read loop.

A protocol's client subclasses :class:`SocketClient`, connects with :func:`connect_tcp`
(TCP_NODELAY; TLS when ``--tls`` / ``FRAMETAP_TLS*`` say so), calls
:meth:`~SocketClient._connected` and, per request frame it sends,
:meth:`~SocketClient._sent` (the client-side frame log's rows). For what it receives it
says only how to cut a frame off the bytes (:meth:`~SocketClient.split_frame`, the same
hook as the reference servers' :meth:`loadgen.serverbase.ServerConnection.split_frame`)
and reads with :meth:`~SocketClient._read_frame`. :func:`parse_host` reads Locust's
``--host``.
"""

from __future__ import annotations

import itertools
import socket
import ssl
import time
from collections import deque

from loadgen import tlsopts
from proxy.addresses import format_peer

__all__ = ["parse_host", "connect_tcp", "DEFAULT_TLS", "SocketClient", "SentRequest",
           "SOCKET_TIMEOUT", "READ_SIZE"]

#: Bytes asked of the socket per read (as the reference servers' ``READ_SIZE``).
READ_SIZE = 256 * 1024

#: ``_read_frame(deadline=SOCKET_TIMEOUT)``: read within the socket's own timeout (the
#: one the connection was opened with); its expiry is a socket error like any other.
SOCKET_TIMEOUT = object()


def parse_host(host: str | None, schemes: tuple[str, ...], default_port: int,
               missing: str) -> tuple[str, int]:
    """``scheme://h:p``, ``h:p``, ``[v6]:p`` or ``h`` -> ``(h, p)``; ValueError otherwise.

    ``schemes``: accepted URL schemes (the first is named in the error); ``missing``:
    the error message when ``host`` is empty.
    """
    if not host:
        raise ValueError(missing)
    text = host.strip()
    if "://" in text:
        scheme, _, text = text.partition("://")
        if scheme.lower() not in schemes:
            raise ValueError(f"host {host!r}: expected scheme {schemes[0]}:// (or HOST:PORT)")
    text = text.rstrip("/")
    if text.startswith("["):  # [v6]:port
        addr, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        addr, _, port_text = text.partition(":")
    else:
        addr, port_text = text, ""
    if not addr:
        raise ValueError(f"host {host!r}: expected HOST:PORT")
    if not port_text:
        return addr, default_port
    if not port_text.isdigit() or not 0 < int(port_text) <= 65535:
        raise ValueError(f"host {host!r}: port {port_text!r} is not 1..65535")
    return addr, int(port_text)


#: connect_tcp(tls=DEFAULT_TLS): the process's TLS setting (loadgen.tlsopts.default())
DEFAULT_TLS = object()


def connect_tcp(host: str, port: int, timeout: float | None,
                tls=DEFAULT_TLS) -> socket.socket:
    """A connected TCP socket with TCP_NODELAY (one request in flight: no Nagle delay);
    a TLS socket (handshake done) when ``tls`` (a loadgen.tlsopts.ClientTLS), or by
    default the process's ``--tls`` options, say so."""
    sock = socket.create_connection((host, port), timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if tls is DEFAULT_TLS:
        tls = tlsopts.default()
    if tls is not None:
        try:
            sock = tls.wrap(sock, host)
        except BaseException:
            sock.close()
            raise
    return sock


#: Per-process numbering of the sync clients' connections (the frame log's ``conn_id``).
_CONN_IDS = itertools.count(1)


class SentRequest:
    """One request a client put on the wire, as the proxy's parser will see it.

    ``seq``: 1-based number of the request on its connection (every request frame the
    client sent, reported to Locust or not); ``correlation_id``: the protocol's id as the
    proxy's frame log writes it (a decimal string; None when the frame carries none);
    ``opcode`` / ``opcode_name``: the request's opcode and the proxy's name for it (the
    protocol's own table, as the parser names it); ``kind``: ``"request"``,
    or ``"oneway"`` for a request that gets no answer; ``status``: the protocol's status
    name of the answer once it arrived (the proxy's ``status`` of the response), else None.
    """

    __slots__ = ("seq", "correlation_id", "opcode", "opcode_name", "kind", "status")

    def __init__(self, seq: int, correlation_id: str | None, opcode: int, opcode_name: str,
                 kind: str = "request"):
        self.seq = seq
        self.correlation_id = correlation_id
        self.opcode = opcode
        self.opcode_name = opcode_name
        self.kind = kind
        self.status: str | None = None

    def __repr__(self) -> str:
        return (f"SentRequest({self.seq}, {self.correlation_id!r}, {self.opcode}, "
                f"{self.opcode_name!r}, {self.kind!r}, status={self.status!r})")


class SocketClient:
    """Base of the sync clients: one TCP connection in ``self._sock`` (None once closed);
    a context manager that closes it on exit.

    For the client-side frame log (docs/design.md, "Frame log"), a client calls
    :meth:`_connected` once its socket is connected, which sets ``conn_id`` (a
    per-process connection number) and ``local_address`` (this end's ``ip:port``, the
    ``peer`` the proxy logs for it, formatted by :func:`proxy.addresses.format_peer` as
    the proxy does; both stay readable after ``close()``), and :meth:`_sent` for every
    request frame it sends. ``requests_sent`` counts those; ``recent`` keeps the last few
    (:class:`SentRequest`), for :meth:`sent_after`.

    Frames go out with :meth:`_send_frame`. The read loop (:meth:`_read_frame`), the
    same for every protocol: read up to
    :attr:`read_size` bytes at a time into the connection's buffer and cut whole frames
    off it with :meth:`split_frame`, the protocol's one hook (frame length from the
    header, then its codec). Frames that arrived together stay buffered for the next
    call (:meth:`take_frame` returns one without reading). Garbage or a length over the
    limit (the codec's ``ValueError``) closes the connection and raises
    :meth:`bad_frame`'s error; EOF closes it and raises ``ConnectionError``; any other
    socket error closes it and propagates. A deadline that passes is no error: the
    connection stays open and the caller says what timed out. ``frame_bytes`` is the
    size of the last frame taken, ``bytes_received`` the sum of them all.
    """

    #: what the client speaks, for its error messages
    what = "client"
    #: bytes asked of the socket per read
    read_size = READ_SIZE
    _sock: socket.socket | None
    conn_id = 0
    local_address = ""
    remote_address = ""
    requests_sent = 0
    recent: deque = deque(maxlen=0)   # replaced per connection by _connected()
    frame_bytes = 0
    bytes_received = 0
    _rbuf: bytearray                  # made per connection by _connected()

    def _connected(self, sock: socket.socket) -> None:
        """Number the connection and note its local address (``[v6]:port`` for IPv6)."""
        self.conn_id = next(_CONN_IDS)
        self.local_address = format_peer(sock.getsockname())
        try:            # where it went: the client frame log's route (the proxy's listener)
            self.remote_address = format_peer(sock.getpeername())
        except (OSError, AttributeError, IndexError, TypeError):
            self.remote_address = ""
        self.requests_sent = 0
        self.recent = deque(maxlen=16)
        self._rbuf = bytearray()

    def _sent(self, correlation_id: str | None, opcode: int, opcode_name: str,
              kind: str = "request") -> SentRequest:
        """Record a request frame just sent; returns its record (the caller sets
        ``status`` when the answer comes)."""
        self.requests_sent += 1
        sent = SentRequest(self.requests_sent, correlation_id, opcode, opcode_name, kind)
        self.recent.append(sent)
        return sent

    def sent_after(self, mark: int) -> SentRequest | None:
        """The first request sent after ``requests_sent`` was ``mark`` (None when none was,
        or when it is no longer among the recent ones)."""
        if self.requests_sent <= mark:
            return None
        first = None
        for sent in reversed(self.recent):
            if sent.seq <= mark:
                break
            first = sent
        return first if first is not None and first.seq == mark + 1 else None

    # ------------------------------------------------------------------ the read loop

    def split_frame(self, buf: memoryview):
        """The protocol's framing: cut one frame off the start of ``buf``: ``(frame,
        bytes consumed)``, or None when ``buf`` does not hold a whole frame yet. Raise
        the codec's error (a ``ValueError``) for garbage or a length over the limit as
        soon as the header shows it. ``frame`` must not keep a reference to ``buf``."""
        raise NotImplementedError

    def bad_frame(self, exc: ValueError) -> Exception:
        """:meth:`split_frame` refused the received bytes (the connection is closed
        already): the exception to raise, by default ``exc`` itself."""
        return exc

    def bytes_in(self, data: bytes) -> bytes:
        """The bytes read from the socket as the protocol's byte stream (a transport
        below the frames, such as WebSocket, unwraps them here)."""
        return data

    @property
    def where(self) -> str:
        """Where the connection goes, for error messages."""
        return self.remote_address or "the server"

    def _send_frame(self, data: bytes) -> None:
        """Send one whole frame; a socket error closes the connection and propagates."""
        sock = self._sock
        if sock is None:
            raise ConnectionError(f"{self.what}: connection to {self.where} is closed")
        try:
            sock.sendall(data)
        except OSError:
            self.close()
            raise

    def take_frame(self):
        """A whole frame already received (:meth:`split_frame`'s), or None; no read."""
        buf = self._rbuf
        if not buf:
            return None
        try:
            split = self.split_frame(memoryview(buf))
        except ValueError as exc:     # the codecs' errors: what follows cannot be paired
            self.close()
            error = self.bad_frame(exc)
            if error is exc:
                raise
            raise error from exc
        if split is None:
            return None
        frame, size = split
        del buf[:size]
        self.frame_bytes = size
        self.bytes_received += size
        return frame

    def _read_frame(self, deadline=SOCKET_TIMEOUT, poll: bool = False):
        """The next frame, reading as needed; None when ``deadline`` passes first.

        ``deadline``: a :func:`time.monotonic` time, None to wait as long as it takes,
        or :data:`SOCKET_TIMEOUT` (the default) to read within the socket's own timeout.
        ``poll``: when the deadline has passed before the first read, still take what
        has already arrived (one read that does not wait)."""
        frame = self.take_frame()
        while frame is None:
            if not self._receive(deadline, poll):
                return None
            poll = False
            frame = self.take_frame()
        return frame

    def _receive(self, deadline, poll: bool) -> bool:
        """One read into the buffer; False when ``deadline`` passed first."""
        sock = self._sock
        if sock is None:
            raise ConnectionError(f"{self.what}: connection to {self.where} is closed")
        if deadline is not SOCKET_TIMEOUT:
            if deadline is None:
                sock.settimeout(None)
            else:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    if not poll:
                        return False
                    remaining = 0.0      # a read that does not wait
                sock.settimeout(remaining)
        try:
            data = sock.recv(self.read_size)
        except (socket.timeout, BlockingIOError, ssl.SSLWantReadError):
            # (a TLS socket's read that would wait raises the last one)
            if deadline is SOCKET_TIMEOUT:
                self.close()
                raise
            return False
        except OSError:
            self.close()
            raise
        if not data:
            self.close()
            raise ConnectionError(f"{self.what}: {self.where} closed the connection")
        self._rbuf += self.bytes_in(data)
        return True

    @property
    def closed(self) -> bool:
        return self._sock is None

    def close(self) -> None:
        """Close the connection (idempotent)."""
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:  # pragma: no cover
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
