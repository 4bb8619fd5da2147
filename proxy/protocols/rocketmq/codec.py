"""RocketMQ remoting codec: whole commands, both header serializations, message encodings.

Pure Python; used by the reference name server + broker (:mod:`loadgen.rocketmq.server`),
address rewriting of route data and the tests. The proxy's hot-path parser does not use it.

Sources, in the order they win (docs/design.md, "RocketMQ remoting"): Apache RocketMQ
(``remoting/.../protocol/RemotingCommand.java``, ``RocketMQSerializable.java``,
``common/message/MessageDecoder.java``, ``protocol/route/*.java``), then the seed spec.

Frames
    ``length u32 | header-length word u32 | header | body``. ``length`` counts everything
    after itself (Apache: ``4 + headerLength + bodyLength``); with
    ``length_includes_self=True`` it also counts its own 4 bytes (the seed's variant, route
    option ``length_includes_self``). The header-length word's high byte is the
    SerializeType (0 JSON, 1 ROCKETMQ), its low 24 bits the header length.
    :func:`encode` builds a frame from a :class:`RemotingCommand`, :func:`decode` splits one
    off a buffer (``None`` = need more bytes; the length is checked against the limit as
    soon as its 4 bytes are there).

Headers
    JSON: what Java's ``RemotingSerializable`` (fastjson) writes — fields in alphabetical
    order ``code, extFields, flag, language, opaque, remark, serializeTypeCurrentRPC,
    version``, null fields left out, ``language`` as the enum name. Decoding accepts keys in
    any order, non-string extFields values (numbers, booleans, nested objects become their
    Java ``toString``/JSON text) and fastjson's bare object keys.
    ROCKETMQ binary: ``code i16 | language u8 | version i16 | opaque i32 | flag i32 |
    remark (i32 len + UTF-8) | extFields (i32 len + repeated (u16 keylen, key, i32 vallen,
    value))``; an empty remark / extFields is written as length 0 and decodes as
    ``None`` / ``{}``.

Messages
    :func:`encode_message_batch` / :func:`decode_message_batch`: the SEND_BATCH_MESSAGE body
    (``MessageDecoder.encodeMessages``: per message ``totalSize i32 | magic i32 (0) |
    bodyCRC i32 (0) | flag i32 | body (i32 + bytes) | properties (i16 + bytes)``).
    :func:`encode_stored_messages` / :func:`decode_stored_messages`: the commit-log
    ``MessageExt`` format a PULL_MESSAGE response body carries (see :class:`StoredMessage`).
    Properties are ``name \\x01 value \\x02`` repeated (:func:`encode_properties`).

Route data
    :func:`encode_topic_route` writes TopicRouteData exactly as the Java name server does,
    including fastjson's bare integer keys in ``brokerAddrs`` (``{0:"127.0.0.1:10911"}``);
    :func:`decode_topic_route` and :func:`loads_java_json` accept that.

Every decoding problem raises :class:`RocketMQCodecError` (a ``ValueError``) and nothing
else; the message says what was expected, what arrived and where.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterable

from proxy.errors import FrameError
from proxy.protocols.rocketmq.constants import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    LANGUAGE_BY_NAME,
    LANGUAGE_CODES,
    MAX_FRAME_BYTES,
    MSG_FLAG_BORNHOST_V6,
    MSG_FLAG_STOREHOST_V6,
    PERM_READ,
    PERM_WRITE,
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    SERIALIZE_TYPE_NAMES,
)

__all__ = [
    "RocketMQCodecError",
    "RemotingCommand",
    "Message",
    "StoredMessage",
    "BrokerData",
    "QueueData",
    "TopicRouteData",
    "MAX_FRAME_BYTES",
    "MESSAGE_MAGIC_CODE",
    "MESSAGE_MAGIC_CODE_V2",
    "SEND_V2_KEYS",
    "encode",
    "decode",
    "encode_header",
    "decode_header",
    "encode_properties",
    "decode_properties",
    "encode_message_batch",
    "decode_message_batch",
    "encode_stored_message",
    "encode_stored_messages",
    "decode_stored_messages",
    "create_message_id",
    "decode_message_id",
    "body_crc",
    "dumps_java_json",
    "loads_java_json",
    "encode_topic_route",
    "decode_topic_route",
    "send_header_from_v2",
    "send_header_to_v2",
]

#: Header length must fit the 24 low bits of the header-length word.
MAX_HEADER_BYTES = 0xFFFFFF

#: ``MessageDecoder.MESSAGE_MAGIC_CODE`` = ``0xAABBCCDD ^ 1880681586 + 8`` (as a signed i32:
#: -626843481); the topic length is one byte.
MESSAGE_MAGIC_CODE = 0xDAA320A7
#: ``MESSAGE_MAGIC_CODE_V2`` (-626843477): the topic length is two bytes (topics > 127 bytes).
MESSAGE_MAGIC_CODE_V2 = 0xDAA320AB


class RocketMQCodecError(FrameError, ValueError):
    """A RocketMQ remoting frame, header or message encoding that does not follow the protocol.

    ``reason`` (the bounded label of ``frametap_protocol_errors_total``) is one of
    ``short_frame``, ``too_large``, ``bad_header``, ``bad_serialize_type``, ``bad_body``,
    ``bad_message`` or ``encode``.
    """

    def __init__(self, message, reason="bad_header"):
        super().__init__(message, reason=reason)


_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_BIN_FIXED = struct.Struct(">hBhii")  # code, language, version, opaque, flag (13 bytes)


# --------------------------------------------------------------------------- command

@dataclass
class RemotingCommand:
    """One remoting command (request or response).

    ``language`` is the LanguageCode enum name (``"JAVA"``, ``"PYTHON"``...; a binary code
    with no name decodes as ``"unknown_<n>"`` and re-encodes as ``n``). ``remark`` is
    ``None`` when absent. ``ext_fields`` maps header field names to their string values,
    as Java's ``HashMap<String, String>``. ``serialize_type`` is
    :data:`~proxy.protocols.rocketmq.constants.SERIALIZE_JSON` or ``SERIALIZE_ROCKETMQ``.
    """

    code: int = 0
    language: str = "JAVA"
    version: int = 0
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: dict = field(default_factory=dict)
    body: bytes = b""
    serialize_type: int = SERIALIZE_JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def response(self, code: int, remark: str | None = None, ext_fields: dict | None = None,
                 body: bytes = b"") -> "RemotingCommand":
        """A response to this request: same opaque and serialize type, ``flag`` = 1."""
        return RemotingCommand(code=code, language="JAVA", version=self.version,
                               opaque=self.opaque, flag=FLAG_RESPONSE, remark=remark,
                               ext_fields=dict(ext_fields or {}), body=body,
                               serialize_type=self.serialize_type)


def _java_str(value) -> str:
    """``value.toString()`` as Java would give it for header values."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return str(value)


def _language_code(name) -> int:
    if isinstance(name, int):
        return name
    code = LANGUAGE_BY_NAME.get(name)
    if code is not None:
        return code
    if isinstance(name, str) and name.startswith("unknown_") and name[8:].isdigit():
        return int(name[8:])
    return LANGUAGE_BY_NAME["OTHER"]


def _language_name(code: int) -> str:
    name = LANGUAGE_CODES.get(code)
    return name if name is not None else f"unknown_{code}"


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RocketMQCodecError(f"rocketmq: cannot encode {what} as UTF-8: {exc}",
                                 "encode") from None


# --------------------------------------------------------------------------- JSON header

def _encode_json_header(cmd: RemotingCommand) -> bytes:
    # fastjson: alphabetical field order, nulls left out (RemotingSerializable.encode).
    obj: dict[str, Any] = {"code": cmd.code}
    if cmd.ext_fields:
        obj["extFields"] = {str(k): _java_str(v) for k, v in cmd.ext_fields.items()}
    obj["flag"] = cmd.flag
    language = cmd.language if isinstance(cmd.language, str) else _language_name(cmd.language)
    obj["language"] = language
    obj["opaque"] = cmd.opaque
    if cmd.remark is not None:
        obj["remark"] = cmd.remark
    obj["serializeTypeCurrentRPC"] = "JSON"
    obj["version"] = cmd.version
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return _utf8(text, "JSON header")


def _int_field(obj: dict, key: str, default: int = 0) -> int:
    value = obj.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise RocketMQCodecError(
        f"rocketmq: JSON header field {key!r} must be an integer, got {value!r}")


def _decode_json_header(data: bytes) -> RemotingCommand:
    obj = loads_java_json(data, what="JSON header", reason="bad_header")
    if not isinstance(obj, dict):
        raise RocketMQCodecError(
            f"rocketmq: JSON header must be an object, got {type(obj).__name__}")
    ext = obj.get("extFields")
    if ext is None:
        ext_fields = {}
    elif isinstance(ext, dict):
        ext_fields = {str(k): _java_str(v) for k, v in ext.items() if v is not None}
    else:
        raise RocketMQCodecError(
            f"rocketmq: JSON header extFields must be an object, got {type(ext).__name__}")
    language = obj.get("language", "JAVA")
    if isinstance(language, bool) or not isinstance(language, (str, int)):
        raise RocketMQCodecError(
            f"rocketmq: JSON header language must be a name, got {language!r}")
    if isinstance(language, int):
        language = _language_name(language)
    remark = obj.get("remark")
    if remark is not None and not isinstance(remark, str):
        remark = _java_str(remark)
    return RemotingCommand(code=_int_field(obj, "code"), language=language,
                           version=_int_field(obj, "version"),
                           opaque=_int_field(obj, "opaque"), flag=_int_field(obj, "flag"),
                           remark=remark, ext_fields=ext_fields,
                           serialize_type=SERIALIZE_JSON)


# --------------------------------------------------------------------------- binary header

def _i16(value: int, what: str) -> int:
    # Java writes (short) value: accept the u16 spelling of a negative short too.
    if not -0x8000 <= value <= 0xFFFF:
        raise RocketMQCodecError(
            f"rocketmq: {what} {value} does not fit the binary header's 16 bits", "encode")
    return value - 0x10000 if value > 0x7FFF else value


def _i32(value: int, what: str) -> int:
    if not -0x80000000 <= value <= 0xFFFFFFFF:
        raise RocketMQCodecError(
            f"rocketmq: {what} {value} does not fit 32 bits", "encode")
    return value - 0x100000000 if value > 0x7FFFFFFF else value


def _encode_binary_header(cmd: RemotingCommand) -> bytes:
    language = _language_code(cmd.language)
    if not 0 <= language <= 0xFF:
        raise RocketMQCodecError(f"rocketmq: language code {language} is not a u8", "encode")
    parts = [_BIN_FIXED.pack(_i16(cmd.code, "code"), language,
                             _i16(cmd.version, "version"), _i32(cmd.opaque, "opaque"),
                             _i32(cmd.flag, "flag"))]
    remark = _utf8(cmd.remark, "remark") if cmd.remark else b""
    parts.append(_I32.pack(len(remark)))
    parts.append(remark)
    ext = bytearray()
    for key, value in (cmd.ext_fields or {}).items():
        if key is None or value is None:
            continue
        kb = _utf8(str(key), "extFields key")
        vb = _utf8(_java_str(value), "extFields value")
        if len(kb) > 0x7FFF:
            raise RocketMQCodecError(
                f"rocketmq: extFields key of {len(kb)} bytes exceeds 32767", "encode")
        ext += _U16.pack(len(kb))
        ext += kb
        ext += _I32.pack(len(vb))
        ext += vb
    parts.append(_I32.pack(len(ext)))
    parts.append(bytes(ext))
    return b"".join(parts)


def _decode_binary_header(data: bytes) -> RemotingCommand:
    n = len(data)
    if n < 21:
        raise RocketMQCodecError(
            f"rocketmq: binary header of {n} bytes is shorter than the 21-byte minimum "
            f"(code, language, version, opaque, flag, remark length, extFields length)")
    code, language, version, opaque, flag = _BIN_FIXED.unpack_from(data, 0)
    pos = 13
    (remark_len,) = _I32.unpack_from(data, pos)
    pos += 4
    if remark_len < 0 or pos + remark_len + 4 > n:
        raise RocketMQCodecError(
            f"rocketmq: binary header remark length {remark_len} at offset 13 does not fit "
            f"the {n}-byte header")
    remark = data[pos:pos + remark_len].decode("utf-8", "replace") if remark_len else None
    pos += remark_len
    (ext_len,) = _I32.unpack_from(data, pos)
    pos += 4
    if ext_len < 0 or pos + ext_len > n:
        raise RocketMQCodecError(
            f"rocketmq: binary header extFields length {ext_len} at offset {pos - 4} does not "
            f"fit the {n}-byte header")
    ext_fields: dict[str, str] = {}
    end = pos + ext_len
    while pos < end:
        if pos + 2 > end:
            raise RocketMQCodecError(
                f"rocketmq: extFields entry at header offset {pos} is cut short (need a "
                f"2-byte key length, {end - pos} bytes left)")
        (klen,) = _U16.unpack_from(data, pos)
        pos += 2
        if pos + klen + 4 > end:
            raise RocketMQCodecError(
                f"rocketmq: extFields key length {klen} at header offset {pos - 2} runs past "
                f"the extFields end {end}")
        key = data[pos:pos + klen].decode("utf-8", "replace")
        pos += klen
        (vlen,) = _I32.unpack_from(data, pos)
        pos += 4
        if vlen < 0 or pos + vlen > end:
            raise RocketMQCodecError(
                f"rocketmq: extFields value length {vlen} for key {key!r} at header offset "
                f"{pos - 4} runs past the extFields end {end}")
        ext_fields[key] = data[pos:pos + vlen].decode("utf-8", "replace")
        pos += vlen
    return RemotingCommand(code=code, language=_language_name(language), version=version,
                           opaque=opaque, flag=flag, remark=remark, ext_fields=ext_fields,
                           serialize_type=SERIALIZE_ROCKETMQ)


# --------------------------------------------------------------------------- frames

def encode_header(cmd: RemotingCommand) -> bytes:
    """The header bytes of ``cmd`` in its ``serialize_type``."""
    if cmd.serialize_type == SERIALIZE_ROCKETMQ:
        return _encode_binary_header(cmd)
    if cmd.serialize_type == SERIALIZE_JSON:
        return _encode_json_header(cmd)
    raise RocketMQCodecError(
        f"rocketmq: unknown serialize type {cmd.serialize_type!r} (expected 0 JSON or "
        f"1 ROCKETMQ)", "encode")


def decode_header(data: bytes, serialize_type: int) -> RemotingCommand:
    """Parse header bytes of the given serialize type into a command (empty body)."""
    if serialize_type == SERIALIZE_JSON:
        return _decode_json_header(bytes(data))
    if serialize_type == SERIALIZE_ROCKETMQ:
        return _decode_binary_header(bytes(data))
    raise RocketMQCodecError(
        f"rocketmq: unknown serialize type {serialize_type} in the header-length word's high "
        f"byte (expected 0 JSON or 1 ROCKETMQ)", "bad_serialize_type")


def encode(cmd: RemotingCommand, length_includes_self: bool = False) -> bytes:
    """The whole frame for ``cmd``: ``length | type<<24 | headerLength | header | body``."""
    header = encode_header(cmd)
    if len(header) > MAX_HEADER_BYTES:
        raise RocketMQCodecError(
            f"rocketmq: header of {len(header)} bytes exceeds the 24-bit limit", "encode")
    body = bytes(cmd.body or b"")
    length = 4 + len(header) + len(body) + (4 if length_includes_self else 0)
    if length > 0xFFFFFFFF:
        raise RocketMQCodecError(f"rocketmq: frame of {length} bytes is too large", "encode")
    word = (cmd.serialize_type << 24) | len(header)
    return b"".join((_U32.pack(length), _U32.pack(word), header, body))


def decode(buf, length_includes_self: bool = False, max_frame_bytes: int = MAX_FRAME_BYTES):
    """Split one command off the start of ``buf``.

    Returns ``(cmd, consumed)`` or ``None`` when ``buf`` does not hold a whole frame yet.
    The length is checked (minimum, ``max_frame_bytes``; 0 = no limit) as soon as its
    4 bytes are there, before the rest is buffered.
    """
    if len(buf) < 4:
        return None
    (length,) = _U32.unpack_from(buf, 0)
    minimum = 8 if length_includes_self else 4
    if length < minimum:
        raise RocketMQCodecError(
            f"rocketmq: frame length {length} at offset 0 is below the minimum {minimum} "
            f"(the header-length word)", "short_frame")
    total = length if length_includes_self else 4 + length
    if max_frame_bytes and total > max_frame_bytes:
        hint = ""
        if length >> 24 in (0x16, 0x15):
            hint = " — is this TLS on a plaintext port?"
        elif 0x41 <= length >> 24 <= 0x5A:
            hint = " — is this HTTP or another text protocol?"
        raise RocketMQCodecError(
            f"rocketmq: frame length {length} exceeds the limit {max_frame_bytes}{hint}",
            "too_large")
    if len(buf) < total:
        return None
    (word,) = _U32.unpack_from(buf, 4)
    serialize_type = word >> 24
    header_len = word & 0xFFFFFF
    if 8 + header_len > total:
        raise RocketMQCodecError(
            f"rocketmq: header length {header_len} at offset 4 runs past the frame end "
            f"({total} bytes)", "bad_header")
    if serialize_type not in SERIALIZE_TYPE_NAMES:
        raise RocketMQCodecError(
            f"rocketmq: unknown serialize type {serialize_type} at offset 4 (expected 0 JSON "
            f"or 1 ROCKETMQ)", "bad_serialize_type")
    cmd = decode_header(bytes(buf[8:8 + header_len]), serialize_type)
    cmd.body = bytes(buf[8 + header_len:total])
    return cmd, total


# --------------------------------------------------------------------------- Java JSON

_BARE_KEY = re.compile(r"(-?\d+|[A-Za-z_$][\w$]*)\s*:")


def _quote_bare_keys(text: str) -> str:
    """Quote fastjson's unquoted object keys (``{0:"x"}`` → ``{"0":"x"}``), skipping strings."""
    out = []
    i = 0
    n = len(text)
    expect_key = False
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n:
                if text[j] == "\\":
                    j += 2
                    continue
                if text[j] == '"':
                    break
                j += 1
            out.append(text[i:j + 1])
            i = j + 1
            expect_key = False
            continue
        if c in "{,":
            out.append(c)
            i += 1
            expect_key = True
            continue
        if expect_key and c not in " \t\r\n":
            expect_key = False
            m = _BARE_KEY.match(text, i)
            if m:
                out.append('"' + m.group(1) + '"')
                i = m.end(1)
                continue
        out.append(c)
        i += 1
    return "".join(out)


def loads_java_json(data, what: str = "JSON body", reason: str = "bad_body"):
    """Parse JSON as Java's fastjson writes it (bare object keys allowed).

    Objects whose keys are all integers (from a bare or quoted number) keep string keys;
    callers convert (``brokerAddrs``). Raises :class:`RocketMQCodecError` on anything else.
    """
    if isinstance(data, (bytes, bytearray, memoryview)):
        text = bytes(data).decode("utf-8", "replace")
    else:
        text = data
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    try:
        return json.loads(_quote_bare_keys(text))
    except (ValueError, RecursionError) as exc:
        raise RocketMQCodecError(f"rocketmq: {what} is not JSON: {exc}", reason) from None


def _dump(obj, out: list) -> None:
    if obj is None:
        out.append("null")
    elif obj is True:
        out.append("true")
    elif obj is False:
        out.append("false")
    elif isinstance(obj, (int, float)):
        out.append(json.dumps(obj))
    elif isinstance(obj, str):
        out.append(json.dumps(obj, ensure_ascii=False))
    elif isinstance(obj, dict):
        out.append("{")
        first = True
        for key, value in obj.items():
            if value is None:
                continue  # fastjson leaves null values out
            if not first:
                out.append(",")
            first = False
            if isinstance(key, int) and not isinstance(key, bool):
                out.append(str(key))  # fastjson: a Map<Long, ...> key is written bare
            else:
                out.append(json.dumps(str(key), ensure_ascii=False))
            out.append(":")
            _dump(value, out)
        out.append("}")
    elif isinstance(obj, (list, tuple, set, frozenset)):
        out.append("[")
        for i, value in enumerate(obj):
            if i:
                out.append(",")
            _dump(value, out)
        out.append("]")
    else:
        raise RocketMQCodecError(f"rocketmq: cannot write {type(obj).__name__} as JSON",
                                 "encode")


def dumps_java_json(obj) -> bytes:
    """``obj`` as fastjson writes it: compact, null values dropped, integer map keys bare.

    Field order is the dict's order; pass keys sorted to mimic fastjson's alphabetical
    bean-field order.
    """
    out: list[str] = []
    _dump(obj, out)
    return _utf8("".join(out), "JSON body")


# --------------------------------------------------------------------------- properties

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"


def encode_properties(properties: dict | None) -> str:
    """``MessageDecoder.messageProperties2String``: ``name\\x01value\\x02`` per entry."""
    if not properties:
        return ""
    return "".join(f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}"
                   for k, v in properties.items())


def _java_split(text: str, sep: str) -> list[str]:
    parts = text.split(sep)
    while parts and parts[-1] == "":  # String.split drops trailing empty strings
        parts.pop()
    return parts


def decode_properties(text: str | None) -> dict[str, str]:
    """``MessageDecoder.string2messageProperties``: items that are not exactly
    ``name\\x01value`` (with a non-empty value) are skipped, as Java does."""
    result: dict[str, str] = {}
    if not text:
        return result
    for item in _java_split(text, PROPERTY_SEPARATOR):
        nv = _java_split(item, NAME_VALUE_SEPARATOR)
        if len(nv) == 2:
            result[nv[0]] = nv[1]
    return result


# --------------------------------------------------------------------------- batch

@dataclass
class Message:
    """A message as a producer sends it (SEND_MESSAGE body + header, or one batch entry)."""

    body: bytes
    flag: int = 0
    properties: dict = field(default_factory=dict)


def _properties_bytes(properties) -> bytes:
    data = _utf8(encode_properties(properties), "properties")
    if len(data) > 0x7FFF:
        raise RocketMQCodecError(
            f"rocketmq: properties of {len(data)} bytes exceed Short.MAX_VALUE (32767)",
            "encode")
    return data


def encode_message_batch(messages: Iterable[Message]) -> bytes:
    """SEND_BATCH_MESSAGE body (``MessageDecoder.encodeMessages``)."""
    out = bytearray()
    for msg in messages:
        body = bytes(msg.body)
        props = _properties_bytes(msg.properties)
        size = 4 + 4 + 4 + 4 + 4 + len(body) + 2 + len(props)
        out += _I32.pack(size)
        out += _I32.pack(0)          # magic code: 0 in a batch entry
        out += _I32.pack(0)          # body CRC: 0 in a batch entry
        out += _I32.pack(_i32(msg.flag, "message flag"))
        out += _I32.pack(len(body))
        out += body
        out += _I16.pack(len(props))
        out += props
    return bytes(out)


def decode_message_batch(body) -> list[Message]:
    """Parse a SEND_BATCH_MESSAGE body into :class:`Message` entries."""
    data = bytes(body)
    n = len(data)
    pos = 0
    result = []
    while pos < n:
        start = pos
        if pos + 20 > n:
            raise RocketMQCodecError(
                f"rocketmq: batch entry at body offset {start} is cut short ({n - pos} bytes, "
                f"need at least 22)", "bad_message")
        (size,) = _I32.unpack_from(data, pos)
        (flag,) = _I32.unpack_from(data, pos + 12)
        (body_len,) = _I32.unpack_from(data, pos + 16)
        pos += 20
        if body_len < 0 or pos + body_len + 2 > n:
            raise RocketMQCodecError(
                f"rocketmq: batch entry at body offset {start}: body length {body_len} runs "
                f"past the {n}-byte batch", "bad_message")
        msg_body = data[pos:pos + body_len]
        pos += body_len
        (props_len,) = _I16.unpack_from(data, pos)
        pos += 2
        if props_len < 0 or pos + props_len > n:
            raise RocketMQCodecError(
                f"rocketmq: batch entry at body offset {start}: properties length {props_len} "
                f"runs past the {n}-byte batch", "bad_message")
        props = data[pos:pos + props_len].decode("utf-8", "replace")
        pos += props_len
        if size != pos - start:
            raise RocketMQCodecError(
                f"rocketmq: batch entry at body offset {start} declares totalSize {size} but "
                f"its fields take {pos - start} bytes", "bad_message")
        result.append(Message(body=msg_body, flag=flag, properties=decode_properties(props)))
    return result


# --------------------------------------------------------------------------- stored messages

def body_crc(body: bytes) -> int:
    """``UtilAll.crc32(body)``: CRC32 with the sign bit cleared."""
    return zlib.crc32(body) & 0x7FFFFFFF


def _host_bytes(host: str) -> bytes:
    try:
        return socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
    except OSError:
        raise RocketMQCodecError(f"rocketmq: {host!r} is not an IP address", "encode") from None


def create_message_id(host: str, port: int, offset: int) -> str:
    """``MessageDecoder.createMessageId``: hex of store IP + port (i32) + commit-log offset
    (i64), upper case; 32 characters for IPv4."""
    return (_host_bytes(host) + _I32.pack(port) + _I64.pack(offset)).hex().upper()


def decode_message_id(msg_id: str) -> tuple[str, int, int]:
    """``(host, port, offset)`` from an offset message id (IPv4 32 chars, IPv6 56)."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise RocketMQCodecError(f"rocketmq: message id {msg_id!r} is not hex",
                                 "bad_message") from None
    if len(raw) == 16:
        host = socket.inet_ntop(socket.AF_INET, raw[:4])
        rest = raw[4:]
    elif len(raw) == 28:
        host = socket.inet_ntop(socket.AF_INET6, raw[:16])
        rest = raw[16:]
    else:
        raise RocketMQCodecError(
            f"rocketmq: message id {msg_id!r} has {len(raw)} bytes (expected 16 or 28)",
            "bad_message")
    return host, _I32.unpack_from(rest, 0)[0], _I64.unpack_from(rest, 4)[0]


@dataclass
class StoredMessage:
    """A message as the broker stores and serves it (``MessageExt``).

    Wire layout (``MessageDecoder.encode``/``decode``): totalSize i32, magicCode i32,
    bodyCRC i32, queueId i32, flag i32, queueOffset i64, physicOffset i64, sysFlag i32,
    bornTimestamp i64, bornHost (4-byte IPv4, or 16 with sysFlag bit 0x10, + i32 port),
    storeTimestamp i64, storeHost (same, bit 0x20), reconsumeTimes i32,
    preparedTransactionOffset i64, body (i32 + bytes), topic (u8 + bytes; u16 with
    MESSAGE_MAGIC_CODE_V2), properties (i16 + bytes).
    """

    topic: str
    body: bytes
    queue_id: int = 0
    queue_offset: int = 0
    physic_offset: int = 0
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: tuple = ("127.0.0.1", 0)
    store_timestamp: int = 0
    store_host: tuple = ("127.0.0.1", 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    properties: dict = field(default_factory=dict)
    body_crc: int | None = None  # None: computed from body when encoding

    @property
    def msg_id(self) -> str:
        """The offset message id: store host + port + physical offset, hex."""
        return create_message_id(self.store_host[0], self.store_host[1], self.physic_offset)


def encode_stored_message(msg: StoredMessage) -> bytes:
    """One message in commit-log format (V1 magic, or V2 when the topic exceeds 127 bytes)."""
    body = bytes(msg.body)
    topic = _utf8(msg.topic, "topic")
    props = _properties_bytes(msg.properties)
    born_ip = _host_bytes(msg.born_host[0])
    store_ip = _host_bytes(msg.store_host[0])
    sys_flag = msg.sys_flag & ~(MSG_FLAG_BORNHOST_V6 | MSG_FLAG_STOREHOST_V6)
    if len(born_ip) == 16:
        sys_flag |= MSG_FLAG_BORNHOST_V6
    if len(store_ip) == 16:
        sys_flag |= MSG_FLAG_STOREHOST_V6
    if len(topic) > 0xFFFF:
        raise RocketMQCodecError(f"rocketmq: topic of {len(topic)} bytes is too long", "encode")
    v2 = len(topic) > 127
    topic_field = (_U16.pack(len(topic)) if v2 else _U8.pack(len(topic))) + topic
    crc = body_crc(body) if msg.body_crc is None else msg.body_crc
    fixed = b"".join((
        _I32.pack(_i32(MESSAGE_MAGIC_CODE_V2 if v2 else MESSAGE_MAGIC_CODE, "magic")),
        _I32.pack(_i32(crc, "bodyCRC")),
        _I32.pack(msg.queue_id),
        _I32.pack(_i32(msg.flag, "flag")),
        _I64.pack(msg.queue_offset),
        _I64.pack(msg.physic_offset),
        _I32.pack(_i32(sys_flag, "sysFlag")),
        _I64.pack(msg.born_timestamp),
        born_ip, _I32.pack(msg.born_host[1]),
        _I64.pack(msg.store_timestamp),
        store_ip, _I32.pack(msg.store_host[1]),
        _I32.pack(msg.reconsume_times),
        _I64.pack(msg.prepared_transaction_offset),
        _I32.pack(len(body)), body,
        topic_field,
        _I16.pack(len(props)), props,
    ))
    return _I32.pack(4 + len(fixed)) + fixed


def encode_stored_messages(messages: Iterable[StoredMessage]) -> bytes:
    """A PULL_MESSAGE response body: stored messages back to back."""
    return b"".join(encode_stored_message(m) for m in messages)


def _need(data: bytes, pos: int, count: int, end: int, start: int, what: str) -> None:
    if pos + count > end:
        raise RocketMQCodecError(
            f"rocketmq: stored message at body offset {start}: {what} at offset {pos} needs "
            f"{count} bytes, only {max(end - pos, 0)} left", "bad_message")


def decode_stored_messages(body) -> list[StoredMessage]:
    """Parse a PULL_MESSAGE response body into :class:`StoredMessage` entries."""
    data = bytes(body)
    n = len(data)
    pos = 0
    result = []
    while pos < n:
        start = pos
        _need(data, pos, 8, n, start, "totalSize and magic")
        (size,) = _I32.unpack_from(data, pos)
        (magic,) = _U32.unpack_from(data, pos + 4)
        if magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2):
            raise RocketMQCodecError(
                f"rocketmq: stored message at body offset {start}: bad magic 0x{magic:08X} "
                f"(expected 0x{MESSAGE_MAGIC_CODE:08X} or 0x{MESSAGE_MAGIC_CODE_V2:08X})",
                "bad_message")
        if size < 8 or start + size > n:
            raise RocketMQCodecError(
                f"rocketmq: stored message at body offset {start}: totalSize {size} does not "
                f"fit the {n}-byte body", "bad_message")
        end = start + size
        pos += 8
        _need(data, pos, 40, end, start, "fixed fields")
        (crc,) = _I32.unpack_from(data, pos)
        (queue_id,) = _I32.unpack_from(data, pos + 4)
        (flag,) = _I32.unpack_from(data, pos + 8)
        (queue_offset,) = _I64.unpack_from(data, pos + 12)
        (physic_offset,) = _I64.unpack_from(data, pos + 20)
        (sys_flag,) = _I32.unpack_from(data, pos + 28)
        (born_ts,) = _I64.unpack_from(data, pos + 32)
        pos += 40
        hosts = []
        for bit, label in ((MSG_FLAG_BORNHOST_V6, "bornHost"), (MSG_FLAG_STOREHOST_V6, None)):
            ip_len = 16 if sys_flag & bit else 4
            if label is None:  # storeTimestamp comes between bornHost and storeHost
                _need(data, pos, 8, end, start, "storeTimestamp")
                hosts.append(_I64.unpack_from(data, pos)[0])
                pos += 8
            _need(data, pos, ip_len + 4, end, start, label or "storeHost")
            ip = socket.inet_ntop(socket.AF_INET6 if ip_len == 16 else socket.AF_INET,
                                  data[pos:pos + ip_len])
            hosts.append((ip, _I32.unpack_from(data, pos + ip_len)[0]))
            pos += ip_len + 4
        born_host, store_ts, store_host = hosts
        _need(data, pos, 16, end, start, "reconsumeTimes, preparedTransactionOffset, body length")
        (reconsume,) = _I32.unpack_from(data, pos)
        (prepared,) = _I64.unpack_from(data, pos + 4)
        (body_len,) = _I32.unpack_from(data, pos + 12)
        pos += 16
        if body_len < 0:
            raise RocketMQCodecError(
                f"rocketmq: stored message at body offset {start}: negative body length "
                f"{body_len}", "bad_message")
        _need(data, pos, body_len, end, start, "body")
        msg_body = data[pos:pos + body_len]
        pos += body_len
        if magic == MESSAGE_MAGIC_CODE_V2:
            _need(data, pos, 2, end, start, "topic length")
            (topic_len,) = _U16.unpack_from(data, pos)
            pos += 2
        else:
            _need(data, pos, 1, end, start, "topic length")
            topic_len = data[pos]
            pos += 1
        _need(data, pos, topic_len, end, start, "topic")
        topic = data[pos:pos + topic_len].decode("utf-8", "replace")
        pos += topic_len
        _need(data, pos, 2, end, start, "properties length")
        (props_len,) = _I16.unpack_from(data, pos)
        pos += 2
        if props_len < 0:
            raise RocketMQCodecError(
                f"rocketmq: stored message at body offset {start}: negative properties "
                f"length {props_len}", "bad_message")
        _need(data, pos, props_len, end, start, "properties")
        props = data[pos:pos + props_len].decode("utf-8", "replace")
        pos = end  # totalSize wins (the store may pad), as the commit log reader does
        result.append(StoredMessage(
            topic=topic, body=msg_body, queue_id=queue_id, queue_offset=queue_offset,
            physic_offset=physic_offset, flag=flag, sys_flag=sys_flag,
            born_timestamp=born_ts, born_host=born_host, store_timestamp=store_ts,
            store_host=store_host, reconsume_times=reconsume,
            prepared_transaction_offset=prepared, properties=decode_properties(props),
            body_crc=crc))
    return result


# --------------------------------------------------------------------------- route data

@dataclass
class BrokerData:
    """One broker group: ``broker_addrs`` maps broker id (0 = master) to ``host:port``."""

    cluster: str
    broker_name: str
    broker_addrs: dict = field(default_factory=dict)
    enable_acting_master: bool = False
    zone_name: str | None = None

    def to_java(self) -> dict:
        return {"brokerAddrs": {int(k): v for k, v in self.broker_addrs.items()},
                "brokerName": self.broker_name, "cluster": self.cluster,
                "enableActingMaster": self.enable_acting_master, "zoneName": self.zone_name}


@dataclass
class QueueData:
    """Queues of a topic on one broker group; ``perm`` 6 = read (4) | write (2)."""

    broker_name: str
    read_queue_nums: int = 4
    write_queue_nums: int = 4
    perm: int = PERM_READ | PERM_WRITE
    topic_sys_flag: int = 0

    def to_java(self) -> dict:
        return {"brokerName": self.broker_name, "perm": self.perm,
                "readQueueNums": self.read_queue_nums, "topicSysFlag": self.topic_sys_flag,
                "writeQueueNums": self.write_queue_nums}


@dataclass
class TopicRouteData:
    """GET_ROUTEINFO_BY_TOPIC response body."""

    queue_datas: list = field(default_factory=list)
    broker_datas: list = field(default_factory=list)
    filter_server_table: dict = field(default_factory=dict)
    order_topic_conf: str | None = None

    def to_java(self) -> dict:
        # fastjson's alphabetical bean order; orderTopicConf and topicQueueMappingByBroker
        # are null for a plain topic and left out.
        return {"brokerDatas": [b.to_java() for b in self.broker_datas],
                "filterServerTable": dict(self.filter_server_table),
                "orderTopicConf": self.order_topic_conf,
                "queueDatas": [q.to_java() for q in self.queue_datas]}


def encode_topic_route(route: TopicRouteData) -> bytes:
    """TopicRouteData JSON as the Java name server writes it, e.g.
    ``{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:10911"},"brokerName":"broker-a",
    "cluster":"DefaultCluster","enableActingMaster":false}],"filterServerTable":{},
    "queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,
    "writeQueueNums":4}]}``."""
    return dumps_java_json(route.to_java())


def _as_int(value, what: str) -> int:
    try:
        if isinstance(value, bool):
            raise ValueError
        return int(value)
    except (TypeError, ValueError):
        raise RocketMQCodecError(f"rocketmq: route data {what} must be an integer, got "
                                 f"{value!r}", "bad_body") from None


def decode_topic_route(body) -> TopicRouteData:
    """Parse route data JSON (bare or quoted integer ``brokerAddrs`` keys, any key order)."""
    obj = loads_java_json(body, what="TopicRouteData")
    if not isinstance(obj, dict):
        raise RocketMQCodecError("rocketmq: TopicRouteData must be a JSON object", "bad_body")
    try:
        brokers = []
        for b in obj.get("brokerDatas") or []:
            addrs = {_as_int(k, "brokerAddrs key"): str(v)
                     for k, v in (b.get("brokerAddrs") or {}).items()}
            brokers.append(BrokerData(cluster=b.get("cluster"), broker_name=b.get("brokerName"),
                                      broker_addrs=addrs,
                                      enable_acting_master=bool(b.get("enableActingMaster",
                                                                      False)),
                                      zone_name=b.get("zoneName")))
        queues = [QueueData(broker_name=q.get("brokerName"),
                            read_queue_nums=_as_int(q.get("readQueueNums", 0), "readQueueNums"),
                            write_queue_nums=_as_int(q.get("writeQueueNums", 0),
                                                     "writeQueueNums"),
                            perm=_as_int(q.get("perm", 0), "perm"),
                            topic_sys_flag=_as_int(q.get("topicSysFlag", 0), "topicSysFlag"))
                  for q in obj.get("queueDatas") or []]
        filters = obj.get("filterServerTable") or {}
        if not isinstance(filters, dict):
            raise TypeError("filterServerTable")
    except (AttributeError, TypeError) as exc:
        raise RocketMQCodecError(f"rocketmq: TopicRouteData has an unexpected shape: {exc}",
                                 "bad_body") from None
    return TopicRouteData(queue_datas=queues, broker_datas=brokers,
                          filter_server_table=filters,
                          order_topic_conf=obj.get("orderTopicConf"))


# --------------------------------------------------------------------------- send headers

#: SendMessageRequestHeaderV2 short keys → SendMessageRequestHeader field names.
SEND_V2_KEYS = {
    "a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums",
    "e": "queueId", "f": "sysFlag", "g": "bornTimestamp", "h": "flag", "i": "properties",
    "j": "reconsumeTimes", "k": "unitMode", "l": "maxReconsumeTimes", "m": "batch",
    "n": "brokerName",
}
_SEND_V1_KEYS = {v: k for k, v in SEND_V2_KEYS.items()}


def send_header_from_v2(ext_fields: dict) -> dict:
    """SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE short-key extFields → V1 field names (other
    keys, such as ``bname``, pass through)."""
    return {SEND_V2_KEYS.get(k, k): v for k, v in ext_fields.items()}


def send_header_to_v2(ext_fields: dict) -> dict:
    """V1 SendMessageRequestHeader field names → the V2 short keys."""
    return {_SEND_V1_KEYS.get(k, k): v for k, v in ext_fields.items()}
