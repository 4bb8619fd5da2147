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
                                  DEFAULT_FIFO_LIMIT, DEFAULT_MAP_LIMIT)
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
    the connection should be closed after forwarding the valid prefix).  When the
    protocol rewrote or held bytes, ``output`` holds the list of bytes to forward
    instead of ``data[:returned]``.
    """

    def __cinit__(self, RouteStats stats, *args, **kwargs):
        self.stats = stats
        self.fifo_cap = 8
        self.fifo = <Pending*>PyMem_Malloc(self.fifo_cap * sizeof(Pending))
        if self.fifo is NULL:
            raise MemoryError()
        self.fifo_limit = DEFAULT_FIFO_LIMIT
        self.map_limit = DEFAULT_MAP_LIMIT
        self.captured = [None, None]
        memset(self.st, 0, sizeof(self.st))

    def __dealloc__(self):
        PyMem_Free(self.fifo)
        PyMem_Free(self.map)

    def __init__(self, RouteStats stats, max_frame_bytes=None, request_timeout=30.0,
                 options=None):
        if max_frame_bytes is not None:
            self.max_frame_bytes = max_frame_bytes
        self.timeout_ns = <int64_t>(request_timeout * 1e9)
        self.st[0].need = self.header_size
        self.st[1].need = self.header_size
        self.options = options or {}

    # ---- hot path -----------------------------------------------------------

    cpdef Py_ssize_t feed(self, int direction, object data) except -1:
        cdef Py_buffer view
        cdef Py_ssize_t r
        if direction != 0 and direction != 1:
            raise ValueError("direction must be 0 (c2s) or 1 (s2c)")
        if self.output is not None:
            self.output = None                 # belongs to the previous call only
        if PyBytes_Check(data) and not self.hold[direction]:
            return self._feed(direction, <const uint8_t*>PyBytes_AS_STRING(data),
                              PyBytes_GET_SIZE(data))
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        try:
            if self.hold[direction]:
                r = self._feed_rewriting(direction, data, <const uint8_t*>view.buf, view.len)
            else:
                r = self._feed(direction, <const uint8_t*>view.buf, view.len)
        finally:
            PyBuffer_Release(&view)
        return r

    cdef Py_ssize_t _feed(self, int d, const uint8_t* buf, Py_ssize_t n) except -1:
        cdef DirState* s = &self.st[d]
        cdef Py_ssize_t pos = 0, take, hs
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
                if s.body:
                    self.on_body(d, buf + pos, take)
                s.remaining -= take
                pos += take
                if s.remaining == 0 and s.body:
                    s.body = 0
                    self.on_body_end(d)
                continue
            if s.have == 0:
                s.frame_start = chunk_start + pos
                if n - pos >= s.need:          # header contiguous in this read: no copy
                    r = self.on_header(d, buf + pos, n - pos)
                    if r > 0:
                        hs = s.need
                        s.need = self.header_size
                        if s.body:             # the body streams through on_body()
                            pos += hs
                            s.remaining = r - hs
                            if s.remaining == 0:
                                s.body = 0
                                self.on_body_end(d)
                        elif r <= n - pos:
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
                if s.body and s.remaining == 0:
                    s.body = 0
                    self.on_body_end(d)
            elif r < 0:
                take = <Py_ssize_t>(s.frame_start - chunk_start)
                return take if take > 0 else 0
        return n

    cdef Py_ssize_t _feed_rewriting(self, int d, object data, const uint8_t* buf,
                                    Py_ssize_t n) except -1:
        """_feed() for a direction that may capture frames (hold[d]): builds ``output``.

        Slower than _feed() only when a frame is captured or a header spans reads.
        """
        cdef DirState* s = &self.st[d]
        cdef Py_ssize_t pos = 0, take, hs, emit = 0, held
        cdef int64_t r, chunk_start = s.offset
        cdef list out = []
        self.output = out
        if self.error is not None or self.closed:
            return 0
        mv = memoryview(data).cast("B")
        s.offset += n
        self.now_ns = monotonic_ns()
        self.stats.relayed[d] += n
        held = s.have                          # header bytes withheld from earlier reads
        while pos < n:
            if s.remaining > 0:
                take = n - pos
                if take > s.remaining:
                    take = s.remaining
                if s.capture:
                    self.captured[d] += mv[pos:pos + take]
                    emit = pos + take
                elif s.body:
                    self.on_body(d, buf + pos, take)
                s.remaining -= take
                pos += take
                if s.remaining == 0:
                    if s.capture:
                        s.capture = 0
                        out.append(self._rewrite(d))
                    elif s.body:
                        s.body = 0
                        self.on_body_end(d)
                continue
            if s.have == 0:
                s.frame_start = chunk_start + pos
                if n - pos >= s.need:
                    r = self.on_header(d, buf + pos, n - pos)
                    if r > 0:
                        hs = s.need
                        s.need = self.header_size
                        if s.capture:
                            if emit < pos:
                                out.append(bytes(mv[emit:pos]))
                            take = r if r <= n - pos else n - pos
                            self.captured[d] = bytearray(mv[pos:pos + take])
                            s.remaining = r - take
                            pos += take
                            emit = pos
                            if s.remaining == 0:
                                s.capture = 0
                                out.append(self._rewrite(d))
                        elif s.body:
                            pos += hs
                            s.remaining = r - hs
                            if s.remaining == 0:
                                s.body = 0
                                self.on_body_end(d)
                        elif r <= n - pos:
                            pos += r
                        else:
                            s.remaining = r - (n - pos)
                            pos = n
                        continue
                    if r == 0:
                        continue
                    if emit < pos:
                        out.append(bytes(mv[emit:pos]))
                    return pos
            take = s.need - s.have
            if take > n - pos:
                take = n - pos
            memcpy(s.hdr + s.have, buf + pos, take)
            s.have += take
            pos += take
            if s.have < s.need:
                # incomplete header at the end of this read: withhold its bytes
                hs = <Py_ssize_t>(s.frame_start - chunk_start)
                if hs < 0:
                    hs = 0
                if emit < hs:
                    out.append(bytes(mv[emit:hs]))
                emit = n
                break
            r = self.on_header(d, s.hdr, s.have)
            if r > 0:
                hs = <Py_ssize_t>(s.frame_start - chunk_start)   # < 0: began earlier
                if s.capture:
                    if hs > emit:
                        out.append(bytes(mv[emit:hs]))
                    self.captured[d] = bytearray(s.hdr[:s.have])
                    emit = pos
                elif held:
                    # release the withheld header bytes ahead of this read's bytes
                    out.append(bytes(s.hdr[:held]))
                held = 0
                s.remaining = r - s.have
                s.have = 0
                s.need = self.header_size
                if s.remaining == 0:
                    if s.capture:
                        s.capture = 0
                        out.append(self._rewrite(d))
                    elif s.body:
                        s.body = 0
                        self.on_body_end(d)
            elif r < 0:
                take = <Py_ssize_t>(s.frame_start - chunk_start)
                take = take if take > 0 else 0
                if emit < take:
                    out.append(bytes(mv[emit:take]))
                return take
        if emit < n:
            out.append(bytes(mv[emit:n]))
        return n

    cdef object _rewrite(self, int d):
        frame = bytes(self.captured[d])
        self.captured[d] = None
        return self.rewrite(d, frame)

    def set_hold(self, int d, bint on):
        """Enable frame capture in direction ``d`` (see rewrite())."""
        self.hold[d] = on

    def rewrite(self, int d, bytes frame):
        """A captured frame, whole; returns the bytes to forward in its place."""
        return frame

    cdef int64_t on_header(self, int d, const uint8_t* h, Py_ssize_t avail) except -2:
        raise NotImplementedError("protocol parsers override on_header")

    cdef int on_body(self, int d, const uint8_t* p, Py_ssize_t n) except -1:
        return 0

    cdef int on_body_end(self, int d) except -1:
        return 0

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

    # ---- correlation map ------------------------------------------------------

    cdef int map_put(self, int32_t tag, uint64_t key, int32_t slot) except -1:
        """Remember a request under (tag, key); a duplicate key replaces the older one."""
        cdef Py_ssize_t i, mask
        cdef MapEntry* e
        if self.map_len * 2 >= self.map_cap:
            if self.map_cap >= self.map_limit * 2:
                self.stats.error(C2S, _reason_overflow)   # bounded: drop, and say so
                return 0
            self._map_grow()
        mask = self.map_cap - 1
        i = _mix(tag, key) & mask
        while True:
            e = &self.map[i]
            if not e.used:
                e.used = 1
                e.tag = tag
                e.key = key
                self.map_len += 1
                self.stats.in_flight += 1
                break
            if e.tag == tag and e.key == key:
                if not e.p.expired:                 # the older one can never be answered
                    self.stats.timeouts[e.p.slot] += 1
                else:
                    self.stats.in_flight += 1
                break
            i = (i + 1) & mask
        e.p.t_ns = self.now_ns
        e.p.key = <int64_t>key
        e.p.slot = slot
        e.p.expired = 0
        return 0

    cdef int map_take(self, int32_t tag, uint64_t key, Pending* out) noexcept:
        """Remove the request under (tag, key) into ``out``; 0 when there is none."""
        cdef Py_ssize_t i, j, k, mask
        cdef MapEntry* e
        if self.map_len == 0:
            return 0
        mask = self.map_cap - 1
        i = _mix(tag, key) & mask
        while True:
            e = &self.map[i]
            if not e.used:
                return 0
            if e.tag == tag and e.key == key:
                break
            i = (i + 1) & mask
        out[0] = e.p
        # backward-shift deletion keeps probe chains intact without tombstones
        j = i
        while True:
            j = (j + 1) & mask
            if not self.map[j].used:
                break
            k = _mix(self.map[j].tag, self.map[j].key) & mask
            if (j > i and (k <= i or k > j)) or (j < i and (k <= i and k > j)):
                self.map[i] = self.map[j]
                i = j
        self.map[i].used = 0
        self.map_len -= 1
        return 1

    cdef int _map_grow(self) except -1:
        cdef Py_ssize_t old_cap = self.map_cap, i, j, mask
        cdef MapEntry* old = self.map
        cdef Py_ssize_t new_cap = old_cap * 2 if old_cap else 64
        self.map = <MapEntry*>PyMem_Malloc(new_cap * sizeof(MapEntry))
        if self.map is NULL:
            self.map = old
            raise MemoryError()
        memset(self.map, 0, new_cap * sizeof(MapEntry))
        self.map_cap = new_cap
        mask = new_cap - 1
        for i in range(old_cap):
            if old[i].used:
                j = _mix(old[i].tag, old[i].key) & mask
                while self.map[j].used:
                    j = (j + 1) & mask
                self.map[j] = old[i]
        PyMem_Free(old)
        return 0

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
        for i in range(self.map_cap):
            p = &self.map[i].p
            if self.map[i].used and not p.expired and now - p.t_ns >= self.timeout_ns:
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
        for i in range(self.map_cap):
            p = &self.map[i].p
            if self.map[i].used and not p.expired:
                self.stats.timeouts[p.slot] += 1
                self.stats.in_flight -= 1
            self.map[i].used = 0
        self.map_len = 0
        if self.error is None:
            for d in range(2):
                if self.st[d].have > 0 or self.st[d].remaining > 0:
                    self.stats.error(d, _reason_truncated)

    @property
    def pending(self):
        """Number of requests awaiting a response (expired ones included)."""
        return self.fifo_len + self.map_len


cdef inline uint64_t _mix(int32_t tag, uint64_t key) noexcept:
    # splitmix64 finalizer: spreads sequential ids over the table
    cdef uint64_t z = key + (<uint64_t>tag << 56) + 0x9E3779B97F4A7C15ULL
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL
    return z ^ (z >> 31)
