# cython: language_level=3
# Byte-order and varint readers shared by every compiled parser.  All inline, all
# noexcept: the caller has checked that the bytes are there (varints check their
# own end: 0 when it runs past it, need more; -1 when it is longer than allowed).

from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t, int32_t, int64_t


cdef inline uint16_t be16(const uint8_t* p) noexcept nogil:
    return <uint16_t>((<uint16_t>p[0] << 8) | p[1])

cdef inline uint32_t be32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]

cdef inline uint64_t be64(const uint8_t* p) noexcept nogil:
    return (<uint64_t>be32(p) << 32) | be32(p + 4)


cdef inline Py_ssize_t skip_some(int64_t* left, Py_ssize_t avail) noexcept nogil:
    """Pass over bytes a parser does not read (a message body, a string) across reads:
    takes min(left[0], avail) of the ``avail`` bytes at hand, lowers ``left[0]`` by as
    many and returns that count (twin: ``framing_common.skip_some``)."""
    cdef Py_ssize_t take = avail
    if take > left[0]:
        take = <Py_ssize_t>left[0]
    left[0] -= take
    return take

cdef inline uint16_t le16(const uint8_t* p) noexcept nogil:
    return <uint16_t>((<uint16_t>p[1] << 8) | p[0])

cdef inline uint32_t le32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[3] << 24) | (<uint32_t>p[2] << 16) | (<uint32_t>p[1] << 8) | p[0]

cdef inline uint64_t le64(const uint8_t* p) noexcept nogil:
    return (<uint64_t>le32(p + 4) << 32) | le32(p)


cdef inline Py_ssize_t uvarint(const uint8_t* p, Py_ssize_t n, int maxlen,
                               uint64_t* out) noexcept nogil:
    """Unsigned LEB128 (protobuf / Thrift compact / THeader) at p[0:n], at most maxlen
    bytes long (10 for a u64, 5 for a u32, 3 for a u16; never more than 10).

    Returns the bytes it took (1..maxlen) with the value in out[0]; 0 when the n bytes
    end before the varint does (need more: n < maxlen); -1 when none of its first maxlen
    bytes ends it (malformed).  n <= 0 needs more.  Twin: proxy/wire_py.py.
    """
    cdef uint64_t v = 0
    cdef Py_ssize_t i = 0
    cdef int shift = 0
    while i < n and i < maxlen:
        v |= <uint64_t>(p[i] & 0x7F) << shift
        if not (p[i] & 0x80):
            out[0] = v
            return i + 1
        shift += 7
        i += 1
    return -1 if i == maxlen else 0


cdef inline int64_t unzigzag(uint64_t v) noexcept nogil:
    return <int64_t>(v >> 1) ^ -(<int64_t>(v & 1))


# The same readers addressed as h[i:] (a buffer and an index), the form code shared with a
# pure-Python twin calls (proxy/wire_py.py defines the same names for Python buffers).

cdef inline int be16_at(const uint8_t* h, Py_ssize_t i) noexcept nogil:
    return be16(h + i)

cdef inline uint32_t be32_at(const uint8_t* h, Py_ssize_t i) noexcept nogil:
    return be32(h + i)

cdef inline int32_t be32s_at(const uint8_t* h, Py_ssize_t i) noexcept nogil:
    return <int32_t>be32(h + i)

cdef inline int32_t i32(uint64_t v) noexcept nogil:
    """The low 32 bits of v as a signed i32 (Thrift seq ids and statuses)."""
    return <int32_t><uint32_t>v

cdef inline (Py_ssize_t, uint64_t) uvarint_at(const uint8_t* h, Py_ssize_t i, Py_ssize_t lim,
                                               int maxlen) noexcept nogil:
    """uvarint() at h[i:lim]: (bytes taken or 0 need more or -1 malformed, value)."""
    cdef uint64_t v = 0
    cdef Py_ssize_t k = uvarint(h + i, lim - i, maxlen, &v)
    return k, v
