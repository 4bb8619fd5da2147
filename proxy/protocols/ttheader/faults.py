"""Thrift (ttheader route) error replies for the fault engine (interface:
proxy/protocols/fault_replies.py).

A CALL is answered as a Thrift server answers a call it cannot serve
(``TProcessor``: ``writeMessageBegin(name, EXCEPTION, seqid)`` then a
``TApplicationException{1: message string, 2: type i32}``): message type EXCEPTION (3),
the call's method name and seq id copied byte for byte, in the call's own protocol and
framing:

- protocol: strict binary (``80 01``), non-strict binary (name length first) or compact
  (``82``), read from the payload's first bytes as Kitex does; Kitex protobuf
  (``90 01`` meta) gets Kitex's ``pbError{1: TypeID varint, 2: Message string}``;
- framing: unframed, framed (u32 length), Kitex TTHeader (0x1000) or Apache THeader
  (0x0FFF).  A header echoes the call's flags, header seq id and protocol id (one the
  framing does not define is replaced by the payload's: 0 binary, 2 compact), carries no
  info key/values, and keeps Kitex's inner u32 length (TTHeaderFramed) when the call had
  one.  A zlib-compressed call gets a zlib-compressed reply (transform ZLIB echoed: the
  client chose zlib, and every THeader/TTHeader reader undoes it); calls whose payload cannot be read (snappy, an unknown
  transform, protobuf without its meta) get an uncompressed reply, with the method from
  the TO_METHOD info (else empty) and the header's seq id as the message seq id (the id
  the parsers then match the call by).

No reply (None): ONEWAY calls, and frames that are replies or exceptions themselves.
Statuses are TApplicationException types (``INTERNAL_ERROR`` 6 by default).
"""

import struct
import zlib

from proxy.protocols.fault_replies import FaultReplyError, default_message, resolve_status
from proxy.protocols.ttheader.codec import varint
from proxy.protocols.ttheader.constants import (CALL, EXCEPTION, HEADER_LIMIT, INFO_ACL_TOKEN,
                                            INFO_INTKEYVALUE, INFO_KEYVALUE, MAGIC_THEADER,
                                            MAGIC_TTHEADER, PROTO_BINARY, PROTO_COMPACT,
                                            PROTO_PROTOBUF,
                                            TAPP_TYPES, TO_METHOD, ZLIB, ZOUT_MAX,
                                            status_name)
from proxy.protocols.ttheader.parser_py import Msg
from proxy.protocols.ttheader.walk_py import M_OK, P_BINARY, P_COMPACT, P_PROTOBUF, read_message

__all__ = ["DEFAULT_ERROR", "ERROR_NAMES", "error_status", "error_reply", "is_request"]

PROTOCOL = "ttheader"
DEFAULT_ERROR = "INTERNAL_ERROR"
#: TApplicationException type names (thrift/lib: TApplicationException.TYPE).
ERROR_NAMES = {name: code for code, name in enumerate(TAPP_TYPES)}
TYPE_MAX = 0x7FFFFFFF

TT_META = 14                                # LENGTH, magic, flags, seq id, header size
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")

# payload transforms, as far as reading goes (the parsers' X_NONE, X_ZLIB, X_OPAQUE)
_X_NONE, _X_ZLIB, _X_OPAQUE = 0, 1, 2


def error_status(value):
    """``(code, label)`` of a TApplicationException type name or number."""
    return resolve_status(PROTOCOL, value, ERROR_NAMES, status_name, 0, TYPE_MAX)


class _Call:
    """What the reply copies from the call."""
    __slots__ = ("framing", "magic", "flags", "hseq", "proto_id", "zlib", "inner",
                 "ptype", "strict", "mtype", "name", "seq_raw", "seq")

    def __init__(self):
        self.framing = "unframed"
        self.magic = self.flags = self.proto_id = 0
        self.hseq = b"\0\0\0\0"
        self.zlib = self.inner = False
        self.ptype = P_BINARY
        self.strict = True
        self.mtype = CALL
        self.name = b""
        self.seq_raw = b""
        self.seq = 0


def _message(c, payload, allow_pb):
    """Fill ``c`` from the Thrift message header at the start of ``payload``."""
    m = Msg()
    n = min(len(payload), HEADER_LIMIT)
    if read_message(m, payload, 0, n, n, allow_pb) != M_OK:
        raise FaultReplyError("ttheader: the payload does not start with a Thrift message")
    c.ptype, c.mtype, c.seq = m.ptype, m.mtype, m.seq
    c.name = bytes(payload[m.name_off:m.name_off + m.name_len])
    if m.ptype == P_COMPACT:
        end, _ = _uvarint(payload, 2, len(payload))   # the seq id varint, copied as sent
        c.seq_raw = bytes(payload[2:end])
    else:
        c.strict = payload[0] & 0x80 != 0
        seq_off = m.name_off + m.name_len + (0 if c.strict else 1)
        c.seq_raw = bytes(payload[seq_off:seq_off + 4])


def _header_info(c, b, p0):
    """Protocol id, transforms and the TO_METHOD info of a (T)THeader header b[14:p0],
    read as the parsers read them (a field cut short ends the reading, keeping what was
    read); returns (readable?, TO_METHOD value or None)."""
    h = b[:p0]
    xform = [_X_NONE]

    def apply(t):                           # the parsers' _xform()
        xform[0] = _X_ZLIB if t == ZLIB and xform[0] == _X_NONE else _X_OPAQUE

    tom = None
    if c.magic == MAGIC_TTHEADER:
        c.proto_id = h[TT_META]
        nt = h[TT_META + 1]
        i = TT_META + 2
        if i + nt <= p0:
            for t in h[i:i + nt]:
                apply(t)
            i += nt
            tom = _to_method(h, i, p0)
    else:
        i, v = _uvarint(h, TT_META, p0)
        if i >= 0:
            c.proto_id = v
            i, nt = _uvarint(h, i, p0)
            while i >= 0 and nt > 0:
                i, t = _uvarint(h, i, p0)
                if i >= 0:
                    apply(t)
                nt -= 1
    c.zlib = xform[0] == _X_ZLIB
    return xform[0] != _X_OPAQUE, tom


def _to_method(h, i, end):
    """The TO_METHOD (INFO_INTKEYVALUE key 9) value of Kitex info blocks at h[i:end]."""
    tom = None
    while i < end:
        iid = h[i]
        i += 1
        if iid == 0:
            continue
        if iid in (INFO_KEYVALUE, INFO_INTKEYVALUE):
            if i + 2 > end:
                break
            cnt = (h[i] << 8) | h[i + 1]
            i += 2
            for _ in range(cnt):
                if i + 2 > end:
                    return tom
                key = (h[i] << 8) | h[i + 1]
                i += 2
                if iid == INFO_KEYVALUE:
                    i += key
                if i + 2 > end:
                    return tom
                vl = (h[i] << 8) | h[i + 1]
                i += 2 + vl
                if i > end:
                    return tom
                if iid == INFO_INTKEYVALUE and key == TO_METHOD:
                    tom = bytes(h[i - vl:i])
        elif iid == INFO_ACL_TOKEN:
            if i + 2 > end:
                break
            i += 2 + ((h[i] << 8) | h[i + 1])
        else:
            break
    return tom


def _uvarint(h, i, end):
    """(index after, value) of the unsigned varint at h[i:end] (at most 5 bytes, as the
    parsers read header varints); (-1, 0) when it is cut short or longer."""
    v = shift = 0
    j = i
    while j < end and j - i < 5:
        c = h[j]
        j += 1
        v |= (c & 0x7F) << shift
        if not c & 0x80:
            return j, v & 0xFFFFFFFFFFFFFFFF
        shift += 7
    return -1, 0


def _call(request):
    """The _Call of one whole frame; FaultReplyError when it is not a Thrift frame."""
    b = bytes(request)
    n = len(b)
    c = _Call()
    if n >= 2 and b[0] == 0x80 and b[1] == 0x01:
        _message(c, b, False)               # unframed strict binary
        return c
    if n < 8:
        raise FaultReplyError(f"ttheader: a frame has at least 8 bytes, got {n}")
    (length,) = _U32.unpack_from(b)
    if length + 4 != n:
        raise FaultReplyError(
            f"ttheader: frame length {length} does not describe the {n}-byte frame "
            f"(expected {n - 4})")
    magic = (b[4] << 8) | b[5]
    if magic not in (MAGIC_TTHEADER, MAGIC_THEADER):
        c.framing = "framed"
        _message(c, b[4:], True)
        return c
    if n < TT_META + 4:
        raise FaultReplyError(f"ttheader: a {n}-byte frame is too short for its header")
    c.framing, c.magic = "header", magic
    c.flags = (b[6] << 8) | b[7]
    c.hseq = b[8:12]
    p0 = TT_META + ((b[12] << 8) | b[13]) * 4
    if p0 == TT_META or p0 > n:
        raise FaultReplyError("ttheader: the header size does not fit the frame")
    readable, tom = _header_info(c, b, p0)
    if magic == MAGIC_THEADER and c.proto_id == PROTO_PROTOBUF:
        raise FaultReplyError("ttheader: an Apache THeader frame with protocol id 3 "
                              "(protobuf exists in Kitex TTHeader only)")
    payload = b[p0:]
    if c.proto_id == PROTO_PROTOBUF and (c.zlib or payload[:2] != b"\x90\x01"):
        readable = False
    if not readable:
        c.zlib = False
        c.ptype = P_PROTOBUF if c.proto_id == PROTO_PROTOBUF else (
            P_COMPACT if c.proto_id == PROTO_COMPACT else P_BINARY)
        c.name = tom or b""
        (c.seq,) = _I32.unpack_from(c.hseq)
        c.seq_raw = varint(c.seq & 0xFFFFFFFF) if c.ptype == P_COMPACT else bytes(c.hseq)
        return c
    if c.zlib:
        try:
            payload = zlib.decompressobj().decompress(payload[:HEADER_LIMIT], ZOUT_MAX)
        except zlib.error as exc:
            raise FaultReplyError(f"ttheader: zlib payload: {exc}") from None
    elif len(payload) >= 4 and _U32.unpack_from(payload)[0] == len(payload) - 4:
        payload = payload[4:]               # Kitex TTHeaderFramed
        c.inner = True
    _message(c, payload, c.proto_id == PROTO_PROTOBUF)
    return c


def is_request(request):
    """True for a CALL (what :func:`error_reply` answers)."""
    try:
        return _call(request).mtype == CALL
    except ValueError:
        return False


def _exception(c, type_, text):
    """The EXCEPTION message: header, then the exception struct, in the call's protocol."""
    msg = text.encode("utf-8")
    if c.ptype == P_COMPACT:
        zig = ((type_ << 1) ^ (type_ >> 31)) & 0xFFFFFFFF
        return (bytes([0x82, (EXCEPTION << 5) | 1]) + c.seq_raw + varint(len(c.name)) + c.name
                + b"\x18" + varint(len(msg)) + msg + b"\x15" + varint(zig) + b"\x00")
    if c.ptype == P_PROTOBUF:               # Kitex: meta, then pbError
        return (struct.pack(">HHi", 0x9001, EXCEPTION, len(c.name)) + c.name + c.seq_raw
                + b"\x08" + varint(type_) + b"\x12" + varint(len(msg)) + msg)
    struct_ = (struct.pack(">BhI", 11, 1, len(msg)) + msg + struct.pack(">Bhi", 8, 2, type_)
               + b"\x00")
    if c.strict:
        head = struct.pack(">HBBI", 0x8001, 0, EXCEPTION, len(c.name)) + c.name
    else:
        head = _I32.pack(len(c.name)) + c.name + bytes([EXCEPTION])
    return head + c.seq_raw + struct_


def error_reply(request, code, label="", message=""):
    """The server's EXCEPTION reply with TApplicationException type ``code`` to a CALL
    (one whole frame), or None for anything else."""
    c = _call(request)
    if c.mtype != CALL:
        return None
    if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= TYPE_MAX:
        raise FaultReplyError(f"ttheader: exception type {code!r} is not in 0..{TYPE_MAX}")
    payload = _exception(c, code, default_message(PROTOCOL, label or status_name(code),
                                                  message))
    if c.framing == "unframed":
        return payload
    if c.framing == "framed":
        return _U32.pack(len(payload)) + payload
    if c.inner:
        payload = _U32.pack(len(payload)) + payload
    transforms = [ZLIB] if c.zlib else []
    if c.zlib:
        payload = zlib.compress(payload)
    proto = c.proto_id
    if proto not in ((PROTO_BINARY, PROTO_COMPACT, PROTO_PROTOBUF) if c.magic == MAGIC_TTHEADER
                     else (PROTO_BINARY, PROTO_COMPACT)):
        proto = PROTO_COMPACT if c.ptype == P_COMPACT else PROTO_BINARY   # not echoed: invalid
    if c.magic == MAGIC_TTHEADER:
        h = bytes([proto, len(transforms)]) + bytes(transforms)
    else:
        h = varint(proto) + varint(len(transforms)) + b"".join(map(varint, transforms))
    h += b"\0" * (-len(h) % 4)
    return (struct.pack(">IHH", 10 + len(h) + len(payload), c.magic, c.flags) + c.hseq
            + struct.pack(">H", len(h) // 4) + h + payload)
