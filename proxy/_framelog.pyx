# cython: language_level=3
"""The frame-log buffer and its transpose (see _framelog.pxd): fixed-size records in
chunks, filled on the event loop by FrameParser._emit(), drained by the frame-log writer
thread (proxy/framelog_native.py) as Arrow column buffers.  framing_py.FrameLogBuffer
is the pure-Python twin."""

from cpython.buffer cimport PyBUF_FORMAT
from libc.stdint cimport uint8_t, int8_t, int32_t, int64_t, uint64_t
from libc.stdlib cimport malloc, calloc, realloc, free
from libc.string cimport memcpy, memset, memcmp

from proxy._counters cimport (FrameRecord, OPCODE_SLOTS, K_EVENT, EV_CLOSED, CORR_NONE,
                              CORR_INT, CORR_SINT, CORR_PAIR, CORR_STR)



#: Column regions a FrameLogBuffer keeps for reuse, a batch in flight each: the writer
#: holds one or two (a drain of a full buffer and its part-filled chunk), each about 1.5x
#: its chunks' records (~40 MB at the default 8 x 32,768).  More batches alive at once get
#: blocks of their own, freed after them.
KEPT_REGIONS = 2


cdef class ColumnRegion:
    """One batch's column buffers in one malloc'd block (columns()).  Arrow sees each
    column as a slice of one memoryview of it (the buffer protocol); once no Arrow buffer
    holds any of them (exports == 0) the block serves a later batch.  Its pages stay
    mapped from batch to batch: a fresh bytearray per column came from mmap() and each of
    its pages was faulted in again, and pyarrow's pool releases the GIL for every buffer
    it hands out (a batch's 34 buffers, each a wait for the event loop to give the GIL
    back when both share a core)."""
    cdef uint8_t* data
    cdef Py_ssize_t cap
    cdef readonly int exports

    def __dealloc__(self):
        free(self.data)

    cdef int reserve(self, Py_ssize_t n) except -1:
        """At least n bytes (only while no export holds the block: nothing is kept)."""
        if n <= self.cap:
            return 0
        free(self.data)
        self.cap = 0
        self.data = <uint8_t*>malloc(n)
        if self.data is NULL:
            raise MemoryError("frame log: no memory for a batch's columns (%d bytes)" % n)
        self.cap = n
        return 0

    def __getbuffer__(self, Py_buffer* view, int flags):
        view.buf = self.data
        view.obj = self
        view.len = self.cap
        view.readonly = 0
        view.itemsize = 1
        view.format = NULL
        if flags & PyBUF_FORMAT:
            view.format = b"B"
        view.ndim = 1
        view.shape = &self.cap
        view.strides = NULL
        view.suboffsets = NULL
        view.internal = NULL
        self.exports += 1

    def __releasebuffer__(self, Py_buffer* view):
        self.exports -= 1


cdef inline Py_ssize_t _aligned(Py_ssize_t n) noexcept:
    return (n + 63) & ~(<Py_ssize_t>63)


cdef inline Py_ssize_t _arena_str(uint8_t* dst, const uint8_t* a) noexcept nogil:
    """Copy one arena string (u16 length, then its bytes) as UTF-8; returns its length."""
    return _utf8_copy(dst, a + 2, (a[0] << 8) | a[1])


cdef Py_ssize_t _utf8_copy(uint8_t* dst, const uint8_t* src, Py_ssize_t n) noexcept nogil:
    """Copy n bytes, each byte of an invalid UTF-8 sequence replaced by '?': a hostile
    client's resource bytes never make a frame-log file unreadable."""
    cdef Py_ssize_t i = 0, k, need
    cdef uint8_t c
    cdef uint64_t w
    while i < n:
        if i + 8 <= n:                     # eight ASCII bytes at a time
            memcpy(&w, src + i, 8)
            if not (w & 0x8080808080808080ULL):
                memcpy(dst + i, &w, 8)
                i += 8
                continue
        c = src[i]
        if c < 0x80:
            dst[i] = c
            i += 1
            continue
        if 0xC2 <= c <= 0xDF:
            need = 1
        elif 0xE0 <= c <= 0xEF:
            need = 2
        elif 0xF0 <= c <= 0xF4:
            need = 3
        else:
            dst[i] = 63
            i += 1
            continue
        if i + need >= n:
            dst[i] = 63                    # sequence cut short by the end
            i += 1
            continue
        for k in range(1, need + 1):
            if src[i + k] & 0xC0 != 0x80:
                break
        else:
            if not ((c == 0xE0 and src[i + 1] < 0xA0) or (c == 0xED and src[i + 1] > 0x9F)
                    or (c == 0xF0 and src[i + 1] < 0x90) or (c == 0xF4 and src[i + 1] > 0x8F)):
                memcpy(dst + i, src + i, need + 1)
                i += need + 1
                continue
        dst[i] = 63
        i += 1
    return n


# Decimal formatting for the writer's correlation ids: the digit count by comparisons,
# then two digits per division, written from the end (a digit per division and a reversal
# cost ~127 instructions per row, a sixth of the transpose).
cdef uint64_t _POW10[20]
cdef uint8_t _DIGITS2[200]


cdef void _init_decimal() noexcept:
    cdef int i
    cdef uint64_t p = 1
    for i in range(20):
        _POW10[i] = p
        if i < 19:
            p *= 10
    for i in range(100):
        _DIGITS2[2 * i] = <uint8_t>(48 + i // 10)
        _DIGITS2[2 * i + 1] = <uint8_t>(48 + i % 10)


_init_decimal()


cdef Py_ssize_t _fmt_u64(uint8_t* out, uint64_t v) noexcept nogil:
    """v in decimal at out; returns the number of digits."""
    cdef Py_ssize_t n = 1, i
    cdef uint64_t q
    while n < 20 and v >= _POW10[n]:
        n += 1
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


cdef Py_ssize_t _fmt_i64(uint8_t* out, int64_t v) noexcept nogil:
    if v < 0:
        out[0] = 45
        return 1 + _fmt_u64(out + 1, <uint64_t>0 - <uint64_t>v)
    return _fmt_u64(out, <uint64_t>v)


cdef inline void _setbit(uint8_t* bits, Py_ssize_t i) noexcept nogil:
    bits[i >> 3] |= <uint8_t>(1 << (i & 7))


# columns()'s dictionary encoding of one batch: int64 keys (opcode/status name keys,
# connection ids) -> dense indices in first-seen order, so that the Arrow side only looks
# each distinct key up once and never hashes a column (a pyarrow dictionary_encode
# pass per column cost ~230 instructions per row).  Rows of one connection come in
# runs, hence the last-key shortcut.
cdef struct Dense:
    int64_t* slot_key           # open addressing, power-of-two capacity
    int32_t* slot_val           # 1 + index; 0: empty
    int64_t* keys               # distinct keys by index (capacity cap // 2)
    Py_ssize_t cap
    Py_ssize_t n
    int64_t last_key
    int32_t last_val            # -1: no last key
    int failed                  # an allocation failed (columns() raises MemoryError)


cdef int _dense_init(Dense* d, Py_ssize_t cap) noexcept nogil:
    d.cap = cap
    d.n = 0
    d.last_val = -1
    d.failed = 0
    d.slot_key = <int64_t*>malloc(cap * sizeof(int64_t))
    d.slot_val = <int32_t*>calloc(cap, sizeof(int32_t))
    d.keys = <int64_t*>malloc((cap // 2) * sizeof(int64_t))
    if d.slot_key is NULL or d.slot_val is NULL or d.keys is NULL:
        d.failed = 1
        return -1
    return 0


cdef void _dense_free(Dense* d) noexcept nogil:
    free(d.slot_key)
    free(d.slot_val)
    free(d.keys)
    d.slot_key = NULL
    d.slot_val = NULL
    d.keys = NULL


cdef inline Py_ssize_t _dense_slot(Dense* d, int64_t key) noexcept nogil:
    cdef Py_ssize_t mask = d.cap - 1
    cdef Py_ssize_t h = <Py_ssize_t>(((<uint64_t>key) * <uint64_t>0x9E3779B97F4A7C15ULL) >> 33) & mask
    while d.slot_val[h] and d.slot_key[h] != key:
        h = (h + 1) & mask
    return h


cdef int32_t _dense_index(Dense* d, int64_t key) noexcept nogil:
    """The index of key (added when new); 0 after an allocation failure."""
    cdef Py_ssize_t h, i, cap
    cdef int64_t* nk
    cdef int32_t* nv
    cdef int64_t* nkeys
    if d.last_val >= 0 and d.last_key == key:
        return d.last_val
    if d.failed:
        return 0
    h = _dense_slot(d, key)
    if not d.slot_val[h]:
        if (d.n + 1) * 2 > d.cap:                 # grow: rehash the keys by index
            cap = d.cap * 2
            nk = <int64_t*>malloc(cap * sizeof(int64_t))
            nv = <int32_t*>calloc(cap, sizeof(int32_t))
            nkeys = <int64_t*>realloc(d.keys, (cap // 2) * sizeof(int64_t))
            if nk is NULL or nv is NULL or nkeys is NULL:
                free(nk)
                free(nv)
                if nkeys is not NULL:
                    d.keys = nkeys
                d.failed = 1
                return 0
            free(d.slot_key)
            free(d.slot_val)
            d.slot_key, d.slot_val, d.keys, d.cap = nk, nv, nkeys, cap
            for i in range(d.n):
                h = _dense_slot(d, d.keys[i])
                d.slot_key[h] = d.keys[i]
                d.slot_val[h] = <int32_t>(i + 1)
            h = _dense_slot(d, key)
        d.slot_key[h] = key
        d.slot_val[h] = <int32_t>(d.n + 1)
        d.keys[d.n] = key
        d.n += 1
    d.last_key = key
    d.last_val = d.slot_val[h] - 1
    return d.last_val


cdef list _dense_keys(Dense* d):
    return [d.keys[i] for i in range(d.n)]


# columns()'s dictionary of resources: each distinct resource is copied (as UTF-8, see
# _utf8_copy) once per batch into the dictionary's values, and every row gets an index:
# Parquet writes an Arrow dictionary of strings as it is, where a plain string column
# had it hash every row's bytes again (~68 instructions per row, bench/callgrind_writer.py).
# Keyed by the raw arena bytes (valid while columns() runs); a frame's rows share one
# arena copy and a connection's rows repeat their resource, hence the last-key shortcut.
cdef struct StrDict:
    uint64_t* slot_hash         # open addressing, power-of-two capacity
    int32_t* slot_val           # 1 + index; 0: empty
    const uint8_t** raw         # by index: the arena bytes and their length
    int32_t* rlen
    Py_ssize_t cap
    Py_ssize_t n
    const uint8_t* last_raw
    int32_t last_len
    int32_t last_val            # -1: no last key
    int failed


cdef int _sdict_init(StrDict* d, Py_ssize_t cap) noexcept nogil:
    d.cap = cap
    d.n = 0
    d.last_val = -1
    d.last_raw = NULL
    d.last_len = 0
    d.failed = 0
    d.slot_hash = <uint64_t*>malloc(cap * sizeof(uint64_t))
    d.slot_val = <int32_t*>calloc(cap, sizeof(int32_t))
    d.raw = <const uint8_t**>malloc((cap // 2) * sizeof(uint8_t*))
    d.rlen = <int32_t*>malloc((cap // 2) * sizeof(int32_t))
    if d.slot_hash is NULL or d.slot_val is NULL or d.raw is NULL or d.rlen is NULL:
        d.failed = 1
        return -1
    return 0


cdef void _sdict_free(StrDict* d) noexcept nogil:
    free(d.slot_hash)
    free(d.slot_val)
    free(<void*>d.raw)
    free(d.rlen)
    d.slot_hash = NULL
    d.slot_val = NULL
    d.raw = NULL
    d.rlen = NULL


cdef inline uint64_t _hash_bytes(const uint8_t* p, Py_ssize_t n) noexcept nogil:
    cdef uint64_t h = (<uint64_t>n + 1) * <uint64_t>0x9E3779B97F4A7C15ULL
    cdef uint64_t w
    while n >= 8:
        memcpy(&w, p, 8)
        h = (h ^ w) * <uint64_t>0xFF51AFD7ED558CCDULL
        h ^= h >> 32
        p += 8
        n -= 8
    if n:
        w = 0
        memcpy(&w, p, n)
        h = (h ^ w) * <uint64_t>0xFF51AFD7ED558CCDULL
        h ^= h >> 32
    return h


cdef inline Py_ssize_t _sdict_slot(StrDict* d, uint64_t h, const uint8_t* p,
                                   int32_t n) noexcept nogil:
    cdef Py_ssize_t mask = d.cap - 1
    cdef Py_ssize_t i = <Py_ssize_t>(h >> 33) & mask
    cdef int32_t v
    while True:
        v = d.slot_val[i]
        if not v:
            return i
        if d.slot_hash[i] == h and d.rlen[v - 1] == n and \
                (n == 0 or memcmp(d.raw[v - 1], p, n) == 0):
            return i
        i = (i + 1) & mask


cdef int32_t _sdict_index(StrDict* d, const uint8_t* p, int32_t n, int32_t* offsets,
                          uint8_t* data) noexcept nogil:
    """The index of the n bytes at p (added when new: copied to data, its end to
    offsets[index + 1]); 0 after an allocation failure."""
    cdef Py_ssize_t i, j, cap
    cdef uint64_t h
    cdef uint64_t* nh
    cdef int32_t* nv
    cdef const uint8_t** nraw
    cdef int32_t* nlen
    if d.last_val >= 0 and d.last_len == n and (d.last_raw == p or
                                                memcmp(d.last_raw, p, n) == 0):
        d.last_raw = p
        return d.last_val
    if d.failed:
        return 0
    h = _hash_bytes(p, n)
    i = _sdict_slot(d, h, p, n)
    if not d.slot_val[i]:
        if (d.n + 1) * 2 > d.cap:                 # grow: rehash by index
            cap = d.cap * 2
            nh = <uint64_t*>malloc(cap * sizeof(uint64_t))
            nv = <int32_t*>calloc(cap, sizeof(int32_t))
            nraw = <const uint8_t**>realloc(<void*>d.raw, (cap // 2) * sizeof(uint8_t*))
            if nraw is not NULL:
                d.raw = nraw
            nlen = <int32_t*>realloc(d.rlen, (cap // 2) * sizeof(int32_t))
            if nlen is not NULL:
                d.rlen = nlen
            if nh is NULL or nv is NULL or nraw is NULL or nlen is NULL:
                free(nh)
                free(nv)
                d.failed = 1
                return 0
            for j in range(d.cap):
                if d.slot_val[j]:
                    i = <Py_ssize_t>(d.slot_hash[j] >> 33) & (cap - 1)
                    while nv[i]:
                        i = (i + 1) & (cap - 1)
                    nh[i] = d.slot_hash[j]
                    nv[i] = d.slot_val[j]
            free(d.slot_hash)
            free(d.slot_val)
            d.slot_hash, d.slot_val, d.cap = nh, nv, cap
            i = _sdict_slot(d, h, p, n)
        d.slot_hash[i] = h
        d.slot_val[i] = <int32_t>(d.n + 1)
        d.raw[d.n] = p
        d.rlen[d.n] = n
        offsets[d.n + 1] = offsets[d.n] + <int32_t>_utf8_copy(data + offsets[d.n], p, n)
        d.n += 1
    d.last_raw = p
    d.last_len = n
    d.last_val = d.slot_val[i] - 1
    return d.last_val


cdef class FrameLogBuffer:
    """Chunks of fixed-size frame-log records, filled on the event loop, drained by the
    frame-log writer thread (proxy/framelog_native.py).  See _framelog.pxd."""

    def __cinit__(self, int chunks=8, Py_ssize_t chunk_records=32768,
                  Py_ssize_t arena_bytes=8 << 20):
        cdef int i
        if chunks < 2 or chunk_records < 1:
            raise ValueError("a frame-log buffer needs >= 2 chunks of >= 1 record")
        self.nchunks = chunks
        self.chunk_records = chunk_records
        self.arena_limit = arena_bytes
        self.chunks = <LogChunk*>malloc(chunks * sizeof(LogChunk))
        self.full = <int*>malloc(chunks * sizeof(int))
        self.free_list = <int*>malloc(chunks * sizeof(int))
        self.routes_cap = 16
        self.dropped = <uint64_t*>malloc(self.routes_cap * sizeof(uint64_t))
        self.appended = <uint64_t*>malloc(self.routes_cap * sizeof(uint64_t))
        if (self.chunks is NULL or self.full is NULL or self.free_list is NULL
                or self.dropped is NULL or self.appended is NULL):
            raise MemoryError()
        memset(self.chunks, 0, chunks * sizeof(LogChunk))
        memset(self.dropped, 0, self.routes_cap * sizeof(uint64_t))
        memset(self.appended, 0, self.routes_cap * sizeof(uint64_t))
        for i in range(chunks):
            self.free_list[i] = chunks - 1 - i
        self.nfree = chunks
        self.cur = -1
        self.last_res = -1
        self.wake_at = 1
        self.routes = []
        self.regions = []

    def __dealloc__(self):
        cdef int i
        if self.chunks is not NULL:
            for i in range(self.nchunks):
                free(self.chunks[i].recs)
                free(self.chunks[i].arena)
        free(self.chunks)
        free(self.full)
        free(self.free_list)
        free(self.dropped)
        free(self.appended)

    def add_route(self, stats):
        """Register a route (a RouteStats); returns its index for
        FrameParser.attach_log()."""
        from proxy._framing import RouteStats     # not cimported: no import cycle
        if stats is not None and not isinstance(stats, RouteStats):
            raise TypeError("Argument 'stats' has incorrect type (expected "
                            "proxy._framing.RouteStats, got %s)" % type(stats).__name__)
        cdef int n = len(self.routes)
        if n >= self.routes_cap:
            self.routes_cap *= 2
            self.dropped = <uint64_t*>realloc(self.dropped, self.routes_cap * sizeof(uint64_t))
            self.appended = <uint64_t*>realloc(self.appended, self.routes_cap * sizeof(uint64_t))
            if self.dropped is NULL or self.appended is NULL:
                raise MemoryError()
            memset(self.dropped + n, 0, (self.routes_cap - n) * sizeof(uint64_t))
            memset(self.appended + n, 0, (self.routes_cap - n) * sizeof(uint64_t))
        self.routes.append(stats)
        self.nroutes = n + 1
        return n

    cdef int _next_chunk(self) noexcept:
        """Make a free chunk current; -1 when none is free (the writer is behind)."""
        cdef LogChunk* c
        if self.nfree == 0:
            self.cur = -1
            return -1
        self.nfree -= 1
        self.cur = self.free_list[self.nfree]
        c = &self.chunks[self.cur]
        if c.recs is NULL:                 # first use: allocate
            c.recs = <LogRecord*>malloc(self.chunk_records * sizeof(LogRecord))
            if c.recs is NULL:
                self.free_list[self.nfree] = self.cur
                self.nfree += 1
                self.cur = -1
                return -1
        c.n = 0
        c.alen = 0
        return self.cur

    cdef void append(self, FrameRecord* rec, int64_t conn_id, int32_t route,
                     const uint8_t* res, Py_ssize_t res_len,
                     const uint8_t* attrs, Py_ssize_t alen, bint same_frame,
                     const uint8_t* cid, Py_ssize_t cid_len) noexcept:
        cdef LogChunk* c
        cdef LogRecord* out
        cdef Py_ssize_t extra = 0, need
        cdef int32_t res_off = -1
        cdef uint8_t* na
        if route < 0 or route >= self.nroutes:
            return
        if self.cur < 0 and self._next_chunk() < 0:
            self.dropped[route] += 1
            return
        c = &self.chunks[self.cur]
        if rec.corr_fmt != CORR_STR:
            cid_len = -1
        if (res_len >= 0 and same_frame and alen <= 0 and cid_len < 0 and self.last_res >= 0
                and self.last_conn == conn_id and self.last_dir == rec.direction):
            # another row of the frame whose resource this chunk holds already (a
            # Stream Publish: a row per publishing id): point at that copy
            res_off = self.last_res
            res_len = -1
        if res_len >= 0:
            extra += 2 + res_len
        if alen > 0:
            extra += 2 + alen
        if cid_len >= 0:
            extra += 2 + cid_len
        if extra and c.alen + extra > c.acap:
            need = c.acap * 2 if c.acap else 65536
            while need < c.alen + extra:
                need *= 2
            if need > self.arena_limit:
                need = self.arena_limit
            if c.alen + extra <= need:
                na = <uint8_t*>realloc(c.arena, need)
                if na is not NULL:
                    c.arena = na
                    c.acap = need
        if extra and c.alen + extra > c.acap:
            # this chunk's arena is full: hand the chunk over, continue in the next
            self._chunk_full()
            if self.cur < 0 and self._next_chunk() < 0:
                self.dropped[route] += 1
                return
            c = &self.chunks[self.cur]
            if c.alen + extra > c.acap:
                need = 65536
                while need < extra:
                    need *= 2
                na = <uint8_t*>realloc(c.arena, need)
                if na is NULL:
                    self.dropped[route] += 1
                    return
                c.arena = na
                c.acap = need
        out = &c.recs[c.n]
        out.r = rec[0]
        out.conn_id = conn_id
        out.route = route
        out.r.resource = res_off
        out.r.attrs = -1
        if res_len >= 0:
            out.r.resource = <int32_t>c.alen
            self.last_res = <int32_t>c.alen
            self.last_conn = conn_id
            self.last_dir = rec.direction
            c.arena[c.alen] = <uint8_t>(res_len >> 8)
            c.arena[c.alen + 1] = <uint8_t>res_len
            memcpy(c.arena + c.alen + 2, res, res_len)
            c.alen += 2 + res_len
        if alen > 0:
            out.r.attrs = <int32_t>c.alen
            c.arena[c.alen] = <uint8_t>(alen >> 8)
            c.arena[c.alen + 1] = <uint8_t>alen
            memcpy(c.arena + c.alen + 2, attrs, alen)
            c.alen += 2 + alen
        if cid_len >= 0:                   # a string correlation id: corr = its offset
            out.r.corr = c.alen
            c.arena[c.alen] = <uint8_t>(cid_len >> 8)
            c.arena[c.alen + 1] = <uint8_t>cid_len
            memcpy(c.arena + c.alen + 2, cid, cid_len)
            c.alen += 2 + cid_len
        elif out.r.corr_fmt == CORR_STR:
            out.r.corr_fmt = CORR_NONE
        c.n += 1
        self.appended[route] += 1
        if c.n == self.chunk_records:
            self._chunk_full()

    cdef void _chunk_full(self) noexcept:
        self.full[(self.full_head + self.full_len) % self.nchunks] = self.cur
        self.full_len += 1
        self.cur = -1
        self.last_res = -1
        if self.wake is not None and self.full_len >= self.wake_at:
            try:
                self.wake.set()
            except Exception:
                pass

    # ---- the writer's side (holds the GIL for take/release only) ------------------

    def take(self, bint partial=True):
        """A chunk to write: the oldest full one, else (``partial``) the current one
        when it holds records; returns its index, or -1 when there is nothing to write.
        The writer leaves the chunk being filled alone when a full one woke it: a
        part-filled chunk makes a small row group, which costs more per row."""
        cdef int i
        if self.full_len:
            i = self.full[self.full_head]
            self.full_head = (self.full_head + 1) % self.nchunks
            self.full_len -= 1
            return i
        if partial and self.cur >= 0 and self.chunks[self.cur].n > 0:
            i = self.cur
            self.cur = -1
            self.last_res = -1
            return i
        return -1

    def release(self, int i):
        """Give chunk i back after columns() (its records are gone)."""
        self.chunks[i].n = 0
        self.chunks[i].alen = 0
        self.free_list[self.nfree] = i
        self.nfree += 1

    def route_counts(self, chunks):
        """{route index: records} in chunks ``chunks`` (indexes): what a batch that could
        not be converted held, so the writer counts those rows as dropped."""
        cdef dict out = {}
        cdef int i
        cdef Py_ssize_t j
        cdef LogChunk* c
        for i in chunks:
            if i < 0 or i >= self.nchunks:
                raise IndexError("no chunk %d" % i)
            c = &self.chunks[i]
            for j in range(c.n):
                out[c.recs[j].route] = out.get(c.recs[j].route, 0) + 1
        return out

    def dropped_counts(self):
        """{route name: records dropped because every chunk was full}."""
        return {self.routes[i].route: self.dropped[i] for i in range(self.nroutes)
                if self.dropped[i]}

    def appended_counts(self):
        return {self.routes[i].route: self.appended[i] for i in range(self.nroutes)}

    cdef list _region(self, Py_ssize_t* sz, uint8_t** at, int k):
        """k column buffers of sz[i] bytes (negative: zeroed) in one ColumnRegion, a free
        kept one when there is one: their addresses in at[], and the memoryview slices
        that hand them to Arrow."""
        cdef Py_ssize_t total = 0, off = 0, size
        cdef ColumnRegion reg = None
        cdef int i
        for i in range(k):
            total += _aligned(abs(sz[i]))
        for r in self.regions:
            if (<ColumnRegion>r).exports == 0:
                reg = r
                break
        if reg is None:
            reg = ColumnRegion()
            if len(self.regions) < KEPT_REGIONS:
                self.regions.append(reg)
        reg.reserve(max(total, 64))
        mv = memoryview(reg)
        out = []
        for i in range(k):
            size = abs(sz[i])
            at[i] = reg.data + off
            if sz[i] < 0:
                memset(at[i], 0, size)
            out.append(mv[off:off + size])
            off += _aligned(size)
        return out

    def columns(self, chunks, int64_t wall_offset_ns):
        """Chunk ``chunks`` (an index, or a list of indexes: one batch, in that order) as
        column buffers for Arrow (memoryviews of one reused block, _region()): fixed-width
        values, validity bitmaps (None: no nulls), and offsets + data for the strings.
        Runs without the GIL over the records.  Several chunks make one table, hence one
        larger row group: the Parquet writer's cost per row falls with the row group's
        size."""
        cdef list idx = [chunks] if isinstance(chunks, int) else list(chunks)
        cdef Py_ssize_t nidx = len(idx), q
        cdef int ci[64]
        cdef LogChunk* c
        cdef Py_ssize_t n = 0, j, k, nb, npairs = 0, m, o, arena = 0
        cdef Py_ssize_t cpos = 0, kpos = 0, vpos = 0, pend
        cdef LogRecord* r
        cdef FrameRecord* f
        cdef const uint8_t* a
        if nidx < 1 or nidx > 64:
            raise ValueError("columns() takes 1 to 64 chunks, not %d" % nidx)
        for q in range(nidx):
            ci[q] = idx[q]
            if ci[q] < 0 or ci[q] >= self.nchunks:
                raise IndexError("no chunk %d" % ci[q])
            n += self.chunks[ci[q]].n
            arena += self.chunks[ci[q]].alen
        nb = (n + 7) // 8
        # Sizes from the arena alone, with no pass over the records (a batch is ~30 MB of
        # records the loop wrote long ago: a sizing pass read them all from memory once
        # more, ~16 % of this function's time).  Every string that reaches a column has
        # its bytes in the arena - a string id and an attrs blob once per row, a resource
        # at least once per distinct value, the dictionary's - and _utf8_copy() writes no
        # more bytes than it reads; each attribute pair takes at least 4 bytes (two
        # lengths).  The buffers exposed stop at the offsets written.
        npairs = arena // 4
        # The batch's buffers, one block (_region()), in this order: sizes in bytes, a
        # negative size zeroed (the validity bitmaps, which _setbit ORs into); the others
        # are written for every row, or up to the offsets exposed.
        cdef Py_ssize_t sz[34]
        cdef uint8_t* at[34]
        cdef int64_t* p_ts
        cdef int64_t* p_conn
        cdef int32_t* p_route
        cdef int8_t* p_dir
        cdef int8_t* p_kind
        cdef int8_t* p_out
        cdef uint8_t* v_out
        cdef int32_t* p_op
        cdef uint8_t* v_op
        cdef int32_t* p_opk
        cdef int32_t* p_reqk
        cdef uint8_t* v_req
        cdef int32_t* p_sk
        cdef uint8_t* v_sk
        cdef int32_t* p_ci
        cdef int64_t* p_fb
        cdef int64_t* p_hb
        cdef int64_t* p_pb
        cdef int64_t* p_msg
        cdef int64_t* p_lat
        cdef uint8_t* v_lat
        cdef int32_t* p_coff
        cdef uint8_t* p_cdat
        cdef uint8_t* v_corr
        cdef int32_t* p_ridx
        cdef uint8_t* v_res
        cdef int32_t* p_roff
        cdef uint8_t* p_rdat
        cdef int32_t* p_moff
        cdef uint8_t* v_map
        cdef int32_t* p_koff
        cdef uint8_t* p_kdat
        cdef int32_t* p_voff
        cdef uint8_t* p_vdat
        sz[:] = [n * 8, n * 8, n * 4, n, n, n, -nb, n * 4, -nb, n * 4, n * 4, -nb, n * 4,
                 -nb, n * 4, n * 8, n * 8, n * 8, n * 8, n * 8, -nb, (n + 1) * 4,
                 n * 32 + arena + 1, -nb, n * 4, -nb, (n + 1) * 4, arena + 1,
                 (n + 1) * 4, -nb, (npairs + 1) * 4, arena + 1, (npairs + 1) * 4, arena + 1]
        (ts, conn, route, direction, kind, outcome, outcome_v, opcode, opcode_v, op_idx,
         req_idx, req_v, st_idx, st_v, conn_idx, fbytes, hbytes, pbytes, msgs, lat, lat_v,
         corr_off, corr_data, corr_v, res_idx, res_v, res_off, res_data, map_off, map_v,
         key_off, key_data, val_off, val_data) = self._region(sz, at, 34)
        p_ts = <int64_t*>at[0]
        p_conn = <int64_t*>at[1]
        p_route = <int32_t*>at[2]
        p_dir = <int8_t*>at[3]
        p_kind = <int8_t*>at[4]
        p_out = <int8_t*>at[5]
        v_out = <uint8_t*>at[6]
        p_op = <int32_t*>at[7]
        v_op = <uint8_t*>at[8]
        p_opk = <int32_t*>at[9]
        p_reqk = <int32_t*>at[10]
        v_req = <uint8_t*>at[11]
        p_sk = <int32_t*>at[12]
        v_sk = <uint8_t*>at[13]
        p_ci = <int32_t*>at[14]
        p_fb = <int64_t*>at[15]
        p_hb = <int64_t*>at[16]
        p_pb = <int64_t*>at[17]
        p_msg = <int64_t*>at[18]
        p_lat = <int64_t*>at[19]
        v_lat = <uint8_t*>at[20]
        p_coff = <int32_t*>at[21]
        p_cdat = <uint8_t*>at[22]
        v_corr = <uint8_t*>at[23]
        p_ridx = <int32_t*>at[24]
        v_res = <uint8_t*>at[25]
        p_roff = <int32_t*>at[26]
        p_rdat = <uint8_t*>at[27]
        p_moff = <int32_t*>at[28]
        v_map = <uint8_t*>at[29]
        p_koff = <int32_t*>at[30]
        p_kdat = <uint8_t*>at[31]
        p_voff = <int32_t*>at[32]
        p_vdat = <uint8_t*>at[33]
        cdef Dense d_name, d_status, d_conn
        cdef StrDict d_res
        _sdict_init(&d_res, 64)
        _dense_init(&d_name, 64)
        _dense_init(&d_status, 64)
        _dense_init(&d_conn, 256)
        cdef Py_ssize_t pairs = 0
        with nogil:
            p_coff[0] = 0
            p_roff[0] = 0
            p_moff[0] = 0
            p_koff[0] = 0
            p_voff[0] = 0
            o = 0
            for q in range(nidx):
                c = &self.chunks[ci[q]]
                for j in range(c.n):
                    r = &c.recs[j]
                    f = &r.r
                    p_ts[o] = f.t_ns + wall_offset_ns
                    p_conn[o] = r.conn_id
                    p_ci[o] = _dense_index(&d_conn, r.conn_id)
                    p_route[o] = r.route
                    p_dir[o] = f.direction
                    p_kind[o] = f.kind
                    p_out[o] = f.outcome if f.outcome >= 0 else 0
                    if f.outcome >= 0:
                        _setbit(v_out, o)
                    p_op[o] = <int32_t>f.opcode
                    if f.opcode >= 0:
                        _setbit(v_op, o)
                    # names by key route * OPCODE_SLOTS + slot (one dictionary serves
                    # opcode_name and request_opcode_name)
                    p_opk[o] = _dense_index(&d_name, r.route * OPCODE_SLOTS + f.slot)
                    if f.req_slot >= 0:
                        p_reqk[o] = _dense_index(&d_name, r.route * OPCODE_SLOTS + f.req_slot)
                        _setbit(v_req, o)
                    else:
                        p_reqk[o] = 0
                    # status by key route << 32 | code; -1 marks a timeout event, -2 a
                    # request cut off by its connection's close
                    if f.kind == K_EVENT:
                        p_sk[o] = _dense_index(&d_status, -2 if f.status == EV_CLOSED else -1)
                        _setbit(v_sk, o)
                    elif f.has_status:
                        p_sk[o] = _dense_index(&d_status, (<int64_t>r.route << 32)
                                               | (f.status & <int64_t>0xFFFFFFFFLL))
                        _setbit(v_sk, o)
                    else:
                        p_sk[o] = 0
                    p_fb[o] = f.frame_bytes
                    p_hb[o] = f.header_bytes
                    p_pb[o] = f.frame_bytes - f.header_bytes if f.frame_bytes else 0
                    p_msg[o] = f.messages
                    p_lat[o] = f.latency_ns if f.latency_ns >= 0 else 0
                    if f.latency_ns >= 0:
                        _setbit(v_lat, o)
                    # correlation id, formatted here rather than in Python
                    if f.corr_fmt == CORR_INT:
                        cpos += _fmt_u64(p_cdat + cpos, <uint64_t>f.corr)
                        _setbit(v_corr, o)
                    elif f.corr_fmt == CORR_SINT:
                        cpos += _fmt_i64(p_cdat + cpos, f.corr)
                        _setbit(v_corr, o)
                    elif f.corr_fmt == CORR_PAIR:
                        cpos += _fmt_i64(p_cdat + cpos, f.corr_hi)
                        p_cdat[cpos] = 58
                        cpos += 1
                        cpos += _fmt_u64(p_cdat + cpos, <uint64_t>f.corr)
                        _setbit(v_corr, o)
                    elif f.corr_fmt == CORR_STR:
                        cpos += _arena_str(p_cdat + cpos, c.arena + f.corr)
                        _setbit(v_corr, o)
                    p_coff[o + 1] = <int32_t>cpos
                    if f.resource >= 0:
                        a = c.arena + f.resource
                        p_ridx[o] = _sdict_index(&d_res, a + 2, (a[0] << 8) | a[1],
                                                 p_roff, p_rdat)
                        _setbit(v_res, o)
                    else:
                        p_ridx[o] = 0
                    if f.attrs >= 0:
                        a = c.arena + f.attrs
                        pend = 2 + ((a[0] << 8) | a[1])
                        k = 2
                        while k + 2 <= pend:
                            m = (a[k] << 8) | a[k + 1]
                            kpos += _utf8_copy(p_kdat + kpos, a + k + 2, m)
                            k += 2 + m
                            m = (a[k] << 8) | a[k + 1]
                            vpos += _utf8_copy(p_vdat + vpos, a + k + 2, m)
                            k += 2 + m
                            pairs += 1
                            p_koff[pairs] = <int32_t>kpos
                            p_voff[pairs] = <int32_t>vpos
                        _setbit(v_map, o)
                    p_moff[o + 1] = <int32_t>pairs
                    o += 1
        try:
            if d_name.failed or d_status.failed or d_conn.failed or d_res.failed:
                raise MemoryError("frame log: no memory for a batch's dictionaries")
            nres = d_res.n
            name_keys = _dense_keys(&d_name)
            status_keys = _dense_keys(&d_status)
            conn_keys = _dense_keys(&d_conn)
        finally:
            _dense_free(&d_name)
            _dense_free(&d_status)
            _dense_free(&d_conn)
            _sdict_free(&d_res)
        return {
            "n": n, "npairs": pairs,
            "ts_ns": ts, "conn_id": conn, "route": route, "direction": direction,
            "kind": kind, "outcome": (outcome, outcome_v), "opcode": (opcode, opcode_v),
            # dictionary indices and their keys: name keys are route * OPCODE_SLOTS +
            # slot, status keys route << 32 | code (-1: a timeout event)
            "name_idx": op_idx, "req_idx": (req_idx, req_v), "name_keys": name_keys,
            "status_idx": (st_idx, st_v), "status_keys": status_keys,
            "conn_idx": conn_idx, "conn_keys": conn_keys,
            "frame_bytes": fbytes, "header_bytes": hbytes, "payload_bytes": pbytes,
            "messages": msgs, "latency_ns": (lat, lat_v),
            "correlation_id": (corr_off, corr_data, corr_v),
            # indices over a dictionary of the batch's distinct resources
            "resource": (res_idx, res_v, nres, res_off, res_data),
            "attrs": (map_off, map_v, key_off, key_data, val_off, val_data),
        }
