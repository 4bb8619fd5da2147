"""Encode and decode whole TTHeader / THeader / framed Thrift frames (used by the
reference server, the clients and the tests; never by the proxy's hot path).

Thrift *payloads* (arguments, results) are encoded with ``thriftpy2`` by the reference
server and clients (``loadgen/ttheader/idl.py``); the helpers here that build message
headers and small structs by hand exist for golden parser fixtures and garbage.
"""

import struct
import zlib

from proxy.protocols.ttheader.constants import (MAGIC_TTHEADER, MAGIC_THEADER, INFO_KEYVALUE,
                                            INFO_INTKEYVALUE, INFO_ACL_TOKEN, ZLIB, CALL,
                                            REPLY, EXCEPTION, ONEWAY, MAX_FRAME_BYTES)

__all__ = ["CALL", "REPLY", "EXCEPTION", "ONEWAY", "FrameError", "InflateLimitError",
           "varint", "binary_message", "compact_message", "ttheader", "theader", "framed",
           "split", "inflate", "read_frame", "tapp_exception", "parse_message_header"]


class FrameError(ValueError):
    """Bytes that are not a frame of the expected kind."""


class InflateLimitError(FrameError):
    """A zlib payload that inflates past the frame limit (a zip bomb, or a limit too low)."""


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _zigzag(n):
    return (n << 1) ^ (n >> 63)


# ---- Thrift message headers (fixtures; real payloads come from the thrift library) -----

def binary_message(name, mtype, seq, body=b"\x00", strict=True):
    """Binary protocol message: header + ``body`` (default: an empty struct)."""
    name = name.encode() if isinstance(name, str) else name
    if strict:
        return struct.pack(">HBBi", 0x8001, 0, mtype, len(name)) + name + \
            struct.pack(">i", seq) + body
    return struct.pack(">i", len(name)) + name + struct.pack(">Bi", mtype, seq) + body


def compact_message(name, mtype, seq, body=b"\x00"):
    name = name.encode() if isinstance(name, str) else name
    return bytes([0x82, (mtype << 5) | 1]) + varint(seq & 0xFFFFFFFF) + varint(len(name)) + \
        name + body


def tapp_exception(type_, message="error", compact=False, with_type=True):
    """A TApplicationException struct {1: string message, 2: i32 type}."""
    msg = message.encode()
    if compact:
        out = bytes([0x18]) + varint(len(msg)) + msg
        if with_type:
            out += bytes([0x15]) + varint(_zigzag(type_) & 0xFFFFFFFFFFFFFFFF)
        return out + b"\x00"
    out = struct.pack(">BhI", 11, 1, len(msg)) + msg
    if with_type:
        out += struct.pack(">Bhi", 8, 2, type_)
    return out + b"\x00"


def parse_message_header(payload):
    """(name, type, seq id) of a binary (strict/non-strict) or compact message."""
    if payload[:2] == b"\x80\x01":
        (n,) = struct.unpack_from(">i", payload, 4)
        return payload[8:8 + n].decode(), payload[3], struct.unpack_from(">i", payload, 8 + n)[0]
    if payload[:1] == b"\x82":
        i, seq = _read_varint(payload, 2)
        i, n = _read_varint(payload, i)
        seq = seq - (1 << 32) if seq & 0x80000000 else seq
        return payload[i:i + n].decode(), payload[1] >> 5, seq
    (n,) = struct.unpack_from(">i", payload, 0)
    return payload[4:4 + n].decode(), payload[4 + n], struct.unpack_from(">i", payload, 5 + n)[0]


def _read_varint(b, i):
    v = shift = 0
    while True:
        if i >= len(b):
            raise FrameError("truncated varint")
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        if not c & 0x80:
            return i, v
        shift += 7
        if shift > 63:
            raise FrameError("varint too long")


# ---- transports ----------------------------------------------------------------------

def _pad(h):
    return h + b"\x00" * (-len(h) % 4)


def ttheader(payload, seq=0, flags=0, proto=0, transforms=(), strinfo=None, intinfo=None,
             acl=None, inner_framed=False, padding_ids=0):
    """A Kitex TTHeader frame (magic 0x1000): u16 counts and string lengths, info
    blocks in the order Kitex writes them (INFO_KEYVALUE, INFO_INTKEYVALUE), then the
    ACL token block as Kitex reads it (one u16-length string), zero padding.
    ``inner_framed``: Kitex TTHeaderFramed (a u32 length before the payload)."""
    for t in transforms:
        if t == ZLIB:
            payload = zlib.compress(payload)
    h = bytes([proto, len(transforms)]) + bytes(transforms)
    h += b"\x00" * padding_ids
    if strinfo:
        h += struct.pack(">BH", INFO_KEYVALUE, len(strinfo))
        for k, v in strinfo.items():
            k, v = _b(k), _b(v)
            h += struct.pack(">H", len(k)) + k + struct.pack(">H", len(v)) + v
    if intinfo:
        h += struct.pack(">BH", INFO_INTKEYVALUE, len(intinfo))
        for k, v in intinfo.items():
            v = _b(v)
            h += struct.pack(">HH", k, len(v)) + v
    if acl is not None:
        a = _b(acl)
        h += struct.pack(">BH", INFO_ACL_TOKEN, len(a)) + a
    h = _pad(h)
    if inner_framed:
        payload = struct.pack(">I", len(payload)) + payload
    return struct.pack(">IHHiH", 10 + len(h) + len(payload), MAGIC_TTHEADER, flags, seq,
                       len(h) // 4) + h + payload


def theader(payload, seq=0, flags=0, proto=0, transforms=(), info=None):
    """An Apache THeader frame (magic 0x0FFF): varints, INFO_KEYVALUE only."""
    for t in transforms:
        if t == ZLIB:
            payload = zlib.compress(payload)
    h = varint(proto) + varint(len(transforms)) + b"".join(varint(t) for t in transforms)
    if info:
        h += varint(INFO_KEYVALUE) + varint(len(info))
        for k, v in info.items():
            k, v = _b(k), _b(v)
            h += varint(len(k)) + k + varint(len(v)) + v
    h = _pad(h)
    return struct.pack(">IHHiH", 10 + len(h) + len(payload), MAGIC_THEADER, flags, seq,
                       len(h) // 4) + h + payload


def framed(payload):
    return struct.pack(">I", len(payload)) + payload


def _b(v):
    return v.encode() if isinstance(v, str) else bytes(v)


_INFLATE_STEP = 1 << 20


def inflate(data, max_bytes=MAX_FRAME_BYTES):
    """zlib-decompress ``data`` into at most ``max_bytes`` bytes, 1 MiB at a time: memory
    stays bounded by the limit whatever the input claims (a zip bomb costs at most the
    limit, never what it would inflate to); more output than that raises
    :class:`InflateLimitError`, a stream that is not whole zlib a :class:`FrameError`."""
    d = zlib.decompressobj()
    parts, total, buf = [], 0, data
    try:
        while not d.eof:
            chunk = d.decompress(buf, min(_INFLATE_STEP, max_bytes + 1 - total))
            buf = d.unconsumed_tail
            if chunk:
                total += len(chunk)
                if total > max_bytes:
                    parts.clear()           # a traceback kept alive must not keep these
                    raise InflateLimitError(
                        "zlib payload of %d bytes inflates past the frame limit of %d bytes"
                        % (len(data), max_bytes))
                parts.append(chunk)
            elif not buf:
                raise FrameError("zlib payload: truncated stream")
    except zlib.error as exc:
        raise FrameError("zlib payload: %s" % exc) from None
    return parts[0] if len(parts) == 1 else b"".join(parts)


def split(frame, max_bytes=MAX_FRAME_BYTES):
    """Decode one whole frame: (transport, header fields dict, Thrift payload).

    transport is ``"ttheader"``, ``"theader"`` or ``"framed"``; header fields hold
    ``seq``, ``flags``, ``proto``, ``transforms``, ``strinfo``, ``intinfo`` (and
    ``acl`` is never returned).  zlib payloads come back decompressed, each transform's
    output capped at ``max_bytes`` (:func:`inflate`: over it, :class:`InflateLimitError`).
    """
    if len(frame) < 8:
        raise FrameError("short frame")
    (length,) = struct.unpack_from(">I", frame)
    if length + 4 != len(frame):
        raise FrameError("frame length %d does not match %d bytes" % (length, len(frame) - 4))
    magic = struct.unpack_from(">H", frame, 4)[0]
    if magic not in (MAGIC_TTHEADER, MAGIC_THEADER):
        return "framed", {}, frame[4:]
    flags, seq, words = struct.unpack_from(">HiH", frame, 6)
    end = 14 + words * 4
    if end > len(frame):
        raise FrameError("header size past the frame")
    h = frame[14:end]
    fields = {"seq": seq, "flags": flags, "strinfo": {}, "intinfo": {}}
    if magic == MAGIC_TTHEADER:
        fields["proto"], nt = h[0], h[1]
        fields["transforms"] = list(h[2:2 + nt])
        i = 2 + nt
        while i < len(h):
            iid = h[i]
            i += 1
            if iid == 0:
                continue
            if iid in (INFO_KEYVALUE, INFO_INTKEYVALUE):
                (cnt,) = struct.unpack_from(">H", h, i)
                i += 2
                for _ in range(cnt):
                    (k,) = struct.unpack_from(">H", h, i)
                    i += 2
                    if iid == INFO_KEYVALUE:
                        key, i = h[i:i + k].decode(), i + k
                    (vl,) = struct.unpack_from(">H", h, i)
                    val = h[i + 2:i + 2 + vl].decode()
                    i += 2 + vl
                    if iid == INFO_KEYVALUE:
                        fields["strinfo"][key] = val
                    else:
                        fields["intinfo"][k] = val
            elif iid == INFO_ACL_TOKEN:
                (n,) = struct.unpack_from(">H", h, i)
                i += 2 + n
            else:
                raise FrameError("unknown info id 0x%02x" % iid)
        transport = "ttheader"
    else:
        i, fields["proto"] = _read_varint(h, 0)
        i, nt = _read_varint(h, i)
        fields["transforms"] = []
        for _ in range(nt):
            i, t = _read_varint(h, i)
            fields["transforms"].append(t)
        while i < len(h):
            i, iid = _read_varint(h, i)
            if iid != INFO_KEYVALUE:
                break
            i, cnt = _read_varint(h, i)
            for _ in range(cnt):
                i, n = _read_varint(h, i)
                key, i = h[i:i + n].decode(), i + n
                i, n = _read_varint(h, i)
                fields["strinfo"][key], i = h[i:i + n].decode(), i + n
        transport = "theader"
    payload = frame[end:]
    for t in reversed(fields["transforms"]):
        if t == ZLIB:
            payload = inflate(payload, max_bytes)
        else:
            raise FrameError("transform %d not supported by this codec" % t)
    if transport == "ttheader" and len(payload) >= 4 and \
            struct.unpack_from(">I", payload)[0] == len(payload) - 4:
        payload = payload[4:]                      # TTHeaderFramed
        fields["inner_framed"] = True
    return transport, fields, payload


def read_frame(sock, max_bytes=64 << 20):
    """One whole frame from a blocking socket (bytes), or None at a clean EOF."""
    head = _recv_exact(sock, 4, eof_ok=True)
    if head is None:
        return None
    (length,) = struct.unpack(">I", head)
    if length > max_bytes:
        raise FrameError("frame length %d over %d" % (length, max_bytes))
    return head + _recv_exact(sock, length)


def _recv_exact(sock, n, eof_ok=False):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            if eof_ok and not buf:
                return None
            raise ConnectionError("connection closed after %d of %d bytes" % (len(buf), n))
        buf += chunk
    return bytes(buf)
