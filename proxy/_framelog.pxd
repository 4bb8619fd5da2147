# cython: language_level=3
# The frame log's buffer (docs/design.md, "Frame log"): FrameParser._emit() appends each
# finished FrameRecord (proxy/_counters.pxd) here; the writer thread takes whole chunks and
# turns them into Arrow columns (FrameLogBuffer.columns(), the transpose).  Nothing here is
# part of the parser contract (proxy/_framing.pxd).

from libc.stdint cimport uint8_t, int8_t, int16_t, int32_t, int64_t, uint64_t
from libc.string cimport memcpy

from proxy._counters cimport FrameRecord, CORR_STR_MAX


# A request's string correlation id, kept while recording so that its timeout row can
# carry it (CorrState.ctext: a direct-mapped table, docs/design.md, "Frame log").
cdef struct CorrText:
    int64_t key              # the request's Pending.key
    int16_t slot             # its opcode slot; -1: the entry is free
    int8_t dir               # the direction it travelled
    int8_t none              # 1: the request's row has no correlation id (null)
    int16_t refs             # pending requests with this (dir, slot, key): PINGs that
                             # share a timestamp (answer()/timeout: one less; 0: free)
    int16_t len
    uint8_t text[CORR_STR_MAX]


# A connection's string-id state (FrameParser.cs), allocated by the first set_corr_str()
# while recording: kept off the FrameParser object, whose layout the counting path uses.
cdef struct CorrState:
    CorrText* ctext          # kept texts of pending requests, direct-mapped (NULL: none yet)
    Py_ssize_t cap
    Py_ssize_t len
    const uint8_t* ev_text   # _timeout(): the text of the event being emitted
    Py_ssize_t ev_text_len
    int cid_len[2]           # set_corr_str(): per direction, the current row's text
    uint8_t cid[2][CORR_STR_MAX]


cdef inline Py_ssize_t _ctext_index(int d, int slot, int64_t key, Py_ssize_t cap) noexcept:
    # framing_py.ctext_index: the same bits in the twin
    cdef uint64_t z = (<uint64_t>key ^ (<uint64_t>(slot * 2 + d) << 48)) * 0x9E3779B97F4A7C15ULL
    return <Py_ssize_t>((z >> 32) & <uint64_t>(cap - 1))

# One frame-log row as buffered for the writer: the record plus who produced it.
cdef struct LogRecord:
    FrameRecord r            # r.resource / r.attrs: offsets into the chunk's arena
    int64_t conn_id
    int32_t route            # FrameLogBuffer.add_route() index
    int32_t spare


cdef struct LogChunk:
    LogRecord* recs
    Py_ssize_t n
    uint8_t* arena           # resource: u16 len + bytes; attrs: u16 total + pairs
    Py_ssize_t alen
    Py_ssize_t acap


# The per-process frame-log buffer (docs/design.md, "Frame log"): parsers append fixed-
# size records to the chunk being filled; the writer thread takes whole chunks, turns
# them into Arrow columns (columns()) and gives them back (release()).  With every
# chunk full, records are dropped and counted per route: relaying never waits.
cdef class FrameLogBuffer:
    cdef LogChunk* chunks
    cdef int nchunks
    cdef Py_ssize_t chunk_records
    cdef Py_ssize_t arena_limit
    cdef int cur                        # chunk being filled, -1 none
    cdef int* full                      # FIFO of full chunks (indexes)
    cdef int full_head, full_len
    cdef int* free_list
    cdef int nfree
    cdef uint64_t* dropped              # per route
    cdef uint64_t* appended             # per route
    cdef int nroutes, routes_cap
    cdef readonly list routes           # RouteStats per route index
    cdef public object wake             # threading.Event set when wake_at chunks are full
    cdef public int wake_at             # full chunks that wake the writer (>= 1)
    cdef int32_t last_res               # chunk arena offset of the last resource copied, -1
    cdef int64_t last_conn              # ... and whose it was (connection, direction)
    cdef int last_dir
    cdef readonly list regions          # ColumnRegion: columns()'s output blocks, reused
    cdef void append(self, FrameRecord* rec, int64_t conn_id, int32_t route,
                     const uint8_t* res, Py_ssize_t res_len,
                     const uint8_t* attrs, Py_ssize_t alen, bint same_frame,
                     const uint8_t* cid, Py_ssize_t cid_len) noexcept
    cdef int _next_chunk(self) noexcept
    cdef list _region(self, Py_ssize_t* sz, uint8_t** at, int k)
    cdef void _chunk_full(self) noexcept


cdef inline bint append_plain(FrameLogBuffer self, FrameRecord* rec, int64_t conn_id,
                              int32_t route, const uint8_t* res, Py_ssize_t res_len) noexcept:
    """append() of the usual row - no attrs, no string id, not a later row of a
    multi-entry frame - when the chunk being filled has room for it and its resource:
    returns 0 (nothing done) otherwise, and the caller takes append().  Inline in the
    recording point: a logged frame's one function call less and no argument spill."""
    cdef LogChunk* c
    cdef LogRecord* out
    cdef Py_ssize_t at
    if self.cur < 0 or route < 0 or route >= self.nroutes:
        return 0
    c = &self.chunks[self.cur]
    at = c.alen
    if res_len >= 0 and at + 2 + res_len > c.acap:
        return 0
    out = &c.recs[c.n]
    out.r = rec[0]
    out.conn_id = conn_id
    out.route = route
    out.r.attrs = -1
    if res_len >= 0:
        out.r.resource = <int32_t>at
        self.last_res = <int32_t>at
        self.last_conn = conn_id
        self.last_dir = rec.direction
        c.arena[at] = <uint8_t>(res_len >> 8)
        c.arena[at + 1] = <uint8_t>res_len
        memcpy(c.arena + at + 2, res, res_len)
        c.alen = at + 2 + res_len
    else:
        out.r.resource = -1
    c.n += 1
    self.appended[route] += 1
    if c.n == self.chunk_records:
        self._chunk_full()
    return 1

