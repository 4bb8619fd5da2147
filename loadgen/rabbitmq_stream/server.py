"""Reference RabbitMQ Stream broker (asyncio, uvloop when installed) for load runs and tests.

``frametap serve rabbitmq-stream`` runs this in-memory single-node broker. It speaks the
protocol of the real server (RabbitMQ 3.13 stream plugin, see
:mod:`proxy.protocols.rabbitmq_stream.codec`) well enough that the unmodified PyPI
``rstream`` client publishes with confirms and consumes through it. Behaviour:

* Handshake as the real server: PeerProperties, SaslHandshake (``PLAIN``, plus
  ``ANONYMOUS`` when ``allow_anonymous``), SaslAuthenticate PLAIN against ``users``
  (AUTHENTICATION_FAILURE, SASL_MECHANISM_NOT_SUPPORTED or SASL_ERROR otherwise); after a
  successful authentication the broker sends Tune(frame_max, heartbeat) and waits for the
  client's Tune; Open checks the virtual host (VIRTUAL_HOST_ACCESS_FAILURE) and returns the
  connection properties ``advertised_host`` / ``advertised_port``. Any other command before
  Open gets the connection closed (Close with ACCESS_REFUSED).
* Streams: Create (STREAM_ALREADY_EXISTS, PRECONDITION_FAILED for an empty or over-long
  name), Delete (STREAM_DOES_NOT_EXIST; publishers and consumers of the stream on every
  connection are dropped and told with MetadataUpdate STREAM_NOT_AVAILABLE), Metadata
  (the one broker entry is the *advertised* address; per stream OK with leader 0 and no
  replicas, or STREAM_DOES_NOT_EXIST with leader 0xFFFF), StreamStats
  (``first_chunk_id``, ``committed_chunk_id``; -1 when the stream is empty).
* Publishing: DeclarePublisher (STREAM_DOES_NOT_EXIST; PRECONDITION_FAILED when the id is
  taken on this connection, the reference is over 256 characters, or the reference is
  already used for that stream on this connection), QueryPublisherSequence,
  DeletePublisher (PUBLISHER_DOES_NOT_EXIST). Publish (v1 and v2 with filter values;
  simple messages, and in v1 sub-entry batches: one publishing id and one confirm each,
  its records stored as one chunk entry) appends one chunk per Publish frame (split every
  ``max_chunk_entries`` entries) and answers PublishConfirm with every publishing id.
  A sub-entry batch in Publish v2 closes the connection with UNKNOWN_FRAME: the real
  server reads v2 entries as filter value + simple message only
  (``rabbit_stream_utils:write_messages/…``), and its reader process dies on a v2 batch
  and drops the connection (without a Close; this broker says why).
  Named publishers are deduplicated: an id not above the last one stored for (stream,
  reference) is confirmed but not stored. Unknown publisher ids get PublishError
  PUBLISHER_DOES_NOT_EXIST.
* Consuming: Subscribe with first / last / next / offset / timestamp and credit
  (SUBSCRIPTION_ID_ALREADY_EXISTS, STREAM_DOES_NOT_EXIST); each Deliver carries one whole
  osiris chunk (real header, CRC32) and uses one credit; Credit adds credit (a response
  only on error: SUBSCRIPTION_ID_DOES_NOT_EXIST); Unsubscribe. OFFSET delivers from the
  chunk *containing* the offset, as the real server does (clients skip the records
  before it). Deliver is version 2 (with CommittedChunkId) only for clients that announced
  Deliver v2 in ExchangeCommandVersions.
* StoreOffset / QueryOffset (NO_OFFSET when nothing was stored, STREAM_DOES_NOT_EXIST).
* ExchangeCommandVersions answers OK with one entry per key 1..28 *in key order* (the
  rstream client indexes the answer by ``key - 1``): Publish and Deliver 1..2, the rest 1.
  Route / Partitions: no super streams here, so STREAM_DOES_NOT_EXIST and an empty list.
* Close from the client: answered OK, then the broker waits (``close_grace`` seconds) for
  the client to close the socket. After a fatal error answer (authentication, virtual
  host) the broker likewise only answers Close/Heartbeat until the client hangs up — closing
  at once would make some clients (rstream) drop the error answer itself.
* Unknown keys, undecodable bodies and unsupported versions: the real server closes with
  UNKNOWN_FRAME, and so does this one: it sends Close(UNKNOWN_FRAME, reason), waits for the
  answer (or ``close_grace``) and closes. A frame over the negotiated frame_max: the same
  with FRAME_TOO_LARGE.
* Heartbeat: once tuned with a non-zero heartbeat the broker sends Heartbeat whenever it
  has written nothing for that long and closes the connection when it has heard nothing
  for two intervals (as the real server does).
* Retention: each stream keeps about ``retention_bytes`` of chunks; older chunks are
  dropped (offsets are never reused; FIRST then starts at the oldest chunk kept).
* Service time (``service_time`` / ``--service-time``, :mod:`loadgen.servicetime`):
  everything a client frame makes the broker send on that connection (the answer, the
  PublishConfirm of a Publish, Tune after SaslAuthenticate, Deliver after
  Subscribe/Credit) leaves one sample after the frame was read; frames leave each
  connection in the order they were sent (Deliver to *other* connections and Heartbeat
  are not delayed, but queue behind held answers).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import hmac
import logging
import socket
import sys
import time

from loadgen.servecli import address_arg, serve_main, service_time_arg, user_arg
from loadgen.serverthread import ServerThread, new_event_loop
from loadgen.serverbase import ReferenceServer, ServerConnection
from loadgen.servicetime import ServiceTime
from proxy.protocols.rabbitmq_stream import codec
from proxy.protocols.rabbitmq_stream.codec import (
    CommandVersion,
    StreamCodecError,
    decode_body,
    decode_frame,
    encode_command,
)
from proxy.protocols.rabbitmq_stream.constants import (
    ACCESS_REFUSED,
    AUTHENTICATION_FAILURE,
    CLOSE,
    COMMANDS,
    CREATE,
    CREDIT,
    DECLARE_PUBLISHER,
    DEFAULT_PORT,
    DELETE,
    DELETE_PUBLISHER,
    DELIVER,
    EXCHANGE_COMMAND_VERSIONS,
    FRAME_TOO_LARGE,
    HEARTBEAT,
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
    PARTITIONS,
    PEER_PROPERTIES,
    PRECONDITION_FAILED,
    PUBLISH,
    PUBLISH_CONFIRM,
    PUBLISH_ERROR,
    PUBLISHER_DOES_NOT_EXIST,
    QUERY_OFFSET,
    QUERY_PUBLISHER_SEQUENCE,
    ROUTE,
    SASL_AUTHENTICATE,
    SASL_ERROR,
    SASL_HANDSHAKE,
    SASL_MECHANISM_NOT_SUPPORTED,
    STORE_OFFSET,
    STREAM_ALREADY_EXISTS,
    STREAM_DOES_NOT_EXIST,
    STREAM_NOT_AVAILABLE,
    STREAM_STATS,
    SUBSCRIBE,
    SUBSCRIPTION_ID_ALREADY_EXISTS,
    SUBSCRIPTION_ID_DOES_NOT_EXIST,
    TUNE,
    UNKNOWN_FRAME,
    UNSUBSCRIBE,
    VIRTUAL_HOST_ACCESS_FAILURE,
    command_name,
    status_name,
)

__all__ = ["StreamBroker", "StreamBrokerThread", "main", "new_event_loop"]

log = logging.getLogger("frametap.rabbitmq_stream.server")

MAX_REFERENCE_LENGTH = 256   # publisher / consumer reference (PROTOCOL.adoc)
MAX_STREAM_NAME = 255
NO_LEADER = 0xFFFF
SERVER_PROPERTIES = {
    "product": "frametap reference stream broker",
    # The feature set emulated is RabbitMQ 3.13's (Publish/Deliver v2, StreamStats).
    "version": "3.13.0",
    "platform": f"Python {sys.version_info.major}.{sys.version_info.minor}",
}

# Handshake steps of one connection.
_STEP_PEER, _STEP_AUTH, _STEP_TUNE, _STEP_OPEN, _STEP_OPENED, _STEP_CLOSING = range(6)
_HANDSHAKE_KEYS = frozenset({PEER_PROPERTIES, SASL_HANDSHAKE, SASL_AUTHENTICATE, TUNE, OPEN,
                             CLOSE, HEARTBEAT})


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class _Stream:
    """One stream: its chunks (encoded once, sent as is) and its tracking data."""

    def __init__(self, name: str, arguments: dict):
        self.name = name
        self.arguments = arguments
        self.chunks: list[bytes] = []          # chunk bytes, oldest kept first
        self.first_offsets: list[int] = []     # first offset of each kept chunk
        self.timestamps: list[int] = []        # timestamp (ms) of each kept chunk
        self.base = 0                          # absolute index of chunks[0]
        self.next_offset = 0                   # offset of the next record appended
        self.bytes = 0
        self.publisher_sequences: dict[str, int] = {}   # reference -> last publishing id
        self.offsets: dict[str, int] = {}               # consumer reference -> offset
        self.subscriptions: set[_Subscription] = set()

    @property
    def end(self) -> int:
        """Absolute index one past the newest chunk."""
        return self.base + len(self.chunks)

    def append(self, entries: list, retention_bytes: int) -> None:
        chunk = codec.Chunk(self.next_offset, _now_ms(), entries)
        data = chunk.to_bytes()
        self.chunks.append(data)
        self.first_offsets.append(chunk.first_offset)
        self.timestamps.append(chunk.timestamp)
        self.next_offset += chunk.num_records
        self.bytes += len(data)
        if self.bytes > retention_bytes and len(self.chunks) > 1:
            # Drop ~10% beyond the limit at once so trimming stays amortised O(1).
            target = retention_bytes - retention_bytes // 10
            drop = 0
            while self.bytes > target and drop < len(self.chunks) - 1:
                self.bytes -= len(self.chunks[drop])
                drop += 1
            del self.chunks[:drop], self.first_offsets[:drop], self.timestamps[:drop]
            self.base += drop

    def start_index(self, offset_type: int, offset) -> int:
        """Absolute chunk index a new subscription starts at (Subscribe offset spec)."""
        if offset_type == OFFSET_FIRST:
            return self.base
        if offset_type == OFFSET_LAST:
            return max(self.base, self.end - 1)
        if offset_type == OFFSET_NEXT:
            return self.end
        if offset_type == OFFSET_OFFSET:
            if offset >= self.next_offset:
                return self.end
            i = bisect.bisect_right(self.first_offsets, offset) - 1
            return self.base + max(i, 0)
        # OFFSET_TIMESTAMP: the first chunk written at or after the timestamp
        return self.base + bisect.bisect_left(self.timestamps, offset)

    def committed_chunk_id(self) -> int:
        return self.first_offsets[-1] if self.first_offsets else 0


class _Publisher:
    __slots__ = ("id", "reference", "stream")

    def __init__(self, publisher_id: int, reference: str, stream: str):
        self.id = publisher_id
        self.reference = reference
        self.stream = stream


class _Subscription:
    __slots__ = ("conn", "id", "stream", "cursor", "credit")

    def __init__(self, conn: "_Connection", subscription_id: int, stream: _Stream,
                 cursor: int, credit: int):
        self.conn = conn
        self.id = subscription_id
        self.stream = stream
        self.cursor = cursor      # absolute index of the next chunk to deliver
        self.credit = credit      # chunks the client still accepts


class _Fatal(Exception):
    """Close the connection with a server-initiated Close(code, reason)."""

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code = code
        self.reason = reason


class _Connection(ServerConnection):
    """State of one client connection; command handlers are ``_on_<command>`` methods."""

    def __init__(self, broker: "StreamBroker", reader, writer, role=""):
        super().__init__(broker, reader, writer, role)
        self.broker = broker
        self.step = _STEP_PEER
        self.user: str | None = None
        self.frame_max = broker.frame_max
        self.heartbeat = 0
        self.deliver_version = 1
        self.publishers: dict[int, _Publisher] = {}
        self.subscriptions: dict[int, _Subscription] = {}
        self.next_correlation_id = 1
        self.close_deadline: float | None = None
        self._reply_due: float | None = None  # while a client frame is handled

    # ------------------------------------------------------------------ read loop hooks

    def split_frame(self, buf):
        split = decode_frame(buf, self.frame_max or 0)
        if split is None:
            return None
        key, version, body, size = split
        return (key, version, body), size

    def bad_frame(self, exc) -> bool:
        # The real server answers garbage with Close(UNKNOWN_FRAME / FRAME_TOO_LARGE) and
        # waits for the client's answer; what else arrived is dropped.
        if self.step != _STEP_CLOSING:
            code = FRAME_TOO_LARGE if getattr(exc, "reason", "") == "too_large" else UNKNOWN_FRAME
            self.server_close(code, str(exc))
        return False

    def frame_received(self, frame, received: float) -> None:
        # Everything this frame makes the broker send on this connection (answer,
        # PublishConfirm, Tune after authentication, Deliver after Subscribe/Credit) leaves
        # after one service time; frames for other connections are not delayed.
        self._reply_due = self.reply_due(received)
        try:
            self.dispatch(*frame)
        finally:
            self._reply_due = None

    def read_timeout(self) -> float | None:
        if self.close_deadline is None:
            return None
        return self.close_deadline - asyncio.get_running_loop().time()

    def connection_lost(self) -> None:
        self.drop_all()

    # ------------------------------------------------------------------ plumbing

    def send(self, frame: bytes, due: float | None = None) -> None:
        super().send(frame, self._reply_due if due is None else due)

    def respond(self, key: int, correlation_id: int, code: int, **fields) -> None:
        self.send(encode_command(key, response=True, correlation_id=correlation_id,
                                 code=code, **fields))

    def begin_closing(self) -> None:
        """Stop serving: answer only Close/Heartbeat until EOF or ``close_grace``."""
        if self.step != _STEP_CLOSING:
            self.step = _STEP_CLOSING
            self.close_deadline = asyncio.get_running_loop().time() + self.broker.close_grace
            self.drop_all()

    def server_close(self, code: int, reason: str) -> None:
        """Server-initiated Close request (the client should answer, then hang up)."""
        self.server.log_peer(logging.INFO, "rabbitmq-stream broker: closing %s: %s (%s)",
                             self.peer, reason, status_name(code))
        corr = self.next_correlation_id
        self.next_correlation_id += 1
        self.send(encode_command(CLOSE, correlation_id=corr, code=code, reason=reason[:1000]))
        self.begin_closing()

    def drop_all(self) -> None:
        for sub in self.subscriptions.values():
            sub.stream.subscriptions.discard(sub)
        self.subscriptions.clear()
        self.publishers.clear()

    async def _heartbeats(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.heartbeat
        while not self.closed:
            await asyncio.sleep(min(interval, 1.0) if interval > 1 else interval)
            now = loop.time()
            if now - self.last_read > 2 * interval and self.step != _STEP_CLOSING:
                self.server.log_peer(logging.INFO,
                                     "rabbitmq-stream broker: %s missed heartbeats, closing",
                                     self.peer)
                self.abort()
                return
            if now - self.last_write >= interval:
                self.send(encode_command(HEARTBEAT))

    # ------------------------------------------------------------------ dispatch

    def dispatch(self, wire_key: int, version: int, body: bytes) -> None:
        key = wire_key & 0x7FFF
        try:
            cmd = decode_body(wire_key, version, body)
        except StreamCodecError as exc:
            if self.step != _STEP_CLOSING:
                self.server_close(UNKNOWN_FRAME, str(exc))
            return
        if self.step == _STEP_CLOSING:
            if key == CLOSE and cmd.response:
                self.close_deadline = 0.0  # the answer to our Close: hang up now
            elif key == CLOSE:
                self.respond(CLOSE, cmd.correlation_id, OK)
            return
        if cmd.response:
            if key == TUNE:
                self._on_tune(cmd)
            # ConsumerUpdate answers and others need no action here
            return
        if self.step != _STEP_OPENED and key not in _HANDSHAKE_KEYS:
            self.server_close(ACCESS_REFUSED,
                              f"{command_name(key)} before the connection was opened")
            return
        handler = getattr(self, f"_on_{_HANDLER_NAMES.get(key, 'unknown')}", None)
        if handler is None:
            self.server_close(UNKNOWN_FRAME, f"unexpected command {command_name(key)} "
                                             f"from a client")
            return
        try:
            handler(cmd)
        except _Fatal as exc:
            self.server_close(exc.code, exc.reason)

    # ------------------------------------------------------------------ handshake

    def _on_peer_properties(self, cmd) -> None:
        self.respond(PEER_PROPERTIES, cmd.correlation_id, OK,
                     properties=dict(SERVER_PROPERTIES))
        if self.step == _STEP_PEER:
            self.step = _STEP_AUTH

    def _on_sasl_handshake(self, cmd) -> None:
        self.respond(SASL_HANDSHAKE, cmd.correlation_id, OK,
                     mechanisms=self.broker.mechanisms())

    def _on_sasl_authenticate(self, cmd) -> None:
        if self.step > _STEP_AUTH:
            raise _Fatal(PRECONDITION_FAILED, "already authenticated")
        mechanism = cmd.mechanism
        if mechanism not in self.broker.mechanisms():
            self.respond(SASL_AUTHENTICATE, cmd.correlation_id, SASL_MECHANISM_NOT_SUPPORTED)
            self.begin_closing()
            return
        if mechanism == "ANONYMOUS":
            user = "anonymous"
        else:
            parts = (cmd.data or b"").split(b"\0")
            if cmd.data is None or len(parts) != 3:
                self.respond(SASL_AUTHENTICATE, cmd.correlation_id, SASL_ERROR)
                self.begin_closing()
                return
            user = parts[1].decode("utf-8", "replace")
            if not self.broker.check_password(user, parts[2]):
                self.server.log_peer(
                    logging.INFO,
                    "rabbitmq-stream broker: failed authentication for user %r from %s",
                    user, self.peer)
                self.respond(SASL_AUTHENTICATE, cmd.correlation_id, AUTHENTICATION_FAILURE)
                self.begin_closing()
                return
        self.user = user
        self.respond(SASL_AUTHENTICATE, cmd.correlation_id, OK)
        self.step = _STEP_TUNE
        self.send(encode_command(TUNE, frame_max=self.broker.frame_max,
                                 heartbeat=self.broker.heartbeat))

    def _on_tune(self, cmd) -> None:
        if self.step != _STEP_TUNE:
            return  # a late or repeated Tune changes nothing
        ours = self.broker.frame_max
        theirs = cmd.frame_max
        self.frame_max = min(ours, theirs) if ours and theirs else (ours or theirs)
        self.heartbeat = cmd.heartbeat
        self.step = _STEP_OPEN
        if self.heartbeat:
            self.spawn(self._heartbeats())

    def _on_open(self, cmd) -> None:
        if self.step != _STEP_OPEN:
            raise _Fatal(ACCESS_REFUSED, "Open before authentication and Tune")
        if cmd.virtual_host not in self.broker.vhosts:
            self.server.log_peer(logging.INFO,
                                 "rabbitmq-stream broker: %s asked for unknown virtual host %r",
                                 self.peer, cmd.virtual_host)
            self.respond(OPEN, cmd.correlation_id, VIRTUAL_HOST_ACCESS_FAILURE)
            self.begin_closing()
            return
        host, port = self.broker.advertised_address()
        self.respond(OPEN, cmd.correlation_id, OK,
                     properties={"advertised_host": host, "advertised_port": str(port)})
        self.step = _STEP_OPENED

    def _on_close(self, cmd) -> None:
        log.debug("rabbitmq-stream broker: %s closes (%d %s)", self.peer, cmd.code, cmd.reason)
        self.respond(CLOSE, cmd.correlation_id, OK)
        self.begin_closing()

    def _on_heartbeat(self, cmd) -> None:
        pass  # last_read was updated when the bytes arrived

    # ------------------------------------------------------------------ streams

    def _on_create(self, cmd) -> None:
        name = cmd.stream
        if not name or len(name) > MAX_STREAM_NAME:
            code = PRECONDITION_FAILED
        elif name in self.broker.streams:
            code = STREAM_ALREADY_EXISTS
        else:
            self.broker.streams[name] = _Stream(name, dict(cmd.arguments))
            code = OK
        self.respond(CREATE, cmd.correlation_id, code)

    def _on_delete(self, cmd) -> None:
        ok = self.broker.delete_stream(cmd.stream)
        self.respond(DELETE, cmd.correlation_id, OK if ok else STREAM_DOES_NOT_EXIST)

    def _on_metadata(self, cmd) -> None:
        host, port = self.broker.advertised_address()
        entries = []
        for name in cmd.streams:
            if name in self.broker.streams:
                entries.append((name, OK, 0, []))
            else:
                entries.append((name, STREAM_DOES_NOT_EXIST, NO_LEADER, []))
        # Like the real server, list only brokers that host one of the streams.
        brokers = [(0, host, port)] if any(e[1] == OK for e in entries) else []
        self.send(codec.encode_metadata_response(cmd.correlation_id, brokers, entries))

    def _on_stream_stats(self, cmd) -> None:
        stream = self.broker.streams.get(cmd.stream)
        if stream is None:
            self.respond(STREAM_STATS, cmd.correlation_id, STREAM_DOES_NOT_EXIST, stats={})
            return
        first = stream.first_offsets[0] if stream.chunks else -1
        committed = stream.first_offsets[-1] if stream.chunks else -1
        self.respond(STREAM_STATS, cmd.correlation_id, OK,
                     stats={"first_chunk_id": first, "committed_chunk_id": committed})

    def _on_route(self, cmd) -> None:
        self.respond(ROUTE, cmd.correlation_id, STREAM_DOES_NOT_EXIST, streams=[])

    def _on_partitions(self, cmd) -> None:
        self.respond(PARTITIONS, cmd.correlation_id, STREAM_DOES_NOT_EXIST, streams=[])

    def _on_exchange_command_versions(self, cmd) -> None:
        for item in cmd.commands:
            if item.key == DELIVER and item.min_version <= 2 <= item.max_version:
                self.deliver_version = 2
        ours = [CommandVersion(key, *codec.SUPPORTED_VERSIONS.get(key, (1, 1)))
                for key in sorted(COMMANDS)]
        self.respond(EXCHANGE_COMMAND_VERSIONS, cmd.correlation_id, OK, commands=ours)

    # ------------------------------------------------------------------ publishing

    def _on_declare_publisher(self, cmd) -> None:
        reference = cmd.reference or ""
        if cmd.stream not in self.broker.streams:
            code = STREAM_DOES_NOT_EXIST
        elif cmd.publisher_id in self.publishers or len(reference) > MAX_REFERENCE_LENGTH:
            code = PRECONDITION_FAILED
        elif reference and any(p.reference == reference and p.stream == cmd.stream
                               for p in self.publishers.values()):
            code = PRECONDITION_FAILED
        else:
            self.publishers[cmd.publisher_id] = _Publisher(cmd.publisher_id, reference,
                                                           cmd.stream)
            code = OK
        self.respond(DECLARE_PUBLISHER, cmd.correlation_id, code)

    def _on_query_publisher_sequence(self, cmd) -> None:
        stream = self.broker.streams.get(cmd.stream)
        if stream is None:
            self.respond(QUERY_PUBLISHER_SEQUENCE, cmd.correlation_id, STREAM_DOES_NOT_EXIST,
                         sequence=0)
        else:
            self.respond(QUERY_PUBLISHER_SEQUENCE, cmd.correlation_id, OK,
                         sequence=stream.publisher_sequences.get(cmd.reference or "", 0))

    def _on_delete_publisher(self, cmd) -> None:
        found = self.publishers.pop(cmd.publisher_id, None)
        self.respond(DELETE_PUBLISHER, cmd.correlation_id,
                     OK if found else PUBLISHER_DOES_NOT_EXIST)

    def _on_publish(self, cmd) -> None:
        if cmd.version >= 2 and any(isinstance(m.data, codec.SubBatch) for m in cmd.messages):
            raise _Fatal(UNKNOWN_FRAME, "a sub-entry batch in Publish v2 (batches are v1 "
                                        "only: v2 entries are a filter value and a message)")
        publisher = self.publishers.get(cmd.publisher_id)
        stream = self.broker.streams.get(publisher.stream) if publisher else None
        if stream is None:
            errors = [(m.publishing_id, PUBLISHER_DOES_NOT_EXIST) for m in cmd.messages]
            if errors:
                self.send(encode_command(PUBLISH_ERROR, publisher_id=cmd.publisher_id,
                                         errors=errors))
            return
        reference = publisher.reference
        last = stream.publisher_sequences.get(reference, -1) if reference else -1
        entries: list = []
        for m in cmd.messages:
            if reference:
                if m.publishing_id <= last:
                    continue  # duplicate: confirmed below, not stored
                last = m.publishing_id
            entries.append(m.data)
        if reference and last >= 0:
            stream.publisher_sequences[reference] = last
        step = self.broker.max_chunk_entries
        for i in range(0, len(entries), step):
            stream.append(entries[i:i + step], self.broker.retention_bytes)
        ids = [m.publishing_id for m in cmd.messages]
        if ids:
            self.send(encode_command(PUBLISH_CONFIRM, publisher_id=cmd.publisher_id,
                                     publishing_ids=ids))
        if entries:
            for sub in list(stream.subscriptions):
                sub.conn.pump(sub)

    # ------------------------------------------------------------------ consuming

    def _on_subscribe(self, cmd) -> None:
        stream = self.broker.streams.get(cmd.stream)
        if cmd.subscription_id in self.subscriptions:
            self.respond(SUBSCRIBE, cmd.correlation_id, SUBSCRIPTION_ID_ALREADY_EXISTS)
            return
        if stream is None:
            self.respond(SUBSCRIBE, cmd.correlation_id, STREAM_DOES_NOT_EXIST)
            return
        if cmd.offset_type not in (OFFSET_FIRST, OFFSET_LAST, OFFSET_NEXT, OFFSET_OFFSET,
                                   OFFSET_TIMESTAMP):
            self.respond(SUBSCRIBE, cmd.correlation_id, PRECONDITION_FAILED)
            return
        sub = _Subscription(self, cmd.subscription_id, stream,
                            stream.start_index(cmd.offset_type, cmd.offset), cmd.credit)
        self.subscriptions[sub.id] = sub
        stream.subscriptions.add(sub)
        self.respond(SUBSCRIBE, cmd.correlation_id, OK)
        self.pump(sub)

    def pump(self, sub: _Subscription) -> None:
        """Deliver chunks to ``sub`` while it has credit and the stream has chunks."""
        stream = sub.stream
        if sub.cursor < stream.base:
            sub.cursor = stream.base  # retention dropped what it was about to read
        while sub.credit > 0 and sub.cursor < stream.end and not self.closed:
            chunk = stream.chunks[sub.cursor - stream.base]
            if self.deliver_version >= 2:
                head = codec.encode_body(DELIVER, version=2, subscription_id=sub.id,
                                         committed_chunk_id=stream.committed_chunk_id(),
                                         chunk=b"")
            else:
                head = bytes((sub.id,))
            self.send(codec.encode_frame(DELIVER, self.deliver_version, head + chunk))
            sub.cursor += 1
            sub.credit -= 1

    def _on_credit(self, cmd) -> None:
        sub = self.subscriptions.get(cmd.subscription_id)
        if sub is None:
            self.send(encode_command(CREDIT, response=True, code=SUBSCRIPTION_ID_DOES_NOT_EXIST,
                                     subscription_id=cmd.subscription_id))
            return
        sub.credit = min(sub.credit + cmd.credit, 0xFFFF)
        self.pump(sub)

    def _on_unsubscribe(self, cmd) -> None:
        sub = self.subscriptions.pop(cmd.subscription_id, None)
        if sub is not None:
            sub.stream.subscriptions.discard(sub)
        self.respond(UNSUBSCRIBE, cmd.correlation_id,
                     OK if sub else SUBSCRIPTION_ID_DOES_NOT_EXIST)

    def _on_store_offset(self, cmd) -> None:
        stream = self.broker.streams.get(cmd.stream)
        reference = cmd.reference or ""
        # The real server ignores bad StoreOffset frames silently (there is no answer).
        if stream is not None and reference and len(reference) <= MAX_REFERENCE_LENGTH:
            stream.offsets[reference] = cmd.offset

    def _on_query_offset(self, cmd) -> None:
        stream = self.broker.streams.get(cmd.stream)
        if stream is None:
            self.respond(QUERY_OFFSET, cmd.correlation_id, STREAM_DOES_NOT_EXIST, offset=0)
            return
        offset = stream.offsets.get(cmd.reference or "")
        if offset is None:
            self.respond(QUERY_OFFSET, cmd.correlation_id, NO_OFFSET, offset=0)
        else:
            self.respond(QUERY_OFFSET, cmd.correlation_id, OK, offset=offset)


#: Command key -> handler suffix (``_on_<suffix>``) for commands a client may send.
_HANDLER_NAMES = {
    PEER_PROPERTIES: "peer_properties", SASL_HANDSHAKE: "sasl_handshake",
    SASL_AUTHENTICATE: "sasl_authenticate", TUNE: "tune", OPEN: "open", CLOSE: "close",
    HEARTBEAT: "heartbeat", CREATE: "create", DELETE: "delete", METADATA: "metadata",
    STREAM_STATS: "stream_stats", ROUTE: "route", PARTITIONS: "partitions",
    EXCHANGE_COMMAND_VERSIONS: "exchange_command_versions",
    DECLARE_PUBLISHER: "declare_publisher",
    QUERY_PUBLISHER_SEQUENCE: "query_publisher_sequence",
    DELETE_PUBLISHER: "delete_publisher", PUBLISH: "publish", SUBSCRIBE: "subscribe",
    CREDIT: "credit", UNSUBSCRIBE: "unsubscribe", STORE_OFFSET: "store_offset",
    QUERY_OFFSET: "query_offset",
}
# Not in the table (server-to-client only: PublishConfirm, PublishError, Deliver,
# MetadataUpdate, ConsumerUpdate requests): the connection is closed with UNKNOWN_FRAME.


class StreamBroker(ReferenceServer):
    """In-memory single-node RabbitMQ Stream broker on one socket (see the module docstring).

    ``users`` maps user names to passwords; ``vhosts`` are the virtual hosts Open accepts;
    ``advertised_host`` / ``advertised_port`` are what Metadata and Open announce (default:
    the listen host and the bound port); ``frame_max`` (bytes, 0 = no limit) and
    ``heartbeat`` (seconds, 0 = none) are what Tune proposes; ``service_time`` (a
    :class:`~loadgen.servicetime.ServiceTime` or its text, ``"2ms±1ms"``) delays answers.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, users=None,
                 vhosts=("/",), advertised_host: str | None = None,
                 advertised_port: int | None = None, frame_max: int = 1048576,
                 heartbeat: int = 60, allow_anonymous: bool = False,
                 max_chunk_entries: int = 1000, retention_bytes: int = 256 * 1024 * 1024,
                 close_grace: float = 3.0, service_time: ServiceTime | str | None = None):
        super().__init__(service_time)
        self.host = host
        self.port = port
        self.users = {"guest": "guest"} if users is None else dict(users)
        self.vhosts = frozenset(vhosts)
        self.advertised_host = advertised_host
        self.advertised_port = advertised_port
        if frame_max < 0 or heartbeat < 0:
            raise ValueError(f"frame_max and heartbeat must be >= 0, got {frame_max}, "
                             f"{heartbeat}")
        self.frame_max = frame_max
        self.heartbeat = heartbeat
        self.allow_anonymous = allow_anonymous
        if not 1 <= max_chunk_entries <= 0xFFFF:
            raise ValueError(f"max_chunk_entries must be 1..65535, got {max_chunk_entries}")
        self.max_chunk_entries = max_chunk_entries
        self.retention_bytes = retention_bytes
        self.close_grace = close_grace
        self.streams: dict[str, _Stream] = {}

    what = "rabbitmq-stream broker"
    log = log  # the module logger
    connection_class = _Connection
    # The handshake and Subscribe-then-Deliver rely on order: answers leave in order.
    ordered_replies = True

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Bind and start accepting; sets :attr:`port` to the bound port."""
        self.port = await self.listen(self.host, self.port)
        host, port = self.advertised_address()
        log.info("rabbitmq-stream broker listening on %s:%d (advertising %s:%d)",
                 self.host, self.port, host, port)

    # ------------------------------------------------------------------ helpers

    def advertised_address(self) -> tuple[str, int]:
        host = self.advertised_host
        if host is None:
            host = self.host if self.host not in ("", "0.0.0.0", "::") else socket.gethostname()
        return host, self.advertised_port or self.port

    def mechanisms(self) -> list[str]:
        return ["PLAIN", "ANONYMOUS"] if self.allow_anonymous else ["PLAIN"]

    def check_password(self, user: str, password: bytes) -> bool:
        expected = self.users.get(user)
        return expected is not None and hmac.compare_digest(expected.encode("utf-8"),
                                                            password)

    def delete_stream(self, name: str) -> bool:
        stream = self.streams.pop(name, None)
        if stream is None:
            return False
        update = encode_command(METADATA_UPDATE, code=STREAM_NOT_AVAILABLE, stream=name)
        for conn in list(self.connections):
            gone_subs = [s for s in conn.subscriptions.values() if s.stream is stream]
            gone_pubs = [p for p in conn.publishers.values() if p.stream == name]
            for s in gone_subs:
                del conn.subscriptions[s.id]
            for p in gone_pubs:
                del conn.publishers[p.id]
            if gone_subs or gone_pubs:
                conn.send(update)
        stream.subscriptions.clear()
        return True


class StreamBrokerThread(ServerThread):
    """Run a :class:`StreamBroker` on its own event loop in a background thread::

        with StreamBrokerThread(users={"guest": "guest"}) as broker:
            Producer("127.0.0.1", broker.port, username="guest", password="guest")
    """

    thread_name = "rabbitmq-stream-broker"
    what = "rabbitmq-stream broker"

    def __init__(self, **broker_kwargs):
        super().__init__(StreamBroker(**broker_kwargs))

    @property
    def broker(self) -> StreamBroker:
        return self.server


# ---------------------------------------------------------------------- command line

def _address_arg(text: str) -> tuple[str, int]:
    return address_arg(text, DEFAULT_PORT)


def _non_negative_int(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 0")
    return int(text)


def build_parser(prog: str = "frametap serve rabbitmq-stream") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run the in-memory reference RabbitMQ Stream broker until "
                    "SIGINT/SIGTERM.")
    parser.add_argument("--listen", type=_address_arg, default=("127.0.0.1", DEFAULT_PORT),
                        metavar="HOST:PORT",
                        help=f"address to listen on (default 127.0.0.1:{DEFAULT_PORT})")
    parser.add_argument("--advertise", type=_address_arg, default=None, metavar="HOST:PORT",
                        help="address Metadata and Open announce to clients (default: the "
                             "listen address)")
    parser.add_argument("--user", type=user_arg, action="append", default=[],
                        metavar="NAME:PASSWORD",
                        help="accept this user (repeatable; default guest:guest)")
    parser.add_argument("--vhost", action="append", default=[], metavar="NAME",
                        help="accept this virtual host in Open (repeatable; default /)")
    parser.add_argument("--anonymous", action="store_true",
                        help="also offer the SASL ANONYMOUS mechanism")
    parser.add_argument("--frame-max", type=_non_negative_int, default=1048576, metavar="N",
                        help="frame_max proposed in Tune, bytes (default 1048576; 0 = none)")
    parser.add_argument("--heartbeat", type=_non_negative_int, default=60, metavar="S",
                        help="heartbeat proposed in Tune, seconds (default 60; 0 = none)")
    parser.add_argument("--service-time", type=service_time_arg, default=None,
                        metavar="DIST",
                        help="delay every answer: '0', '500us', '2ms±1ms', '2ms+-1ms', "
                             "'exp:2ms' (default 0)")
    parser.add_argument("--log-level", default="INFO",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser


def _make_broker(args: argparse.Namespace) -> tuple[StreamBroker, str]:
    host, port = args.listen
    adv_host, adv_port = args.advertise if args.advertise else (None, None)
    broker = StreamBroker(host, port, users=dict(args.user) if args.user else None,
                          vhosts=tuple(args.vhost) or ("/",), advertised_host=adv_host,
                          advertised_port=adv_port, frame_max=args.frame_max,
                          heartbeat=args.heartbeat, allow_anonymous=args.anonymous,
                          service_time=args.service_time)
    return broker, f"{host}:{port}"


def _banner(broker: StreamBroker) -> str:
    host, port = broker.advertised_address()
    return (f"rabbitmq-stream: listening on {broker.host}:{broker.port} "
            f"(advertising {host}:{port})")


def main(argv: list[str] | None = None) -> int:
    """``frametap serve rabbitmq-stream`` entry point; returns the exit status."""
    return serve_main(build_parser(), argv, _make_broker, _banner)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
