"""FlyMQ codec: whole frames and whole messages (the FlyMQ seed document, with the
real server's request decoding; docs/design.md, "FlyMQ").

Pure Python; used by the reference server, the sync client, the Locust users and the
tests. The proxy's hot-path parser does not use it.

Frames
    ``encode_frame(opcode, payload)`` builds header + payload; ``decode_header(buf)``
    validates the 8-byte header ("Wire Format") and ``decode_frame(buf)`` splits one whole
    frame off a buffer.

Messages
    One small dataclass per request and per response. ``msg.encode()`` returns the
    payload bytes, ``Cls.decode(payload)`` parses them, ``msg.to_frame()`` returns header +
    payload. ``decode_request(opcode, payload)`` / ``decode_response(opcode, payload)``
    pick the class from the opcode. All integers are big-endian; ``string`` is u16 length +
    UTF-8, ``bytes`` is u32 length + raw, ``[]string`` is u32 count + strings ("Binary
    Encoding Rules"). A truncated payload raises :class:`FlyMQCodecError` (and nothing
    else). Request decoders read what the real server reads (below); response decoders are
    strict: a bad bool byte, invalid UTF-8 or trailing bytes raise too.

Compared with the real server
    The request decoders were audited against firefly-oss/flymq at commit
    4df79e040d02f7c65240c6955a0458cc49d6bf84 (v1.26.11, 2026-01-19):
    ``internal/protocol/binary.go`` (``DecodeBinary*Request``) and
    ``internal/server/server.go`` (``handleMessage`` and the handlers). Like it, every
    request decoder here ignores bytes after the last field it knows (fields a newer client
    adds), does not check strings for UTF-8, and:

    * FETCH reads an optional trailing ``string filter`` (kept only when whole);
    * SUBSCRIBE's mode is u8 length + bytes, not a u16 string;
    * LIST_TOPICS ignores its payload.

    What the reference server then does with those fields (defaults when absent or zero,
    the filter, gzip-compressed payloads) is described in :mod:`loadgen.flymq.server`.

    Responses are encoded as the real server encodes them (``EncodeBinary*Response``,
    ``WriteError``), where they differ from the seed document:

    * FETCH: uint32 count, uint64 next_offset, then per message uint64 offset, bytes key,
      bytes value;
    * CREATE_TOPIC, DELETE_TOPIC, COMMIT: one byte 0x01 (failures are ERROR frames);
    * AUTH: answered with opcode AUTH_RESPONSE (0x71): bool success, string username,
      uint32 role count + u8-length roles, string error;
    * ERROR: the message's plain bytes with header flags 0 (a bad AUTH request gets the
      coded form, int32 code + string message); both decode (:class:`ErrorResponse`);
    * METADATA (which the real server does not dispatch: it answers "unknown opcode: 4")
      uses the real code base's ``EncodeBinaryMetadataResponse`` layout: string topic,
      uint32 count, per partition int32 id, int32 leader, uint64 oldest, uint64 newest.

Layouts the spec gives (PRODUCE, CONSUME, FETCH request, CREATE_TOPIC request, SUBSCRIBE)
are followed exactly. Where it gives none, frametap uses these (same encoding rules):

    COMMIT        req: string topic, string group, int32 partition, uint64 offset
    LIST_TOPICS   req: empty
                  resp: []string topics
    DELETE_TOPIC  req: string topic

Keys: the spec encodes "no key" as key length 0, so a decoded empty key is ``None``.

Known spec errata (the bytes win): in "Wire Example - Produce "hello" to "test"" the request
header says length 0x13 (19) but the payload shown is 23 (0x17) bytes; and the response's
timestamp bytes ``00 00 01 8D 5A 3B 2C 00`` are 1706615843840, not the 1705123456000 in the
comment.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple

from proxy.errors import FlyMQFrameError
from proxy.protocols.flymq.constants import (
    AUTH,
    AUTH_RESPONSE,
    COMMIT,
    CONSUME,
    CREATE_TOPIC,
    DELETE_TOPIC,
    ERROR,
    FETCH,
    FLAG_BINARY,
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

__all__ = [
    "FlyMQCodecError",
    "Frame",
    "encode_frame",
    "decode_header",
    "decode_frame",
    "ProduceRequest",
    "RecordMetadata",
    "ConsumeRequest",
    "ConsumeResponse",
    "FetchRequest",
    "FetchedMessage",
    "FetchResponse",
    "CreateTopicRequest",
    "CreateTopicResponse",
    "MetadataRequest",
    "MetadataResponse",
    "PartitionInfo",
    "SubscribeRequest",
    "SubscribeResponse",
    "CommitRequest",
    "CommitResponse",
    "ListTopicsRequest",
    "ListTopicsResponse",
    "DeleteTopicRequest",
    "DeleteTopicResponse",
    "AuthRequest",
    "AuthResponse",
    "ErrorResponse",
    "REQUEST_TYPES",
    "RESPONSE_TYPES",
    "decode_request",
    "decode_response",
    "RESPONSE_OPCODE",
]


class FlyMQCodecError(FlyMQFrameError, ValueError):
    """A FlyMQ frame or payload that does not follow the spec (or cannot be encoded).

    A ``ValueError`` and a :class:`proxy.errors.FlyMQFrameError`; ``reason`` is
    ``bad_magic``, ``too_large``, ``short_header``, ``bad_payload`` or ``encode``.
    """

    def __init__(self, message, reason="bad_payload"):
        super().__init__(message, reason=reason)


# --------------------------------------------------------------------------- frames

_HEADER = struct.Struct(">BBBBI")  # magic, version, opcode, flags, payload length
_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")


class Frame(NamedTuple):
    """One whole frame split off a buffer by :func:`decode_frame`."""

    version: int
    opcode: int
    flags: int
    payload: bytes
    size: int  # header + payload bytes consumed from the buffer


def _magic_hint(magic: int) -> str:
    if magic == 0x16:
        return " — is this TLS on a plaintext port?"
    if 0x41 <= magic <= 0x5A:
        return " — is this HTTP or another text protocol?"
    return ""


def encode_frame(opcode: int, payload: bytes, flags: int = FLAG_BINARY,
                 version: int = VERSION) -> bytes:
    """Return the 8-byte header ("Wire Format") followed by ``payload``."""
    if len(payload) > MAX_FRAME_BYTES:
        raise FlyMQCodecError(
            f"flymq: payload of {len(payload)} bytes exceeds MAX_MESSAGE_SIZE "
            f"{MAX_FRAME_BYTES} (opcode {opcode_name(opcode) if isinstance(opcode, int) else opcode})",
            "too_large")
    try:
        header = _HEADER.pack(MAGIC, version, opcode, flags, len(payload))
    except struct.error as exc:
        raise FlyMQCodecError(
            f"flymq: cannot encode header (opcode={opcode!r}, flags={flags!r}, "
            f"version={version!r}; each must be 0..255): {exc}", "encode") from None
    return header + bytes(payload)


def decode_header(buf, max_length: int = MAX_FRAME_BYTES) -> tuple[int, int, int, int, int]:
    """Parse the first 8 bytes of ``buf`` into ``(magic, version, opcode, flags, length)``.

    Raises :class:`FlyMQCodecError` on a short buffer, a magic other than 0xAF, or a payload
    length over ``max_length`` (checked before any payload is read, per "Error Handling").
    The version is returned, not checked: the caller decides what to do with it.
    """
    if len(buf) < HEADER_SIZE:
        raise FlyMQCodecError(
            f"flymq: short header: {len(buf)} bytes (expected {HEADER_SIZE})", "short_header")
    magic, version, opcode, flags, length = _HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise FlyMQCodecError(
            f"flymq: bad magic 0x{magic:02X} at offset 0 (expected 0x{MAGIC:02X})"
            f"{_magic_hint(magic)}", "bad_magic")
    if length > max_length:
        raise FlyMQCodecError(
            f"flymq: payload length {length} exceeds limit {max_length} "
            f"(opcode 0x{opcode:02X} {opcode_name(opcode)})", "too_large")
    return magic, version, opcode, flags, length


def decode_frame(buf, max_length: int = MAX_FRAME_BYTES) -> Frame | None:
    """Split one whole frame off the start of ``buf``; ``None`` when more bytes are needed.

    Header errors raise :class:`FlyMQCodecError` as in :func:`decode_header`.
    """
    if len(buf) < HEADER_SIZE:
        return None
    _magic, version, opcode, flags, length = decode_header(buf, max_length)
    end = HEADER_SIZE + length
    if len(buf) < end:
        return None
    return Frame(version, opcode, flags, bytes(buf[HEADER_SIZE:end]), end)


# --------------------------------------------------------------------------- primitives

def _pack(st: struct.Struct, value, what: str) -> bytes:
    try:
        return st.pack(value)
    except (struct.error, TypeError) as exc:
        raise FlyMQCodecError(f"flymq: cannot encode {what}={value!r}: {exc}", "encode") from None


def _put_string(out: bytearray, value: str, what: str) -> None:
    try:
        data = value.encode("utf-8", "surrogateescape")
    except (AttributeError, UnicodeEncodeError) as exc:
        raise FlyMQCodecError(f"flymq: {what} must be a UTF-8 encodable str: {exc}", "encode") from None
    if len(data) > 0xFFFF:
        raise FlyMQCodecError(
            f"flymq: {what} is {len(data)} bytes of UTF-8 (a string holds at most 65535)", "encode")
    out += _U16.pack(len(data))
    out += data


def _put_bytes(out: bytearray, value, what: str) -> None:
    if value is None:
        value = b""
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise FlyMQCodecError(
            f"flymq: {what} must be bytes-like, not {type(value).__name__}", "encode")
    data = bytes(value)
    if len(data) > 0xFFFFFFFF:
        raise FlyMQCodecError(f"flymq: {what} is {len(data)} bytes (max 2^32-1)", "encode")
    out += _U32.pack(len(data))
    out += data


def _put_bool(out: bytearray, value: bool) -> None:
    out.append(1 if value else 0)


class _Reader:
    """Cursor over one payload; every read checks the remaining length first."""

    __slots__ = ("buf", "pos", "what", "strict")

    def __init__(self, payload, what: str, strict: bool = True):
        self.buf = bytes(payload)
        self.pos = 0
        self.what = what
        # Requests are read as the real server reads them (see the module docstring):
        # trailing bytes are ignored and strings are not checked for UTF-8 (Go's
        # string(b) keeps any bytes; surrogateescape keeps them too, and _put_string
        # writes them back unchanged). Responses stay strict.
        self.strict = strict

    def _need(self, n: int, field_name: str) -> None:
        have = len(self.buf) - self.pos
        if n > have:
            raise FlyMQCodecError(
                f"flymq: truncated {self.what} payload: {field_name} needs {n} bytes at "
                f"offset {self.pos}, {have} left")

    def _unpack(self, st: struct.Struct, field_name: str) -> int:
        self._need(st.size, field_name)
        (value,) = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return value

    def bool(self, field_name: str) -> bool:
        self._need(1, field_name)
        b = self.buf[self.pos]
        if b > 1:
            raise FlyMQCodecError(
                f"flymq: {self.what} {field_name} at offset {self.pos} is 0x{b:02X} "
                f"(expected bool 0x00 or 0x01)")
        self.pos += 1
        return b == 1

    def i32(self, field_name: str) -> int:
        return self._unpack(_I32, field_name)

    def u32(self, field_name: str) -> int:
        return self._unpack(_U32, field_name)

    def i64(self, field_name: str) -> int:
        return self._unpack(_I64, field_name)

    def u64(self, field_name: str) -> int:
        return self._unpack(_U64, field_name)

    def raw(self, n: int, field_name: str) -> bytes:
        self._need(n, field_name)
        data = self.buf[self.pos:self.pos + n]
        self.pos += n
        return data

    def string(self, field_name: str) -> str:
        n = self._unpack(_U16, f"{field_name} length")
        start = self.pos
        data = self.raw(n, field_name)
        if not self.strict:
            return data.decode("utf-8", "surrogateescape")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FlyMQCodecError(
                f"flymq: {self.what} {field_name} at offset {start} is not valid UTF-8: "
                f"{exc.reason}") from None

    def bytes(self, field_name: str) -> bytes:
        n = self._unpack(_U32, f"{field_name} length")
        return self.raw(n, field_name)

    def count(self, field_name: str, min_item_size: int) -> int:
        """Read a u32/i32 item count and refuse counts the remaining bytes cannot hold."""
        n = self._unpack(_U32, field_name)
        left = len(self.buf) - self.pos
        if n * min_item_size > left:
            raise FlyMQCodecError(
                f"flymq: truncated {self.what} payload: {field_name} {n} needs at least "
                f"{n * min_item_size} bytes at offset {self.pos}, {left} left")
        return n

    def string_list(self, field_name: str) -> list[str]:
        n = self.count(f"{field_name} count", 2)
        return [self.string(f"{field_name}[{i}]") for i in range(n)]

    def short_string(self, field_name: str) -> str:
        """u8 length + bytes (the real server's SUBSCRIBE mode)."""
        n = self._unpack(_U8, f"{field_name} length")
        return self.raw(n, field_name).decode("utf-8", "surrogateescape")

    def left(self) -> int:
        return len(self.buf) - self.pos

    def finish(self) -> None:
        extra = len(self.buf) - self.pos
        if extra and self.strict:
            raise FlyMQCodecError(
                f"flymq: {self.what} payload has {extra} unexpected trailing bytes "
                f"at offset {self.pos}")


class _Message:
    """Base of every message dataclass: ``encode``/``decode``/``to_frame``."""

    __slots__ = ()
    OPCODE: ClassVar[int]
    KIND: ClassVar[str]  # "request" or "response"

    def encode(self) -> bytes:  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    @classmethod
    def decode(cls, payload):  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    def to_frame(self, flags: int = FLAG_BINARY) -> bytes:
        """Header + payload, ready to send."""
        return encode_frame(self.OPCODE, self.encode(), flags)

    @classmethod
    def _reader(cls, payload) -> _Reader:
        return _Reader(payload, f"{opcode_name(cls.OPCODE)} {cls.KIND}",
                       strict=cls.KIND != "request")


# --------------------------------------------------------------------------- PRODUCE 0x01

@dataclass(slots=True)
class ProduceRequest(_Message):
    """PRODUCE request: string topic, bytes key (empty = none), bytes value, int32 partition
    (-1 = let the server choose)."""

    OPCODE: ClassVar[int] = PRODUCE
    KIND: ClassVar[str] = "request"
    topic: str
    value: bytes
    key: bytes | None = None
    partition: int = -1

    def encode(self) -> bytes:
        out = bytearray()
        _put_string(out, self.topic, "topic")
        _put_bytes(out, self.key, "key")
        _put_bytes(out, self.value, "value")
        out += _pack(_I32, self.partition, "partition")
        return bytes(out)

    @classmethod
    def decode(cls, payload) -> "ProduceRequest":
        r = cls._reader(payload)
        topic = r.string("topic")
        key = r.bytes("key") or None
        value = r.bytes("value")
        partition = r.i32("partition")
        r.finish()
        return cls(topic, value, key, partition)


@dataclass(slots=True)
class RecordMetadata(_Message):
    """PRODUCE response: where and when the record was stored.

    ``timestamp`` is ms since the Unix epoch; ``key_size`` is -1 when there was no key.
    """

    OPCODE: ClassVar[int] = PRODUCE
    KIND: ClassVar[str] = "response"
    topic: str
    partition: int
    offset: int
    timestamp: int
    key_size: int
    value_size: int

    def encode(self) -> bytes:
        out = bytearray()
        _put_string(out, self.topic, "topic")
        out += _pack(_I32, self.partition, "partition")
        out += _pack(_U64, self.offset, "offset")
        out += _pack(_I64, self.timestamp, "timestamp")
        out += _pack(_I32, self.key_size, "key_size")
        out += _pack(_I32, self.value_size, "value_size")
        return bytes(out)

    @classmethod
    def decode(cls, payload) -> "RecordMetadata":
        r = cls._reader(payload)
        result = cls(r.string("topic"), r.i32("partition"), r.u64("offset"),
                     r.i64("timestamp"), r.i32("key_size"), r.i32("value_size"))
        r.finish()
        return result


ProduceResponse = RecordMetadata


# --------------------------------------------------------------------------- CONSUME 0x02

@dataclass(slots=True)
class ConsumeRequest(_Message):
    """CONSUME request: string topic, int32 partition, uint64 offset."""

    OPCODE: ClassVar[int] = CONSUME
    KIND: ClassVar[str] = "request"
    topic: str
    partition: int
    offset: int

    def encode(self) -> bytes:
        out = bytearray()
        _put_string(out, self.topic, "topic")
        out += _pack(_I32, self.partition, "partition")
        out += _pack(_U64, self.offset, "offset")
        return bytes(out)

    @classmethod
    def decode(cls, payload) -> "ConsumeRequest":
        r = cls._reader(payload)
        result = cls(r.string("topic"), r.i32("partition"), r.u64("offset"))
        r.finish()
        return result


@dataclass(slots=True)
class ConsumeResponse(_Message):
    """CONSUME response: bytes key (empty = none), bytes value."""

    OPCODE: ClassVar[int] = CONSUME
    KIND: ClassVar[str] = "response"
    value: bytes
    key: bytes | None = None

    def encode(self) -> bytes:
        out = bytearray()
        _put_bytes(out, self.key, "key")
        _put_bytes(out, self.value, "value")
        return bytes(out)

    @classmethod
    def decode(cls, payload) -> "ConsumeResponse":
        r = cls._reader(payload)
        key = r.bytes("key") or None
        value = r.bytes("value")
        r.finish()
        return cls(value, key)


# --------------------------------------------------------------------------- FETCH 0x07

@dataclass(slots=True)
class FetchRequest(_Message):
    """FETCH request: string topic, int32 partition, uint64 offset, int32 max_messages,
    then optionally string filter (newer servers; "" = no filter).

    As in the real server, the filter is read only when its 2-byte length is there and
    kept only when all its bytes are; a short filter is ignored, never an error. It is
    encoded only when set, so older servers still get the four fields they expect.
    """

    OPCODE: ClassVar[int] = FETCH
    KIND: ClassVar[str] = "request"
    topic: str
    partition: int
    offset: int
    max_messages: int = 100
    filter: str = ""

    def encode(self) -> bytes:
        out = bytearray()
        _put_string(out, self.topic, "topic")
        out += _pack(_I32, self.partition, "partition")
        out += _pack(_U64, self.offset, "offset")
        out += _pack(_I32, self.max_messages, "max_messages")
        if self.filter:
            _put_string(out, self.filter, "filter")
        return bytes(out)

    @classmethod
    def decode(cls, payload) -> "FetchRequest":
        r = cls._reader(payload)
        result = cls(r.string("topic"), r.i32("partition"), r.u64("offset"),
                     r.i32("max_messages"))
        if r.left() >= 2:
            n = _U16.unpack_from(r.buf, r.pos)[0]
            if 2 + n <= r.left():
                result.filter = r.string("filter")
        r.finish()
        return result


@dataclass(slots=True)
class FetchedMessage:
    """One message in a FETCH response."""

    offset: int
    value: bytes
    key: bytes | None = None


@dataclass(slots=True)
class FetchResponse(_Message):
    """FETCH response, in the real server's layout (``EncodeBinaryFetchResponse``):
    uint32 count, uint64 next_offset, then count x (uint64 offset, bytes key, bytes
    value). (The seed document puts next_offset last and the offset after each value.)"""

    OPCODE: ClassVar[int] = FETCH
    KIND: ClassVar[str] = "response"
    messages: list[FetchedMessage]
    next_offset: int

    def encode(self) -> bytes:
        out = bytearray()
        out += _pack(_U32, len(self.messages), "message_count")
        out += _pack(_U64, self.next_offset, "next_offset")
        for i, m in enumerate(self.messages):
            out += _pack(_U64, m.offset, f"messages[{i}].offset")
            _put_bytes(out, m.key, f"messages[{i}].key")
            _put_bytes(out, m.value, f"messages[{i}].value")
        return bytes(out)

    @classmethod
    def decode(cls, payload) -> "FetchResponse":
        r = cls._reader(payload)
        n = r.count("message_count", 8 + 4 + 4)
        next_offset = r.u64("next_offset")
        messages = []
        for i in range(n):
            offset = r.u64(f"messages[{i}].offset")
            key = r.bytes(f"messages[{i}].key") or None
            value = r.bytes(f"messages[{i}].value")
            messages.append(FetchedMessage(offset, value, key))
        r.finish()
        return cls(messages, next_offset)


# --------------------------------------------------------------------------- CREATE_TOPIC 0x03

@dataclass(slots=True)
class CreateTopicRequest(_Message):
    """CREATE_TOPIC request: string topic, int32 partitions."""

    OPCODE: ClassVar[int] = CREATE_TOPIC
    KIND: ClassVar[str] = "request"
    topic: str
    partitions: int = 1

    def encode(self) -> bytes:
        out = bytearray()
        _put_string(out, self.topic, "topic")
        out += _pack(_I32, self.partitions, "partitions")
        return bytes(out)

    @classmethod
    def decode(cls, payload) -> "CreateTopicRequest":
        r = cls._reader(payload)
        result = cls(r.string("topic"), r.i32("partitions"))
        r.finish()
        return result


@dataclass(slots=True)
class _SuccessResponse(_Message):
    """One byte, 0x01 = success (the real server's CREATE_TOPIC, DELETE_TOPIC and COMMIT
    answers; a failure is an ERROR frame instead)."""

    success: bool = True

    def encode(self) -> bytes:
        return b"\x01" if self.success else b"\x00"

    @classmethod
    def decode(cls, payload):
        r = cls._reader(payload)
        result = cls(r.bool("success"))
        r.finish()
        return result


@dataclass(slots=True)
class CreateTopicResponse(_SuccessResponse):
    """CREATE_TOPIC response: bool success (the real server answers 0x01, also for a topic
    that already exists; failures are ERROR frames)."""

    OPCODE: ClassVar[int] = CREATE_TOPIC
    KIND: ClassVar[str] = "response"


# --------------------------------------------------------------------------- METADATA 0x04

@dataclass(slots=True)
class MetadataRequest(_Message):
    """METADATA request (frametap layout): string topic."""

    OPCODE: ClassVar[int] = METADATA
    KIND: ClassVar[str] = "request"
    topic: str

    def encode(self) -> bytes:
        out = bytearray()
        _put_string(out, self.topic, "topic")
        return bytes(out)

    @classmethod
    def decode(cls, payload) -> "MetadataRequest":
        r = cls._reader(payload)
        result = cls(r.string("topic"))
        r.finish()
        return result


@dataclass(slots=True)
class PartitionInfo:
    """One partition in a METADATA response: id, leader node id, oldest and newest
    offset (the newest is the offset the next record will get)."""

    id: int
    leader: int
    oldest: int
    newest: int


@dataclass(slots=True)
class MetadataResponse(_Message):
    """METADATA response in the layout of the real code base's
    ``EncodeBinaryMetadataResponse``: string topic, uint32 partition_count, then per
    partition int32 id, int32 leader_id, uint64 oldest_offset, uint64 newest_offset."""

    OPCODE: ClassVar[int] = METADATA
    KIND: ClassVar[str] = "response"
    topic: str
    infos: list[PartitionInfo]

    @property
    def partitions(self) -> int:
        return len(self.infos)

    @property
    def high_watermarks(self) -> list[int]:
        return [p.newest for p in self.infos]

    def encode(self) -> bytes:
        out = bytearray()
        _put_string(out, self.topic, "topic")
        out += _pack(_U32, len(self.infos), "partition_count")
        for i, p in enumerate(self.infos):
            out += _pack(_I32, p.id, f"partitions[{i}].id")
            out += _pack(_I32, p.leader, f"partitions[{i}].leader")
            out += _pack(_U64, p.oldest, f"partitions[{i}].oldest")
            out += _pack(_U64, p.newest, f"partitions[{i}].newest")
        return bytes(out)

    @classmethod
    def decode(cls, payload) -> "MetadataResponse":
        r = cls._reader(payload)
        topic = r.string("topic")
        n = r.count("partition_count", 24)
        infos = [PartitionInfo(r.i32(f"partitions[{i}].id"), r.i32(f"partitions[{i}].leader"),
                               r.u64(f"partitions[{i}].oldest"),
                               r.u64(f"partitions[{i}].newest")) for i in range(n)]
        r.finish()
        return cls(topic, infos)


# --------------------------------------------------------------------------- SUBSCRIBE 0x05

@dataclass(slots=True)
class SubscribeRequest(_Message):
    """SUBSCRIBE request: string topic, string group_id, int32 partition, then mode
    ("earliest", "latest" or "commit") as **u8** length + bytes — the real server's layout
    (the spec's u16 string is wrong). An empty mode means "latest" on the server."""

    OPCODE: ClassVar[int] = SUBSCRIBE
    KIND: ClassVar[str] = "request"
    topic: str
    group: str
    partition: int = 0
    mode: str = "earliest"

    def encode(self) -> bytes:
        out = bytearray()
        _put_string(out, self.topic, "topic")
        _put_string(out, self.group, "group_id")
        out += _pack(_I32, self.partition, "partition")
        mode = self.mode.encode("utf-8", "surrogateescape") if isinstance(self.mode, str) \
            else None
        if mode is None or len(mode) > 0xFF:
            raise FlyMQCodecError(
                f"flymq: SUBSCRIBE mode must be a str of at most 255 UTF-8 bytes, "
                f"got {self.mode!r}", "encode")
        out.append(len(mode))
        out += mode
        return bytes(out)

    @classmethod
    def decode(cls, payload) -> "SubscribeRequest":
        r = cls._reader(payload)
        result = cls(r.string("topic"), r.string("group_id"), r.i32("partition"),
                     r.short_string("mode"))
        r.finish()
        return result


@dataclass(slots=True)
class SubscribeResponse(_Message):
    """SUBSCRIBE response: uint64 starting offset."""

    OPCODE: ClassVar[int] = SUBSCRIBE
    KIND: ClassVar[str] = "response"
    offset: int

    def encode(self) -> bytes:
        return _pack(_U64, self.offset, "offset")

    @classmethod
    def decode(cls, payload) -> "SubscribeResponse":
        r = cls._reader(payload)
        result = cls(r.u64("offset"))
        r.finish()
        return result


# --------------------------------------------------------------------------- COMMIT 0x06

@dataclass(slots=True)
class CommitRequest(_Message):
    """COMMIT request (frametap layout): string topic, string group, int32 partition,
    uint64 offset."""

    OPCODE: ClassVar[int] = COMMIT
    KIND: ClassVar[str] = "request"
    topic: str
    group: str
    partition: int
    offset: int

    def encode(self) -> bytes:
        out = bytearray()
        _put_string(out, self.topic, "topic")
        _put_string(out, self.group, "group")
        out += _pack(_I32, self.partition, "partition")
        out += _pack(_U64, self.offset, "offset")
        return bytes(out)

    @classmethod
    def decode(cls, payload) -> "CommitRequest":
        r = cls._reader(payload)
        result = cls(r.string("topic"), r.string("group"), r.i32("partition"),
                     r.u64("offset"))
        r.finish()
        return result


@dataclass(slots=True)
class CommitResponse(_SuccessResponse):
    """COMMIT response: bool success (the real server always answers 0x01)."""

    OPCODE: ClassVar[int] = COMMIT
    KIND: ClassVar[str] = "response"


# --------------------------------------------------------------------------- LIST_TOPICS 0x08

@dataclass(slots=True)
class ListTopicsRequest(_Message):
    """LIST_TOPICS request (frametap layout): empty payload."""

    OPCODE: ClassVar[int] = LIST_TOPICS
    KIND: ClassVar[str] = "request"

    def encode(self) -> bytes:
        return b""

    @classmethod
    def decode(cls, payload) -> "ListTopicsRequest":
        cls._reader(payload).finish()
        return cls()


@dataclass(slots=True)
class ListTopicsResponse(_Message):
    """LIST_TOPICS response (frametap layout): []string topics."""

    OPCODE: ClassVar[int] = LIST_TOPICS
    KIND: ClassVar[str] = "response"
    topics: list[str]

    def encode(self) -> bytes:
        out = bytearray()
        out += _pack(_U32, len(self.topics), "topic count")
        for i, t in enumerate(self.topics):
            _put_string(out, t, f"topics[{i}]")
        return bytes(out)

    @classmethod
    def decode(cls, payload) -> "ListTopicsResponse":
        r = cls._reader(payload)
        result = cls(r.string_list("topics"))
        r.finish()
        return result


# --------------------------------------------------------------------------- DELETE_TOPIC 0x09

@dataclass(slots=True)
class DeleteTopicRequest(_Message):
    """DELETE_TOPIC request (frametap layout): string topic."""

    OPCODE: ClassVar[int] = DELETE_TOPIC
    KIND: ClassVar[str] = "request"
    topic: str

    def encode(self) -> bytes:
        out = bytearray()
        _put_string(out, self.topic, "topic")
        return bytes(out)

    @classmethod
    def decode(cls, payload) -> "DeleteTopicRequest":
        r = cls._reader(payload)
        result = cls(r.string("topic"))
        r.finish()
        return result


@dataclass(slots=True)
class DeleteTopicResponse(_SuccessResponse):
    """DELETE_TOPIC response: bool success (0x01, also for a topic that does not exist, as
    the real server answers; failures are ERROR frames)."""

    OPCODE: ClassVar[int] = DELETE_TOPIC
    KIND: ClassVar[str] = "response"


# --------------------------------------------------------------------------- AUTH 0x70

@dataclass(slots=True)
class AuthRequest(_Message):
    """AUTH request: string username, string password (never shown in repr)."""

    OPCODE: ClassVar[int] = AUTH
    KIND: ClassVar[str] = "request"
    username: str
    password: str = field(repr=False)

    def encode(self) -> bytes:
        out = bytearray()
        _put_string(out, self.username, "username")
        _put_string(out, self.password, "password")
        return bytes(out)

    @classmethod
    def decode(cls, payload) -> "AuthRequest":
        r = cls._reader(payload)
        result = cls(r.string("username"), r.string("password"))
        r.finish()
        return result


@dataclass(slots=True)
class AuthResponse(_Message):
    """AUTH response, as the real server sends it: opcode AUTH_RESPONSE (0x71, not an
    echo of AUTH), then bool success, string username, uint32 role count + that many
    roles each as **u8** length + bytes, string error ("" on success)."""

    OPCODE: ClassVar[int] = AUTH_RESPONSE
    KIND: ClassVar[str] = "response"
    success: bool
    error: str = ""
    username: str = ""
    roles: list[str] = field(default_factory=list)

    def encode(self) -> bytes:
        out = bytearray()
        _put_bool(out, self.success)
        _put_string(out, self.username, "username")
        out += _pack(_U32, len(self.roles), "roles count")
        for i, role in enumerate(self.roles):
            data = role.encode("utf-8", "surrogateescape") if isinstance(role, str) else None
            if data is None or len(data) > 0xFF:
                raise FlyMQCodecError(
                    f"flymq: roles[{i}] must be a str of at most 255 UTF-8 bytes, "
                    f"got {role!r}", "encode")
            out.append(len(data))
            out += data
        _put_string(out, self.error, "error")
        return bytes(out)

    @classmethod
    def decode(cls, payload) -> "AuthResponse":
        r = cls._reader(payload)
        success = r.bool("success")
        username = r.string("username")
        n = r.count("roles count", 1)
        roles = [r.short_string(f"roles[{i}]") for i in range(n)]
        error = r.string("error")
        r.finish()
        return cls(success, error, username, roles)


# --------------------------------------------------------------------------- ERROR 0xFF

@dataclass(slots=True)
class ErrorResponse(_Message):
    """ERROR response. The real server writes most errors as the message's plain bytes
    (``WriteError``, header flags 0); a few (a bad AUTH request) as int32 code + string
    message. ``code`` None is the plain form. Decoding follows the real client
    (``decodeError``): the coded form when the payload has one, else plain text."""

    OPCODE: ClassVar[int] = ERROR
    KIND: ClassVar[str] = "response"
    message: str
    code: int | None = None

    def encode(self) -> bytes:
        if self.code is None:
            try:
                return self.message.encode("utf-8", "surrogateescape")
            except (AttributeError, UnicodeEncodeError) as exc:
                raise FlyMQCodecError(f"flymq: ERROR message must be a str: {exc}",
                                      "encode") from None
        out = bytearray(_pack(_I32, self.code, "code"))
        _put_string(out, self.message, "message")
        return bytes(out)

    @property
    def flags(self) -> int:
        """Header flags the real server uses: 0 for the plain form, binary for the coded."""
        return 0 if self.code is None else FLAG_BINARY

    def to_frame(self, flags: int | None = None) -> bytes:
        return encode_frame(self.OPCODE, self.encode(), self.flags if flags is None else flags)

    @classmethod
    def decode(cls, payload) -> "ErrorResponse":
        data = bytes(payload)
        if len(data) >= 6:
            n = _U16.unpack_from(data, 4)[0]
            if 6 + n <= len(data):
                return cls(data[6:6 + n].decode("utf-8", "replace"),
                           _I32.unpack_from(data, 0)[0])
        return cls(data.decode("utf-8", "replace"))


# --------------------------------------------------------------------------- dispatch

REQUEST_TYPES: dict[int, type[_Message]] = {
    cls.OPCODE: cls
    for cls in (ProduceRequest, ConsumeRequest, FetchRequest, CreateTopicRequest,
                MetadataRequest, SubscribeRequest, CommitRequest, ListTopicsRequest,
                DeleteTopicRequest, AuthRequest)
}
RESPONSE_TYPES: dict[int, type[_Message]] = {
    cls.OPCODE: cls
    for cls in (RecordMetadata, ConsumeResponse, FetchResponse, CreateTopicResponse,
                MetadataResponse, SubscribeResponse, CommitResponse, ListTopicsResponse,
                DeleteTopicResponse, AuthResponse, ErrorResponse)
}
#: Request opcode -> the opcode of the real server's answer (itself, except AUTH).
RESPONSE_OPCODE = {op: op for op in REQUEST_TYPES}
RESPONSE_OPCODE[AUTH] = AUTH_RESPONSE


def decode_request(opcode: int, payload):
    """Decode a request payload with the class registered for ``opcode``."""
    cls = REQUEST_TYPES.get(opcode)
    if cls is None:
        raise FlyMQCodecError(
            f"flymq: no request layout known for opcode 0x{opcode:02X} ({opcode_name(opcode)})")
    return cls.decode(payload)


def decode_response(opcode: int, payload):
    """Decode a response payload by its own opcode (0xFF gives :class:`ErrorResponse`,
    0x71 :class:`AuthResponse`)."""
    cls = RESPONSE_TYPES.get(opcode)
    if cls is None:
        raise FlyMQCodecError(
            f"flymq: no response layout known for opcode 0x{opcode:02X} ({opcode_name(opcode)})")
    return cls.decode(payload)
