"""RabbitMQ Stream error replies for the fault engine (interface:
proxy/protocols/fault_replies.py).

A request with a correlation id gets its command's response, as the real server
(``rabbit_stream_core.erl``) writes a failed one: ``key | 0x8000``, version 1 (the server
writes ``?VERSION_1`` on every response), the same correlation id, the response code,
then the command's remaining response fields empty or zero (QueryOffset /
QueryPublisherSequence: 0; PeerProperties, SaslHandshake, Route, Partitions,
ExchangeCommandVersions, StreamStats: an empty array or map; ConsumerUpdate: offset type
``next``; SaslAuthenticate and Open: nothing, as the server omits them).  Metadata has no response code of its own: the reply lists no broker and
every requested stream with the code and no leader (``0xFFFF``), as the server answers
for a stream it cannot serve.

``Publish`` has no response: the reply is one ``PublishError`` (key 4, version 1) with the
publisher id and every publishing id of the frame, each with the code — Publish v1 and
v2 (filter value) layouts, simple messages and sub-entry batches alike.

No reply (None): responses, ``Tune``, and the commands that have no response (Credit,
StoreOffset, Heartbeat; the server's PublishConfirm, PublishError, Deliver,
MetadataUpdate); a Publish carrying no message.  The text ``message`` has no place in a
Stream response and is not sent.
"""

import struct

from proxy.protocols.fault_replies import FaultReplyError, resolve_status
from proxy.protocols.rabbitmq_stream.constants import (
    CLOSE, CONSUMER_UPDATE, CREATE, DECLARE_PUBLISHER, DELETE, DELETE_PUBLISHER,
    EXCHANGE_COMMAND_VERSIONS, METADATA, OK, OPEN, PARTITIONS, PEER_PROPERTIES, PUBLISH,
    PUBLISH_ERROR, QUERY_OFFSET, QUERY_PUBLISHER_SEQUENCE, RESPONSE_BIT, RESPONSE_CODES,
    ROUTE, SASL_AUTHENTICATE, SASL_HANDSHAKE, STREAM_STATS, SUBSCRIBE, UNSUBSCRIBE,
    OFFSET_NEXT, status_name)

__all__ = ["DEFAULT_ERROR", "ERROR_NAMES", "error_status", "error_reply", "is_request"]

PROTOCOL = "rabbitmq-stream"
DEFAULT_ERROR = "INTERNAL_ERROR"
#: Response-code names accepted as a rule's ``status`` (OK is no error).
ERROR_NAMES = {name: code for code, name in RESPONSE_CODES.items() if code != OK}

_I32_0 = struct.pack(">i", 0)
#: The response fields after the code, empty, per request with a correlation id.
RESPONSE_TAIL = {
    DECLARE_PUBLISHER: b"", DELETE_PUBLISHER: b"", SUBSCRIBE: b"", UNSUBSCRIBE: b"",
    CREATE: b"", DELETE: b"", CLOSE: b"", SASL_AUTHENTICATE: b"", OPEN: b"",
    QUERY_PUBLISHER_SEQUENCE: bytes(8), QUERY_OFFSET: bytes(8),
    PEER_PROPERTIES: _I32_0, SASL_HANDSHAKE: _I32_0, ROUTE: _I32_0, PARTITIONS: _I32_0,
    EXCHANGE_COMMAND_VERSIONS: _I32_0, STREAM_STATS: _I32_0,
    CONSUMER_UPDATE: struct.pack(">H", OFFSET_NEXT),
    METADATA: None,                         # built from the request's stream list
}

_HEAD = struct.Struct(">IHH")              # size, key, version
_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_NO_LEADER = 0xFFFF


def error_status(value):
    """``(code, label)`` of a response-code name (``STREAM_NOT_AVAILABLE``) or number."""
    return resolve_status(PROTOCOL, value, ERROR_NAMES, status_name, 0, 0xFFFF,
                          success=(OK,), hint="; OK is not an error")


def _frame(request):
    b = bytes(request)
    n = len(b)
    if n < 8:
        raise FaultReplyError(f"rabbitmq-stream: a frame has at least 8 bytes, got {n}")
    size, key, version = _HEAD.unpack_from(b)
    if size + 4 != n:
        raise FaultReplyError(
            f"rabbitmq-stream: frame Size {size} does not describe the {n}-byte frame "
            f"(expected {n - 4})")
    return b, key, version


def is_request(request):
    """True for Publish (with at least one message) and every request with a correlation
    id: the frames :func:`error_reply` answers."""
    try:
        return error_reply(request, OK) is not None
    except ValueError:
        return False


def error_reply(request, code, label="", message=""):
    """The server's answer with response ``code`` to ``request`` (one whole frame), or None."""
    b, key, version = _frame(request)     # version: the Publish layout (v2: filter value)
    if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= 0xFFFF:
        raise FaultReplyError(f"rabbitmq-stream: response code {code!r} is not a u16")
    if key == PUBLISH:
        return _publish_error(b, version, code)
    if key not in RESPONSE_TAIL:
        return None                          # a response, or a command without one
    if len(b) < 12:
        raise FaultReplyError(
            f"rabbitmq-stream: {len(b)}-byte frame has no room for its correlation id")
    corr = b[8:12]
    if key == METADATA:
        body = corr + _I32_0 + _metadata_streams(b, code)
    else:
        body = corr + _U16.pack(code) + RESPONSE_TAIL[key]
    return _HEAD.pack(4 + len(body), key | RESPONSE_BIT, 1) + body


def _metadata_streams(b, code):
    """The StreamMetadata array for the streams a Metadata request names, each with
    ``code`` and no leader; names are copied as sent (one that is not UTF-8 is left out).  A body that does not hold a whole
    stream list gets an empty array (the parsers count the request whatever its body)."""
    n = len(b)
    out = []
    if n >= 16:
        (count,) = _I32.unpack_from(b, 12)
        pos = 16
        if 0 <= count <= (n - pos) // 2:
            for _ in range(count):
                if pos + 2 > n:
                    out = None
                    break
                (slen,) = _I16.unpack_from(b, pos)
                end = pos + 2 + max(slen, 0)
                if slen < -1 or end > n:
                    out = None
                    break
                try:
                    b[pos + 2:end].decode("utf-8")
                except UnicodeDecodeError:
                    pass                     # no client can name such a stream: left out
                else:
                    out.append(b[pos:end])
                pos = end
        else:
            out = None
    else:
        out = None
    if not out:
        return _I32_0
    tail = _U16.pack(code) + _U16.pack(_NO_LEADER) + _I32_0
    return _I32.pack(len(out)) + b"".join(name + tail for name in out)


def _publish_error(b, version, code):
    """PublishError for every publishing id of a Publish frame (v1: id, message; v2: id,
    filter value, message; a message is ``u32 size + bytes`` or, top bit set, a
    sub-entry batch ``u8 type, u16 records, u32 uncompressed, u32 size + bytes``)."""
    n = len(b)
    if n < 13:
        raise FaultReplyError(
            f"rabbitmq-stream: Publish of {n} bytes has no room for publisher id and count")
    pubid = b[8]
    (count,) = _U32.unpack_from(b, 9)
    pos = 13
    if count > (n - pos) // 12:
        raise FaultReplyError(
            f"rabbitmq-stream: Publish count {count} needs at least {count * 12} bytes, "
            f"{n - pos} left")
    if count == 0:
        return None
    code_bytes = _U16.pack(code)
    entries = []
    for i in range(count):
        if pos + 8 > n:
            raise FaultReplyError(
                f"rabbitmq-stream: Publish message {i} is cut short at body offset {pos - 8}")
        entries.append(b[pos:pos + 8] + code_bytes)
        pos += 8
        if version >= 2:
            if pos + 2 > n:
                raise FaultReplyError(
                    f"rabbitmq-stream: Publish message {i} filter value is cut short")
            (flen,) = _I16.unpack_from(b, pos)
            pos += 2 + max(flen, 0)
        if pos + 1 > n:
            raise FaultReplyError(f"rabbitmq-stream: Publish message {i} is cut short")
        if b[pos] & 0x80:                    # sub-entry batch
            if pos + 11 > n:
                raise FaultReplyError(
                    f"rabbitmq-stream: Publish message {i} sub-entry header is cut short")
            pos += 11 + _U32.unpack_from(b, pos + 7)[0]
        else:
            if pos + 4 > n:
                raise FaultReplyError(f"rabbitmq-stream: Publish message {i} size is cut short")
            pos += 4 + _U32.unpack_from(b, pos)[0]
        if pos > n:
            raise FaultReplyError(
                f"rabbitmq-stream: Publish message {i} runs past the end of the frame")
    if pos != n:
        raise FaultReplyError(
            f"rabbitmq-stream: {n - pos} bytes after the last of {count} Publish messages")
    body = bytes([pubid]) + _I32.pack(count) + b"".join(entries)
    return _HEAD.pack(4 + len(body), PUBLISH_ERROR, 1) + body
