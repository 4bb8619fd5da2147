"""Synchronous RabbitMQ Stream client over a plain ``socket`` (gevent-patchable, used by Locust).

Wire format: deps/rabbitmq_stream/docs/PROTOCOL.adoc of rabbitmq-server, with the real
server's behaviour where the document is behind (docs/design.md, "RabbitMQ Stream"). Every
frame is ``Size u32 | Key u16 | Version u16 | body``; requests and their responses carry a
correlation id, while Publish, PublishConfirm, PublishError, Deliver, Credit, StoreOffset,
Heartbeat, Tune and MetadataUpdate do not. All commands are sent as version 1, so the
server answers with version-1 Deliver frames (no committed-offset field).

Every frame is encoded and decoded by the protocol's codec
(:mod:`proxy.protocols.rabbitmq_stream.codec`), so the client follows its rules: a string
is int16 length + UTF-8 (-1 = null, read as None); text that UTF-8 cannot carry, or over
32767 bytes, raises the codec's ``StreamCodecError`` (a ValueError) before anything is
sent; invalid UTF-8 or any other malformed frame from the server is a
:class:`StreamProtocolError`. Deliver chunks are read as the real server sends them
(without the trailer their header counts); tracking chunks carry no records.

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
from collections import deque
from time import perf_counter
from typing import NamedTuple

from loadgen import clientbase
from proxy.protocols.rabbitmq_stream.codec import (
    Command,
    PublishedMessage,
    StreamCodecError,
    decode_body,
    decode_frame,
    encode_command,
    parse_delivered_chunk,
    split_deliver,
)
from proxy.protocols.rabbitmq_stream.constants import (
    CHUNK_HEADER_SIZE,
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

_U32 = struct.Struct(">I")
# Publish v1 item: PublishingId u64 + Message bytes (int32 length); Size + Key + Version +
# PublisherId u8 + item count: what a Publish frame costs before its items.
_PUBLISH_ITEM_OVERHEAD = 8 + 4
_PUBLISH_FRAME_OVERHEAD = 4 + 4 + 1 + 4


def parse_host(host: str | None) -> tuple[str, int]:
    """``rabbitmq-stream://h:p``, ``h:p`` or ``h`` -> ``(h, p)``; ValueError otherwise."""
    return clientbase.parse_host(host, ("rabbitmq-stream", "rabbitmq_stream"), DEFAULT_PORT,
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

class StreamClient(clientbase.SocketClient):
    """Blocking RabbitMQ Stream client; one TCP connection.

    ``frame_max`` / ``heartbeat`` are the values the server proposed in Tune (echoed
    back); ``server_properties`` / ``connection_properties`` what PeerProperties and
    Open returned. ``last_response_bytes`` is the size of the last response frame and
    ``bytes_sent`` / ``bytes_received`` count everything, for load-test accounting.
    """

    what = "rabbitmq-stream"

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
        self.credit_errors: list[tuple[int, int]] = []      # (subscription_id, code)
        self.metadata_updates: list[tuple[int, str]] = []   # (code, stream)
        self._correlation = 0
        self._responses: dict[int, tuple[Command, int]] = {}  # corr -> (response, bytes)
        self._deliveries: deque[Delivery] = deque()
        self._confirmed: dict[int, dict[int, float]] = {}   # publisher -> {id: recv time}
        self._errored: dict[int, dict[int, int]] = {}       # publisher -> {id: code}
        self._sequences: dict[int, int] = {}                # publisher -> last publishing id
        self._stage = "PeerProperties"
        try:
            # TCP_NODELAY; TLS too when --tls (loadgen.tlsopts)
            self._sock: socket.socket | None = clientbase.connect_tcp(host, self.port, timeout)
        except OSError as exc:
            exc.command = "PeerProperties"
            raise
        self._connected(self._sock)
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
                self._request(CLOSE, timeout=min(self.timeout or 2.0, 2.0), code=OK,
                              reason="frametap: bye")
            except (OSError, StreamError):
                pass
        super().close()

    def __exit__(self, *exc) -> None:
        self.close(graceful=True)

    def _send(self, key: int, **fields) -> int:
        """Encode command ``key`` (version 1) with the codec and send it; returns its size.
        A field the protocol cannot carry (e.g. a string over 32767 UTF-8 bytes) raises
        :class:`~proxy.protocols.rabbitmq_stream.codec.StreamCodecError`, a ValueError."""
        frame = encode_command(key, **fields)
        self._send_frame(frame)
        self.bytes_sent += len(frame)
        return len(frame)

    def _next_correlation(self) -> int:
        self._correlation = (self._correlation + 1) & 0xFFFFFFFF
        return self._correlation

    def _protocol_error(self, exc: StreamCodecError) -> StreamProtocolError:
        """Close the connection; the codec's complaint as this client's error."""
        self.close()
        error = StreamProtocolError(f"{exc} (from {self.host}:{self.port})")
        error.__cause__ = exc
        return error

    def split_frame(self, buf):
        # the negotiated frame_max, never less than the client's own limit
        split = decode_frame(buf, max(self.frame_max or MAX_FRAME_BYTES, MAX_FRAME_BYTES))
        if split is None:
            return None
        key, version, body, size = split
        return (key, version, body), size

    def bad_frame(self, exc: ValueError) -> Exception:
        return self._protocol_error(exc)

    def _frame_within(self, timeout: float | None) -> tuple[int, int, bytes] | None:
        """The next frame as ``(key, version, body)`` (body after Key/Version), or None
        when ``timeout`` (seconds; None = block) passes first; 0 takes only what has
        arrived. Partial frames stay buffered; a Size over the limit is refused as soon
        as it has arrived."""
        deadline = None if timeout is None else time.monotonic() + timeout
        return self._read_frame(deadline, poll=True)

    def _dispatch(self, key: int, version: int, body: bytes) -> None:
        """Handle one received frame: store responses, record the server's own frames."""
        if key == DELIVER:
            self._deliveries.append(self._delivery(version, body))
            return
        try:
            cmd = decode_body(key, version, body)
        except StreamCodecError as exc:
            if exc.reason == "unknown_key":
                return  # commands this client does not know are ignored
            raise self._protocol_error(exc) from exc
        if cmd.response:
            if cmd.key == CREDIT:  # sent only on failure; no correlation id
                self.credit_errors.append((cmd.subscription_id, cmd.code))
            elif "correlation_id" in cmd.fields:
                self._responses[cmd.correlation_id] = (cmd, len(body) + 8)
            return
        if cmd.key == HEARTBEAT:
            self._send(HEARTBEAT)
        elif cmd.key == PUBLISH_CONFIRM:
            now = perf_counter()
            confirmed = self._confirmed.setdefault(cmd.publisher_id, {})
            for pid in cmd.publishing_ids:
                confirmed[pid] = now
        elif cmd.key == PUBLISH_ERROR:
            errored = self._errored.setdefault(cmd.publisher_id, {})
            for pid, code in cmd.errors:
                errored[pid] = code
        elif cmd.key == CLOSE:
            try:
                self._send(CLOSE, response=True, correlation_id=cmd.correlation_id, code=OK)
            except OSError:
                pass
            self.close()
            raise StreamConnectionClosed(cmd.code, cmd.reason or "")
        elif cmd.key == METADATA_UPDATE:
            self.metadata_updates.append((cmd.code, cmd.stream or ""))
        # Tune after the handshake, ConsumerUpdate (single active consumer, not used
        # here) and the rest are ignored.

    def _delivery(self, version: int, body: bytes) -> Delivery:
        # Deliver: SubscriptionId u8 (v2: CommittedChunkId u64), then one osiris chunk.
        # Only user chunks (type 0) hold records; tracking chunks are checked and skipped.
        try:
            subscription_id, _committed, chunk_bytes = split_deliver(version, body)
            chunk = parse_delivered_chunk(chunk_bytes)
            records = chunk.records()
        except StreamCodecError as exc:
            raise self._protocol_error(exc) from exc
        data_bytes = len(chunk_bytes) - CHUNK_HEADER_SIZE - len(chunk.trailer)
        return Delivery(subscription_id, chunk.num_records, chunk.first_offset, records,
                        chunk.timestamp, data_bytes)

    def _request(self, command: int, timeout: float | None = -1.0, **fields) -> Command:
        """Send a request with a fresh correlation id; return the decoded response.
        Response codes are not checked here."""
        corr = self._next_correlation()
        self._send(command, correlation_id=corr, **fields)
        sent = self._sent(str(corr), command, command_name(command))
        if timeout == -1.0:
            timeout = self.timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        name = command_name(command)
        while corr not in self._responses:
            remaining = None if deadline is None else deadline - time.monotonic()
            frame = None
            if remaining is None or remaining > 0:
                frame = self._frame_within(remaining)
            if frame is None:
                exc = TimeoutError(f"rabbitmq-stream: no {name} response from "
                                   f"{self.host}:{self.port} within {timeout} s")
                exc.command = name
                raise exc
            self._dispatch(*frame)
        response, size = self._responses.pop(corr)
        # the proxy's status of the response: its code's name (Metadata has none: OK)
        code = response.fields.get("code")
        sent.status = "OK" if code is None else status_name(code)
        if response.key != command:
            self.close()
            raise StreamProtocolError(
                f"rabbitmq-stream: correlation id {corr} answered by "
                f"{command_name(response.key)} (0x{response.wire_key:04x}), expected a "
                f"{name} response")
        self.last_response_bytes = size
        return response

    def _call(self, command: int, ok=(OK,), **fields) -> Command:
        """A request whose response has a code; raises :class:`StreamServerError` unless
        the code is in ``ok``."""
        response = self._request(command, **fields)
        if response.code not in ok:
            raise StreamServerError(command_name(command), response.code)
        return response

    def _handshake(self, user: str, password: str, connection_name: str) -> None:
        # PROTOCOL.adoc "Authentication": PeerProperties, SaslHandshake,
        # SaslAuthenticate, Tune (server first, we echo), Open.
        self._stage = "PeerProperties"
        self.server_properties = self._call(PEER_PROPERTIES, properties={
            "product": "frametap", "version": "0", "platform": "Python",
            "connection_name": connection_name}).properties
        self._stage = "SaslHandshake"
        mechanisms = self._call(SASL_HANDSHAKE).mechanisms
        if "PLAIN" not in mechanisms:
            raise StreamServerError("SaslHandshake", 0x07,
                                    f"server offers {mechanisms}, this client needs PLAIN")
        self._stage = "SaslAuthenticate"
        self._call(SASL_AUTHENTICATE, mechanism="PLAIN",
                   data=b"\0" + user.encode() + b"\0" + password.encode())
        self._stage = "Tune"
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            frame = self._frame_within(remaining) if remaining is None or remaining > 0 else None
            if frame is None:
                raise TimeoutError(f"rabbitmq-stream: no Tune from {self.host}:{self.port} "
                                   f"after authentication")
            if frame[0] == TUNE:
                try:
                    tune = decode_body(*frame)
                except StreamCodecError as exc:
                    raise self._protocol_error(exc) from exc
                self.frame_max, self.heartbeat = tune.frame_max, tune.heartbeat
                break
            self._dispatch(*frame)
        self._send(TUNE, frame_max=self.frame_max, heartbeat=self.heartbeat)
        self._stage = "Open"
        self.connection_properties = self._call(OPEN, virtual_host=self.vhost).properties or {}

    # ------------------------------------------------------------------ publishing

    def declare_publisher(self, publisher_id: int, stream: str,
                          reference: str | None = None) -> int:
        """DeclarePublisher; returns the last publishing id of this publisher (0 for a
        new or unnamed one; with a ``reference`` the server deduplicates, so numbering
        continues from QueryPublisherSequence)."""
        self._call(DECLARE_PUBLISHER, publisher_id=publisher_id, reference=reference or "",
                   stream=stream)
        last = 0
        if reference:
            last = self.query_publisher_sequence(reference, stream)
        self._sequences[publisher_id] = last
        self._confirmed.setdefault(publisher_id, {})
        self._errored.setdefault(publisher_id, {})
        return last

    def query_publisher_sequence(self, reference: str, stream: str) -> int:
        """QueryPublisherSequence: the last publishing id stored for ``reference``."""
        return self._call(QUERY_PUBLISHER_SEQUENCE, reference=reference,
                          stream=stream).sequence

    def delete_publisher(self, publisher_id: int) -> None:
        """DeletePublisher."""
        self._call(DELETE_PUBLISHER, publisher_id=publisher_id)
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
        items: list[PublishedMessage] = []
        size = _PUBLISH_FRAME_OVERHEAD
        for message in messages:
            seq += 1
            item_size = _PUBLISH_ITEM_OVERHEAD + len(message)
            if items and size + item_size > limit:
                self._send(PUBLISH, publisher_id=publisher_id, messages=items)
                items, size = [], _PUBLISH_FRAME_OVERHEAD
            items.append(PublishedMessage(seq, message))
            size += item_size
            ids.append(seq)
        if items:
            self._send(PUBLISH, publisher_id=publisher_id, messages=items)
        self._sequences[publisher_id] = seq
        return ids

    def pump(self, timeout: float = 0.0) -> int:
        """Handle the frames already received; when there are none, wait up to
        ``timeout`` seconds for one. Returns the number of frames handled."""
        handled = 0
        frame = self._frame_within(timeout)
        while frame is not None:
            self._dispatch(*frame)
            handled += 1
            frame = self._frame_within(0.0)
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
            frame = self._frame_within(remaining)
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
        """Create ``stream`` (arguments such as ``max-length-bytes``, ``max-age``; values
        are sent as strings); returns False when it already existed and ``exist_ok``."""
        arguments = {str(k): str(v) for k, v in (arguments or {}).items()}
        code = self._call(CREATE, ok=(OK, STREAM_ALREADY_EXISTS) if exist_ok else (OK,),
                          stream=stream, arguments=arguments).code
        return code == OK

    def delete(self, stream: str, missing_ok: bool = False) -> bool:
        """Delete ``stream``; returns False when it did not exist and ``missing_ok``."""
        code = self._call(DELETE, ok=(OK, STREAM_DOES_NOT_EXIST) if missing_ok else (OK,),
                          stream=stream).code
        return code == OK

    def metadata(self, streams) -> Metadata:
        """Metadata for ``streams`` (a name or a list). Per-stream codes are returned in
        ``.streams[name].code``, not raised (the response has no overall code)."""
        if isinstance(streams, str):
            streams = [streams]
        response = self._request(METADATA, streams=list(streams))
        brokers = {b.reference: (b.host, b.port) for b in response.brokers}
        result = {}
        for entry in response.streams:
            result[entry.name] = StreamMetadata(
                entry.code, brokers.get(entry.leader) if entry.code == OK else None,
                [brokers[x] for x in entry.replicas if x in brokers])
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
        # The codec writes the Offset field only for the offset and timestamp types, as
        # the server reads it.
        self._call(SUBSCRIBE, subscription_id=subscription_id, stream=stream,
                   offset_type=offset_type, offset=offset, credit=credit,
                   properties=properties or {})

    def credit(self, subscription_id: int, n: int = 1) -> None:
        """Credit: let the server send ``n`` more chunks (no response unless it fails,
        which lands in ``credit_errors``)."""
        self._send(CREDIT, subscription_id=subscription_id, credit=n)

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
            frame = self._frame_within(remaining)
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
        """StoreOffset (no response, no correlation id)."""
        self._send(STORE_OFFSET, reference=reference, stream=stream, offset=offset)
        self._sent(None, STORE_OFFSET, command_name(STORE_OFFSET), "oneway")

    def query_offset(self, reference: str, stream: str) -> int | None:
        """QueryOffset: the stored offset, or None when nothing is stored."""
        response = self._call(QUERY_OFFSET, ok=(OK, NO_OFFSET), reference=reference,
                              stream=stream)
        return response.offset if response.code == OK else None

    def unsubscribe(self, subscription_id: int) -> None:
        """Unsubscribe; chunks already received for it stay in the delivery queue."""
        self._call(UNSUBSCRIBE, subscription_id=subscription_id)
