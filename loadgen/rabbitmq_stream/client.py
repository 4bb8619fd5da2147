"""Synchronous RabbitMQ Stream client over a plain ``socket`` (gevent-patchable, used by Locust).

Wire format: deps/rabbitmq_stream/docs/PROTOCOL.adoc of rabbitmq-server, with the real
server's behaviour where the document is behind (DESIGN.md, "RabbitMQ Stream"). Every
frame is ``Size u32 | Key u16 | Version u16 | body``; requests and their responses carry a
correlation id, while Publish, PublishConfirm, PublishError, Deliver, Credit, StoreOffset,
Heartbeat, Tune and MetadataUpdate do not. All commands are sent as version 1, so the
server answers with version-1 Deliver frames (no committed-offset field).

The connection is opened in the constructor: PeerProperties, SaslHandshake,
SaslAuthenticate (PLAIN), the server's Tune echoed back, Open(vhost).

Frames the server sends on its own are handled whenever the client reads:

* Heartbeat is answered with a Heartbeat;
* PublishConfirm / PublishError are recorded per publisher (see :meth:`wait_confirms`,
  :meth:`take_confirms`);
* Deliver chunks are queued for :meth:`poll_deliver`;
* a Credit response (sent only on failure, e.g. unknown subscription) is recorded in
  ``credit_errors``, MetadataUpdate in ``metadata_updates``;
* a server Close is answered with CloseResponse OK, the socket is closed and
  :class:`StreamConnectionClosed` is raised.

Errors: a non-OK response code raises :class:`StreamServerError` (connection still
usable); a malformed frame raises :class:`StreamProtocolError` and a socket error or
EOF raises ``OSError``/``ConnectionError`` — after those the connection is closed and
later calls raise ``ConnectionError``. A request that gets no answer within ``timeout``
raises ``TimeoutError``; the connection stays open (late answers are matched by
correlation id and dropped).

Messages are opaque bytes to the server. :func:`amqp_data` wraps a body in an AMQP 1.0
message with one data section (what ``rstream.AMQPMessage(body=...)`` produces and
``rstream.amqp_decoder`` reads); :func:`amqp_body` gets the body back from such a record
(and from records rstream published).
"""

from __future__ import annotations

import socket
import struct
import time
import zlib
from collections import deque
from time import perf_counter
from typing import NamedTuple

from loadgen import common
from proxy.protocols.rabbitmq_stream.constants import (
    CLOSE,
    CREATE,
    CREDIT,
    DECLARE_PUBLISHER,
    DEFAULT_PORT,
    DELETE,
    DELETE_PUBLISHER,
    DELIVER,
    HEARTBEAT,
    MAX_FRAME_BYTES,
    METADATA,
    METADATA_UPDATE,
    MIN_FRAME_SIZE,
    NO_OFFSET,
    OFFSET_FIRST,
    OFFSET_LAST,
    OFFSET_NEXT,
    OFFSET_OFFSET,
    OFFSET_TIMESTAMP,
    OK,
    OPEN,
    PEER_PROPERTIES,
    PUBLISH,
    PUBLISH_CONFIRM,
    PUBLISH_ERROR,
    QUERY_OFFSET,
    QUERY_PUBLISHER_SEQUENCE,
    RESPONSE_BIT,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    STORE_OFFSET,
    STREAM_ALREADY_EXISTS,
    STREAM_DOES_NOT_EXIST,
    SUBSCRIBE,
    TUNE,
    UNSUBSCRIBE,
    command_name,
    status_name,
)

__all__ = [
    "StreamClient", "StreamError", "StreamServerError", "StreamProtocolError",
    "StreamConnectionClosed", "Delivery", "Confirms", "Metadata", "StreamMetadata",
    "parse_host", "amqp_data", "amqp_body", "OFFSET_TYPES",
]

#: ``--host``-friendly names of the Subscribe offset types.
OFFSET_TYPES = {"first": OFFSET_FIRST, "last": OFFSET_LAST, "next": OFFSET_NEXT,
                "offset": OFFSET_OFFSET, "timestamp": OFFSET_TIMESTAMP}

_VERSION = 1
_HEADER = struct.Struct(">IHH")         # Size, Key, Version
_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_U64 = struct.Struct(">Q")
_CORR_CODE = struct.Struct(">IH")       # CorrelationId, ResponseCode
# Osiris chunk header (osiris_log.erl): magic+version i8, chunk type i8, entries u16,
# records u32, timestamp i64, epoch u64, first offset u64, crc i32, data length u32,
# trailer length u32, 4 reserved bytes.
_CHUNK = struct.Struct(">BBHIqQQiII4x")


def parse_host(host: str | None) -> tuple[str, int]:
    """``rabbitmq-stream://h:p``, ``h:p`` or ``h`` -> ``(h, p)``; ValueError otherwise."""
    return common.parse_host(host, ("rabbitmq-stream", "rabbitmq_stream"), DEFAULT_PORT,
                             "RabbitMQ Stream users need a host: run Locust with --host "
                             "HOST:PORT (or rabbitmq-stream://HOST:PORT)")


# ---------------------------------------------------------------------- errors

class StreamError(Exception):
    """Base class of this client's errors. ``command`` names the command involved."""

    command: str | None = None


class StreamServerError(StreamError):
    """A response carried a non-OK response code."""

    def __init__(self, command: str, code: int, detail: str = ""):
        self.command = command
        self.code = code
        self.status = status_name(code)
        super().__init__(f"rabbitmq-stream: {command} failed: {self.status} "
                         f"(0x{code:02x}){': ' + detail if detail else ''}")


class StreamProtocolError(StreamError, ValueError):
    """The server sent something this client cannot parse."""


class StreamConnectionClosed(StreamError, ConnectionError):
    """The server closed the connection with a Close command."""

    def __init__(self, code: int, reason: str):
        self.command = "Close"
        self.code = code
        self.reason = reason
        super().__init__(f"rabbitmq-stream: server closed the connection: "
                         f"{status_name(code)} (0x{code:02x}) {reason!r}")


# ---------------------------------------------------------------------- results

class Delivery(NamedTuple):
    """One Deliver frame: an Osiris chunk for a subscription."""

    subscription_id: int
    num_records: int
    chunk_first_offset: int
    records: list            # message bytes, sub-entry batches expanded
    timestamp_ms: int = 0    # when the broker wrote the chunk
    chunk_bytes: int = 0     # size of the chunk's data section


class Confirms(NamedTuple):
    """Outcome of :meth:`StreamClient.wait_confirms`."""

    confirmed: list          # publishing ids confirmed
    errored: dict            # publishing id -> response code (PublishError)
    missing: list            # neither, when the wait timed out

    @property
    def complete(self) -> bool:
        return not self.errored and not self.missing


class StreamMetadata(NamedTuple):
    code: int
    leader: tuple | None     # (host, port) or None
    replicas: list           # [(host, port)]


class Metadata(NamedTuple):
    brokers: dict            # reference -> (host, port)
    streams: dict            # name -> StreamMetadata


# ---------------------------------------------------------------------- encoding

def _string(text: str | None) -> bytes:
    if text is None:
        return b"\xff\xff"  # int16 -1: null
    raw = text.encode()
    if len(raw) > 0x7FFF:
        raise ValueError(f"rabbitmq-stream: string of {len(raw)} bytes is too long")
    return _U16.pack(len(raw)) + raw


def _bytes(data: bytes) -> bytes:
    return _I32.pack(len(data)) + data


def _properties(props: dict | None) -> bytes:
    props = props or {}
    return _I32.pack(len(props)) + b"".join(_string(str(k)) + _string(str(v))
                                            for k, v in props.items())


class _Reader:
    """Reads PROTOCOL.adoc types from one frame body, naming the field on a short read."""

    __slots__ = ("data", "pos", "command")

    def __init__(self, data: bytes, pos: int, command: str):
        self.data = data
        self.pos = pos
        self.command = command

    def _take(self, n: int, what: str) -> int:
        pos = self.pos
        if pos + n > len(self.data):
            raise StreamProtocolError(
                f"rabbitmq-stream: {self.command} frame ends at byte {len(self.data)} "
                f"inside {what} (needed {n} bytes at {pos})")
        self.pos = pos + n
        return pos

    def u8(self, what="u8"):
        return self.data[self._take(1, what)]

    def u16(self, what="u16"):
        return _U16.unpack_from(self.data, self._take(2, what))[0]

    def u32(self, what="u32"):
        return _U32.unpack_from(self.data, self._take(4, what))[0]

    def i32(self, what="i32"):
        return _I32.unpack_from(self.data, self._take(4, what))[0]

    def u64(self, what="u64"):
        return _U64.unpack_from(self.data, self._take(8, what))[0]

    def string(self, what="string"):
        n = _U16.unpack_from(self.data, self._take(2, what))[0]
        if n == 0xFFFF:
            return None
        pos = self._take(n, what)
        return self.data[pos:pos + n].decode(errors="replace")

    def bytes_(self, what="bytes"):
        n = self.i32(what)
        if n < 0:
            return None
        pos = self._take(n, what)
        return self.data[pos:pos + n]

    def array_len(self, what="array"):
        n = self.i32(what)
        if n < 0 or n > len(self.data):
            raise StreamProtocolError(
                f"rabbitmq-stream: {self.command}: bad {what} length {n} at byte "
                f"{self.pos - 4}")
        return n

    def properties(self, what="properties"):
        return {self.string(what): self.string(what) for _ in range(self.array_len(what))}


# ---------------------------------------------------------------------- AMQP 1.0

_AMQP_DATA_SECTION = b"\x00\x53\x75"     # described type, smallulong 0x75 = data


def amqp_data(body: bytes) -> bytes:
    """``body`` as an AMQP 1.0 message with a single data section (rstream-readable)."""
    if len(body) < 256:
        return _AMQP_DATA_SECTION + b"\xa0" + bytes((len(body),)) + body  # vbin8
    return _AMQP_DATA_SECTION + b"\xb0" + _U32.pack(len(body)) + body        # vbin32


# Fixed widths of AMQP 1.0 primitive encodings by constructor code (AMQP 1.0 part 1,
# section 1.6), for skipping the sections around the body.
_AMQP_FIXED = {0x40: 0, 0x41: 0, 0x42: 0, 0x43: 0, 0x44: 0, 0x45: 0,
               0x50: 1, 0x51: 1, 0x52: 1, 0x53: 1, 0x54: 1, 0x55: 1, 0x56: 1,
               0x60: 2, 0x61: 2, 0x70: 4, 0x71: 4, 0x72: 4, 0x73: 4, 0x74: 4,
               0x80: 8, 0x81: 8, 0x82: 8, 0x83: 8, 0x84: 8, 0x94: 16, 0x98: 16}


def _amqp_skip(data: bytes, pos: int) -> tuple[int, int, int]:
    """Skip one AMQP value at ``pos``; returns (constructor, payload_start, end)."""
    code = data[pos]
    pos += 1
    if code == 0x00:  # described: descriptor, then the value
        _c, _s, pos = _amqp_skip(data, pos)
        return _amqp_skip(data, pos)
    if code in _AMQP_FIXED:
        return code, pos, pos + _AMQP_FIXED[code]
    high = code & 0xF0
    if high in (0xA0, 0xC0, 0xE0):   # 1-byte size
        return code, pos + 1, pos + 1 + data[pos]
    if high in (0xB0, 0xD0, 0xF0):   # 4-byte size
        return code, pos + 4, pos + 4 + _U32.unpack_from(data, pos)[0]
    raise ValueError(f"unknown AMQP constructor 0x{code:02x}")


def amqp_body(record: bytes) -> bytes:
    """The body of an AMQP 1.0 encoded record: its data sections concatenated, or an
    amqp-value holding binary/string. Records that are not AMQP come back unchanged."""
    try:
        pos = 0
        parts = []
        while pos < len(record):
            if record[pos] != 0x00 or record[pos + 1] != 0x53:
                return record
            section = record[pos + 2]
            code, start, end = _amqp_skip(record, pos + 3)
            if end > len(record):
                return record
            if section == 0x75 or (section == 0x77 and code in (0xA0, 0xB0, 0xA1, 0xB1)):
                parts.append(record[start:end])
            pos = end
        return b"".join(parts) if parts else record
    except (IndexError, ValueError, struct.error):
        return record


# ---------------------------------------------------------------------- client

class StreamClient(common.SocketClient):
    """Blocking RabbitMQ Stream client; one TCP connection.

    ``frame_max`` / ``heartbeat`` are the values the server proposed in Tune (echoed
    back); ``server_properties`` / ``connection_properties`` what PeerProperties and
    Open returned. ``last_response_bytes`` is the size of the last response frame and
    ``bytes_sent`` / ``bytes_received`` count everything, for load-test accounting.
    """

    def __init__(self, host: str, port: int = DEFAULT_PORT, user: str = "guest",
                 password: str = "guest", vhost: str = "/", timeout: float | None = 10.0,
                 connection_name: str = "frametap-loadgen"):
        self.host = host
        self.port = int(port)
        self.vhost = vhost
        self.timeout = timeout
        self.frame_max = 0                 # 0 = no limit (until Tune)
        self.heartbeat = 0
        self.server_properties: dict = {}
        self.connection_properties: dict = {}
        self.last_response_bytes = 0
        self.bytes_sent = 0
        self.bytes_received = 0
        self.credit_errors: list[tuple[int, int]] = []      # (subscription_id, code)
        self.metadata_updates: list[tuple[int, str]] = []   # (code, stream)
        self._buf = bytearray()
        self._correlation = 0
        self._responses: dict[int, tuple[int, bytes]] = {}  # corr -> (key, frame body)
        self._deliveries: deque[Delivery] = deque()
        self._confirmed: dict[int, dict[int, float]] = {}   # publisher -> {id: recv time}
        self._errored: dict[int, dict[int, int]] = {}       # publisher -> {id: code}
        self._sequences: dict[int, int] = {}                # publisher -> last publishing id
        self._stage = "PeerProperties"
        try:
            self._sock: socket.socket | None = socket.create_connection(
                (host, self.port), timeout)
        except OSError as exc:
            exc.command = "PeerProperties"
            raise
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.local_address = common.format_address(self._sock.getsockname())
        try:
            self._handshake(user, password, connection_name)
        except BaseException as exc:
            if isinstance(exc, Exception) and getattr(exc, "command", None) is None:
                try:
                    exc.command = self._stage
                except AttributeError:  # pragma: no cover
                    pass
            self.close()
            raise

    # ------------------------------------------------------------------ plumbing

    def close(self, graceful: bool = False) -> None:
        """Close the connection (idempotent). ``graceful`` sends Close first and waits
        briefly for the server's answer."""
        if graceful and self._sock is not None:
            try:
                self._request(CLOSE, _U16.pack(OK) + _string("frametap: bye"),
                              timeout=min(self.timeout or 2.0, 2.0))
            except (OSError, StreamError):
                pass
        super().close()

    def __exit__(self, *exc) -> None:
        self.close(graceful=True)

    def _send(self, key: int, body: bytes) -> int:
        if self._sock is None:
            raise ConnectionError(
                f"rabbitmq-stream: client for {self.host}:{self.port} is closed")
        frame = _HEADER.pack(len(body) + 4, key, _VERSION) + body
        try:
            self._sock.sendall(frame)
        except OSError:
            self.close()
            raise
        self.bytes_sent += len(frame)
        return len(frame)

    def _next_correlation(self) -> int:
        self._correlation = (self._correlation + 1) & 0xFFFFFFFF
        return self._correlation

    def _read_frame(self, timeout: float | None) -> tuple[int, bytes] | None:
        """The next frame as ``(key, body)`` (body after Key/Version), or None when
        ``timeout`` (seconds; None = block) passes first. Partial frames stay buffered."""
        sock = self._sock
        if sock is None:
            raise ConnectionError(
                f"rabbitmq-stream: client for {self.host}:{self.port} is closed")
        deadline = None if timeout is None else time.monotonic() + timeout
        buf = self._buf
        attempted = False
        while True:
            if len(buf) >= 4:
                size = _U32.unpack_from(buf)[0]
                limit = self.frame_max or MAX_FRAME_BYTES
                if size < MIN_FRAME_SIZE or size > max(limit, MAX_FRAME_BYTES):
                    self.close()
                    raise StreamProtocolError(
                        f"rabbitmq-stream: frame size {size} at offset 0 of the stream "
                        f"from {self.host}:{self.port} (expected {MIN_FRAME_SIZE}.."
                        f"{max(limit, MAX_FRAME_BYTES)}) — is this a stream port?")
                if len(buf) >= 4 + size:
                    key = _U16.unpack_from(buf, 4)[0]
                    body = bytes(buf[8:4 + size])
                    del buf[:4 + size]
                    self.bytes_received += 4 + size
                    return key, body
                want = 4 + size - len(buf)
            else:
                want = 4 - len(buf)
            if deadline is None:
                sock.settimeout(None)
            else:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    if attempted:
                        return None
                    remaining = 0.0  # timeout 0: one non-blocking read
                sock.settimeout(remaining)
            attempted = True
            try:
                chunk = sock.recv(max(want, 65536))
            except (socket.timeout, BlockingIOError):
                return None
            except OSError:
                self.close()
                raise
            if not chunk:
                self.close()
                raise ConnectionError(
                    f"rabbitmq-stream: connection to {self.host}:{self.port} closed by "
                    f"the server")
            buf += chunk

    def _dispatch(self, key: int, body: bytes) -> None:
        """Handle one received frame: store responses, record the server's own frames."""
        if key & RESPONSE_BIT:
            command = key & ~RESPONSE_BIT
            if command == CREDIT:  # CreditResponse: ResponseCode SubscriptionId, no corr id
                r = _Reader(body, 0, "Credit")
                code = r.u16("response code")
                self.credit_errors.append((r.u8("subscription id"), code))
                return
            if len(body) < 4:
                raise StreamProtocolError(
                    f"rabbitmq-stream: {command_name(key)} response of {len(body)} bytes "
                    f"has no correlation id")
            self._responses[_U32.unpack_from(body)[0]] = (key, body)
            return
        if key == HEARTBEAT:
            self._send(HEARTBEAT, b"")
        elif key == DELIVER:
            self._deliveries.append(self._parse_deliver(body))
        elif key == PUBLISH_CONFIRM:
            r = _Reader(body, 0, "PublishConfirm")
            publisher = r.u8("publisher id")
            now = perf_counter()
            confirmed = self._confirmed.setdefault(publisher, {})
            for _ in range(r.array_len("publishing ids")):
                confirmed[r.u64("publishing id")] = now
        elif key == PUBLISH_ERROR:
            r = _Reader(body, 0, "PublishError")
            publisher = r.u8("publisher id")
            errored = self._errored.setdefault(publisher, {})
            for _ in range(r.array_len("publishing errors")):
                pid = r.u64("publishing id")
                errored[pid] = r.u16("code")
        elif key == CLOSE:
            r = _Reader(body, 0, "Close")
            corr = r.u32("correlation id")
            code = r.u16("closing code")
            reason = r.string("closing reason") or ""
            try:
                self._send(CLOSE | RESPONSE_BIT, _CORR_CODE.pack(corr, OK))
            except OSError:
                pass
            self.close()
            raise StreamConnectionClosed(code, reason)
        elif key == METADATA_UPDATE:
            r = _Reader(body, 0, "MetadataUpdate")
            code = r.u16("code")
            self.metadata_updates.append((code, r.string("stream") or ""))
        # Tune after the handshake, ConsumerUpdate (single active consumer, not used
        # here) and unknown commands are ignored.

    def _parse_deliver(self, body: bytes) -> Delivery:
        # Deliver v1: SubscriptionId u8, then one Osiris chunk (PROTOCOL.adoc "Deliver")
        if len(body) < 1 + _CHUNK.size:
            raise StreamProtocolError(
                f"rabbitmq-stream: Deliver frame of {len(body)} bytes is shorter than the "
                f"{1 + _CHUNK.size}-byte chunk header")
        subscription = body[0]
        (magic, chunk_type, num_entries, num_records, timestamp, _epoch, first_offset,
         crc, data_length, _trailer) = _CHUNK.unpack_from(body, 1)
        start = 1 + _CHUNK.size
        data = body[start:start + data_length]
        if len(data) != data_length:
            raise StreamProtocolError(
                f"rabbitmq-stream: Deliver chunk at offset {first_offset} declares "
                f"{data_length} data bytes, frame holds {len(data)}")
        if zlib.crc32(data) & 0xFFFFFFFF != crc & 0xFFFFFFFF:
            raise StreamProtocolError(
                f"rabbitmq-stream: Deliver chunk at offset {first_offset}: CRC mismatch")
        records = _chunk_records(data, num_entries, first_offset) if chunk_type == 0 else []
        return Delivery(subscription, num_records, first_offset, records, timestamp,
                        data_length)

    def _request(self, command: int, payload: bytes, timeout: float | None = -1.0,
                 ) -> tuple[bytes, int]:
        """Send a request with a fresh correlation id; return (response body, offset
        after the correlation id). Response codes are not checked here."""
        corr = self._next_correlation()
        self._send(command, _U32.pack(corr) + payload)
        if timeout == -1.0:
            timeout = self.timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        name = command_name(command)
        while corr not in self._responses:
            remaining = None if deadline is None else deadline - time.monotonic()
            frame = None
            if remaining is None or remaining > 0:
                frame = self._read_frame(remaining)
            if frame is None:
                exc = TimeoutError(f"rabbitmq-stream: no {name} response from "
                                   f"{self.host}:{self.port} within {timeout} s")
                exc.command = name
                raise exc
            self._dispatch(*frame)
        key, body = self._responses.pop(corr)
        if key != command | RESPONSE_BIT:
            self.close()
            raise StreamProtocolError(
                f"rabbitmq-stream: correlation id {corr} answered by "
                f"{command_name(key)} (0x{key:04x}), expected a {name} response")
        self.last_response_bytes = len(body) + 8
        return body, 4

    def _call(self, command: int, payload: bytes, ok=(OK,)) -> tuple[_Reader, int]:
        """A request whose response has a code: returns (reader after the code, code)."""
        body, pos = self._request(command, payload)
        r = _Reader(body, pos, command_name(command))
        code = r.u16("response code")
        if code not in ok:
            raise StreamServerError(command_name(command), code)
        return r, code

    def _handshake(self, user: str, password: str, connection_name: str) -> None:
        # PROTOCOL.adoc "Authentication": PeerProperties, SaslHandshake,
        # SaslAuthenticate, Tune (server first, we echo), Open.
        self._stage = "PeerProperties"
        r, _ = self._call(PEER_PROPERTIES, _properties({
            "product": "frametap", "version": "0", "platform": "Python",
            "connection_name": connection_name}))
        self.server_properties = r.properties()
        self._stage = "SaslHandshake"
        r, _ = self._call(SASL_HANDSHAKE, b"")
        mechanisms = [r.string("mechanism") for _ in range(r.array_len("mechanisms"))]
        if "PLAIN" not in mechanisms:
            raise StreamServerError("SaslHandshake", 0x07,
                                    f"server offers {mechanisms}, this client needs PLAIN")
        self._stage = "SaslAuthenticate"
        self._call(SASL_AUTHENTICATE, _string("PLAIN") + _bytes(
            b"\0" + user.encode() + b"\0" + password.encode()))
        self._stage = "Tune"
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            frame = self._read_frame(remaining) if remaining is None or remaining > 0 else None
            if frame is None:
                raise TimeoutError(f"rabbitmq-stream: no Tune from {self.host}:{self.port} "
                                   f"after authentication")
            if frame[0] == TUNE:
                r = _Reader(frame[1], 0, "Tune")
                self.frame_max = r.u32("frame max")
                self.heartbeat = r.u32("heartbeat")
                break
            self._dispatch(*frame)
        self._send(TUNE, _U32.pack(self.frame_max) + _U32.pack(self.heartbeat))
        self._stage = "Open"
        r, _ = self._call(OPEN, _string(self.vhost))
        if r.pos < len(r.data):
            self.connection_properties = r.properties()
        self._stage = "Open"

    # ------------------------------------------------------------------ publishing

    def declare_publisher(self, publisher_id: int, stream: str,
                          reference: str | None = None) -> int:
        """DeclarePublisher; returns the last publishing id of this publisher (0 for a
        new or unnamed one; with a ``reference`` the server deduplicates, so numbering
        continues from QueryPublisherSequence)."""
        self._call(DECLARE_PUBLISHER, _U8.pack(publisher_id) + _string(reference or "")
                   + _string(stream))
        last = 0
        if reference:
            last = self.query_publisher_sequence(reference, stream)
        self._sequences[publisher_id] = last
        self._confirmed.setdefault(publisher_id, {})
        self._errored.setdefault(publisher_id, {})
        return last

    def query_publisher_sequence(self, reference: str, stream: str) -> int:
        """QueryPublisherSequence: the last publishing id stored for ``reference``."""
        r, _ = self._call(QUERY_PUBLISHER_SEQUENCE, _string(reference) + _string(stream))
        return r.u64("sequence")

    def delete_publisher(self, publisher_id: int) -> None:
        """DeletePublisher."""
        self._call(DELETE_PUBLISHER, _U8.pack(publisher_id))
        self._sequences.pop(publisher_id, None)

    def publish_batch(self, publisher_id: int, messages: list[bytes]) -> list[int]:
        """Publish ``messages`` (one Publish frame, or several when a frame would exceed
        the negotiated frame_max); returns their publishing ids, in order."""
        if publisher_id not in self._sequences:
            raise ValueError(f"rabbitmq-stream: publisher {publisher_id} was not declared "
                             f"on this connection")
        seq = self._sequences[publisher_id]
        limit = self.frame_max or (1 << 31)
        ids: list[int] = []
        parts: list[bytes] = []
        empty = 4 + 4 + 1 + 4           # Size, Key+Version, publisher id, count
        size = empty
        for message in messages:
            seq += 1
            entry = _U64.pack(seq) + _I32.pack(len(message)) + message
            if parts and size + len(entry) > limit:
                self._send_publish(publisher_id, parts)
                parts, size = [], empty
            parts.append(entry)
            size += len(entry)
            ids.append(seq)
        if parts:
            self._send_publish(publisher_id, parts)
        self._sequences[publisher_id] = seq
        return ids

    def _send_publish(self, publisher_id: int, entries: list[bytes]) -> None:
        # Publish v1: PublisherId u8, [PublishingId u64, Message bytes]
        self._send(PUBLISH, _U8.pack(publisher_id) + _I32.pack(len(entries))
                   + b"".join(entries))

    def pump(self, timeout: float = 0.0) -> int:
        """Handle the frames already received; when there are none, wait up to
        ``timeout`` seconds for one. Returns the number of frames handled."""
        handled = 0
        frame = self._read_frame(timeout)
        while frame is not None:
            self._dispatch(*frame)
            handled += 1
            frame = self._read_frame(0.0)
        return handled

    def take_confirms(self, publisher_id: int) -> tuple[dict, dict]:
        """Everything confirmed / errored for ``publisher_id`` since the last call:
        ``({publishing_id: perf_counter() at receipt}, {publishing_id: code})``."""
        confirmed = self._confirmed.get(publisher_id) or {}
        errored = self._errored.get(publisher_id) or {}
        self._confirmed[publisher_id] = {}
        self._errored[publisher_id] = {}
        return confirmed, errored

    def wait_confirms(self, publisher_id: int, ids, timeout: float | None = None) -> Confirms:
        """Read frames until every publishing id in ``ids`` is confirmed or errored, or
        ``timeout`` (default: the client's) passes. Only these ids are taken from the
        client's records; confirms for other ids stay for later calls."""
        if timeout is None:
            timeout = self.timeout
        wanted = set(ids)
        confirmed = self._confirmed.setdefault(publisher_id, {})
        errored = self._errored.setdefault(publisher_id, {})
        deadline = None if timeout is None else time.monotonic() + timeout
        while not wanted.issubset(confirmed.keys() | errored.keys()):
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            frame = self._read_frame(remaining)
            if frame is None:
                break
            self._dispatch(*frame)
            confirmed = self._confirmed[publisher_id]
            errored = self._errored[publisher_id]
        done, failed, missing = [], {}, []
        for pid in ids:
            if pid in confirmed:
                del confirmed[pid]
                done.append(pid)
            elif pid in errored:
                failed[pid] = errored.pop(pid)
            else:
                missing.append(pid)
        return Confirms(done, failed, missing)

    # ------------------------------------------------------------------ streams

    def create(self, stream: str, arguments: dict | None = None,
               exist_ok: bool = False) -> bool:
        """Create ``stream`` (arguments such as ``max-length-bytes``, ``max-age``);
        returns False when it already existed and ``exist_ok``."""
        _r, code = self._call(CREATE, _string(stream) + _properties(arguments),
                              ok=(OK, STREAM_ALREADY_EXISTS) if exist_ok else (OK,))
        return code == OK

    def delete(self, stream: str, missing_ok: bool = False) -> bool:
        """Delete ``stream``; returns False when it did not exist and ``missing_ok``."""
        _r, code = self._call(DELETE, _string(stream),
                              ok=(OK, STREAM_DOES_NOT_EXIST) if missing_ok else (OK,))
        return code == OK

    def metadata(self, streams) -> Metadata:
        """Metadata for ``streams`` (a name or a list). Per-stream codes are returned in
        ``.streams[name].code``, not raised (the response has no overall code)."""
        if isinstance(streams, str):
            streams = [streams]
        body, pos = self._request(METADATA, _I32.pack(len(streams))
                                  + b"".join(_string(s) for s in streams))
        r = _Reader(body, pos, "Metadata")
        brokers = {}
        for _ in range(r.array_len("brokers")):
            ref = r.u16("broker reference")
            host = r.string("broker host")
            brokers[ref] = (host, r.u32("broker port"))
        result = {}
        for _ in range(r.array_len("stream metadata")):
            name = r.string("stream name")
            code = r.u16("stream response code")
            leader = r.u16("leader reference")
            replicas = [r.u16("replica reference") for _ in range(r.array_len("replicas"))]
            result[name] = StreamMetadata(
                code, brokers.get(leader) if code == OK else None,
                [brokers[x] for x in replicas if x in brokers])
        return Metadata(brokers, result)

    # ------------------------------------------------------------------ consuming

    def subscribe(self, subscription_id: int, stream: str, offset_type: int | str = OFFSET_FIRST,
                  offset: int = 0, credit: int = 10, properties: dict | None = None) -> None:
        """Subscribe; ``offset_type`` is a constants.OFFSET_* value or ``first``, ``last``,
        ``next``, ``offset``, ``timestamp``; ``offset`` is used by the last two (an offset,
        or milliseconds since the epoch). ``credit`` = chunks the server may send before
        the next :meth:`credit`."""
        if isinstance(offset_type, str):
            try:
                offset_type = OFFSET_TYPES[offset_type.lower()]
            except KeyError:
                raise ValueError(f"offset type {offset_type!r}: expected one of "
                                 f"{', '.join(OFFSET_TYPES)}") from None
        # The server reads an Offset field only for the offset and timestamp types.
        spec = _U16.pack(offset_type)
        if offset_type == OFFSET_OFFSET:
            spec += _U64.pack(offset)
        elif offset_type == OFFSET_TIMESTAMP:
            spec += struct.pack(">q", offset)
        self._call(SUBSCRIBE, _U8.pack(subscription_id) + _string(stream) + spec
                   + _U16.pack(credit) + _properties(properties))

    def credit(self, subscription_id: int, n: int = 1) -> None:
        """Credit: let the server send ``n`` more chunks (no response unless it fails,
        which lands in ``credit_errors``)."""
        self._send(CREDIT, _U8.pack(subscription_id) + _U16.pack(n))

    def poll_deliver(self, timeout: float | None = None) -> Delivery | None:
        """The next Deliver chunk, waiting up to ``timeout`` seconds (None: the
        client's timeout); None when nothing arrived. Records of a chunk that starts
        before a requested ``offset`` are all returned: skip them by offset if needed."""
        if timeout is None:
            timeout = self.timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._deliveries:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            frame = self._read_frame(remaining)
            if frame is None:
                return None
            self._dispatch(*frame)
        return self._deliveries.popleft()

    def take_credit_errors(self) -> list[tuple[int, int]]:
        """Credit failures reported by the server since the last call:
        ``[(subscription_id, code)]``."""
        errors, self.credit_errors = self.credit_errors, []
        return errors

    def store_offset(self, reference: str, stream: str, offset: int) -> None:
        """StoreOffset (no response)."""
        self._send(STORE_OFFSET, _string(reference) + _string(stream) + _U64.pack(offset))

    def query_offset(self, reference: str, stream: str) -> int | None:
        """QueryOffset: the stored offset, or None when nothing is stored."""
        r, code = self._call(QUERY_OFFSET, _string(reference) + _string(stream),
                             ok=(OK, NO_OFFSET))
        return r.u64("offset") if code == OK else None

    def unsubscribe(self, subscription_id: int) -> None:
        """Unsubscribe; chunks already received for it stay in the delivery queue."""
        self._call(UNSUBSCRIBE, _U8.pack(subscription_id))


def _chunk_records(data: bytes, num_entries: int, first_offset: int) -> list[bytes]:
    """The records of a user chunk (osiris_log.erl data layout): simple entries
    ``0 | size:31 | data`` and sub-entry batches ``1 | compression:3 | reserved:4 |
    records u16 | uncompressed size u32 | size u32 | data`` (compression 0 none, 1 gzip)."""
    records = []
    pos = 0
    for _ in range(num_entries):
        if pos + 4 > len(data):
            raise StreamProtocolError(
                f"rabbitmq-stream: chunk at offset {first_offset}: entry header past the "
                f"end of the data ({pos} of {len(data)} bytes)")
        head = data[pos]
        if head & 0x80 == 0:
            size = _U32.unpack_from(data, pos)[0]
            pos += 4
            records.append(data[pos:pos + size])
            pos += size
            continue
        compression = (head & 0x70) >> 4
        count = _U16.unpack_from(data, pos + 1)[0]
        size = _U32.unpack_from(data, pos + 7)[0]
        pos += 11
        batch = data[pos:pos + size]
        pos += size
        if compression == 1:
            batch = zlib.decompress(batch, 31)  # gzip
        elif compression != 0:
            raise StreamProtocolError(
                f"rabbitmq-stream: chunk at offset {first_offset}: sub-entry compression "
                f"{compression} is not supported (0 none, 1 gzip)")
        bpos = 0
        for _ in range(count):
            n = _U32.unpack_from(batch, bpos)[0]
            records.append(batch[bpos + 4:bpos + 4 + n])
            bpos += 4 + n
    return records
