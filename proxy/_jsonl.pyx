# cython: boundscheck=False, wraparound=False, cdivision=True
"""JSON Lines frame-log writer: a batch's Arrow columns formatted into lines in C, without
the GIL and without a Python object per row (docs/design.md, "Frame log").

``format_table(table)`` returns the bytes of ``table`` (a pyarrow Table of the frame-log
schema, or any table of the column types below) as JSON Lines, byte for byte what
``json.dumps(row, separators=(",", ":"))`` makes of each row of ``table.to_pylist()`` (the
pure-Python writer, ``proxy.framelog.jsonl_bytes_py``): keys in column order, nulls as
``null``, non-ASCII text as ``\\uXXXX`` escapes, a map as an object whose duplicate keys
keep their first position and their last value (as ``dict()`` of the pairs).

Per batch, in Python: the column buffers' addresses, and each dictionary column's
distinct values rendered once.  Per row, in C: integers in decimal, strings escaped,
dictionary values copied from their rendering.  The Arrow types handled: signed integers
(8..64 bits), utf8 strings, dictionaries of utf8 with signed integer indices, maps of
utf8 to utf8, and the null type; any other column type raises TypeError.
"""

import json
import os

from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy, memset
from libc.errno cimport errno, EINTR
from posix.unistd cimport write as c_write

import pyarrow as pa


cdef enum:
    K_NULL = 0
    K_INT = 1
    K_STR = 2
    K_DICT = 3
    K_MAP = 4


cdef struct SArr:                 # a utf8 array's buffers (element j: offs[off + j])
    const uint8_t* valid          # NULL: no nulls
    int64_t off
    const int32_t* offs
    const uint8_t* data


cdef struct Col:
    int kind
    int width                     # bytes of an integer / dictionary index
    const uint8_t* prefix         # ',"name":' ('{' instead of ',' for the first column)
    Py_ssize_t prefix_len
    const uint8_t* valid          # the column's validity bitmap (NULL: no nulls)
    int64_t off                   # the array's offset
    const uint8_t* values         # integers, dictionary indices, map offsets (int32)
    SArr s                        # K_STR: the strings
    const uint8_t* null_text      # prefix + 'null'
    Py_ssize_t null_len
    const uint8_t* dtext          # K_DICT: prefix + each value rendered, concatenated
    const int64_t* doff           # ... value i is dtext[doff[i]:doff[i + 1]]
    int64_t dn
    SArr keys                     # K_MAP
    SArr items


cdef struct Buf:
    uint8_t* p
    Py_ssize_t len
    Py_ssize_t cap
    int failed


cdef inline int _reserve(Buf* b, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t cap
    cdef uint8_t* np
    if b.len + n <= b.cap:
        return 0
    cap = b.cap * 2
    if cap < b.len + n:
        cap = b.len + n
    np = <uint8_t*>realloc(b.p, cap)
    if np is NULL:
        b.failed = 1
        return -1
    b.p = np
    b.cap = cap
    return 0


cdef inline void _copy(uint8_t* d, const uint8_t* s, Py_ssize_t n) noexcept nogil:
    """memcpy without a call for the short copies that make up a line (two overlapping
    loads and stores that stay inside [s, s + n))."""
    cdef uint64_t a, z
    cdef uint32_t a4, z4
    if n > 16:
        memcpy(d, s, n)
    elif n >= 8:
        memcpy(&a, s, 8)
        memcpy(&z, s + n - 8, 8)
        memcpy(d, &a, 8)
        memcpy(d + n - 8, &z, 8)
    elif n >= 4:
        memcpy(&a4, s, 4)
        memcpy(&z4, s + n - 4, 4)
        memcpy(d, &a4, 4)
        memcpy(d + n - 4, &z4, 4)
    else:
        while n > 0:
            n -= 1
            d[n] = s[n]


cdef inline void _put(Buf* b, const uint8_t* s, Py_ssize_t n) noexcept nogil:
    if _reserve(b, n) == 0:
        _copy(b.p + b.len, s, n)
        b.len += n


cdef inline void _put_nc(Buf* b, const uint8_t* s, Py_ssize_t n) noexcept nogil:
    """_put() into room reserved already (a row's fixed part)."""
    _copy(b.p + b.len, s, n)
    b.len += n


cdef inline bint _bit(const uint8_t* bits, int64_t i) noexcept nogil:
    return bits is NULL or (bits[i >> 3] >> (i & 7)) & 1


# ---- numbers --------------------------------------------------------------------

cdef uint64_t _POW10[20]
cdef uint8_t _DIGITS2[200]
cdef uint8_t _HEX[16]
cdef uint64_t _SEED = 0xCBF29CE484222325ULL   # the map keys' hash basis, per process


cdef void _init() noexcept:
    cdef int i
    cdef uint64_t p = 1
    cdef const char* hx = b"0123456789abcdef"
    for i in range(20):
        _POW10[i] = p
        if i < 19:
            p *= 10
    for i in range(100):
        _DIGITS2[2 * i] = <uint8_t>(48 + i // 10)
        _DIGITS2[2 * i + 1] = <uint8_t>(48 + i % 10)
    for i in range(16):
        _HEX[i] = <uint8_t>hx[i]


_init()


def _seed():
    """A random hash basis per process: keys chosen to collide cost what others cost."""
    global _SEED
    import os
    _SEED ^= int.from_bytes(os.urandom(8), "little")


_seed()


cdef extern from *:
    int __builtin_clzll(unsigned long long) nogil


cdef inline Py_ssize_t _fmt_u64(uint8_t* out, uint64_t v) noexcept nogil:
    cdef Py_ssize_t n, i
    cdef uint64_t q
    # digits from the bit length (1233/4096 ~ log10 2), corrected by one comparison
    n = 1 if v == 0 else (((64 - __builtin_clzll(v)) * 1233) >> 12) + 1
    if n < 20 and v >= _POW10[n]:
        n += 1
    elif n > 1 and v < _POW10[n - 1]:
        n -= 1
    i = n
    while v >= 100:
        q = v // 100
        i -= 2
        memcpy(out + i, &_DIGITS2[2 * (v - q * 100)], 2)
        v = q
    if v >= 10:
        memcpy(out + i - 2, &_DIGITS2[2 * v], 2)
    else:
        out[i - 1] = <uint8_t>(48 + v)
    return n


cdef inline void _put_int(Buf* b, int64_t v) noexcept nogil:
    """v in decimal, into room reserved already (at most 20 bytes)."""
    if v < 0:
        b.p[b.len] = 45
        b.len += 1 + _fmt_u64(b.p + b.len + 1, <uint64_t>0 - <uint64_t>v)
    else:
        b.len += _fmt_u64(b.p + b.len, <uint64_t>v)


cdef inline int64_t _load_int(const uint8_t* values, int width, int64_t i) noexcept nogil:
    if width == 8:
        return (<const int64_t*>values)[i]
    if width == 4:
        return (<const int32_t*>values)[i]
    if width == 2:
        return (<const int16_t*>values)[i]
    return (<const int8_t*>values)[i]


# ---- strings --------------------------------------------------------------------

cdef inline void _u_escape(uint8_t* o, uint32_t cp) noexcept nogil:
    o[0] = 92            # \u + 4 lowercase hex digits, as json.dumps writes them
    o[1] = 117
    o[2] = _HEX[(cp >> 12) & 15]
    o[3] = _HEX[(cp >> 8) & 15]
    o[4] = _HEX[(cp >> 4) & 15]
    o[5] = _HEX[cp & 15]


cdef void _put_str(Buf* b, const uint8_t* s, Py_ssize_t n) noexcept nogil:
    """s (UTF-8) as a JSON string, escaped as json.dumps(ensure_ascii=True) does."""
    cdef Py_ssize_t i = 0, start, need
    cdef uint8_t c
    cdef uint32_t cp
    cdef uint8_t* o
    if _reserve(b, n + 2) < 0:
        return
    b.p[b.len] = 34
    b.len += 1
    while i < n:
        start = i
        while i < n and 0x20 <= s[i] <= 0x7E and s[i] != 34 and s[i] != 92:
            i += 1
        if i > start:
            _put(b, s + start, i - start)
        if i >= n:
            break
        if _reserve(b, 12) < 0:
            return
        o = b.p + b.len
        c = s[i]
        if c == 34 or c == 92:
            o[0] = 92
            o[1] = c
            b.len += 2
            i += 1
            continue
        if c < 0x80:
            o[0] = 92
            if c == 10:
                o[1] = 110
            elif c == 13:
                o[1] = 114
            elif c == 9:
                o[1] = 116
            elif c == 8:
                o[1] = 98
            elif c == 12:
                o[1] = 102
            else:
                _u_escape(o, c)            # other controls and DEL
                b.len += 6
                i += 1
                continue
            b.len += 2
            i += 1
            continue
        # a UTF-8 sequence (Arrow strings are valid UTF-8; anything else becomes '?')
        if 0xC2 <= c <= 0xDF:
            need = 1
            cp = c & 0x1F
        elif 0xE0 <= c <= 0xEF:
            need = 2
            cp = c & 0x0F
        elif 0xF0 <= c <= 0xF4:
            need = 3
            cp = c & 0x07
        else:
            o[0] = 63
            b.len += 1
            i += 1
            continue
        if i + need >= n:                  # cut short by the end
            o[0] = 63
            b.len += 1
            i += 1
            continue
        start = i + 1
        while start <= i + need:
            if s[start] & 0xC0 != 0x80:
                break
            cp = (cp << 6) | (s[start] & 0x3F)
            start += 1
        if start <= i + need:
            o[0] = 63
            b.len += 1
            i += 1
            continue
        if cp >= 0x10000:                  # a surrogate pair, as json.dumps writes it
            cp -= 0x10000
            _u_escape(o, 0xD800 | (cp >> 10))
            _u_escape(o + 6, 0xDC00 | (cp & 0x3FF))
            b.len += 12
        else:
            _u_escape(o, cp)
            b.len += 6
        i += need + 1
    if _reserve(b, 1) == 0:
        b.p[b.len] = 34
        b.len += 1


cdef inline void _put_sarr(Buf* b, SArr* a, int64_t j) noexcept nogil:
    cdef int32_t s0 = a.offs[a.off + j], s1 = a.offs[a.off + j + 1]
    _put_str(b, a.data + s0, s1 - s0)


cdef inline bint _same_key(SArr* a, int64_t i, int64_t j) noexcept nogil:
    cdef int32_t i0 = a.offs[a.off + i], i1 = a.offs[a.off + i + 1]
    cdef int32_t j0 = a.offs[a.off + j], j1 = a.offs[a.off + j + 1]
    cdef int32_t k
    if i1 - i0 != j1 - j0:
        return False
    for k in range(i1 - i0):
        if a.data[i0 + k] != a.data[j0 + k]:
            return False
    return True


cdef struct Scratch:              # a map's duplicate-key bookkeeping (grown as needed)
    int32_t* table                # open addressing over pair numbers, -1: empty
    int32_t* last                 # pair -> the last pair with its key (-1: a later copy)
    Py_ssize_t tcap
    Py_ssize_t lcap


cdef int _scratch(Scratch* sc, Py_ssize_t pairs, Py_ssize_t tcap) noexcept nogil:
    cdef int32_t* p
    if pairs > sc.lcap:
        p = <int32_t*>realloc(sc.last, pairs * sizeof(int32_t))
        if p is NULL:
            return -1
        sc.last, sc.lcap = p, pairs
    if tcap > sc.tcap:
        p = <int32_t*>realloc(sc.table, tcap * sizeof(int32_t))
        if p is NULL:
            return -1
        sc.table, sc.tcap = p, tcap
    return 0


cdef void _put_map(Buf* b, Col* c, int64_t row, Scratch* sc) noexcept nogil:
    """One map value as an object: dict() semantics for duplicate keys (first position,
    last value), in time linear in the pairs (a hash of the keys), however many."""
    cdef const int32_t* mo = <const int32_t*>c.values
    cdef int32_t p0 = mo[c.off + row], p1 = mo[c.off + row + 1]
    cdef Py_ssize_t k = p1 - p0, i, tcap, h, mask
    cdef int32_t j, s0, s1
    cdef uint64_t hv
    cdef bint first = True
    _put(b, <const uint8_t*>"{", 1)
    if k > 1:
        tcap = 4
        while tcap < 2 * k:
            tcap *= 2
        if _scratch(sc, k, tcap) < 0:
            b.failed = 1
            return
        mask = tcap - 1
        memset(sc.table, 0xFF, tcap * sizeof(int32_t))
        for i in range(k):
            s0 = c.keys.offs[c.keys.off + p0 + i]
            s1 = c.keys.offs[c.keys.off + p0 + i + 1]
            hv = _SEED
            for j in range(s0, s1):
                hv = (hv ^ c.keys.data[j]) * 0x100000001B3ULL
            h = <Py_ssize_t>(hv & mask)
            sc.last[i] = <int32_t>i
            while sc.table[h] >= 0:
                j = sc.table[h]
                if _same_key(&c.keys, p0 + j, p0 + i):
                    sc.last[j] = <int32_t>i        # the later value wins
                    sc.last[i] = -1                # ... at the first key's place
                    break
                h = (h + 1) & mask
            else:
                sc.table[h] = <int32_t>i
    for i in range(k):
        if k > 1:
            j = sc.last[i]
            if j < 0:
                continue
        else:
            j = <int32_t>i
        if not first:
            _put(b, <const uint8_t*>",", 1)
        first = False
        _put_sarr(b, &c.keys, p0 + i)
        _put(b, <const uint8_t*>":", 1)
        if _bit(c.items.valid, c.items.off + p0 + j):
            _put_sarr(b, &c.items, p0 + j)
        else:
            _put(b, <const uint8_t*>"null", 4)
    _put(b, <const uint8_t*>"}", 1)


# ---- the batch ------------------------------------------------------------------

cdef inline const uint8_t* _addr(buf):
    return NULL if buf is None else <const uint8_t*><size_t>buf.address


cdef int _sarr(SArr* a, arr) except -1:
    if not (pa.types.is_string(arr.type)):
        raise TypeError("frame-log JSON: strings must be utf8, not %s" % arr.type)
    bufs = arr.buffers()
    a.valid = _addr(bufs[0]) if arr.null_count else NULL
    a.off = arr.offset
    a.offs = <const int32_t*>_addr(bufs[1])
    a.data = _addr(bufs[2]) if bufs[2] is not None else <const uint8_t*>""
    return 0


def _render(prefix, values):
    """A dictionary's values, each rendered once after the column's prefix:
    (concatenated bytes, offsets, longest)."""
    parts = [prefix + (b"null" if v is None else json.dumps(v).encode())
             for v in values.to_pylist()]
    offs = [0]
    for p in parts:
        offs.append(offs[len(offs) - 1] + len(p))
    return (b"".join(parts), pa.array(offs, pa.int64()).buffers()[1],
            max([len(p) for p in parts] or [0]))


cdef Py_ssize_t _describe(Col* c, arr, bytes prefix, list keep) except -1:
    """Fill c for arr; returns the most bytes a row's value of it takes besides the
    contents of its strings (reserved per row, so those writes need no check)."""
    cdef object t = arr.type
    cdef Py_ssize_t most = len(prefix) + 4
    null_text = prefix + b"null"
    keep.append(null_text)
    c.null_text = <const uint8_t*>(<bytes>null_text)
    c.null_len = len(null_text)
    c.off = arr.offset
    c.valid = NULL
    if pa.types.is_null(t):
        c.kind = K_NULL
        return most
    bufs = arr.buffers()
    if arr.null_count:
        c.valid = _addr(bufs[0])
    if pa.types.is_integer(t) and pa.types.is_signed_integer(t):
        c.kind = K_INT
        c.width = t.bit_width // 8
        c.values = _addr(bufs[1])
        return len(prefix) + 21
    elif pa.types.is_string(t):
        c.kind = K_STR
        _sarr(&c.s, arr)
        return most + 2
    elif pa.types.is_dictionary(t):
        if not (pa.types.is_signed_integer(t.index_type)
                and (pa.types.is_string(t.value_type) or pa.types.is_null(t.value_type))):
            raise TypeError("frame-log JSON: no writer for a column of %s" % t)
        c.kind = K_DICT
        ind = arr.indices
        c.width = t.index_type.bit_width // 8
        c.off = ind.offset
        ibufs = ind.buffers()
        c.valid = _addr(ibufs[0]) if ind.null_count else NULL
        c.values = _addr(ibufs[1])
        text, offs, longest = _render(prefix, arr.dictionary)
        keep.append(text)
        keep.append(offs)
        c.dtext = <const uint8_t*>(<bytes>text)
        c.doff = <const int64_t*>_addr(offs)
        c.dn = len(arr.dictionary)
        return max(most, longest)
    elif pa.types.is_map(t):
        c.kind = K_MAP
        c.values = _addr(bufs[1])
        keys, items = arr.keys, arr.items
        keep.append(keys)
        keep.append(items)
        _sarr(&c.keys, keys)
        _sarr(&c.items, items)
        return most + 2
    raise TypeError("frame-log JSON: no writer for a column of %s" % t)


cdef enum:
    BLOCK = 256 * 1024            # written out whenever this much is formatted


cdef int _drain(Buf* b, int fd, int64_t* written) noexcept nogil:
    """Write the formatted block to fd (all of it); 0, or the errno of the failure."""
    cdef Py_ssize_t off = 0, n
    while off < b.len:
        n = c_write(fd, b.p + off, b.len - off)
        if n < 0:
            if errno == EINTR:
                continue
            return errno
        off += n
    written[0] += b.len
    b.len = 0
    return 0


cdef int _rows(Buf* b, Col* cols, int ncols, int64_t n, Py_ssize_t row_most, Scratch* sc,
               int fd, int64_t* written) noexcept nogil:
    """Format n rows into b (fd >= 0: written out block by block, so the buffer stays
    small and warm in the cache); returns 0 or the errno of a failed write.  Each row
    reserves ``row_most`` bytes first: its fixed parts (prefixes, numbers, dictionary
    values) are copied without a check; strings reserve what they need."""
    cdef int64_t r, v
    cdef int k, err
    cdef Col* c
    for r in range(n):
        if _reserve(b, row_most) < 0:
            return 0
        for k in range(ncols):
            c = &cols[k]
            if c.kind == K_NULL or not _bit(c.valid, c.off + r):
                _put_nc(b, c.null_text, c.null_len)
            elif c.kind == K_DICT:
                v = _load_int(c.values, c.width, c.off + r)
                if 0 <= v < c.dn:
                    _put_nc(b, c.dtext + c.doff[v], c.doff[v + 1] - c.doff[v])
                else:
                    _put_nc(b, c.null_text, c.null_len)
            elif c.kind == K_INT:
                _put_nc(b, c.prefix, c.prefix_len)
                _put_int(b, _load_int(c.values, c.width, c.off + r))
            elif c.kind == K_STR:
                _put_nc(b, c.prefix, c.prefix_len)
                _put_sarr(b, &c.s, r)
                if _reserve(b, row_most) < 0:       # the rest of the row's fixed parts
                    return 0
            else:
                _put_nc(b, c.prefix, c.prefix_len)
                _put_map(b, c, r, sc)
                if _reserve(b, row_most) < 0:
                    return 0
        if ncols == 0:
            _put_nc(b, <const uint8_t*>"{", 1)
        _put_nc(b, <const uint8_t*>"}\n", 2)
        if b.failed:
            return 0
        if fd >= 0 and b.len >= BLOCK:
            err = _drain(b, fd, written)
            if err:
                return err
    if fd >= 0 and b.len:
        return _drain(b, fd, written)
    return 0


cdef object _format(table, int fd):
    cdef list keep = []
    cdef Col* cols = NULL
    cdef Buf b
    cdef Scratch sc
    cdef int k, ncols, err = 0
    cdef int64_t n, written = 0
    cdef Py_ssize_t row_most
    if isinstance(table, pa.RecordBatch):
        batches = [table]
    else:
        batches = table.to_batches()
    names = table.schema.names
    ncols = len(names)
    prefixes = [(("{" if k == 0 else ",") + json.dumps(name) + ":").encode()
                for k, name in enumerate(names)]
    b.p = NULL
    b.len = b.cap = 0
    b.failed = 0
    sc.table = sc.last = NULL
    sc.tcap = sc.lcap = 0
    cols = <Col*>malloc(max(ncols, 1) * sizeof(Col))
    if cols is NULL:
        raise MemoryError()
    try:
        for k in range(ncols):
            cols[k].prefix = <const uint8_t*>(<bytes>prefixes[k])
            cols[k].prefix_len = len(prefixes[k])
        for batch in batches:
            n = batch.num_rows
            if n == 0:
                continue
            keep.clear()
            row_most = 3
            for k in range(ncols):
                arr = batch.column(k)
                keep.append(arr)
                row_most += _describe(&cols[k], arr, prefixes[k], keep)
            with nogil:
                if _reserve(&b, BLOCK + 65536 if fd >= 0 else n * 64) == 0:
                    err = _rows(&b, cols, ncols, n, row_most, &sc, fd, &written)
            if b.failed:
                raise MemoryError("frame-log JSON: no memory for a batch's lines")
            if err:
                raise OSError(err, os.strerror(err))
        if fd >= 0:
            return written
        if b.len == 0:
            return b""
        return PyBytes_FromStringAndSize(<char*>b.p, b.len)
    finally:
        free(cols)
        free(b.p)
        free(sc.table)
        free(sc.last)


def format_table(table):
    """``table`` (a pyarrow Table or RecordBatch) as JSON Lines bytes, one line per row."""
    return _format(table, -1)


def write_table(table, int fd):
    """``table`` as JSON Lines written to file descriptor ``fd`` in blocks of 256 KiB,
    formatted and written without the GIL and never held whole in memory; returns the
    bytes written, raises OSError when a write fails (part of the lines may be written)."""
    if fd < 0:
        raise ValueError("write_table needs a file descriptor")
    return _format(table, fd)
