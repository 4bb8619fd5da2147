"""Byte-order and varint readers for Python buffers: the pure-Python twin of the
``*_at`` readers and ``uvarint`` / ``unzigzag`` in ``proxy/_wire.pxd`` (same names, same
results), for code that is written once and compiled by Cython with C types or run as
Python (proxy/protocols/ttheader/walk_py.py)."""


def be16_at(h, i):
    return (h[i] << 8) | h[i + 1]


def be32_at(h, i):
    return (h[i] << 24) | (h[i + 1] << 16) | (h[i + 2] << 8) | h[i + 3]


def be32s_at(h, i):
    v = (h[i] << 24) | (h[i + 1] << 16) | (h[i + 2] << 8) | h[i + 3]
    return v - (1 << 32) if v & 0x80000000 else v


def i32(v):
    """The low 32 bits of v as a signed i32 (Thrift seq ids and statuses)."""
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


def unzigzag(v):
    return (v >> 1) ^ -(v & 1)


def uvarint_at(h, i, lim, maxlen):
    """Unsigned LEB128 at h[i:lim], at most maxlen bytes long: (bytes taken, value);
    (0, 0) when lim comes before its end (need more), (-1, 0) when none of its first
    maxlen bytes ends it (malformed).  The value keeps its low 64 bits."""
    v = 0
    shift = 0
    j = i
    while j < lim and j - i < maxlen:
        b = h[j]
        v |= (b & 0x7F) << shift
        j += 1
        if not b & 0x80:
            return j - i, v & 0xFFFFFFFFFFFFFFFF
        shift += 7
    return (-1 if j - i == maxlen else 0), 0
