"""Reference FlyMQ server (asyncio, uvloop when installed) for load runs and tests.

No real FlyMQ broker is installable here (docs/design.md, "Reference servers"), so this in-memory
server is what ``frametap serve flymq``, the demo and the tests talk to. It implements
the core opcodes of the FlyMQ seed document (docs/design.md, "FlyMQ") with the payload layouts of
:mod:`proxy.protocols.flymq.codec`:

* Topics hold partitions; each partition is an append-only log whose offsets start at 0.
  PRODUCE with partition -1 picks ``crc32(key) % partitions`` for keyed records and
  round-robin otherwise, and returns real RecordMetadata (offset, ms timestamp, key_size -1
  when there is no key). PRODUCE to a missing topic creates it with 1 partition.
* CONSUME returns the record at an offset (ERROR when the offset is not in the log);
  FETCH returns up to ``max_messages`` records from an offset plus the next offset.
* Requests are read as the real server (firefly-oss/flymq 4df79e0, v1.26.11) reads them:
  fields a newer client appends are ignored (see :mod:`proxy.protocols.flymq.codec`), and
  its defaults apply — FETCH ``max_messages`` <= 0 means 10; FETCH's optional filter keeps
  the records whose value or key contains it (case-insensitive), looking at no more than
  1000 records per request as the real broker does (its regular-expression and ``$.``
  JSON-path forms are not evaluated here: only the substring match); CREATE_TOPIC with 0
  partitions makes 1; SUBSCRIBE with an empty mode means ``latest``; a header flag 0x02
  (gzip, also set in the flag values 3 and 7 << 1) means the payload is gzip-compressed and
  is inflated (up to the frame limit) before it is decoded.
* CREATE_TOPIC / DELETE_TOPIC / LIST_TOPICS / METADATA manage topics; SUBSCRIBE (modes
  ``earliest``, ``latest``, ``commit``) and COMMIT keep consumer-group offsets. As in the
  real broker, creating a topic that exists and deleting one that does not both succeed,
  and COMMIT stores any (group, topic, partition) (up to ``MAX_COMMITTED`` of them here).
* AUTH checks the configured users and is answered with AUTH_RESPONSE (0x71); with
  ``require_auth`` every other request before a successful AUTH gets ERROR.
* Answers are encoded as the real server encodes them (see
  :mod:`proxy.protocols.flymq.codec`): responses echo the request opcode (AUTH aside),
  failures come back as ERROR (0xFF) whose payload is the message's plain text (header
  flags 0; a malformed AUTH request gets the coded form). Unknown or unimplemented opcodes
  get ERROR ``unknown opcode: <n>`` / ``unsupported opcode ...``.
* A bad magic byte, a protocol version other than 0x01 or a payload length over the
  limit: like the real server (whose header reader refuses all three), no answer — one
  rate-limited log line, that connection is closed, the server carries on.
* Service time: each response is held back by a sample of the configured distribution
  (:mod:`loadgen.servicetime`), measured from when the request was read; responses on one
  connection still leave in request order.
* Retention: each partition keeps about ``retention_messages`` records (up to 10% more;
  the oldest are dropped in chunks, offsets are never reused) so long load runs do not
  exhaust memory.
"""

from __future__ import annotations

import argparse
import hmac
import logging
import sys
import time
import zlib
from collections.abc import Mapping

from loadgen.servecli import CommandLineError, address_arg, serve_main, service_time_arg, user_arg
from loadgen.serverthread import ServerThread, new_event_loop
from loadgen.serverbase import ReferenceServer, ServerConnection
from loadgen.servicetime import ServiceTime
from proxy.protocols.flymq.codec import (
    AuthResponse,
    CommitResponse,
    ConsumeResponse,
    CreateTopicResponse,
    DeleteTopicResponse,
    ErrorResponse,
    FetchedMessage,
    FetchResponse,
    FlyMQCodecError,
    ListTopicsResponse,
    MetadataResponse,
    PartitionInfo,
    RecordMetadata,
    REQUEST_TYPES,
    SubscribeResponse,
    decode_header,
)
from proxy.protocols.flymq.constants import (
    AUTH,
    COMMIT,
    CONSUME,
    CREATE_TOPIC,
    DELETE_TOPIC,
    FETCH,
    HEADER_SIZE,
    LIST_TOPICS,
    MAGIC,
    MAX_FRAME_BYTES,
    METADATA,
    PRODUCE,
    SUBSCRIBE,
    VERSION,
    opcode_name,
)

__all__ = ["FlyMQServer", "FlyMQServerThread", "main", "new_event_loop"]

log = logging.getLogger("frametap.flymq.server")

DEFAULT_ROLES = ("admin",)
MAX_PARTITIONS = 1024
MAX_FETCH_MESSAGES = 10_000
MAX_FETCH_BYTES = 8 * 1024 * 1024  # keep FETCH responses well under MAX_MESSAGE_SIZE
MAX_ERROR_TEXT = 1000
MAX_COMMITTED = 100_000    # (group, topic, partition) offsets kept
DEFAULT_FETCH_MESSAGES = 10  # FETCH with max_messages <= 0 (the real server's default)
FILTER_SCAN_LIMIT = 1000     # records a filtered FETCH looks at (the real broker's scanLimit)
FLAG_GZIP = 0x02             # header flags: payload is gzip-compressed (bits 1-3 = 1 or 3)


def _gunzip(payload: bytes, limit: int) -> bytes:
    """Inflate a gzip payload, refusing more than ``limit`` bytes (a small compressed
    frame must not become gigabytes here). Raises ValueError."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        data = inflater.decompress(payload, limit + 1)
    except zlib.error as exc:
        raise ValueError(f"bad gzip data: {exc}") from None
    if len(data) > limit:
        raise ValueError(f"inflates to more than {limit} bytes")
    if not inflater.eof:
        raise ValueError("truncated gzip data")
    return data
SUBSCRIBE_MODES = ("earliest", "latest", "commit")


class _RequestError(Exception):
    """Turns into an ERROR (0xFF) response with this message."""


class _Partition:
    __slots__ = ("records", "base")

    def __init__(self):
        self.records: list[tuple[bytes | None, bytes, int]] = []  # (key, value, ts_ms)
        self.base = 0  # offset of records[0]; grows when retention drops old records

    @property
    def high_watermark(self) -> int:
        return self.base + len(self.records)


class _Topic:
    __slots__ = ("name", "partitions", "next_rr")

    def __init__(self, name: str, partitions: int):
        self.name = name
        self.partitions = [_Partition() for _ in range(partitions)]
        self.next_rr = 0


class _FlyMQConnection(ServerConnection):
    """One client: 8-byte header + payload frames, answered in order (FIFO)."""

    def __init__(self, server, reader, writer, role=""):
        super().__init__(server, reader, writer, role)
        self.user: str | None = None
        self.roles: list[str] = []

    def split_frame(self, buf):
        if len(buf) < HEADER_SIZE:
            return None
        if buf[0] == MAGIC and buf[1] != VERSION:
            # the real server's header reader refuses it before the length: no answer, close
            raise FlyMQCodecError(f"flymq: unsupported protocol version 0x{buf[1]:02X} "
                                  f"(expected 0x{VERSION:02X})", "bad_version")
        _magic, version, opcode, flags, length = decode_header(buf, self.server.max_frame_bytes)
        if len(buf) < HEADER_SIZE + length:
            return None
        return (version, opcode, bytes(buf[HEADER_SIZE:HEADER_SIZE + length]), flags), \
            HEADER_SIZE + length

    def frame_received(self, frame, received: float) -> None:
        self.send(self.server.handle_request(self, *frame), self.reply_due(received))


def _normalize_users(users) -> dict[str, tuple[str, list[str]]]:
    result: dict[str, tuple[str, list[str]]] = {}
    if not users:
        return result
    if not isinstance(users, Mapping):
        raise ValueError(f"users must be a mapping of name -> password, got {type(users).__name__}")
    for name, value in users.items():
        if isinstance(value, str):
            result[name] = (value, list(DEFAULT_ROLES))
        else:
            password, roles = value
            result[name] = (password, list(roles))
    return result


class FlyMQServer(ReferenceServer):
    """In-memory FlyMQ broker on one listening socket (see the module docstring).

    ``users`` maps a user name to a password, or to ``(password, roles)``; users given a
    bare password get the role ``admin``. ``service_time`` is a :class:`ServiceTime` or
    its text (``"2ms±1ms"``).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, users=None,
                 service_time: ServiceTime | str | None = None, require_auth: bool = False,
                 max_frame_bytes: int = MAX_FRAME_BYTES, retention_messages: int = 100_000):
        super().__init__(service_time)
        self.host = host
        self.port = port
        self.users = _normalize_users(users)
        self.require_auth = require_auth
        self.max_frame_bytes = max_frame_bytes
        if retention_messages < 1:
            raise ValueError(f"retention_messages must be >= 1, got {retention_messages}")
        self.retention_messages = retention_messages
        self.topics: dict[str, _Topic] = {}
        # (group, topic, partition) -> committed offset
        self.committed: dict[tuple[str, str, int], int] = {}
        self.requests_served = 0
        self._handlers = {
            PRODUCE: self._produce,
            CONSUME: self._consume,
            FETCH: self._fetch,
            CREATE_TOPIC: self._create_topic,
            DELETE_TOPIC: self._delete_topic,
            LIST_TOPICS: self._list_topics,
            METADATA: self._metadata,
            SUBSCRIBE: self._subscribe,
            COMMIT: self._commit,
            AUTH: self._auth,
        }

    what = "flymq server"
    log = log  # the module logger
    connection_class = _FlyMQConnection
    ordered_replies = True  # no correlation id: answers must keep request order

    async def start(self) -> None:
        """Bind and start accepting; sets :attr:`port` to the bound port."""
        self.port = await self.listen(self.host, self.port)
        log.info("flymq server listening on %s:%d", self.host, self.port)

    # ------------------------------------------------------------------ requests

    def handle_request(self, conn: _FlyMQConnection, version: int, opcode: int,
                       payload: bytes, flags: int = 0) -> bytes:
        """Process one request; returns the whole response frame (header + payload)."""
        self.requests_served += 1
        if version != VERSION:  # split_frame closes on it; direct callers get an ERROR
            return self._error(f"invalid protocol version 0x{version:02X}")
        if flags & FLAG_GZIP:
            try:
                payload = _gunzip(payload, self.max_frame_bytes)
            except ValueError as exc:
                return self._error(f"cannot decompress {opcode_name(opcode)} payload: {exc}")
        handler = self._handlers.get(opcode)
        if handler is None:
            name = opcode_name(opcode)
            if name.startswith("unknown_"):
                return self._error(f"unknown opcode: {opcode}")  # the real server's words
            return self._error(f"unsupported opcode 0x{opcode:02X} ({name})")
        if self.require_auth and conn.user is None and opcode != AUTH:
            return self._error(f"authentication required before {opcode_name(opcode)}: "
                               f"send AUTH first")
        try:
            request = REQUEST_TYPES[opcode].decode(payload)
        except FlyMQCodecError as exc:
            if opcode == AUTH:  # the real server's sendErrorResponse: code 1 + string
                return ErrorResponse(f"invalid auth request: {exc}"[:MAX_ERROR_TEXT],
                                     1).to_frame()
            return self._error(f"bad {opcode_name(opcode)} request: {exc}")
        try:
            response = handler(conn, request)
        except _RequestError as exc:
            return self._error(str(exc))
        return response.to_frame()

    @staticmethod
    def _error(message: str) -> bytes:
        """ERROR as the real server's WriteError sends it: plain text, flags 0."""
        return ErrorResponse(message[:MAX_ERROR_TEXT]).to_frame()

    def _get_partition(self, topic_name: str, partition: int) -> _Partition:
        topic = self.topics.get(topic_name)
        if topic is None:
            raise _RequestError(f"unknown topic {topic_name!r}")
        if not 0 <= partition < len(topic.partitions):
            raise _RequestError(f"topic {topic_name!r} has no partition {partition} "
                                f"(partitions 0..{len(topic.partitions) - 1})")
        return topic.partitions[partition]

    def _create(self, name: str, partitions: int) -> _Topic:
        topic = _Topic(name, partitions)
        self.topics[name] = topic
        return topic

    @staticmethod
    def _check_topic_name(name: str) -> str | None:
        if not name:
            return "topic name must not be empty"
        if len(name) > 249:
            return f"topic name is {len(name)} characters (max 249)"
        return None

    def _produce(self, conn, req) -> RecordMetadata:
        topic = self.topics.get(req.topic)
        if topic is None:
            problem = self._check_topic_name(req.topic)
            if problem:
                raise _RequestError(problem)
            topic = self._create(req.topic, 1)  # auto-create, 1 partition
        n = len(topic.partitions)
        if req.partition == -1:
            if req.key:
                index = zlib.crc32(req.key) % n
            else:
                index = topic.next_rr % n
                topic.next_rr += 1
        elif 0 <= req.partition < n:
            index = req.partition
        else:
            raise _RequestError(f"topic {req.topic!r} has no partition {req.partition} "
                                f"(partitions 0..{n - 1}, or -1 for auto)")
        part = topic.partitions[index]
        ts_ms = time.time_ns() // 1_000_000
        offset = part.high_watermark
        part.records.append((req.key, req.value, ts_ms))
        excess = len(part.records) - self.retention_messages
        if excess > 0 and excess >= max(1, self.retention_messages // 10):
            # Drop in chunks of ~10% so trimming stays amortised O(1) per record.
            del part.records[:excess]
            part.base += excess
        return RecordMetadata(req.topic, index, offset, ts_ms,
                              len(req.key) if req.key else -1, len(req.value))

    def _consume(self, conn, req) -> ConsumeResponse:
        part = self._get_partition(req.topic, req.partition)
        if not part.base <= req.offset < part.high_watermark:
            raise _RequestError(
                f"offset {req.offset} out of range for {req.topic!r} partition "
                f"{req.partition} (valid {part.base}..{part.high_watermark - 1})"
                if part.high_watermark > part.base else
                f"offset {req.offset} out of range for {req.topic!r} partition "
                f"{req.partition} (partition is empty, next offset {part.high_watermark})")
        key, value, _ts = part.records[req.offset - part.base]
        return ConsumeResponse(value, key)

    def _fetch(self, conn, req) -> FetchResponse:
        part = self._get_partition(req.topic, req.partition)
        max_messages = req.max_messages if req.max_messages > 0 else DEFAULT_FETCH_MESSAGES
        hw = part.high_watermark
        if req.offset > hw:
            raise _RequestError(f"offset {req.offset} is beyond the end of {req.topic!r} "
                                f"partition {req.partition} (next offset {hw})")
        start = max(req.offset, part.base)
        limit = min(max_messages, MAX_FETCH_MESSAGES)
        if req.filter:
            return self._collect(part, start, min(hw, start + FILTER_SCAN_LIMIT), limit,
                                 req.filter.encode("utf-8", "surrogateescape").lower())
        return self._collect(part, start, min(hw, start + limit), limit)

    @staticmethod
    def _collect(part: _Partition, start: int, scan_end: int, limit: int,
                 needle: bytes | None = None) -> FetchResponse:
        """Up to ``limit`` records from ``start`` (and MAX_FETCH_BYTES), looking no further
        than ``scan_end``; with ``needle``, like the real broker's filter, only those whose
        value or key contains it (case-insensitive).  The next offset is the first record
        not looked at."""
        messages = []
        size = 0
        offset = start
        for key, value, _ts in part.records[start - part.base:scan_end - part.base]:
            if len(messages) >= limit:
                break
            if needle is None or needle in value.lower() or (
                    key is not None and needle in key.lower()):
                size += len(value) + (len(key) if key else 0) + 16
                if messages and size > MAX_FETCH_BYTES:
                    break
                messages.append(FetchedMessage(offset, value, key))
            offset += 1
        return FetchResponse(messages, offset)

    def _create_topic(self, conn, req) -> CreateTopicResponse:
        problem = self._check_topic_name(req.topic)
        if problem:
            raise _RequestError(problem)
        if req.topic in self.topics:
            return CreateTopicResponse(True)  # idempotent, as in the real broker
        partitions = req.partitions or 1  # the real server's default for 0
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise _RequestError(f"partitions must be 1..{MAX_PARTITIONS}, got {req.partitions}")
        self._create(req.topic, partitions)
        return CreateTopicResponse(True)

    def _delete_topic(self, conn, req) -> DeleteTopicResponse:
        if self.topics.pop(req.topic, None) is not None:  # a missing topic: success too
            for key in [k for k in self.committed if k[1] == req.topic]:
                del self.committed[key]
        return DeleteTopicResponse(True)

    def _list_topics(self, conn, req) -> ListTopicsResponse:
        return ListTopicsResponse(sorted(self.topics))

    def _metadata(self, conn, req) -> MetadataResponse:
        topic = self.topics.get(req.topic)
        if topic is None:
            raise _RequestError(f"unknown topic {req.topic!r}")
        return MetadataResponse(req.topic, [PartitionInfo(i, 0, p.base, p.high_watermark)
                                            for i, p in enumerate(topic.partitions)])

    def _subscribe(self, conn, req) -> SubscribeResponse:
        part = self._get_partition(req.topic, req.partition)
        mode = req.mode or "latest"  # the real server's default
        if mode == "earliest":
            return SubscribeResponse(part.base)
        if mode == "latest":
            return SubscribeResponse(part.high_watermark)
        if mode == "commit":
            committed = self.committed.get((req.group, req.topic, req.partition))
            return SubscribeResponse(part.base if committed is None else committed)
        raise _RequestError(f"bad subscribe mode {req.mode!r} "
                            f"(expected one of {', '.join(SUBSCRIBE_MODES)})")

    def _commit(self, conn, req) -> CommitResponse:
        key = (req.group, req.topic, req.partition)
        if key not in self.committed and len(self.committed) >= MAX_COMMITTED:
            raise _RequestError(f"too many committed offsets ({MAX_COMMITTED})")
        self.committed[key] = req.offset  # any group/topic/partition, as the real broker
        return CommitResponse(True)

    def _auth(self, conn, req) -> AuthResponse:
        entry = self.users.get(req.username)
        if entry is not None and hmac.compare_digest(entry[0].encode("utf-8"),
                                                     req.password.encode("utf-8")):
            conn.user, conn.roles = req.username, list(entry[1])
            return AuthResponse(True, "", req.username, list(entry[1]))
        self.log_peer(logging.INFO, "flymq server: failed AUTH for user %r from %s",
                      req.username, conn.peer)
        return AuthResponse(False, "invalid credentials")


class FlyMQServerThread(ServerThread):
    """Run a :class:`FlyMQServer` on its own event loop in a background thread.

    For tests and the demo::

        with FlyMQServerThread(service_time="1ms") as srv:
            client = FlyMQClient("127.0.0.1", srv.port)
    """

    thread_name = "flymq-server"
    what = "flymq server"
    cancel_pending_tasks = False  # let connection handlers see their closed sockets and finish

    def __init__(self, **server_kwargs):
        super().__init__(FlyMQServer(**server_kwargs))


# ---------------------------------------------------------------------- command line

def _listen_arg(text: str) -> tuple[str, int]:
    return address_arg(text, 9092)


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer")
    return int(text)


def build_parser(prog: str = "frametap serve flymq") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run the in-memory reference FlyMQ server until SIGINT/SIGTERM.")
    parser.add_argument("--listen", type=_listen_arg, default=("127.0.0.1", 9092),
                        metavar="HOST:PORT", help="address to listen on (default 127.0.0.1:9092)")
    parser.add_argument("--service-time", type=service_time_arg, default=None,
                        metavar="DIST",
                        help="delay each response: '0', '500us', '2ms±1ms', '2ms+-1ms', 'exp:2ms'")
    parser.add_argument("--user", type=user_arg, action="append", default=[],
                        metavar="NAME:PASSWORD", help="accept this user in AUTH (repeatable)")
    parser.add_argument("--require-auth", action="store_true",
                        help="refuse every request before a successful AUTH")
    parser.add_argument("--max-frame-bytes", type=_positive_int, default=MAX_FRAME_BYTES,
                        metavar="N", help=f"payload length limit (default {MAX_FRAME_BYTES})")
    parser.add_argument("--retention-messages", type=_positive_int, default=100_000,
                        metavar="N", help="records kept per partition (default 100000)")
    parser.add_argument("--log-level", default="INFO",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser


def _make_server(args: argparse.Namespace) -> tuple[FlyMQServer, str]:
    host, port = args.listen
    if args.require_auth and not args.user:
        raise CommandLineError("--require-auth needs at least one --user NAME:PASSWORD")
    server = FlyMQServer(host, port, users=dict(args.user), service_time=args.service_time,
                         require_auth=args.require_auth, max_frame_bytes=args.max_frame_bytes,
                         retention_messages=args.retention_messages)
    return server, f"{host}:{port}"


def main(argv: list[str] | None = None) -> int:
    """``frametap serve flymq`` entry point; returns the exit status."""
    return serve_main(build_parser(), argv, _make_server,
                      lambda server: f"flymq: listening on {server.host}:{server.port}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
