"""The Thrift wire as the reference server and the client read it: :func:`split_frame`
cuts one length-prefixed frame (TTHeader, THeader or framed Thrift) off the received
bytes, and :func:`check` checks a message's shape before ``thriftpy2`` decodes it.

The shape check: thriftpy2's decoders trust the length and count fields they read: over
a memory buffer its Cython binary codec copies ``length`` bytes whatever is there (a
string claiming 2 GB in a 30-byte message crashed the process), and its Python codecs
loop ``count`` times over a container whose element type reads nothing. A peer's bytes
therefore go through :func:`check` first: one walk of the message (strict or non-strict
binary, or compact) that reads every field as the wire says, without the IDL, and
refuses a length or count past the bytes left, an element or field type that does not
exist, a nesting deeper than :data:`MAX_DEPTH` or a message cut short. A message that
passes reads within its own bytes whatever decodes it. Nothing is built, so it costs one
pass.
"""

from __future__ import annotations

import struct

from proxy.protocols.ttheader.codec import FrameError

__all__ = ["MalformedMessage", "check", "split_frame", "MAX_DEPTH"]

MAX_DEPTH = 64                      # thriftpy2's own DEFAULT_MAX_DEPTH
_U32 = struct.Struct(">I")

# binary protocol: TType -> fixed size (None: variable)
_BIN_FIXED = {2: 1, 3: 1, 4: 8, 6: 2, 8: 4, 10: 8}
_BIN_TYPES = frozenset((2, 3, 4, 6, 8, 10, 11, 12, 13, 14, 15))
_BIN_MIN = {2: 1, 3: 1, 4: 8, 6: 2, 8: 4, 10: 8, 11: 4, 12: 1, 13: 6, 14: 5, 15: 5}
# compact protocol element types (1/2: bool, one byte inside containers)
_CT_TYPES = frozenset(range(1, 13))
_CT_MIN = {1: 1, 2: 1, 3: 1, 4: 1, 5: 1, 6: 1, 7: 8, 8: 1, 9: 1, 10: 1, 11: 1, 12: 1}


def split_frame(buf, max_bytes: int):
    """One whole length-prefixed frame off the start of ``buf`` (the loadgen read loops'
    ``split_frame``): ``(frame bytes, size)``, or None when it has not all arrived. A
    length over ``max_bytes``, or unframed Thrift (a strict binary message begins
    ``80 01``), is a :class:`FrameError` as soon as the first four bytes are there."""
    if len(buf) < 4:
        return None
    if buf[0] == 0x80 and buf[1] == 0x01:
        raise FrameError("unframed Thrift is not served (use framed, THeader or TTHeader)")
    (length,) = _U32.unpack_from(buf)
    if length > max_bytes:
        raise FrameError("frame length %d over the limit %d" % (length, max_bytes))
    if len(buf) < 4 + length:
        return None
    return bytes(buf[:4 + length]), 4 + length


class MalformedMessage(FrameError):
    """The bytes are not a whole Thrift message; ``str()`` says where and why."""


def check(payload) -> None:
    """Raise :class:`MalformedMessage` unless ``payload`` starts with one whole Thrift
    message (header and argument/result struct) whose every length fits."""
    b = bytes(payload)
    if b[:1] == b"\x82":
        _check_compact(b)
    else:
        _check_binary(b)


def _fail(i, why):
    raise MalformedMessage("malformed Thrift message at byte %d: %s" % (i, why))


# ---- binary ----------------------------------------------------------------------------

_I32 = struct.Struct(">i").unpack_from
_BIN_STRUCT, _BIN_STRING, _BIN_MAP, _BIN_SET, _BIN_LIST = 12, 11, 13, 14, 15


def _check_binary(b: bytes) -> None:
    n = len(b)
    if n < 4:
        _fail(0, "short message")
    (v,) = _I32(b, 0)
    if v < 0:
        if v & 0xFFFF0000 != 0x80010000:
            _fail(0, "bad binary protocol version 0x%08x" % (v & 0xFFFFFFFF))
        if n < 8:
            _fail(4, "short message")
        (k,) = _I32(b, 4)
        if k < 0:
            _fail(4, "negative name length %d" % k)
        i = 8 + k
    else:
        i = 4 + v + 1                               # non-strict: name, type
    if i + 4 > n:
        _fail(n, "message header past the end")
    _bin_struct(b, i + 4, n, 0)


def _bin_struct(b, i, n, depth):
    """Walk a struct starting at ``i``; returns the index after its STOP."""
    if depth >= MAX_DEPTH:
        _fail(i, "nested deeper than %d" % MAX_DEPTH)
    fixed = _BIN_FIXED
    while True:
        if i >= n:
            _fail(i, "struct cut short")
        ft = b[i]
        if ft == 0:
            return i + 1
        i += 3                                      # type, field id
        size = fixed.get(ft)
        if size is not None:
            i += size
        elif ft == _BIN_STRING:
            if i + 4 > n:
                _fail(i, "string length cut short")
            (k,) = _I32(b, i)
            if k < 0:
                _fail(i, "negative length %d" % k)
            i += 4 + k
        else:
            i = _bin_value(b, i, n, ft, depth + 1)
        if i > n:
            _fail(n, "field past the end")


def _bin_value(b, i, n, t, depth):
    fixed = _BIN_FIXED.get(t)
    if fixed is not None:
        return i + fixed
    if t == _BIN_STRING:
        if i + 4 > n:
            _fail(i, "string length cut short")
        (k,) = _I32(b, i)
        if k < 0:
            _fail(i, "negative length %d" % k)
        return i + 4 + k
    if t == _BIN_STRUCT:
        return _bin_struct(b, i, n, depth)
    if t == _BIN_MAP:
        if i + 6 > n:
            _fail(i, "map header cut short")
        kt, vt = b[i], b[i + 1]
        (size,) = _I32(b, i + 2)
        types = (kt, vt)
        i += 6
    elif t in (_BIN_SET, _BIN_LIST):
        if i + 5 > n:
            _fail(i, "list header cut short")
        et = b[i]
        (size,) = _I32(b, i + 1)
        types = (et,)
        i += 5
    else:
        _fail(i, "type %d" % t)
    if size == 0:
        return i
    if size < 0:
        _fail(i, "negative container size %d" % size)
    if any(t not in _BIN_TYPES for t in types):
        _fail(i, "container of types %s" % (types,))
    if size * sum(_BIN_MIN[t] for t in types) > n - i:
        _fail(i, "container of %d elements in %d bytes" % (size, n - i))
    if depth >= MAX_DEPTH:
        _fail(i, "nested deeper than %d" % MAX_DEPTH)
    if len(types) == 1 and types[0] in _BIN_FIXED:
        return i + size * _BIN_FIXED[types[0]]      # checked above: within the bytes
    for _ in range(size):
        for t in types:
            i = _bin_value(b, i, n, t, depth + 1)
            if i > n:
                _fail(n, "element past the end")
    return i


# ---- compact ---------------------------------------------------------------------------

def _varint(b, i, n, max_bytes):
    """(value, next index) of the varint at ``i``."""
    v = shift = 0
    end = min(n, i + max_bytes)
    while i < end:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        if not c & 0x80:
            return v, i
        shift += 7
    _fail(i, "varint cut short or longer than %d bytes" % max_bytes)


def _check_compact(b: bytes) -> None:
    n = len(b)
    if n < 2 or b[1] & 0x1F != 1:
        _fail(1, "bad compact protocol version")
    _, i = _varint(b, 2, n, 5)                      # seq id
    k, i = _varint(b, i, n, 5)                      # name
    i += k
    if i > n:
        _fail(n, "message name past the end")
    _ct_struct(b, i, n, 0)


def _ct_struct(b, i, n, depth):
    if depth >= MAX_DEPTH:
        _fail(i, "nested deeper than %d" % MAX_DEPTH)
    while True:
        if i >= n:
            _fail(i, "struct cut short")
        h = b[i]
        i += 1
        if h == 0:
            return i
        ft = h & 0x0F
        if h < 0x10:                                # long form: zigzag i16 field id
            _, i = _varint(b, i, n, 3)
        if ft <= 2:
            if ft == 0:
                _fail(i - 1, "field type 0")
            continue                                # bool: in the type nibble
        i = _ct_value(b, i, n, ft, depth + 1)
        if i > n:
            _fail(n, "field past the end")


def _ct_value(b, i, n, t, depth):
    if t in (1, 2, 3):                              # bool element / byte: one byte
        return i + 1
    if t in (4, 5):
        return _varint(b, i, n, 5)[1]
    if t == 6:
        return _varint(b, i, n, 10)[1]
    if t == 7:
        return i + 8
    if t == 8:
        k, i = _varint(b, i, n, 5)
        return i + k
    if t == 12:
        return _ct_struct(b, i, n, depth)
    if t in (9, 10):
        if i >= n:
            _fail(i, "list header cut short")
        h = b[i]
        i += 1
        size, types = h >> 4, (h & 0x0F,)
        if size == 15:
            size, i = _varint(b, i, n, 5)
    elif t == 11:
        size, i = _varint(b, i, n, 5)
        if size == 0:
            return i
        if i >= n:
            _fail(i, "map header cut short")
        types = (b[i] >> 4, b[i] & 0x0F)
        i += 1
    else:
        _fail(i, "type %d" % t)
    if size == 0:
        return i
    if any(t not in _CT_TYPES for t in types):
        _fail(i, "container of types %s" % (types,))
    if size * sum(_CT_MIN[t] for t in types) > n - i:
        _fail(i, "container of %d elements in %d bytes" % (size, n - i))
    if depth >= MAX_DEPTH:
        _fail(i, "nested deeper than %d" % MAX_DEPTH)
    if len(types) == 1 and types[0] in (1, 2, 3, 7):
        return i + size * _CT_MIN[types[0]]         # checked above: within the bytes
    for _ in range(size):
        for t in types:
            i = _ct_value(b, i, n, t, depth + 1)
            if i > n:
                _fail(n, "element past the end")
    return i
