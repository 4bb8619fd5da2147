"""RabbitMQ Stream codec: whole frames, every command, osiris chunks.

Pure Python; used by the reference broker (:mod:`loadgen.rabbitmq_stream.server`), the
proxy's Metadata address rewriting and the tests. The proxy's hot-path parser does not use
it.

Sources, in the order they win (docs/design.md, "Protocol decisions"): what the real server
(``rabbit_stream_core.erl``) and the real clients (PyPI ``rstream``) put on the wire, then
``deps/rabbitmq_stream/docs/PROTOCOL.adoc``, then the seed draft.

Frames
    ``Size u32 | Key u16 | Version u16 | body``; ``Size`` counts everything after itself,
    bit 15 of ``Key`` marks a response. :func:`encode_frame` builds one,
    :func:`decode_frame` splits one off a buffer (``None`` = need more bytes) and checks
    ``Size`` against the limit before any body is buffered.

Commands
    :func:`encode_command` turns ``key`` + keyword fields into frame bytes,
    :func:`decode_body` turns ``(key, version, body)`` into a :class:`Command` whose fields
    read as attributes (``cmd.correlation_id``, ``cmd.stream``). :data:`REQUEST_LAYOUTS` and
    :data:`RESPONSE_LAYOUTS` list every field of every command; the few irregular ones
    (Publish, Deliver, Subscribe, optional trailing fields) are spelled out in code below.
    Types: integers are big-endian; ``string`` is int16 length + UTF-8 (length -1 = null,
    decoded as ``None``); ``bytes`` is int32 length + raw (-1 = null); arrays are int32
    count + items; a "map" is an array of (string key, string value).

Chunks (Deliver)
    :func:`build_chunk` / :func:`parse_chunk` implement the osiris chunk: a 48-byte header
    (magic 0x5 | version 0, chunk type, entry count, record count, timestamp ms, epoch,
    first offset, CRC32 of the data section, data length, trailer length, reserved), the
    data section (entries) and the trailer. A simple entry is ``u32 size`` (top bit 0) +
    record bytes; a sub-batch entry is ``u8 0x80|compression<<4``, ``u16 records``,
    ``u32 uncompressed length``, ``u32 length`` + data (:class:`SubBatch`).

Every decoding problem raises :class:`StreamCodecError` (a ``ValueError``) and nothing
else; its message says what was expected, what arrived and at which body offset.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from proxy.errors import FrameError
from proxy.protocols.rabbitmq_stream.constants import (
    CHUNK_HEADER_SIZE,
    CHUNK_MAGIC_VERSION,
    CLOSE,
    CONSUMER_UPDATE,
    CREATE,
    CREDIT,
    DECLARE_PUBLISHER,
    DELETE,
    DELETE_PUBLISHER,
    DELIVER,
    EXCHANGE_COMMAND_VERSIONS,
    HEARTBEAT,
    MAX_FRAME_BYTES,
    METADATA,
    METADATA_UPDATE,
    MIN_FRAME_SIZE,
    OFFSET_OFFSET,
    OFFSET_TIMESTAMP,
    OPEN,
    PARTITIONS,
    PEER_PROPERTIES,
    PUBLISH,
    PUBLISH_CONFIRM,
    PUBLISH_ERROR,
    QUERY_OFFSET,
    QUERY_PUBLISHER_SEQUENCE,
    RESPONSE_BIT,
    ROUTE,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    STORE_OFFSET,
    STREAM_STATS,
    SUBSCRIBE,
    TUNE,
    UNSUBSCRIBE,
    command_name,
)

__all__ = [
    "StreamCodecError",
    "Command",
    "Broker",
    "StreamMetadata",
    "PublishedMessage",
    "PublishingError",
    "CommandVersion",
    "SubBatch",
    "Chunk",
    "REQUEST_LAYOUTS",
    "RESPONSE_LAYOUTS",
    "SUPPORTED_VERSIONS",
    "encode_frame",
    "decode_frame",
    "encode_body",
    "encode_command",
    "decode_body",
    "decode_command",
    "build_chunk",
    "parse_chunk",
    "ChunkHeader",
    "parse_chunk_header",
    "parse_delivered_chunk",
    "split_deliver",
    "encode_metadata_response",
    "decode_metadata_response",
]


class StreamCodecError(FrameError, ValueError):
    """A RabbitMQ Stream frame, command body or chunk that does not follow the protocol.

    ``reason`` (the bounded label of ``frametap_protocol_errors_total``) is one of
    ``short_frame`` (Size < 4), ``too_large`` (Size over the limit), ``bad_version``,
    ``unknown_key``, ``bad_body``, ``bad_chunk``, ``bad_crc`` or ``encode``.
    """

    def __init__(self, message, reason="bad_body"):
        super().__init__(message, reason=reason)


# --------------------------------------------------------------------------- frames

_FRAME_HEAD = struct.Struct(">IHH")  # size, key, version
_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")


def encode_frame(key: int, version: int, body: bytes) -> bytes:
    """Return ``Size | Key | Version | body``; ``key`` includes the response bit if any."""
    size = MIN_FRAME_SIZE + len(body)
    try:
        head = _FRAME_HEAD.pack(size, key, version)
    except struct.error as exc:
        raise StreamCodecError(
            f"rabbitmq-stream: cannot encode frame header (key={key!r}, version={version!r},"
            f" body {len(body)} bytes): {exc}", "encode") from None
    return head + bytes(body)


def decode_frame(buf, max_size: int = MAX_FRAME_BYTES):
    """Split one frame off the start of ``buf``.

    Returns ``(key, version, body, size)`` — ``key`` with its response bit, ``size`` the
    bytes consumed (4 + Size) — or ``None`` when ``buf`` does not hold a whole frame yet.
    A Size below 4 or above ``max_size`` (checked as soon as the 4 size bytes are there,
    before any body is buffered) raises :class:`StreamCodecError` (``short_frame`` /
    ``too_large``). ``max_size`` 0 means no limit (Tune's "0 = no limit").
    """
    if len(buf) < 4:
        return None
    (size,) = _U32.unpack_from(buf, 0)
    if size < MIN_FRAME_SIZE:
        raise StreamCodecError(
            f"rabbitmq-stream: frame Size {size} at offset 0 is below the minimum "
            f"{MIN_FRAME_SIZE} (Key u16 + Version u16)", "short_frame")
    if max_size and size > max_size:
        hint = ""
        if size >> 24 in (0x16, 0x15):
            hint = " — is this TLS on a plaintext port?"
        elif 0x41 <= size >> 24 <= 0x5A:
            hint = " — is this HTTP or another text protocol?"
        raise StreamCodecError(
            f"rabbitmq-stream: frame Size {size} exceeds the limit {max_size}{hint}",
            "too_large")
    end = 4 + size
    if len(buf) < end:
        return None
    _size, key, version = _FRAME_HEAD.unpack_from(buf, 0)
    return key, version, bytes(buf[8:end]), end


# --------------------------------------------------------------------------- small types

class Broker(NamedTuple):
    """Metadata broker entry: reference u16, host string, port u32."""
    reference: int
    host: str
    port: int


class StreamMetadata(NamedTuple):
    """Metadata per-stream entry; ``leader`` is 0xFFFF when there is none."""
    name: str
    code: int
    leader: int
    replicas: list


class PublishingError(NamedTuple):
    publishing_id: int
    code: int


class CommandVersion(NamedTuple):
    """ExchangeCommandVersions item: the versions one peer handles for a key."""
    key: int
    min_version: int
    max_version: int


class SubBatch(NamedTuple):
    """A sub-entry batch (Publish message or chunk entry with the top bit set).

    ``data`` is the (possibly compressed) concatenation of ``u32 size + record`` items;
    ``compression`` 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd.
    """
    compression: int
    num_records: int
    uncompressed_length: int
    data: bytes

    def records(self) -> list[bytes]:
        """The records of an uncompressed or gzip batch (others raise)."""
        if self.compression == 0:
            raw = self.data
        elif self.compression == 1:
            try:
                raw = zlib.decompress(self.data, wbits=31)
            except zlib.error as exc:
                raise StreamCodecError(f"rabbitmq-stream: bad gzip sub-batch: {exc}",
                                       "bad_chunk") from None
        else:
            raise StreamCodecError(
                f"rabbitmq-stream: sub-batch compression {self.compression} is not supported "
                f"(only 0 none and 1 gzip)", "bad_chunk")
        r = _Reader(raw, "sub-batch")
        out = [r.raw(r.u32("record size"), "record") for _ in range(self.num_records)]
        r.finish()
        return out

    @classmethod
    def of(cls, records: list[bytes]) -> "SubBatch":
        """An uncompressed batch of ``records``."""
        data = b"".join(_U32.pack(len(rec)) + bytes(rec) for rec in records)
        return cls(0, len(records), len(data), data)


class PublishedMessage(NamedTuple):
    """One Publish item: a simple message (``data`` bytes) or a :class:`SubBatch`.

    ``filter_value`` exists from Publish version 2 on (null string when absent).
    """
    publishing_id: int
    data: Any
    filter_value: str | None = None

    @property
    def num_records(self) -> int:
        return self.data.num_records if isinstance(self.data, SubBatch) else 1


# --------------------------------------------------------------------------- reader

class _Reader:
    """Cursor over one body; every read checks the remaining length first."""

    __slots__ = ("buf", "pos", "what")

    def __init__(self, buf, what: str):
        self.buf = bytes(buf)
        self.pos = 0
        self.what = what

    @property
    def left(self) -> int:
        return len(self.buf) - self.pos

    def _need(self, n: int, name: str) -> None:
        if n > self.left:
            raise StreamCodecError(
                f"rabbitmq-stream: truncated {self.what}: {name} needs {n} bytes at body "
                f"offset {self.pos}, {self.left} left")

    def _unpack(self, st: struct.Struct, name: str) -> int:
        self._need(st.size, name)
        (value,) = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return value

    def u8(self, name): return self._unpack(_U8, name)
    def u16(self, name): return self._unpack(_U16, name)
    def u32(self, name): return self._unpack(_U32, name)
    def u64(self, name): return self._unpack(_U64, name)
    def i64(self, name): return self._unpack(_I64, name)

    def raw(self, n: int, name: str) -> bytes:
        self._need(n, name)
        data = self.buf[self.pos:self.pos + n]
        self.pos += n
        return data

    def string(self, name: str) -> str | None:
        n = self._unpack(_I16, f"{name} length")
        if n == -1:
            return None
        if n < 0:
            raise StreamCodecError(
                f"rabbitmq-stream: {self.what} {name} length {n} at body offset "
                f"{self.pos - 2} (expected >= 0, or -1 for null)")
        start = self.pos
        data = self.raw(n, name)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise StreamCodecError(
                f"rabbitmq-stream: {self.what} {name} at body offset {start} is not valid "
                f"UTF-8: {exc.reason}") from None

    def bytes_(self, name: str) -> bytes | None:
        n = self._unpack(_I32, f"{name} length")
        if n == -1:
            return None
        if n < 0:
            raise StreamCodecError(
                f"rabbitmq-stream: {self.what} {name} length {n} at body offset "
                f"{self.pos - 4} (expected >= 0, or -1 for null)")
        return self.raw(n, name)

    def count(self, name: str, min_item: int) -> int:
        """An int32 array count, refused when the remaining bytes cannot hold it."""
        n = self._unpack(_I32, f"{name} count")
        if n < 0 or n * min_item > self.left:
            raise StreamCodecError(
                f"rabbitmq-stream: truncated {self.what}: {name} count {n} needs at least "
                f"{max(n, 0) * min_item} bytes at body offset {self.pos}, {self.left} left")
        return n

    def finish(self) -> None:
        if self.left:
            raise StreamCodecError(
                f"rabbitmq-stream: {self.left} unexpected trailing bytes in {self.what} at "
                f"body offset {self.pos}")


# --------------------------------------------------------------------------- field types
# Each type: (decode(reader, name), encode(out, value, name), minimum encoded size).

def _enc_int(st: struct.Struct):
    def enc(out: bytearray, value, name: str) -> None:
        try:
            out += st.pack(value)
        except (struct.error, TypeError) as exc:
            raise StreamCodecError(
                f"rabbitmq-stream: cannot encode {name}={value!r}: {exc}", "encode") from None
    return enc


def _enc_string(out: bytearray, value, name: str) -> None:
    if value is None:
        out += _I16.pack(-1)
        return
    try:
        data = value.encode("utf-8")
    except (AttributeError, UnicodeEncodeError) as exc:
        raise StreamCodecError(
            f"rabbitmq-stream: {name} must be a UTF-8 encodable str: {exc}", "encode") from None
    if len(data) > 0x7FFF:
        raise StreamCodecError(
            f"rabbitmq-stream: {name} is {len(data)} bytes of UTF-8 (a string holds at most "
            f"32767)", "encode")
    out += _I16.pack(len(data))
    out += data


def _enc_bytes(out: bytearray, value, name: str) -> None:
    if value is None:
        out += _I32.pack(-1)
        return
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise StreamCodecError(
            f"rabbitmq-stream: {name} must be bytes-like, not {type(value).__name__}", "encode")
    out += _I32.pack(len(value))
    out += value


def _list_type(item):
    dec_item, enc_item, min_item = item

    def dec(r: _Reader, name: str):
        return [dec_item(r, f"{name}[{i}]") for i in range(r.count(name, min_item))]

    def enc(out: bytearray, values, name: str) -> None:
        values = list(values)
        out += _I32.pack(len(values))
        for i, v in enumerate(values):
            enc_item(out, v, f"{name}[{i}]")
    return dec, enc, 4


def _struct_type(cls, *items):
    """A fixed sequence of typed fields decoded into the NamedTuple ``cls``."""
    min_size = sum(t[2] for t in items)

    def dec(r: _Reader, name: str):
        return cls(*(t[0](r, f"{name}.{f}") for f, t in zip(cls._fields, items)))

    def enc(out: bytearray, value, name: str) -> None:
        try:
            parts = tuple(value)
        except TypeError:
            raise StreamCodecError(f"rabbitmq-stream: {name} must be a {cls.__name__} tuple, "
                                   f"not {type(value).__name__}", "encode") from None
        if len(parts) != len(items):
            raise StreamCodecError(f"rabbitmq-stream: {name} has {len(parts)} parts (expected "
                                   f"{len(items)}: {', '.join(cls._fields)})", "encode")
        for f, t, v in zip(cls._fields, items, parts):
            t[1](out, v, f"{name}.{f}")
    return dec, enc, min_size


def _map_type(value_type):
    """Array of (string key, value) decoded into a dict (order kept)."""
    dec_v, enc_v, min_v = value_type

    def dec(r: _Reader, name: str):
        result = {}
        for i in range(r.count(name, 2 + min_v)):
            k = r.string(f"{name}[{i}].key")
            result[k] = dec_v(r, f"{name}[{k}]")
        return result

    def enc(out: bytearray, mapping, name: str) -> None:
        items = list((mapping or {}).items())
        out += _I32.pack(len(items))
        for k, v in items:
            _enc_string(out, k, f"{name} key")
            enc_v(out, v, f"{name}[{k}]")
    return dec, enc, 4


U8 = (_Reader.u8, _enc_int(_U8), 1)
U16 = (_Reader.u16, _enc_int(_U16), 2)
U32 = (_Reader.u32, _enc_int(_U32), 4)
U64 = (_Reader.u64, _enc_int(_U64), 8)
I64 = (_Reader.i64, _enc_int(_I64), 8)
STRING = (_Reader.string, _enc_string, 2)
BYTES = (_Reader.bytes_, _enc_bytes, 4)
STRING_MAP = _map_type(STRING)
STAT_MAP = _map_type(I64)
BROKER = _struct_type(Broker, U16, STRING, U32)
STREAM_METADATA = _struct_type(StreamMetadata, STRING, U16, U16, _list_type(U16))
PUBLISHING_ERROR = _struct_type(PublishingError, U64, U16)
COMMAND_VERSION = _struct_type(CommandVersion, U16, U16, U16)

CORR = ("correlation_id", U32)
CODE = ("code", U16)

#: Request (and one-way) command bodies: key -> [(field, type)]. Publish, Deliver and
#: Subscribe are irregular and handled in code; they are listed for completeness.
REQUEST_LAYOUTS: dict[int, list] = {
    DECLARE_PUBLISHER: [CORR, ("publisher_id", U8), ("reference", STRING), ("stream", STRING)],
    PUBLISH: [("publisher_id", U8), ("messages", None)],
    PUBLISH_CONFIRM: [("publisher_id", U8), ("publishing_ids", _list_type(U64))],
    PUBLISH_ERROR: [("publisher_id", U8), ("errors", _list_type(PUBLISHING_ERROR))],
    QUERY_PUBLISHER_SEQUENCE: [CORR, ("reference", STRING), ("stream", STRING)],
    DELETE_PUBLISHER: [CORR, ("publisher_id", U8)],
    SUBSCRIBE: [CORR, ("subscription_id", U8), ("stream", STRING), ("offset_type", U16),
                ("offset", None), ("credit", U16), ("properties", None)],
    DELIVER: [("subscription_id", U8), ("committed_chunk_id", None), ("chunk", None)],
    CREDIT: [("subscription_id", U8), ("credit", U16)],
    STORE_OFFSET: [("reference", STRING), ("stream", STRING), ("offset", U64)],
    QUERY_OFFSET: [CORR, ("reference", STRING), ("stream", STRING)],
    UNSUBSCRIBE: [CORR, ("subscription_id", U8)],
    CREATE: [CORR, ("stream", STRING), ("arguments", STRING_MAP)],
    DELETE: [CORR, ("stream", STRING)],
    METADATA: [CORR, ("streams", _list_type(STRING))],
    METADATA_UPDATE: [CODE, ("stream", STRING)],
    PEER_PROPERTIES: [CORR, ("properties", STRING_MAP)],
    SASL_HANDSHAKE: [CORR],
    SASL_AUTHENTICATE: [CORR, ("mechanism", STRING), ("data", BYTES)],
    TUNE: [("frame_max", U32), ("heartbeat", U32)],
    OPEN: [CORR, ("virtual_host", STRING)],
    CLOSE: [CORR, CODE, ("reason", STRING)],
    HEARTBEAT: [],
    ROUTE: [CORR, ("routing_key", STRING), ("super_stream", STRING)],
    PARTITIONS: [CORR, ("super_stream", STRING)],
    CONSUMER_UPDATE: [CORR, ("subscription_id", U8), ("active", U8)],
    EXCHANGE_COMMAND_VERSIONS: [CORR, ("commands", _list_type(COMMAND_VERSION))],
    STREAM_STATS: [CORR, ("stream", STRING)],
}

_PLAIN_RESPONSE = [CORR, CODE]

#: Response bodies: key -> [(field, type)]. A field type wrapped in ``_Optional`` may be
#: absent at the end of the body (the real server omits empty Open properties and the
#: SASL challenge). Metadata has no response code; Credit has no correlation id.
RESPONSE_LAYOUTS: dict[int, list] = {
    DECLARE_PUBLISHER: _PLAIN_RESPONSE,
    QUERY_PUBLISHER_SEQUENCE: [CORR, CODE, ("sequence", U64)],
    DELETE_PUBLISHER: _PLAIN_RESPONSE,
    SUBSCRIBE: _PLAIN_RESPONSE,
    CREDIT: [CODE, ("subscription_id", U8)],
    QUERY_OFFSET: [CORR, CODE, ("offset", U64)],
    UNSUBSCRIBE: _PLAIN_RESPONSE,
    CREATE: _PLAIN_RESPONSE,
    DELETE: _PLAIN_RESPONSE,
    METADATA: [CORR, ("brokers", _list_type(BROKER)),
               ("streams", _list_type(STREAM_METADATA))],
    PEER_PROPERTIES: [CORR, CODE, ("properties", STRING_MAP)],
    SASL_HANDSHAKE: [CORR, CODE, ("mechanisms", _list_type(STRING))],
    SASL_AUTHENTICATE: [CORR, CODE, ("challenge", "optional", BYTES)],
    TUNE: [("frame_max", U32), ("heartbeat", U32)],
    OPEN: [CORR, CODE, ("properties", "optional", STRING_MAP)],
    CLOSE: _PLAIN_RESPONSE,
    ROUTE: [CORR, CODE, ("streams", _list_type(STRING))],
    PARTITIONS: [CORR, CODE, ("streams", _list_type(STRING))],
    CONSUMER_UPDATE: [CORR, CODE, ("offset_type", U16), ("offset", None)],
    EXCHANGE_COMMAND_VERSIONS: [CORR, CODE, ("commands", _list_type(COMMAND_VERSION))],
    STREAM_STATS: [CORR, CODE, ("stats", STAT_MAP)],
}

#: Versions this codec encodes and decodes, per key (both directions).
SUPPORTED_VERSIONS: dict[int, tuple[int, int]] = {
    key: ((1, 2) if key in (PUBLISH, DELIVER) else (1, 1)) for key in REQUEST_LAYOUTS}


# --------------------------------------------------------------------------- commands

@dataclass
class Command:
    """One decoded command: ``key`` (no response bit), ``response``, ``version`` and the
    body fields, which also read as attributes (``cmd.correlation_id``)."""

    key: int
    response: bool = False
    version: int = 1
    fields: dict = field(default_factory=dict)

    def __getattr__(self, name):
        if name == "fields":  # not yet set (copy/pickle): avoid recursion
            raise AttributeError(name)
        try:
            return self.fields[name]
        except KeyError:
            raise AttributeError(
                f"{self.name}{' response' if self.response else ''} has no field {name!r} "
                f"(fields: {', '.join(self.fields) or 'none'})") from None

    @property
    def name(self) -> str:
        return command_name(self.key)

    @property
    def wire_key(self) -> int:
        return self.key | RESPONSE_BIT if self.response else self.key

    def to_frame(self) -> bytes:
        return encode_command(self.key, response=self.response, version=self.version,
                              **self.fields)


def _check_version(key: int, version: int) -> None:
    lo, hi = SUPPORTED_VERSIONS.get(key, (1, 1))
    if not lo <= version <= hi:
        raise StreamCodecError(
            f"rabbitmq-stream: {command_name(key)} version {version} is not supported "
            f"(expected {lo}..{hi})", "bad_version")


def _layout(key: int, response: bool) -> list:
    table = RESPONSE_LAYOUTS if response else REQUEST_LAYOUTS
    layout = table.get(key)
    if layout is None:
        kind = "response" if response else "request"
        raise StreamCodecError(
            f"rabbitmq-stream: unknown {kind} key 0x{key | (RESPONSE_BIT if response else 0):04X}"
            f" ({command_name(key)})", "unknown_key")
    return layout


def _need_field(fields: dict, key: int, name: str):
    try:
        return fields[name]
    except KeyError:
        raise StreamCodecError(
            f"rabbitmq-stream: {command_name(key)} needs field {name!r}", "encode") from None


def encode_body(key: int, response: bool = False, version: int = 1, **fields) -> bytes:
    """The body (after Key/Version) of command ``key`` from keyword ``fields``."""
    key &= 0x7FFF
    _check_version(key, version)
    layout = _layout(key, response)
    out = bytearray()
    if not response and key == PUBLISH:
        _enc_publish(out, version, fields)
        return bytes(out)
    if not response and key == DELIVER:
        U8[1](out, _need_field(fields, key, "subscription_id"), "subscription_id")
        if version >= 2:
            U64[1](out, _need_field(fields, key, "committed_chunk_id"), "committed_chunk_id")
        chunk = _need_field(fields, key, "chunk")
        out += chunk.to_bytes() if isinstance(chunk, Chunk) else bytes(chunk)
        return bytes(out)
    for entry in layout:
        name = entry[0]
        if len(entry) == 3:  # optional trailing field: omitted when None
            value = fields.get(name)
            if value is not None:
                entry[2][1](out, value, name)
            continue
        ftype = entry[1]
        if ftype is None:  # irregular field
            if name == "offset":  # Subscribe / ConsumerUpdate response offset specification
                if fields.get("offset_type") in (OFFSET_OFFSET, OFFSET_TIMESTAMP):
                    offset = _need_field(fields, key, "offset")
                    (I64 if fields["offset_type"] == OFFSET_TIMESTAMP else U64)[1](
                        out, offset, "offset")
            elif name == "properties":  # Subscribe: always written, like rstream
                STRING_MAP[1](out, fields.get("properties") or {}, name)
            continue
        if name in ("properties", "arguments") and name not in fields:
            value = {}
        else:
            value = _need_field(fields, key, name)
        ftype[1](out, value, name)
    return bytes(out)


def encode_command(key: int, response: bool = False, version: int = 1, **fields) -> bytes:
    """Whole frame bytes of command ``key`` (see :data:`REQUEST_LAYOUTS` for field names)."""
    body = encode_body(key, response, version, **fields)
    return encode_frame((key & 0x7FFF) | (RESPONSE_BIT if response else 0), version, body)


def decode_body(key: int, version: int, body) -> Command:
    """Decode a body split off by :func:`decode_frame` (``key`` with its response bit)."""
    response = bool(key & RESPONSE_BIT)
    key &= 0x7FFF
    layout = _layout(key, response)
    _check_version(key, version)
    what = f"{command_name(key)}{' response' if response else ''} body"
    r = _Reader(body, what)
    fields: dict = {}
    if not response and key == PUBLISH:
        _dec_publish(r, version, fields)
    elif not response and key == DELIVER:
        fields["subscription_id"] = r.u8("subscription_id")
        if version >= 2:
            fields["committed_chunk_id"] = r.u64("committed_chunk_id")
        fields["chunk"] = parse_chunk(r.raw(r.left, "chunk"))
    else:
        for entry in layout:
            name = entry[0]
            if len(entry) == 3:
                fields[name] = entry[2][0](r, name) if r.left else None
                continue
            ftype = entry[1]
            if ftype is None:
                if name == "offset":
                    otype = fields["offset_type"]
                    if otype == OFFSET_TIMESTAMP:
                        fields[name] = r.i64(name)
                    elif otype == OFFSET_OFFSET:
                        fields[name] = r.u64(name)
                    elif key == CONSUMER_UPDATE and r.left == 8:
                        # rstream always writes an offset, whatever the type
                        fields[name] = r.u64(name)
                    else:
                        fields[name] = None
                elif name == "properties":  # Subscribe: the real server accepts it absent
                    fields[name] = STRING_MAP[0](r, name) if r.left else {}
                continue
            fields[name] = ftype[0](r, name)
    r.finish()
    return Command(key, response, version, fields)


def decode_command(frame_bytes) -> Command:
    """Decode exactly one whole frame (``Size`` included)."""
    split = decode_frame(frame_bytes, max_size=0)
    if split is None:
        raise StreamCodecError(
            f"rabbitmq-stream: truncated frame: {len(frame_bytes)} bytes do not hold the "
            f"whole frame", "short_frame")
    key, version, body, size = split
    if size != len(frame_bytes):
        raise StreamCodecError(
            f"rabbitmq-stream: {len(frame_bytes) - size} trailing bytes after the frame")
    return decode_body(key, version, body)


# --------------------------------------------------------------------------- Publish

def _enc_publish(out: bytearray, version: int, fields: dict) -> None:
    U8[1](out, _need_field(fields, PUBLISH, "publisher_id"), "publisher_id")
    messages = list(_need_field(fields, PUBLISH, "messages"))
    out += _I32.pack(len(messages))
    for i, m in enumerate(messages):
        if not isinstance(m, PublishedMessage):
            m = PublishedMessage(*m)
        U64[1](out, m.publishing_id, f"messages[{i}].publishing_id")
        if version >= 2:
            _enc_string(out, m.filter_value, f"messages[{i}].filter_value")
        if isinstance(m.data, SubBatch):
            _enc_sub_batch(out, m.data, f"messages[{i}]")
        else:
            _enc_bytes(out, m.data, f"messages[{i}].data")


def _dec_publish(r: _Reader, version: int, fields: dict) -> None:
    fields["publisher_id"] = r.u8("publisher_id")
    messages = []
    for i in range(r.count("messages", 12)):
        pid = r.u64(f"messages[{i}].publishing_id")
        fv = r.string(f"messages[{i}].filter_value") if version >= 2 else None
        r._need(1, f"messages[{i}] entry type")
        if r.buf[r.pos] & 0x80:
            data = _dec_sub_batch(r, f"messages[{i}]")
        else:
            data = r.raw(r.u32(f"messages[{i}] size"), f"messages[{i}].data")
        messages.append(PublishedMessage(pid, data, fv))
    fields["messages"] = messages


def _enc_sub_batch(out: bytearray, sb: SubBatch, name: str) -> None:
    if not 0 <= sb.compression <= 7:
        raise StreamCodecError(f"rabbitmq-stream: {name} compression {sb.compression} "
                               f"(expected 0..7)", "encode")
    out.append(0x80 | sb.compression << 4)
    U16[1](out, sb.num_records, f"{name}.num_records")
    U32[1](out, sb.uncompressed_length, f"{name}.uncompressed_length")
    U32[1](out, len(sb.data), f"{name}.length")
    out += sb.data


def _dec_sub_batch(r: _Reader, name: str) -> SubBatch:
    entry_type = r.u8(f"{name} entry type")
    n = r.u16(f"{name} record count")
    uncompressed = r.u32(f"{name} uncompressed length")
    data = r.raw(r.u32(f"{name} length"), f"{name} data")
    return SubBatch((entry_type & 0x70) >> 4, n, uncompressed, data)


# --------------------------------------------------------------------------- chunks

# magic|version, chunk type, entries, records, timestamp, epoch, first offset, CRC32,
# data length, trailer length, reserved: CHUNK_HEADER_SIZE (48) bytes (osiris_log.erl).
_CHUNK_HEADER = struct.Struct(">BBHIqQQIIII")


@dataclass
class Chunk:
    """One osiris chunk as carried by Deliver (see the module docstring)."""

    first_offset: int
    timestamp: int               # ms since the epoch
    entries: list                # bytes (simple entry) or SubBatch, in order
    epoch: int = 1
    chunk_type: int = 0          # 0 user, 1 tracking delta, 2 tracking snapshot
    trailer: bytes = b""
    num_records: int = -1        # -1: computed from the entries
    crc: int = -1                # -1: computed from the data section

    def __post_init__(self):
        if self.num_records < 0:
            self.num_records = sum(e.num_records if isinstance(e, SubBatch) else 1
                                   for e in self.entries)

    @property
    def num_entries(self) -> int:
        return len(self.entries)

    def data(self) -> bytes:
        out = bytearray()
        for i, e in enumerate(self.entries):
            if isinstance(e, SubBatch):
                _enc_sub_batch(out, e, f"chunk entry {i}")
            else:
                if len(e) > 0x7FFFFFFF:
                    raise StreamCodecError(f"rabbitmq-stream: chunk entry {i} of {len(e)} "
                                           f"bytes (max 2^31-1)", "encode")
                out += _U32.pack(len(e))
                out += e
        return bytes(out)

    def records(self) -> list[bytes]:
        """Every record in offset order (sub-batches expanded)."""
        out = []
        for e in self.entries:
            out.extend(e.records() if isinstance(e, SubBatch) else [e])
        return out

    def to_bytes(self) -> bytes:
        data = self.data()
        crc = zlib.crc32(data) if self.crc < 0 else self.crc
        try:
            head = _CHUNK_HEADER.pack(CHUNK_MAGIC_VERSION, self.chunk_type, len(self.entries),
                                      self.num_records, self.timestamp, self.epoch,
                                      self.first_offset, crc, len(data), len(self.trailer), 0)
        except struct.error as exc:
            raise StreamCodecError(f"rabbitmq-stream: cannot encode chunk header: {exc}",
                                   "encode") from None
        return head + data + self.trailer


def build_chunk(records, first_offset: int, timestamp: int, epoch: int = 1,
                chunk_type: int = 0) -> bytes:
    """Chunk bytes (header + data, CRC32 filled in) holding ``records``: each a record's
    bytes (one simple entry) or a :class:`SubBatch`."""
    return Chunk(first_offset, timestamp, list(records), epoch, chunk_type).to_bytes()



def _chunk_entries(data, n_entries):
    """The entries of a chunk's data section: simple entries and sub-batches."""
    r = _Reader(data, "chunk data")
    entries: list = []
    for i in range(n_entries):
        r._need(1, f"entry {i}")
        if r.buf[r.pos] & 0x80:
            entries.append(_dec_sub_batch(r, f"entry {i}"))
        else:
            entries.append(r.raw(r.u32(f"entry {i} size"), f"entry {i}"))
    r.finish()
    return entries

def parse_chunk(buf, verify_crc: bool = True) -> Chunk:
    """Parse one whole chunk (header, data, trailer; nothing after it).

    Checks the magic/version byte, the lengths, the entry and record counts and (unless
    ``verify_crc`` is false) the CRC32 of the data section.
    """
    buf = bytes(buf)
    if len(buf) < CHUNK_HEADER_SIZE:
        raise StreamCodecError(
            f"rabbitmq-stream: truncated chunk: {len(buf)} bytes (header needs "
            f"{CHUNK_HEADER_SIZE})", "bad_chunk")
    (magic, ctype, n_entries, n_records, ts, epoch, first, crc, data_len, trailer_len,
     _reserved) = _CHUNK_HEADER.unpack_from(buf, 0)
    if magic != CHUNK_MAGIC_VERSION:
        raise StreamCodecError(
            f"rabbitmq-stream: bad chunk magic/version byte 0x{magic:02X} (expected "
            f"0x{CHUNK_MAGIC_VERSION:02X}: magic 5, version 0)", "bad_chunk")
    total = CHUNK_HEADER_SIZE + data_len + trailer_len
    if len(buf) != total:
        raise StreamCodecError(
            f"rabbitmq-stream: chunk header says {data_len} data + {trailer_len} trailer bytes "
            f"({total} in all), {len(buf)} arrived", "bad_chunk")
    data = buf[CHUNK_HEADER_SIZE:CHUNK_HEADER_SIZE + data_len]
    actual = zlib.crc32(data)
    if verify_crc and actual != crc:
        raise StreamCodecError(
            f"rabbitmq-stream: chunk at offset {first} has CRC 0x{crc:08X} but its data "
            f"section's CRC32 is 0x{actual:08X}", "bad_crc")
    entries = _chunk_entries(data, n_entries)
    chunk = Chunk(first, ts, entries, epoch, ctype, buf[CHUNK_HEADER_SIZE + data_len:],
                  crc=crc)
    if chunk.num_records != n_records:
        raise StreamCodecError(
            f"rabbitmq-stream: chunk at offset {first} says {n_records} records, its "
            f"{n_entries} entries hold {chunk.num_records}", "bad_chunk")
    return chunk


class ChunkHeader(NamedTuple):
    """The 48-byte osiris chunk header (see :class:`Chunk` for the fields)."""
    magic_version: int
    chunk_type: int
    num_entries: int
    num_records: int
    timestamp: int
    epoch: int
    first_offset: int
    crc: int
    data_length: int
    trailer_length: int


def parse_chunk_header(buf, verify_crc: bool = True) -> ChunkHeader:
    """Check one whole chunk's header, lengths and (unless ``verify_crc`` is false) the
    CRC32 of its data section, without decoding the entries.

    Unlike :func:`parse_chunk`, the trailer may be absent: the real server (3.13) sends
    Deliver chunks as header + data only, while the header still counts the trailer
    (the writer-tracking data it keeps on disk)."""
    buf = memoryview(buf)
    if len(buf) < CHUNK_HEADER_SIZE:
        raise StreamCodecError(
            f"rabbitmq-stream: truncated chunk: {len(buf)} bytes (header needs "
            f"{CHUNK_HEADER_SIZE})", "bad_chunk")
    header = ChunkHeader(*_CHUNK_HEADER.unpack_from(buf, 0)[:10])
    if header.magic_version != CHUNK_MAGIC_VERSION:
        raise StreamCodecError(
            f"rabbitmq-stream: bad chunk magic/version byte 0x{header.magic_version:02X} "
            f"(expected 0x{CHUNK_MAGIC_VERSION:02X}: magic 5, version 0)", "bad_chunk")
    total = CHUNK_HEADER_SIZE + header.data_length + header.trailer_length
    if len(buf) not in (total, total - header.trailer_length):
        raise StreamCodecError(
            f"rabbitmq-stream: chunk header says {header.data_length} data + "
            f"{header.trailer_length} trailer bytes ({total} in all, or "
            f"{total - header.trailer_length} without the trailer), {len(buf)} arrived",
            "bad_chunk")
    if verify_crc:
        actual = zlib.crc32(buf[CHUNK_HEADER_SIZE:CHUNK_HEADER_SIZE + header.data_length])
        if actual != header.crc:
            raise StreamCodecError(
                f"rabbitmq-stream: chunk at offset {header.first_offset} has CRC "
                f"0x{header.crc:08X} but its data section's CRC32 is 0x{actual:08X}",
                "bad_crc")
    return header


def parse_delivered_chunk(buf, verify_crc: bool = True) -> Chunk:
    """A chunk as Deliver carries it (trailer present or not, see
    :func:`parse_chunk_header`). The entries of a user chunk (type 0) are decoded and
    counted; tracking chunks (types 1, 2) come back without entries (a consumer skips
    them), their ``num_records`` taken from the header."""
    header = parse_chunk_header(buf, verify_crc)
    buf = bytes(buf)
    data_end = CHUNK_HEADER_SIZE + header.data_length
    entries: list = []
    if header.chunk_type == 0:
        entries = _chunk_entries(buf[CHUNK_HEADER_SIZE:data_end], header.num_entries)
    chunk = Chunk(header.first_offset, header.timestamp, entries, header.epoch,
                  header.chunk_type, buf[data_end:], num_records=header.num_records,
                  crc=header.crc)
    if header.chunk_type == 0:
        counted = sum(e.num_records if isinstance(e, SubBatch) else 1 for e in entries)
        if counted != header.num_records:
            raise StreamCodecError(
                f"rabbitmq-stream: chunk at offset {header.first_offset} says "
                f"{header.num_records} records, its {header.num_entries} entries hold "
                f"{counted}", "bad_chunk")
    return chunk


def split_deliver(version: int, body) -> tuple[int, int | None, bytes]:
    """A Deliver body (after Key/Version) as ``(subscription_id, committed_chunk_id or
    None for version 1, chunk bytes)``, the chunk not yet parsed (see
    :func:`parse_chunk_header` / :func:`parse_chunk`)."""
    _check_version(DELIVER, version)
    r = _Reader(body, "Deliver body")
    subscription_id = r.u8("subscription_id")
    committed = r.u64("committed_chunk_id") if version >= 2 else None
    return subscription_id, committed, r.raw(r.left, "chunk")


# --------------------------------------------------------------------------- Metadata

def encode_metadata_response(correlation_id: int, brokers, streams) -> bytes:
    """Metadata response frame. ``brokers``: ``(reference, host, port)`` items;
    ``streams``: ``(name, code, leader_reference, [replica_references])`` items."""
    return encode_command(METADATA, response=True, correlation_id=correlation_id,
                          brokers=[Broker(*b) for b in brokers],
                          streams=[StreamMetadata(n, c, l, list(rep))
                                   for n, c, l, rep in streams])


def decode_metadata_response(body):
    """Parse a Metadata response body (after Key/Version) into
    ``(correlation_id, [(reference, host, port)], [(name, code, leader, replicas)])``."""
    cmd = decode_body(METADATA | RESPONSE_BIT, 1, body)
    return (cmd.correlation_id,
            [tuple(b) for b in cmd.brokers],
            [(s.name, s.code, s.leader, list(s.replicas)) for s in cmd.streams])
