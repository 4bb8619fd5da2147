# cython: language_level=3
"""Compiled framing core: native per-route counters and the resumable frame splitter.

See _framing.pxd for the field-by-field contract; framing_py.py is the pure-Python
twin with the same behaviour (selected by FRAMETAP_NO_EXTENSIONS=1).
"""

from cpython.bytes cimport PyBytes_Check, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from cpython.mem cimport PyMem_Malloc, PyMem_Realloc, PyMem_Free
from libc.string cimport memcpy, memset
from libc.stdint cimport uint8_t, int16_t, int32_t, int64_t, uint64_t

from proxy.errors import frame_error_class
from proxy.framing_common import (BUCKETS_NS, DIRECTIONS, REASONS, OUTCOMES,
                                  DEFAULT_FIFO_LIMIT)
from proxy.framing_common import R_OVERFLOW, R_TRUNCATED

cdef extern from "<time.h>" nogil:
    ctypedef long time_t
    struct timespec:
        time_t tv_sec
        long tv_nsec
    int clock_gettime(int clk, timespec *tp)
    int CLOCK_MONOTONIC

cdef int64_t _bounds[N_BUCKETS]
for _i in range(N_BUCKETS):
    _bounds[_i] = BUCKETS_NS[_i]

cdef int _reason_overflow = R_OVERFLOW
cdef int _reason_truncated = R_TRUNCATED


cdef inline int64_t monotonic_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec


def now_ns():
    """The clock the parsers use (CLOCK_MONOTONIC, ns) — for expire() callers."""
    return monotonic_ns()


cdef inline int bucket_of(int64_t dt_ns) noexcept:
    cdef int i = 0
    while i < N_BUCKETS and dt_ns > _bounds[i]:
        i += 1
    return i


cdef class RouteStats:
    """Every counter of one route, in C arrays (shared by all its connections)."""

    def __cinit__(self, route="route", protocol="unknown", opcode_namer=None,
                  status_namer=None):
        self.slot_of = <int16_t*>PyMem_Malloc(CODE_TABLE * sizeof(int16_t))
        self.responses = <uint64_t*>PyMem_Malloc(
            OPCODE_SLOTS * STATUS_SLOTS * sizeof(uint64_t))
        self.hist = <uint64_t*>PyMem_Malloc(
            OPCODE_SLOTS * 2 * (N_BUCKETS + 1) * sizeof(uint64_t))
        if self.slot_of is NULL or self.responses is NULL or self.hist is NULL:
            raise MemoryError()
        memset(self.slot_of, 0xFF, CODE_TABLE * sizeof(int16_t))   # all -1
        memset(self.responses, 0, OPCODE_SLOTS * STATUS_SLOTS * sizeof(uint64_t))
        memset(self.hist, 0, OPCODE_SLOTS * 2 * (N_BUCKETS + 1) * sizeof(uint64_t))
        self.route = str(route)
        self.protocol = str(protocol)
        self.opcode_namer = opcode_namer
        self.status_namer = status_namer

    def __dealloc__(self):
        PyMem_Free(self.slot_of)
        PyMem_Free(self.responses)
        PyMem_Free(self.hist)

    cdef int slot_for(self, int64_t code) noexcept:
        cdef int s
        if code < 0 or code >= CODE_TABLE:
            return OTHER_SLOT
        s = self.slot_of[code]
        if s >= 0:
            return s
        if self.nslots >= OTHER_SLOT:
            self.slot_of[code] = OTHER_SLOT
            return OTHER_SLOT
        s = self.nslots
        self.nslots += 1
        self.slot_code[s] = code
        self.slot_of[code] = <int16_t>s
        return s

    cdef int status_slot(self, int64_t code) noexcept:
        cdef int i
        for i in range(self.nstatus):
            if self.status_code[i] == code:
                return i
        if self.nstatus < STATUS_SLOTS - 1:
            i = self.nstatus
            self.status_code[i] = code
            self.nstatus += 1
            return i
        return STATUS_SLOTS - 1

    cdef void observe(self, int slot, int outcome, int64_t dt_ns) noexcept:
        if dt_ns < 0:
            dt_ns = 0
        self.hist[(slot * 2 + outcome) * (N_BUCKETS + 1) + bucket_of(dt_ns)] += 1
        self.hist_sum[slot][outcome] += dt_ns * 1e-9

    cdef void response(self, int slot, int64_t status) noexcept:
        self.responses[slot * STATUS_SLOTS + self.status_slot(status)] += 1

    cdef void error(self, int direction, int reason) noexcept:
        if 0 <= reason < REASON_SLOTS:
            self.errors[direction][reason] += 1

    # ---- Python-level API (relay, tests, scrape) ----------------------------

    def count_bytes(self, int direction, Py_ssize_t n):
        self.relayed[direction] += n

    def observe_connect(self, double seconds):
        """Record one upstream connect duration (frametap_upstream_connect_duration_seconds)."""
        self.connect_hist[bucket_of(<int64_t>(seconds * 1e9))] += 1
        self.connect_sum += seconds

    def count_error(self, str direction, str reason):
        """Count a protocol error found outside a parser (e.g. by the relay)."""
        self.error(DIRECTIONS.index(direction), REASONS.index(reason))

    def opcode_slot(self, int64_t code):
        return self.slot_for(code)

    def snapshot(self):
        """Copy every counter into plain Python data (read at scrape time)."""
        cdef int d, s, o, b, r
        opname = self.opcode_namer or (lambda c: "unknown_%d" % c)
        stname = self.status_namer or str
        names = [opname(self.slot_code[s]) for s in range(self.nslots)]
        names.extend(["other"] * (OPCODE_SLOTS - self.nslots))
        statuses = [stname(self.status_code[s]) for s in range(self.nstatus)]
        while len(statuses) < STATUS_SLOTS:
            statuses.append("other")
        frames, fbytes, msgs, responses, hist, timeouts, errors = {}, {}, {}, {}, {}, {}, {}
        for d in range(2):
            for s in range(OPCODE_SLOTS):
                if self.frames[d][s]:
                    key = (DIRECTIONS[d], names[s])
                    frames[key] = frames.get(key, 0) + self.frames[d][s]
                    fbytes[key] = fbytes.get(key, 0) + self.frame_bytes[d][s]
                if self.messages[d][s]:
                    key = (DIRECTIONS[d], names[s])
                    msgs[key] = msgs.get(key, 0) + self.messages[d][s]
            for r in range(REASON_SLOTS):
                if self.errors[d][r]:
                    errors[(DIRECTIONS[d], REASONS[r])] = self.errors[d][r]
        for s in range(OPCODE_SLOTS):
            name = names[s]
            for r in range(STATUS_SLOTS):
                v = self.responses[s * STATUS_SLOTS + r]
                if v:
                    key = (name, statuses[r])
                    responses[key] = responses.get(key, 0) + v
            for o in range(2):
                counts = [self.hist[(s * 2 + o) * (N_BUCKETS + 1) + b]
                          for b in range(N_BUCKETS + 1)]
                if any(counts):
                    hist[(name, OUTCOMES[o])] = (counts, self.hist_sum[s][o])
            if self.timeouts[s]:
                timeouts[name] = timeouts.get(name, 0) + self.timeouts[s]
        return {
            "route": self.route, "protocol": self.protocol,
            "frames": frames, "frame_bytes": fbytes, "messages": msgs,
            "bytes": {DIRECTIONS[0]: self.relayed[0], DIRECTIONS[1]: self.relayed[1]},
            "responses": responses, "hist": hist, "timeouts": timeouts,
            "unmatched": self.unmatched, "in_flight": self.in_flight, "errors": errors,
            "conn_active": self.conn_active, "conn_total": self.conn_total,
            "conn_rejected": self.conn_rejected,
            "connect_failures": self.connect_failures,
            "connect_hist": ([self.connect_hist[b] for b in range(N_BUCKETS + 1)],
                             self.connect_sum),
        }


cdef class FrameParser:
    """Splits both directions of one connection into frames; protocols subclass it.

    feed(direction, data) accepts any slice of the stream (one byte, many frames,
    a frame's middle) and returns how many bytes were valid: len(data) normally,
    or the offset where a frame with a fatal error begins (then ``error`` is set and
    the connection should be closed after forwarding the valid prefix).
    """

    def __cinit__(self, RouteStats stats, *args, **kwargs):
        self.stats = stats
        self.fifo_cap = 8
        self.fifo = <Pending*>PyMem_Malloc(self.fifo_cap * sizeof(Pending))
        if self.fifo is NULL:
            raise MemoryError()
        self.fifo_limit = DEFAULT_FIFO_LIMIT
        memset(self.st, 0, sizeof(self.st))

    def __dealloc__(self):
        PyMem_Free(self.fifo)

    def __init__(self, RouteStats stats, max_frame_bytes=None, request_timeout=30.0):
        if max_frame_bytes is not None:
            self.max_frame_bytes = max_frame_bytes
        self.timeout_ns = <int64_t>(request_timeout * 1e9)
        self.st[0].need = self.header_size
        self.st[1].need = self.header_size

    # ---- hot path -----------------------------------------------------------

    cpdef Py_ssize_t feed(self, int direction, object data) except -1:
        cdef Py_buffer view
        cdef const uint8_t* buf
        cdef Py_ssize_t n, r
        if direction != 0 and direction != 1:
            raise ValueError("direction must be 0 (c2s) or 1 (s2c)")
        if PyBytes_Check(data):
            return self._feed(direction, <const uint8_t*>PyBytes_AS_STRING(data),
                              PyBytes_GET_SIZE(data))
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        try:
            r = self._feed(direction, <const uint8_t*>view.buf, view.len)
        finally:
            PyBuffer_Release(&view)
        return r

    cdef Py_ssize_t _feed(self, int d, const uint8_t* buf, Py_ssize_t n) except -1:
        cdef DirState* s = &self.st[d]
        cdef Py_ssize_t pos = 0, take
        cdef int64_t r, chunk_start = s.offset
        if self.error is not None or self.closed:
            return 0
        s.offset += n
        self.now_ns = monotonic_ns()           # one clock read per read (DESIGN.md)
        self.stats.relayed[d] += n
        while pos < n:
            if s.remaining > 0:                # inside a payload: pass it without copying
                take = n - pos
                if take > s.remaining:
                    take = s.remaining
                s.remaining -= take
                pos += take
                continue
            if s.have == 0:
                s.frame_start = chunk_start + pos
                if n - pos >= s.need:          # header contiguous in this read: no copy
                    r = self.on_header(d, buf + pos, n - pos)
                    if r > 0:
                        s.need = self.header_size
                        if r <= n - pos:
                            pos += r
                        else:
                            s.remaining = r - (n - pos)
                            pos = n
                        continue
                    if r == 0:
                        continue               # need was raised; retry or accumulate
                    return pos                 # fatal: the valid prefix ends here
            # header split across reads: copy just the header bytes
            take = s.need - s.have
            if take > n - pos:
                take = n - pos
            memcpy(s.hdr + s.have, buf + pos, take)
            s.have += take
            pos += take
            if s.have < s.need:
                break
            r = self.on_header(d, s.hdr, s.have)
            if r > 0:
                s.remaining = r - s.have
                s.have = 0
                s.need = self.header_size
            elif r < 0:
                take = <Py_ssize_t>(s.frame_start - chunk_start)
                return take if take > 0 else 0
        return n

    cdef int64_t on_header(self, int d, const uint8_t* h, Py_ssize_t avail) except -2:
        raise NotImplementedError("protocol parsers override on_header")

    # ---- helpers for protocols ---------------------------------------------

    cdef int fail(self, int d, int reason, str message) except -1:
        self.stats.error(d, reason)
        self.error = frame_error_class(self.stats.protocol)(
            "%s: %s" % (self.stats.protocol, message), REASONS[reason], DIRECTIONS[d],
            self.st[d].frame_start)
        return 0

    cdef int fifo_push(self, int32_t slot, int64_t key) except -1:
        cdef Pending* p
        cdef Py_ssize_t i, newcap
        if self.fifo_len == self.fifo_cap:
            if self.fifo_cap >= self.fifo_limit:
                # Too many unanswered requests: give up on the oldest (a timeout).
                p = self.fifo_pop()
                if p.expired == 0:
                    self.stats.timeouts[p.slot] += 1
                    self.stats.in_flight -= 1
                self.stats.error(C2S, _reason_overflow)
            else:
                newcap = self.fifo_cap * 2
                p = <Pending*>PyMem_Malloc(newcap * sizeof(Pending))
                if p is NULL:
                    raise MemoryError()
                for i in range(self.fifo_len):
                    p[i] = self.fifo[(self.fifo_head + i) % self.fifo_cap]
                PyMem_Free(self.fifo)
                self.fifo = p
                self.fifo_head = 0
                self.fifo_cap = newcap
        p = &self.fifo[(self.fifo_head + self.fifo_len) % self.fifo_cap]
        p.t_ns = self.now_ns
        p.key = key
        p.slot = slot
        p.expired = 0
        self.fifo_len += 1
        self.stats.in_flight += 1
        return 0

    cdef Pending* fifo_pop(self) noexcept:
        cdef Pending* p
        if self.fifo_len == 0:
            return NULL
        p = &self.fifo[self.fifo_head]
        self.fifo_head = (self.fifo_head + 1) % self.fifo_cap
        self.fifo_len -= 1
        return p

    cdef void settle(self, Pending* p, int outcome) noexcept:
        """A response matched request ``p``: observe its latency unless it timed out."""
        if p.expired == 0:
            self.stats.observe(p.slot, outcome, self.now_ns - p.t_ns)
            self.stats.in_flight -= 1

    # ---- lifecycle ------------------------------------------------------------

    def expire(self, int64_t now=0):
        """Count requests older than request_timeout as timeouts; returns how many."""
        cdef Py_ssize_t i
        cdef Pending* p
        cdef int n = 0
        if now == 0:
            now = monotonic_ns()
        for i in range(self.fifo_len):
            p = &self.fifo[(self.fifo_head + i) % self.fifo_cap]
            if p.expired:
                continue
            if now - p.t_ns < self.timeout_ns:
                break                    # FIFO: everything after is younger
            p.expired = 1
            self.stats.timeouts[p.slot] += 1
            self.stats.in_flight -= 1
            n += 1
        return n

    def close(self):
        """Connection ended: unanswered requests are timeouts, half frames are errors."""
        cdef Py_ssize_t i
        cdef Pending* p
        cdef int d
        if self.closed:
            return
        self.closed = True
        for i in range(self.fifo_len):
            p = &self.fifo[(self.fifo_head + i) % self.fifo_cap]
            if not p.expired:
                self.stats.timeouts[p.slot] += 1
                self.stats.in_flight -= 1
        self.fifo_len = 0
        if self.error is None:
            for d in range(2):
                if self.st[d].have > 0 or self.st[d].remaining > 0:
                    self.stats.error(d, _reason_truncated)

    @property
    def pending(self):
        """Number of requests awaiting a response (expired ones included)."""
        return self.fifo_len
