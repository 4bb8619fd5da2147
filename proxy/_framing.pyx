# cython: language_level=3
"""Compiled framing core: native per-route counters, the resumable frame splitter and
the single recording point every parser reports its frames to.

See _framing.pxd for the contract; framing_py.py is the pure-Python twin with the same
behaviour (selected by FRAMETAP_NO_EXTENSIONS=1).
"""

from cpython.bytes cimport (PyBytes_Check, PyBytes_AS_STRING, PyBytes_GET_SIZE,
                            PyBytes_FromStringAndSize)
from cpython.bytearray cimport (PyByteArray_FromStringAndSize, PyByteArray_Resize,
                                PyByteArray_AS_STRING, PyByteArray_GET_SIZE)
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from cpython.mem cimport PyMem_Malloc, PyMem_Realloc, PyMem_Free
from libc.string cimport memcpy, memset, memcmp, memmove
from cpython.pyport cimport PY_SSIZE_T_MAX
from libc.stdint cimport uint8_t, int16_t, int32_t, int64_t, uint64_t

import os

from proxy.errors import frame_error_class
from proxy.framing_common import (BUCKETS_NS, DIRECTIONS, REASONS, OUTCOMES,
                                  DEFAULT_FIFO_LIMIT, DEFAULT_MAP_LIMIT, record_dict)

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

#: The enum values of _framing.pxd, for the check that REASONS and KINDS agree.
REASON_IDS = {"bad_magic": R_BAD_MAGIC, "bad_version": R_BAD_VERSION,
              "frame_too_large": R_TOO_LARGE, "frame_too_small": R_TOO_SMALL,
              "truncated_frame": R_TRUNCATED, "in_flight_overflow": R_OVERFLOW,
              "response_mismatch": R_MISMATCH, "bad_header": R_BAD_HEADER,
              "unknown_command": R_UNKNOWN, "bad_body": R_BAD_BODY,
              "header_too_large": R_HEADER_TOO_LARGE, "parser_error": R_PARSER_ERROR,
              "header_rule": R_HEADER_RULE, "pending_budget": R_PENDING_BUDGET}
# the WebSocket reasons (proxy/websocket.py) follow, in REASONS' order from R_WS_FIRST
REASON_IDS.update({name: R_WS_FIRST + i for i, name in enumerate(
    [r for r in REASONS if r.startswith("ws_")])})
KIND_IDS = {"request": K_REQUEST, "response": K_RESPONSE, "oneway": K_ONEWAY,
            "event": K_EVENT}


cdef inline int64_t monotonic_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec


# Memory of every connection's pending-request state (map and FIFO capacity), against the
# process's budget ([proxy] max_pending_bytes, docs/design.md "Pending requests").
cdef int64_t _pending_bytes = 0
cdef int64_t _pending_budget = 1LL << 62
# one map slot: the entry and its request-ring slot (framing_common.MAP_ENTRY_BYTES)
cdef int64_t _MAP_SLOT_BYTES = sizeof(MapEntry) + sizeof(int32_t)

# Pending-map seeds: a secret drawn once per process, then one per map by splitmix64.
cdef uint64_t _seed_state = int.from_bytes(os.urandom(8), "little")


cdef uint64_t _next_seed() noexcept:
    global _seed_state
    cdef uint64_t z
    _seed_state += 0x9E3779B97F4A7C15ULL
    z = _seed_state
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL
    return z ^ (z >> 31)


def set_pending_budget(int64_t budget):
    """Most bytes all connections' pending-request tables may hold together; a table
    that would grow past it stays as it is (the request is dropped and counted as
    in_flight_overflow, or a full map evicts its oldest expired entry)."""
    global _pending_budget
    _pending_budget = budget


def pending_bytes():
    """Bytes the pending-request tables of this process hold now."""
    return _pending_bytes


def pending_budget():
    return _pending_budget


def now_ns():
    """The clock the parsers use (CLOCK_MONOTONIC, ns) — for expire() callers."""
    return monotonic_ns()


cdef inline int _decide(FrameParser self, int d) noexcept:
    """FrameParser._fault_decide(), inline where it runs per frame (_capture_head)."""
    cdef DirState* s = &self.st[d]
    cdef int slot, mode
    if s.capture & CAP_NEXT:
        s.capture = (s.capture & ~CAP_NEXT) | CAP_UNDECIDED
    if s.rec.messages < 0:
        return s.capture                   # not begun yet (begin() in on_body())
    s.capture &= ~CAP_UNDECIDED
    slot = s.rec.slot
    mode = self.fault_mode[d]
    if mode == 2 or (mode == 1 and 0 <= slot < OPCODE_SLOTS and
                     (self.fault_bits[d][slot >> 6] >> (slot & 63)) & 1):
        s.capture |= CAP_FAULT
    else:
        s.capture |= CAP_NEXT
    return s.capture & ~CAP_NEXT


cdef inline bytes _span(const uint8_t* buf, Py_ssize_t a, Py_ssize_t b):
    """buf[a:b] as bytes (a read's bytes, held or placed in ``output``)."""
    return PyBytes_FromStringAndSize(<const char*>buf + a, b - a)


cdef inline int _extend(bytearray ba, const uint8_t* p, Py_ssize_t n) except -1:
    """ba += p[:n] without a temporary object."""
    cdef Py_ssize_t old = PyByteArray_GET_SIZE(ba)
    if PyByteArray_Resize(ba, old + n) < 0:
        return -1
    memcpy(PyByteArray_AS_STRING(ba) + old, p, n)
    return 0


cdef inline bint _passes(FrameParser self, int d, int64_t r, Py_ssize_t avail) noexcept:
    """An armed direction's frame (capture == CAP_NEXT) whose opcode slot is known at
    its header and not armed: it passes as usual, decided here without a call (what
    _decide() and _capture_head() would do for it); 0 leaves it to _capture_head()."""
    cdef DirState* s = &self.st[d]
    cdef int slot = s.rec.slot
    cdef int mode = self.fault_mode[d]
    if s.rec.messages < 0 or mode == 2 or (mode == 1 and 0 <= slot < OPCODE_SLOTS and
                                           (self.fault_bits[d][slot >> 6] >> (slot & 63)) & 1):
        return 0
    if not s.body and r <= avail and not s.open:
        self._fault_rearm(d)               # it ends here and _frame_end() won't run
    return 1


cdef class RouteStats:
    """Every counter of one route, in C arrays (shared by all its connections)."""

    def __cinit__(self, route="route", protocol="unknown", opcode_namer=None,
                  status_namer=None):
        self.slot_of = <int16_t*>PyMem_Malloc(CODE_TABLE * sizeof(int16_t))
        self.c.responses = <uint64_t*>PyMem_Malloc(
            OPCODE_SLOTS * STATUS_SLOTS * sizeof(uint64_t))
        self.c.hist = <uint64_t*>PyMem_Malloc(
            OPCODE_SLOTS * 2 * (N_BUCKETS + 1) * sizeof(uint64_t))
        if self.slot_of is NULL or self.c.responses is NULL or self.c.hist is NULL:
            raise MemoryError()
        memset(self.slot_of, 0xFF, CODE_TABLE * sizeof(int16_t))   # all -1
        self.unknown_slot = -1
        memset(self.name_slot_of, 0xFF, sizeof(self.name_slot_of))
        self.slot_label = [None] * OPCODE_SLOTS
        memset(self.c.responses, 0, OPCODE_SLOTS * STATUS_SLOTS * sizeof(uint64_t))
        memset(self.c.hist, 0, OPCODE_SLOTS * 2 * (N_BUCKETS + 1) * sizeof(uint64_t))
        for i in range(N_BUCKETS):
            self.c.bounds[i] = _bounds[i]
        self.route = str(route)
        self.protocol = str(protocol)
        self.opcode_namer = opcode_namer
        self.status_namer = status_namer

    @property
    def unmatched(self):
        return self.c.unmatched

    @property
    def in_flight(self):
        return self.c.in_flight

    def __dealloc__(self):
        PyMem_Free(self.slot_of)
        PyMem_Free(self.c.responses)
        PyMem_Free(self.c.hist)

    cdef int slot_for(self, int64_t code) noexcept:
        cdef int s
        if code < 0 or code >= CODE_TABLE:
            return OTHER_SLOT
        s = self.slot_of[code]
        if s >= 0:
            return s
        if s == -1 and self.has_known:         # not in the protocol's table
            if self.n_unknown >= UNKNOWN_LABELS:
                s = self._shared_unknown()
                self.slot_of[code] = <int16_t>s
                return s
            self.n_unknown += 1
        if self.nslots >= OTHER_SLOT:
            self.slot_of[code] = OTHER_SLOT
            return OTHER_SLOT
        s = self.nslots
        self.nslots += 1
        self.slot_code[s] = code
        self.slot_of[code] = <int16_t>s
        return s

    cdef int _shared_unknown(self) noexcept:
        if self.unknown_slot < 0:
            if self.nslots >= OTHER_SLOT:
                return OTHER_SLOT
            self.unknown_slot = self.nslots
            self.nslots += 1
            self.slot_code[self.unknown_slot] = -1
            self.slot_label[self.unknown_slot] = b"unknown"
        return self.unknown_slot

    def describe(self, opcode_namer, status_namer, known_codes):
        """What a protocol tells its route once (the first parser does; later ones find
        it done): how to name opcodes and statuses, and its opcode table."""
        if self.opcode_namer is None:
            self.opcode_namer = opcode_namer
        if self.status_namer is None:
            self.status_namer = status_namer
        if not self.has_known:
            self.set_known(known_codes)

    def set_known(self, codes):
        """The protocol's opcode table: these codes always get their own label (while
        slots last); any other code is one of at most UNKNOWN_LABELS unknown_<n> labels,
        then "unknown"."""
        cdef int64_t code
        for code in codes:
            if 0 <= code < CODE_TABLE and self.slot_of[code] == -1:
                self.slot_of[code] = -2
        self.has_known = True

    cdef int slot_for_name(self, const uint8_t* name, Py_ssize_t n) except -1:
        """Slot of an opcode known by name (Thrift method...): interned, at most
        OTHER_SLOT distinct per route (shared with numeric codes), then OTHER_SLOT."""
        cdef uint64_t h = 0xCBF29CE484222325ULL
        cdef Py_ssize_t i
        cdef int s, j
        cdef object label
        for i in range(n):
            h = (h ^ name[i]) * 0x100000001B3ULL
        j = <int>(h & (NAME_TABLE - 1))
        while True:
            s = self.name_slot_of[j]
            if s < 0:
                break
            if self.name_hash[s] == h:
                label = self.slot_label[s]
                if PyBytes_GET_SIZE(label) == n and memcmp(PyBytes_AS_STRING(label), name, n) == 0:
                    return s
            j = (j + 1) & (NAME_TABLE - 1)
        if self.nslots >= OTHER_SLOT:
            return OTHER_SLOT
        s = self.nslots
        self.nslots += 1
        self.slot_code[s] = -1
        self.name_hash[s] = h
        self.slot_label[s] = PyBytes_FromStringAndSize(<const char*>name, n)
        self.name_slot_of[j] = <int16_t>s
        return s




    cdef void error(self, int direction, int reason) noexcept:
        _count_error(&self.c, direction, reason)

    # ---- Python-level API (relay, tests, scrape) ----------------------------

    def count_bytes(self, int direction, Py_ssize_t n):
        self.c.relayed[direction] += n

    def observe_connect(self, double seconds):
        """Record one upstream connect duration (frametap_upstream_connect_duration_seconds)."""
        self.connect_hist[_bucket(self.c.bounds, <int64_t>(seconds * 1e9))] += 1
        self.connect_sum += seconds

    def count_error(self, str direction, str reason):
        """Count a protocol error found outside a parser (e.g. by the relay)."""
        self.error(DIRECTIONS.index(direction), REASONS.index(reason))

    def opcode_slot(self, int64_t code):
        return self.slot_for(code)

    def name_slot(self, name):
        """Slot of an opcode name (bytes or str), interned as parsers do."""
        cdef bytes b = name.encode() if isinstance(name, str) else bytes(name)
        return self.slot_for_name(<const uint8_t*>PyBytes_AS_STRING(b), len(b))

    def slot_name(self, int slot):
        """The opcode label of ``slot`` (frame log, tests)."""
        if slot < 0 or slot >= self.nslots:
            return "other"
        if self.slot_label[slot] is not None:
            return self.slot_label[slot].decode("utf-8", "replace")
        return (self.opcode_namer or (lambda c: "unknown_%d" % c))(self.slot_code[slot])

    def slot_opcode(self, int slot):
        """The numeric opcode of ``slot`` (-1 for interned names and "other")."""
        if slot < 0 or slot >= self.nslots:
            return -1
        return self.slot_code[slot]

    def snapshot(self):
        """Copy every counter into plain Python data (read at scrape time)."""
        cdef int d, s, o, b, r
        opname = self.opcode_namer or (lambda c: "unknown_%d" % c)
        stname = self.status_namer or str
        names = [opname(self.slot_code[s]) if self.slot_label[s] is None
                 else self.slot_label[s].decode("utf-8", "replace")
                 for s in range(self.nslots)]
        names.extend(["other"] * (OPCODE_SLOTS - self.nslots))
        statuses = [stname(self.c.status_code[s]) for s in range(self.c.nstatus)]
        while len(statuses) < STATUS_SLOTS:
            statuses.append("other")
        frames, fbytes, msgs, responses, hist, timeouts, errors = {}, {}, {}, {}, {}, {}, {}
        cutoffs = {}
        for d in range(2):
            for s in range(OPCODE_SLOTS):
                if self.c.frames[d][s]:
                    key = (DIRECTIONS[d], names[s])
                    frames[key] = frames.get(key, 0) + self.c.frames[d][s]
                    fbytes[key] = fbytes.get(key, 0) + self.c.frame_bytes[d][s]
                if self.c.messages[d][s]:
                    key = (DIRECTIONS[d], names[s])
                    msgs[key] = msgs.get(key, 0) + self.c.messages[d][s]
            for r in range(N_REASONS):
                if self.c.errors[d][r]:
                    errors[(DIRECTIONS[d], REASONS[r])] = self.c.errors[d][r]
        for s in range(OPCODE_SLOTS):
            name = names[s]
            for r in range(STATUS_SLOTS):
                v = self.c.responses[s * STATUS_SLOTS + r]
                if v:
                    key = (name, statuses[r])
                    responses[key] = responses.get(key, 0) + v
            for o in range(2):
                counts = [self.c.hist[(s * 2 + o) * (N_BUCKETS + 1) + b]
                          for b in range(N_BUCKETS + 1)]
                if any(counts):
                    hist[(name, OUTCOMES[o])] = (counts, self.c.hist_sum[s][o])
            if self.c.timeouts[s]:
                timeouts[name] = timeouts.get(name, 0) + self.c.timeouts[s]
            if self.c.cutoffs[s]:
                cutoffs[name] = cutoffs.get(name, 0) + self.c.cutoffs[s]
        return {
            "route": self.route, "protocol": self.protocol,
            "frames": frames, "frame_bytes": fbytes, "messages": msgs,
            "bytes": {DIRECTIONS[0]: self.c.relayed[0], DIRECTIONS[1]: self.c.relayed[1]},
            "responses": responses, "hist": hist, "timeouts": timeouts, "cutoffs": cutoffs,
            "unmatched": self.c.unmatched, "in_flight": self.c.in_flight, "errors": errors,
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
        global _pending_bytes
        self.stats = stats
        self.c = &stats.c
        self.fifo_cap = 8
        self.fifo = <Pending*>PyMem_Malloc(self.fifo_cap * sizeof(Pending))
        if self.fifo is NULL:
            raise MemoryError()
        _pending_bytes += self.fifo_cap * sizeof(Pending)
        self.fifo_limit = DEFAULT_FIFO_LIMIT
        self.map_seed = _next_seed()
        self.map_limit = DEFAULT_MAP_LIMIT
        self.header_limit = HEADER_LIMIT
        self.captured = [None, None]
        memset(self.st, 0, sizeof(self.st))

    def __dealloc__(self):
        global _pending_bytes
        if self.fifo is not NULL:
            _pending_bytes -= self.fifo_cap * sizeof(Pending)
        _pending_bytes -= self.map_cap * _MAP_SLOT_BYTES
        PyMem_Free(self.fifo)
        PyMem_Free(self.map)
        PyMem_Free(self.ring)
        _pending_bytes -= self.st[0].hcap + self.st[1].hcap
        PyMem_Free(self.st[0].hbuf)
        PyMem_Free(self.st[1].hbuf)
        PyMem_Free(self.st[0].attrs)
        PyMem_Free(self.st[1].attrs)
        if self.cs is not NULL:
            PyMem_Free(self.cs.ctext)
            PyMem_Free(self.cs)

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
        if PyBytes_Check(data):
            r = self._feed(direction, data, <const uint8_t*>PyBytes_AS_STRING(data),
                           PyBytes_GET_SIZE(data))
        else:
            PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
            try:
                r = self._feed(direction, data, <const uint8_t*>view.buf, view.len)
            finally:
                PyBuffer_Release(&view)
        if self._tracer_error is not None:
            self._raise_tracer_error()
        return r

    def _raise_tracer_error(self):
        """A test's tracer raised (an assertion, say): the test fails with it, after the
        parser finished the call in a consistent state."""
        err, self._tracer_error = self._tracer_error, None
        if err is not None:
            raise err

    cdef Py_ssize_t _feed(self, int d, object data, const uint8_t* buf,
                          Py_ssize_t n) except -1:
        """The one feed loop.  With hold[d] (a direction that may capture frames for
        rewriting) it also builds ``output``; that costs only when a frame is captured
        or a header spans reads."""
        cdef DirState* s = &self.st[d]
        cdef Py_ssize_t pos = 0, take, hs, asked, emit = 0, held = 0
        cdef int64_t r, chunk_start = s.offset
        cdef bint hold = self.hold[d]
        cdef list out = None
        if hold:
            out = []
            self.output = out
            held = s.have                      # header bytes withheld from earlier reads
        if self.error is not None or self.closed:
            return 0
        s.offset += n
        self.feed_frames = 0
        # One clock read per read, not per frame (docs/design.md, "Performance principles").
        self.now_ns = monotonic_ns()
        self.c.relayed[d] += n
        while pos < n:
            if s.remaining > 0:                # inside a payload: pass it without copying
                take = n - pos
                if take > s.remaining:
                    take = s.remaining
                if s.capture:
                    emit = self._capture_more(d, buf + pos, pos, take, emit)
                elif s.body:
                    self.on_body(d, buf + pos, take)
                s.remaining -= take
                pos += take
                if s.remaining == 0 and (s.capture or s.body or s.open):
                    self._frame_end(d, out)
                continue
            if s.have == 0:
                s.frame_start = chunk_start + pos
                if n - pos >= s.need:          # header contiguous in this read: no copy
                    asked = s.need
                    r = self.on_header(d, buf + pos, n - pos)
                    if r > 0:
                        self.feed_frames += 1
                        s.need = self.header_size
                        if r < asked or (s.body and (s.skip > n - pos or s.skip > r)):
                            return self._contract_error(d, r, asked, pos, emit, buf, out)
                        if s.capture and not (s.capture == CAP_NEXT and
                                              _passes(self, d, r, n - pos)):
                            take = self._capture_head(d, r, pos, emit, n, buf, out)
                            if take >= 0:      # held: the read goes on after its bytes
                                pos = emit = take
                                continue
                        if s.body:           # the body streams through on_body()
                            pos += s.skip
                            s.remaining = r - s.skip
                            if s.remaining == 0:
                                self._frame_end(d, out)
                        elif r <= n - pos:
                            pos += r
                            if s.open:
                                self._frame_end(d, out)
                        else:
                            s.remaining = r - (n - pos)
                            pos = n
                        continue
                    if r == 0:
                        continue               # want_header() raised need: retry or copy
                    if hold and emit < pos:
                        out.append(_span(buf, emit, pos))
                    return pos                 # fatal: the valid prefix ends here
            # header split across reads: copy just the header bytes
            if s.need > s.hcap and self._hbuf_reserve(d, s.need) < 0:
                return self._fatal_prefix(d, chunk_start, emit, buf, out)
            take = s.need - s.have
            if take > n - pos:
                take = n - pos
            memcpy(s.hbuf + s.have, buf + pos, take)
            s.have += take
            pos += take
            if s.have < s.need:
                if hold:                       # withhold an incomplete header: it may
                    hs = <Py_ssize_t>(s.frame_start - chunk_start)   # start a capture
                    if hs < 0:
                        hs = 0
                    if emit < hs:
                        out.append(_span(buf, emit, hs))
                    emit = n
                break
            asked = s.have
            r = self.on_header(d, s.hbuf, s.have)
            if r > 0:
                self.feed_frames += 1
                if r < asked or (s.body and (s.skip > asked or s.skip > r)):
                    self._short_frame(d, r, asked)
                    return self._fatal_prefix(d, chunk_start, emit, buf, out)
                if hold:
                    if s.capture & (CAP_UNDECIDED | CAP_NEXT):
                        self._fault_decide(d)
                    hs = <Py_ssize_t>(s.frame_start - chunk_start)   # < 0: began earlier
                    if s.capture & ~CAP_NEXT:
                        if hs > emit:
                            out.append(_span(buf, emit, hs))
                        self.captured[d] = bytearray(s.hbuf[:s.have])
                        emit = pos
                    elif held:
                        # release the withheld header bytes ahead of this read's bytes
                        out.append(bytes(s.hbuf[:held]))
                    held = 0
                self._header_done(d, r, asked, s.hbuf)
                if s.remaining == 0 and (s.capture or s.body or s.open):
                    self._frame_end(d, out)
            elif r < 0:
                return self._fatal_prefix(d, chunk_start, emit, buf, out)
        if hold and emit < n:
            self._hold_tail(d, n, emit, data, buf, out)
        return n

    cdef int _hold_tail(self, int d, Py_ssize_t n, Py_ssize_t emit, object data,
                        const uint8_t* buf, list out) except -1:
        """End of a read with hold on: what is not yet placed in ``out`` goes there,
        except a split header whose on_header() asked for more (want_header): that is
        withheld like any incomplete header (out of line: the loop stays small)."""
        cdef DirState* s = &self.st[d]
        cdef Py_ssize_t hs
        if s.have:
            hs = <Py_ssize_t>(s.frame_start - (s.offset - n))
            if hs > emit:
                out.append(_span(buf, emit, hs))
        elif emit == 0 and PyBytes_Check(data):
            if out:
                out.append(data)               # the whole read goes on: no copy
            else:
                self.output = None             # as it came: the relay writes it itself
        else:
            out.append(_span(buf, emit, n))
        return 0

    cdef int _header_done(self, int d, int64_t r, Py_ssize_t seen,
                          const uint8_t* h) except -1:
        """A header gathered across reads was accepted: `seen` bytes of the frame are
        consumed.  Body bytes among them go to on_body() (copied out of hbuf first,
        since on_body() may gather() into hbuf)."""
        cdef DirState* s = &self.st[d]
        cdef bytes rest
        s.have = 0
        s.need = self.header_size
        s.remaining = r - seen
        if s.body and s.skip < seen:           # (a held frame streams its body too)
            rest = PyBytes_FromStringAndSize(<const char*>h + s.skip, seen - s.skip)
            self.on_body(d, <const uint8_t*>PyBytes_AS_STRING(rest), seen - s.skip)
        if s.hcap > HBUF_KEEP:
            self._hbuf_release(d)
        return 0

    cdef Py_ssize_t _fatal_prefix(self, int d, int64_t chunk_start, Py_ssize_t emit,
                                  const uint8_t* buf, list out) except -1:
        cdef Py_ssize_t take = <Py_ssize_t>(self.st[d].frame_start - chunk_start)
        if take < 0:
            take = 0
        if out is not None and emit < take:
            out.append(_span(buf, emit, take))
        return take

    cdef Py_ssize_t _contract_error(self, int d, int64_t r, Py_ssize_t asked, Py_ssize_t pos,
                                    Py_ssize_t emit, const uint8_t* buf, list out) except -1:
        self._short_frame(d, r, asked)
        if out is not None and emit < pos:
            out.append(_span(buf, emit, pos))
        return pos

    cdef int _short_frame(self, int d, int64_t r, Py_ssize_t asked) except -1:
        self.fail(d, R_BAD_HEADER, "frame of %d bytes at offset %d is shorter than the %d "
                  "header bytes its parser read, or its body skip is longer (parser "
                  "contract)" % (r, self.st[d].frame_start, asked))
        return 0

    cdef int _hbuf_reserve(self, int d, Py_ssize_t n) except -1:
        """Grow direction d's header buffer to n bytes; -2 after fail() past header_limit
        or the pending budget (-1 is a raised exception)."""
        cdef DirState* s = &self.st[d]
        global _pending_bytes
        cdef uint8_t* nb
        cdef Py_ssize_t cap
        if n <= s.hcap:
            return 0
        if n > self.header_limit:
            self.fail(d, R_HEADER_TOO_LARGE, "a header of %d bytes at offset %d exceeds the "
                      "header limit %d" % (n, s.frame_start, self.header_limit))
            return -2
        cap = s.hcap if s.hcap else 64
        while cap < n:
            cap *= 2
        if cap > self.header_limit:
            cap = self.header_limit
        if _pending_bytes + (cap - s.hcap) > _pending_budget:
            # partial headers are pending memory too: 10,000 connections each holding a
            # 64 KiB header would otherwise sit outside every budget
            self.fail(d, R_PENDING_BUDGET, "a header of %d bytes at offset %d does not fit "
                      "the pending-memory budget (max_pending_bytes)" % (n, s.frame_start))
            return -2
        nb = <uint8_t*>PyMem_Realloc(s.hbuf, cap)
        if nb is NULL:
            raise MemoryError()
        _pending_bytes += cap - s.hcap
        s.hbuf = nb
        s.hcap = cap
        return 0

    cdef void _hbuf_release(self, int d) noexcept:
        """A big split-header buffer is given back once its header is done."""
        global _pending_bytes
        cdef DirState* s = &self.st[d]
        if s.hcap > HBUF_KEEP and s.ghave == 0 and s.have == 0:
            _pending_bytes -= s.hcap
            PyMem_Free(s.hbuf)
            s.hbuf = NULL
            s.hcap = 0

    cdef int _frame_end(self, int d, list out) except -1:
        """The frame's last byte has passed: finish body/capture, emit its record."""
        cdef DirState* s = &self.st[d]
        cdef bytes frame
        cdef int cap = s.capture
        if s.body:
            s.body = 0
            self.on_body_end(d)
        s.capture = 0
        if cap & ~CAP_NEXT:                    # a held frame
            if cap & CAP_UNDECIDED:
                s.capture = cap
                self._fault_decide(d)
                cap = s.capture & ~(CAP_UNDECIDED | CAP_NEXT)   # never began: let go
                s.capture = 0
            frame = bytes(self.captured[d])
            self.captured[d] = None
            if cap & CAP_REWRITE:
                frame = self.rewrite(d, frame)
            if cap & CAP_FAULT and self.fault_hook is not None:
                out.append(self.fault_hook(d, frame))
            else:
                out.append(frame)
        s.ghave = 0
        if s.hcap > HBUF_KEEP:
            self._hbuf_release(d)
        if s.open:
            s.open = 0
            self._emit(&s.rec)
        if self.fault_mode[d] and self.hold[d]:
            self._fault_rearm(d)               # decide the next frame at its header
        return 0

    cdef bint _fault_wants(self, int d) noexcept:
        cdef int slot = self.st[d].rec.slot
        if self.fault_mode[d] == 2:
            return 1
        return self.fault_mode[d] == 1 and 0 <= slot < OPCODE_SLOTS and \
            (self.fault_bits[d][slot >> 6] >> (slot & 63)) & 1

    cdef Py_ssize_t _capture_head(self, int d, int64_t r, Py_ssize_t pos, Py_ssize_t emit,
                                  Py_ssize_t n, const uint8_t* buf, list out) except -2:
        """A frame whose header is whole in this read, with capture bits set: hold it
        from its first byte (returns where the read goes on), or -1 when an armed
        direction's frame turns out not to be armed (it passes as usual).  Out of line,
        as _capture_more(): the feed loop stays as small as without captures."""
        cdef DirState* s = &self.st[d]
        cdef Py_ssize_t take
        if s.capture & (CAP_UNDECIDED | CAP_NEXT) and not _decide(self, d):
            if not s.body and r <= n - pos and not s.open:
                self._fault_rearm(d)           # it ends here and _frame_end() won't run
            return -1
        if emit < pos:
            out.append(_span(buf, emit, pos))
        take = r if r <= n - pos else n - pos
        self.captured[d] = PyByteArray_FromStringAndSize(<const char*>buf + pos, take)
        if s.body and take > s.skip:           # held for faults: the body still streams
            self.on_body(d, buf + pos + s.skip, take - s.skip)
        s.remaining = r - take
        if s.remaining == 0:
            self._frame_end(d, out)
        return pos + take

    cdef Py_ssize_t _capture_more(self, int d, const uint8_t* p, Py_ssize_t pos,
                                  Py_ssize_t take, Py_ssize_t emit) except -1:
        """More bytes of a held frame (and its body, for a frame held for faults);
        returns where the bytes not yet placed in the output start."""
        cdef DirState* s = &self.st[d]
        if s.capture & ~CAP_NEXT:
            _extend(self.captured[d], p, take)
            emit = pos + take
        if s.body:
            self.on_body(d, p, take)
        return emit

    cdef void _mark_injected(self, int d) noexcept:
        """A row of a frame the fault engine made: attrs.injected = "1" and attrs.fault =
        its rule, once per frame (entry()'s later rows share the frame's attrs)."""
        cdef DirState* s = &self.st[d]
        cdef bytes name
        if self.fault_marked[d] == s.frame_start + 1:
            return
        self.fault_marked[d] = s.frame_start + 1
        add_attr(self, d, b"injected", 8, b"1", 1)
        name = self.fault_names[d] if self.fault_names is not None else None
        if name is not None:               # the rule that made it (attrs.fault)
            add_attr(self, d, b"fault", 5, <const uint8_t*>PyBytes_AS_STRING(name), len(name))

    cdef int _fault_decide(self, int d) noexcept:
        """At an armed frame's header (CAP_NEXT) or end: once begin() named its opcode
        slot, keep it for the fault hook (CAP_FAULT) or let it go (CAP_NEXT: the next
        frame is decided in turn); until then hold it (CAP_UNDECIDED).  Returns the bits
        that hold the frame (0: it passes).  begin() always sets rec.messages = 0, over
        the -1 _fault_rearm() left: that tells a begun frame without recording."""
        return _decide(self, d)

    cdef void _fault_rearm(self, int d) noexcept:
        """Between two frames of an armed direction: decide the next at its header."""
        self.st[d].capture = CAP_NEXT
        self.st[d].rec.messages = -1
        self.fault_fifo_mark[d] = self.fifo_seq

    # ---- faults (proxy/faults.py; docs/design.md, "Faults") ------------------

    def set_faults(self, int d, int mode, slots=(), bint record=True):
        """Arm direction d: mode 0 off, 1 the opcode slots in ``slots``, 2 every frame.
        Armed frames go whole to ``fault_hook(d, frame)``, whose result is forwarded in
        their place.  Returns False when the change must wait for a frame boundary (a
        header split across reads was forwarded, or a held frame is unfinished): call
        again after the next read."""
        cdef DirState* s = &self.st[d]
        cdef int slot, w
        if d != 0 and d != 1:
            raise ValueError("direction must be 0 (c2s) or 1 (s2c)")
        for w in range(FAULT_WORDS):
            self.fault_bits[d][w] = 0
        for slot in slots:
            if 0 <= slot < OPCODE_SLOTS:
                self.fault_bits[d][slot >> 6] |= (<uint64_t>1) << (slot & 63)
        self.fault_mode[d] = mode if 0 <= mode <= 2 else 2
        self.fault_record[d] = record
        self.fault_rec = (self.fault_mode[0] != 0 and self.fault_record[0]) or \
            (self.fault_mode[1] != 0 and self.fault_record[1])
        self.recording = self.log is not None or self._tracer is not None or self.fault_rec
        if self.fault_mode[d]:
            if not self.hold[d]:
                if s.have:
                    return False               # those header bytes were forwarded already
                self.hold[d] = 1
                self.fault_hold[d] = 1
            if not s.capture & ~CAP_NEXT:
                if s.have:
                    return False               # mid-header: at the next boundary
                if s.remaining == 0:
                    self._fault_rearm(d)
                else:                          # mid-frame: it passes, the next is decided
                    s.capture = CAP_NEXT
            return True
        if s.capture & (CAP_NEXT | CAP_UNDECIDED) == s.capture and s.have == 0 \
                and s.remaining == 0:
            s.capture = 0                      # nothing held
        if self.fault_hold[d]:
            if s.capture or s.have:
                return False                   # a held frame or header: at its end
            self.hold[d] = 0
            self.fault_hold[d] = 0
        return True

    def fault_armed(self, int d):
        """(mode, hold) of direction d (tests)."""
        return self.fault_mode[d], bool(self.hold[d])

    def fault_info(self, int d):
        """From fault_hook: (opcode slot, kind, correlation id, resource bytes or None,
        whether the frame is the newest FIFO request) of the frame being handed over."""
        cdef DirState* s = &self.st[d]
        cdef FrameRecord* rec = &s.rec
        cdef bint fifo = 0
        res = None
        if s.open and s.res_len >= 0:
            res = (<const char*>&s.res[0])[:s.res_len]
        if self.fifo_len and self.fifo_seq != self.fault_fifo_mark[d]:
            # this frame pushed the newest FIFO entry: a request answered in order
            fifo = self.fifo[(self.fifo_head + self.fifo_len - 1) & (self.fifo_cap - 1)].key \
                == self.fifo_seq
        return (rec.slot, rec.kind if s.open else -1,
                <uint64_t>self.fifo_seq if fifo else (<uint64_t>rec.corr if s.open else 0),
                res, fifo)

    def fault_attr(self, int d, bytes key, bytes value):
        """An attrs entry on the frame being handed over (attrs.fault = rule name)."""
        if self.st[d].open:
            add_attr(self, d, <const uint8_t*>PyBytes_AS_STRING(key), len(key),
                     <const uint8_t*>PyBytes_AS_STRING(value), len(value))

    def fault_mark(self, int d, bint on, bytes rule=None):
        """Frames fed while on were made by the proxy: attrs.injected = "1" (and
        attrs.fault = ``rule``, the rule that made them)."""
        self.fault_marking[d] = on
        if self.fault_names is None:
            self.fault_names = [None, None]
        self.fault_names[d] = rule if on else None

    def fault_forget(self):
        """The FIFO request just handed over never reaches the server: take it out of
        the FIFO (later answers pair with later requests) and count it as a timeout."""
        cdef Pending* p
        if self.fifo_len == 0:
            return False
        p = &self.fifo[(self.fifo_head + self.fifo_len - 1) & (self.fifo_cap - 1)]
        if p.key != self.fifo_seq or p.flags & P_EXPIRED:
            return False
        self._timeout(p, 0)
        self.fifo_len -= 1
        return True

    def fault_step(self, int d):
        """(at a frame boundary, bytes to feed before the next point where it may be)."""
        cdef DirState* s = &self.st[d]
        if s.remaining > 0:
            return False, s.remaining
        return s.have == 0, s.need - s.have

    def fifo_first(self):
        """Sequence number of the oldest request awaiting its answer in order, or -1."""
        if self.fifo_len == 0:
            return -1
        return self.fifo[self.fifo_head].key

    def set_hold(self, int d, bint on):
        """Enable frame capture in direction ``d`` (see rewrite())."""
        self.hold[d] = on

    def rewrite(self, int d, bytes frame):
        """A captured frame, whole; returns the bytes to forward in its place."""
        return frame

    # ---- protocol hooks -------------------------------------------------------

    cdef int64_t on_header(self, int d, const uint8_t* h, Py_ssize_t avail) except -2:
        raise NotImplementedError("protocol parsers override on_header")

    cdef int on_body(self, int d, const uint8_t* p, Py_ssize_t n) except -1:
        return 0

    cdef int on_body_end(self, int d) except -1:
        return 0

    # ---- helpers of the recording calls (_framing.pxd) ---------------------

    cdef int fail(self, int d, int reason, str message) except -1:
        self.stats.error(d, reason)
        self.error = frame_error_class(self.stats.protocol)(
            "%s: %s" % (self.stats.protocol, message), REASONS[reason], DIRECTIONS[d],
            self.st[d].frame_start)
        return 0

    cdef void _timeout(self, Pending* p, int tag) noexcept:
        """Request p will never be answered in time: count it, emit its event row."""
        cdef FrameRecord ev
        cdef CorrText* t
        cdef CorrState* cs
        p.flags |= P_EXPIRED
        if self.closed:                    # close(): its connection ended first
            self.c.cutoffs[p.slot] += 1
        else:
            self.c.timeouts[p.slot] += 1
        self.c.in_flight -= 1
        if not self.recording:
            return
        memset(&ev, 0, sizeof(ev))
        ev.t_ns = self.now_ns if self.now_ns else monotonic_ns()
        ev.latency_ns = -1
        ev.corr = p.key
        ev.corr_hi = p.aux if not p.flags & P_FIFO else -1
        ev.corr_fmt = _corr_fmt(ev.corr_hi)
        ev.opcode = self.stats.slot_code[p.slot] if p.slot < self.stats.nslots else -1
        ev.resource = -1
        ev.attrs = -1
        ev.slot = <int16_t>p.slot
        ev.req_slot = <int16_t>p.slot
        ev.direction = 1 if p.flags & P_S2C else 0
        ev.kind = K_EVENT
        ev.status = EV_CLOSED if self.closed else EV_TIMEOUT
        ev.outcome = OUTCOME_NONE
        cs = self.cs
        t = self._ctext_find(ev.direction, p.slot, p.key) if cs is not NULL and cs.len else NULL
        if t is not NULL:                  # the request's string id (set_corr_str)
            ev.corr_fmt = CORR_NONE if t.none else CORR_STR
            cs.ev_text = t.text
            cs.ev_text_len = t.len
            _ctext_drop(t, self)
        elif cs is not NULL and cs.cap:    # evicted, or sent before recording began
            ev.corr_fmt = CORR_NONE
        self._emit(&ev)

    cdef CorrState* _corr_state(self) noexcept:
        """set_corr_str()'s state, allocated on first use (NULL: out of memory)."""
        if self.cs is NULL:
            self.cs = <CorrState*>PyMem_Malloc(sizeof(CorrState))
            if self.cs is not NULL:
                memset(self.cs, 0, sizeof(CorrState))
        return self.cs

    cdef int _ctext_keep(self, int d, FrameRecord* rec) except -1:
        """set_corr_str() on a request: keep its text for the request's timeout row
        (only called while recording)."""
        cdef CorrState* cs = self.cs
        cdef CorrText* old = cs.ctext
        cdef CorrText* t
        cdef Py_ssize_t i, old_cap = cs.cap, new_cap
        if (cs.len + 1) * 2 > cs.cap and cs.cap < CORR_TEXT_SLOTS:
            new_cap = cs.cap * 2 if cs.cap else 16
            t = <CorrText*>PyMem_Malloc(new_cap * sizeof(CorrText))
            if t is NULL:
                raise MemoryError()
            for i in range(new_cap):
                t[i].slot = -1
            cs.ctext = t
            cs.cap = new_cap
            cs.len = 0
            for i in range(old_cap):       # in index order, as the twin does
                if old[i].slot >= 0:
                    t = &cs.ctext[_ctext_index(old[i].dir, old[i].slot, old[i].key, new_cap)]
                    if t.slot < 0:
                        cs.len += 1
                    t[0] = old[i]
            PyMem_Free(old)
        t = &cs.ctext[_ctext_index(d, rec.slot, rec.corr, cs.cap)]
        if t.slot < 0:
            cs.len += 1
        if t.slot == rec.slot and t.key == rec.corr and t.dir == d:
            if t.refs < 32767:
                t.refs += 1                # another pending request with this identity
        else:
            t.refs = 1                     # a free entry, or a newer id evicts an older one
        t.key = rec.corr
        t.slot = rec.slot
        t.dir = <int8_t>d
        t.none = cs.cid_len[d] < 0
        t.len = cs.cid_len[d] if cs.cid_len[d] > 0 else 0
        memcpy(t.text, &cs.cid[d][0], t.len)
        return 0

    cdef CorrText* _ctext_find(self, int d, int slot, int64_t key) noexcept:
        cdef CorrText* t
        cdef CorrState* cs = self.cs
        if cs is NULL or cs.cap == 0:
            return NULL
        t = &cs.ctext[_ctext_index(d, slot, key, cs.cap)]
        if t.slot == slot and t.key == key and t.dir == d:
            return t
        return NULL

    cdef void _emit(self, FrameRecord* rec) noexcept:
        """Hand one finished record to the frame log (and the tracer, in tests)."""
        cdef DirState* s = &self.st[rec.direction & 1]
        cdef const uint8_t* res = NULL
        cdef const uint8_t* attrs = NULL
        cdef const uint8_t* cid = NULL
        cdef Py_ssize_t res_len = -1, alen = 0, cid_len = -1
        cdef bint same_frame = 0
        if rec is &s.rec:                  # a frame's row (timeout events have neither)
            if self.fault_marking[rec.direction & 1]:
                self._mark_injected(rec.direction & 1)
            res = &s.res[0]
            res_len = s.res_len
            attrs = s.attrs
            alen = s.alen
            same_frame = s.rows > 1        # entry() rows after the first: same resource
            if rec.corr_fmt == CORR_STR and self.cs is not NULL:
                cid = &self.cs.cid[rec.direction & 1][0]
                cid_len = self.cs.cid_len[rec.direction & 1]
            if (self.cs is not NULL and self.cs.len and rec.req_slot >= 0
                    and rec.latency_ns >= 0):
                # a response answered its request in time: the request's kept string id
                # is no longer needed (a response travels the other way)
                _ctext_drop(self._ctext_find(1 - (rec.direction & 1), rec.req_slot,
                                             rec.corr), self)
        elif rec.corr_fmt == CORR_STR and self.cs is not NULL:   # a timeout row: its
            cid = self.cs.ev_text                                 # request's kept text
            cid_len = self.cs.ev_text_len
        if self.log is not None:
            self.log.append(rec, self.conn_id, self.log_route, res, res_len, attrs, alen,
                            same_frame, cid, cid_len)
        if self._tracer is None:
            return
        try:
            row = self._record_dict(rec, res, res_len, attrs, alen)
            if rec.corr_fmt == CORR_STR and cid is not NULL:
                row["correlation_id"] = cid[:cid_len].decode("utf-8", "replace")
            self._tracer(row)
        except BaseException as exc:       # raised when the public call returns
            if self._tracer_error is None:
                self._tracer_error = exc

    @property
    def tracer(self):
        """A callable given each finished record as a dict (tests), or None."""
        return self._tracer

    @tracer.setter
    def tracer(self, fn):
        self._tracer = fn
        self.recording = fn is not None or self.log is not None or self.fault_rec

    def attach_log(self, FrameLogBuffer log, int route):
        """Write this connection's records to ``log`` (as route index ``route``; see
        FrameLogBuffer.add_route), or stop with ``log=None``."""
        self.log = log
        self.log_route = route
        self.recording = log is not None or self._tracer is not None or self.fault_rec

    cdef dict _record_dict(self, FrameRecord* rec, const uint8_t* res, Py_ssize_t res_len,
                           const uint8_t* attrs, Py_ssize_t alen):
        return record_dict(
            self.stats, self.conn_id, rec[0],
            res[:res_len].decode("utf-8", "replace") if res_len >= 0 else None,
            _attrs_dict(attrs, alen) if alen > 0 else None)

    # ---- correlation map ------------------------------------------------------

    def set_map_seed(self, uint64_t seed):
        """Tests only: key the pending map with ``seed`` (rehashing what it holds)."""
        self.map_seed = seed
        if self.map_cap:
            self._map_resize(self.map_cap)

    cdef int _map_reseed(self) except -1:
        """A probe passed MAP_PROBE_LIMIT: rehash the table, same size, under a new seed."""
        self.map_seed = _next_seed()
        self.map_reseeds += 1
        return self._map_resize(self.map_cap)

    cdef int _map_grow(self) except -1:
        """Double the table (64 entries first); 1 when the pending budget refuses."""
        return self._map_resize(self.map_cap * 2 if self.map_cap else 64)

    cdef int _map_resize(self, Py_ssize_t new_cap) except -1:
        """Rehash into ``new_cap`` slots (0 frees the table; the map must be empty then),
        keeping the request order (the new ring holds no answered slots); 1 when growing
        would pass the pending budget."""
        global _pending_bytes
        cdef Py_ssize_t old_cap = self.map_cap, i, j, mask, omask = self.map_cap - 1
        cdef int64_t r, w = 0, live = -1
        cdef MapEntry* old = self.map
        cdef MapEntry* new = NULL
        cdef int32_t* ring = NULL
        if new_cap > old_cap and _pending_bytes + (new_cap - old_cap) * _MAP_SLOT_BYTES \
                > _pending_budget:
            return 1
        if new_cap:
            new = <MapEntry*>PyMem_Malloc(new_cap * sizeof(MapEntry))
            ring = <int32_t*>PyMem_Malloc(new_cap * sizeof(int32_t))
            if new is NULL or ring is NULL:
                PyMem_Free(new)
                PyMem_Free(ring)
                raise MemoryError()
            memset(new, 0, new_cap * sizeof(MapEntry))
        if self.ring_live < self.ring_head:
            self.ring_live = self.ring_head
        mask = new_cap - 1
        for r in range(self.ring_head, self.ring_tail):   # oldest first: the order is kept
            if r == self.ring_live:
                live = w
            i = self.ring[r & omask]
            if i < 0:
                continue                       # answered since
            j = _mix(self.map_seed, old[i].tag, <uint64_t>old[i].p.key) & mask
            while new[j].used:
                j = (j + 1) & mask
            new[j] = old[i]
            new[j].used = <int32_t>(w + 1)
            ring[w] = <int32_t>j
            w += 1
        self.ring_head = 0
        self.ring_tail = w
        self.ring_live = live if live >= 0 else w
        PyMem_Free(old)
        PyMem_Free(self.ring)
        self.map = new
        self.ring = ring
        self.map_cap = new_cap
        _pending_bytes += (new_cap - old_cap) * _MAP_SLOT_BYTES
        return 0

    cdef void _ring_compact(self) noexcept:
        """The request ring is full: drop the answered slots at its head and, when that
        frees less than half, squeeze out the others, in place, keeping the order (the
        map holds at most map_cap / 2 entries, so half the ring frees)."""
        cdef Py_ssize_t mask = self.map_cap - 1
        cdef int64_t r, w, live = -1, h = self.ring_head, t = self.ring_tail
        cdef int32_t i
        cdef int32_t* ring = self.ring
        # answers mostly come in request order: dropping the answered head is enough
        while h < t and ring[h & mask] < 0:
            h += 1
        self.ring_head = h
        if self.ring_live < self.ring_head:
            self.ring_live = self.ring_head
        if (self.ring_tail - self.ring_head) * 2 <= self.map_cap:
            return
        w = self.ring_head
        for r in range(self.ring_head, self.ring_tail):
            if r == self.ring_live:
                live = w
            i = self.ring[r & mask]
            if i >= 0:
                self.ring[w & mask] = i
                self.map[i].used = <int32_t>((w & mask) + 1)
                w += 1
        self.ring_live = live if live >= 0 else w
        self.ring_tail = w

    cdef bint _has_expired(self) noexcept:
        """Whether the map holds a request already counted as a timeout (the ring's
        answered head slots are dropped on the way)."""
        cdef Py_ssize_t rmask = self.map_cap - 1
        if self.map_cap == 0:
            return 0
        if self.ring_live < self.ring_head:
            self.ring_live = self.ring_head
        while self.ring_head < self.ring_live and self.ring[self.ring_head & rmask] < 0:
            self.ring_head += 1
        return self.ring_head < self.ring_live

    cdef int _expect_key(self, int d, int32_t tag, uint64_t key, int32_t corr_hi) except -1:
        """expect() when the table must grow first, is full, or already holds the key
        (set_corr() done)."""
        cdef Py_ssize_t i, mask, rmask, probes = 0
        cdef MapEntry* e
        cdef int32_t j
        cdef bint reseeded = 0
        if (self.map_len + 1) * 2 > self.map_cap and self.map_len < self.map_limit \
                and not self._has_expired():
            self._map_grow()                   # keeps the table at most half full (budget
                                               # permitting: see set_pending_budget); a
                                               # table holding expired requests drops
                                               # those first (below) instead of growing
        if self.map_cap == 0:                  # map_limit <= 0 or no budget: nothing is tracked
            _count_error(self.c, d, R_OVERFLOW)
            return 0
        mask = self.map_cap - 1
        i = _mix(self.map_seed, tag, key) & mask
        while self.map[i].used:                # one probe: the key, or where it goes
            e = &self.map[i]
            if e.tag == tag and <uint64_t>e.p.key == key:
                # the older request can never be answered now
                if not e.p.flags & P_EXPIRED:
                    self._timeout(&e.p, tag)
                self.c.in_flight += 1
                _pending_set(&e.p, self.now_ns, key, self.st[d].rec.slot, corr_hi, 0, d)
                self.ring[e.used - 1] = -1     # a new request: the newest entry
                _ring_push(self, i)
                return 0
            i = (i + 1) & mask
            probes += 1
            if probes == MAP_PROBE_LIMIT and not reseeded:
                reseeded = 1                   # see expect(): break a chosen cluster
                self._map_reseed()
                i = _mix(self.map_seed, tag, key) & mask
                probes = 0
        if self.map_len >= self.map_limit or (self.map_len + 1) * 2 > self.map_cap:
            # full (the limit, or the budget refused to grow): the oldest expired entry
            # makes room, else the request is dropped, and counted
            rmask = self.map_cap - 1
            if not self._has_expired():
                _count_error(self.c, d, R_OVERFLOW)
                return 0
            j = self.ring[self.ring_head & rmask]
            self.ring[self.ring_head & rmask] = -1
            self.ring_head += 1
            _map_remove(self, j)
            i = _mix(self.map_seed, tag, key) & mask
            while self.map[i].used:
                i = (i + 1) & mask
        _map_insert(self, d, i, tag, key, corr_hi)
        return 0

    cdef int _fifo_grow(self) except -1:
        """Double the FIFO ring; 1 when the pending budget refuses."""
        return self._fifo_resize(self.fifo_cap * 2)

    cdef int _fifo_resize(self, Py_ssize_t new_cap) except -1:
        global _pending_bytes
        cdef Py_ssize_t i
        cdef Pending* p
        if new_cap > self.fifo_cap and _pending_bytes + (new_cap - self.fifo_cap) * \
                <int64_t>sizeof(Pending) > _pending_budget:
            return 1
        p = <Pending*>PyMem_Malloc(new_cap * sizeof(Pending))
        if p is NULL:
            raise MemoryError()
        for i in range(self.fifo_len):
            p[i] = self.fifo[(self.fifo_head + i) & (self.fifo_cap - 1)]
        PyMem_Free(self.fifo)
        _pending_bytes += (new_cap - self.fifo_cap) * <int64_t>sizeof(Pending)
        self.fifo = p
        self.fifo_head = 0
        self.fifo_cap = new_cap
        return 0

    cdef int _shrink(self) except -1:
        """After a burst: tables at most 1/8 full are halved or more (map load at most
        1/4 afterwards, FIFO at most half full); never below 64 / 8 entries."""
        cdef Py_ssize_t cap
        if self.map_cap > 64 and self.map_len * 8 <= self.map_cap:
            cap = 64
            while cap < self.map_len * 4:
                cap *= 2
            self._map_resize(cap)
        if self.fifo_cap > 8 and self.fifo_len * 8 <= self.fifo_cap:
            cap = 8
            while cap < self.fifo_len * 2:
                cap *= 2
            self._fifo_resize(cap)
        return 0

    # ---- lifecycle ------------------------------------------------------------

    def expire(self, int64_t now=0, Py_ssize_t limit=0):
        """Count requests older than request_timeout as timeouts; returns how many.
        Walks only what expires (both tables are in request order), then shrinks
        tables a burst left mostly empty.  With ``limit`` > 0 it counts at most that
        many (FIFO first, then the map, oldest first) and leaves the rest, and the
        shrinking, to the next call: the relay's sweep calls again after letting other
        connections run, so an upstream that stopped answering never stalls the loop
        for a whole second's worth of timeouts (docs/design.md, "Pending requests")."""
        cdef Py_ssize_t i, mask
        cdef Pending* p
        cdef Py_ssize_t n = 0
        if now == 0:
            now = monotonic_ns()
        if limit <= 0:
            limit = PY_SSIZE_T_MAX
        self.now_ns = now
        # the expired requests are a prefix of the FIFO, whose sequence numbers are
        # consecutive: start at the first one not yet expired
        i = 0
        if self.fifo_len and self.fifo_live > self.fifo[self.fifo_head].key:
            i = self.fifo_live - self.fifo[self.fifo_head].key
            if i > self.fifo_len:
                i = self.fifo_len
            # a request the fault engine dropped left a gap in the sequence numbers:
            # step back over entries not expired yet (one check when there is none)
            while i > 0 and not self.fifo[(self.fifo_head + i - 1) & (self.fifo_cap - 1)].flags \
                    & P_EXPIRED:
                i -= 1
        while i < self.fifo_len and n < limit:
            p = &self.fifo[(self.fifo_head + i) & (self.fifo_cap - 1)]
            if now - p.t_ns < self.timeout_ns:
                break                    # FIFO: everything after is younger
            if not p.flags & P_EXPIRED:
                self._timeout(p, 0)
                n += 1
            i += 1
        self.fifo_live = self.fifo_seq + 1 if i == self.fifo_len else (
            self.fifo[(self.fifo_head + i) & (self.fifo_cap - 1)].key)
        if self.ring_live < self.ring_head:
            self.ring_live = self.ring_head
        mask = self.map_cap - 1
        while self.ring_live < self.ring_tail and n < limit:
            i = self.ring[self.ring_live & mask]
            if i >= 0:                   # else answered since
                p = &self.map[i].p
                if now - p.t_ns < self.timeout_ns:
                    break                # request order: everything after is younger
                self._timeout(p, self.map[i].tag)
                n += 1
            self.ring_live += 1
        if n < limit:                    # else more may be due: the caller comes back
            self._shrink()
        if self._tracer_error is not None:
            self._raise_tracer_error()
        return n

    def close(self):
        """Connection ended: unanswered requests are timeouts, half frames are errors."""
        cdef Py_ssize_t i, mask
        cdef int64_t r
        cdef Pending* p
        cdef int d
        if self.closed:
            return
        self.closed = True
        self.now_ns = monotonic_ns()
        for d in range(2):                     # a frame begun but not finished
            if self.st[d].open:
                self.st[d].open = 0
                self._emit(&self.st[d].rec)
        for i in range(self._fifo_first_live(), self.fifo_len):
            p = &self.fifo[(self.fifo_head + i) & (self.fifo_cap - 1)]
            if not p.flags & P_EXPIRED:
                self._timeout(p, 0)
        self.fifo_len = 0
        if self.ring_live < self.ring_head:
            self.ring_live = self.ring_head
        mask = self.map_cap - 1
        for r in range(self.ring_live, self.ring_tail):   # the expired ones were counted
            i = self.ring[r & mask]
            if i >= 0 and not self.map[i].p.flags & P_EXPIRED:
                self._timeout(&self.map[i].p, self.map[i].tag)
        self._forget_all()
        if self.error is None:
            for d in range(2):
                if self.st[d].have > 0 or self.st[d].remaining > 0:
                    _count_error(self.c, d, R_TRUNCATED)
        if self._tracer_error is not None:
            self._raise_tracer_error()

    def _forget_all(self):
        """Empty both tables and give their memory back (a closed connection)."""
        self.fifo_len = 0
        self.fifo_head = 0
        self.map_len = 0
        self.ring_head = self.ring_live = self.ring_tail = 0
        self._map_resize(0)
        if self.fifo_cap > 8:
            self._fifo_resize(8)

    def abandon(self):
        """Forget every pending request without counting it as a timeout (the upstream
        was never reached: the relay counts that as a connect failure)."""
        cdef Py_ssize_t i, mask
        cdef int64_t r
        for i in range(self._fifo_first_live(), self.fifo_len):
            if not self.fifo[(self.fifo_head + i) & (self.fifo_cap - 1)].flags & P_EXPIRED:
                self.c.in_flight -= 1
        if self.ring_live < self.ring_head:
            self.ring_live = self.ring_head
        mask = self.map_cap - 1
        for r in range(self.ring_live, self.ring_tail):   # only the live ones are in flight
            i = self.ring[r & mask]
            if i >= 0 and not self.map[i].p.flags & P_EXPIRED:
                self.c.in_flight -= 1
        self._forget_all()

    def _fifo_first_live(self):
        """Offset of the first FIFO entry expire() has not counted (those before it are
        expired: close() and abandon() skip them)."""
        cdef Py_ssize_t i
        if self.fifo_len and self.fifo_live > self.fifo[self.fifo_head].key:
            i = min(self.fifo_live - self.fifo[self.fifo_head].key, self.fifo_len)
            while i > 0 and not self.fifo[(self.fifo_head + i - 1) & (self.fifo_cap - 1)].flags \
                    & P_EXPIRED:
                i -= 1                   # a gap the fault engine left (fault_forget)
            return i
        return 0

    @property
    def pending_capacity(self):
        """(map slots, FIFO slots) allocated now (tests: tables shrink after a burst)."""
        return self.map_cap, self.fifo_cap

    @property
    def bytes_fed(self):
        """Bytes fed in both directions so far (the relay's idle check)."""
        return self.st[0].offset + self.st[1].offset

    @property
    def pending(self):
        """Number of requests awaiting a response (expired ones included)."""
        return self.fifo_len + self.map_len

    def frame_start(self, int d):
        """Stream offset where direction d's current frame began."""
        return self.st[d].frame_start


cdef dict _attrs_dict(const uint8_t* a, Py_ssize_t n):
    """add_attr()'s packed pairs as a dict (tracer and tests)."""
    cdef Py_ssize_t i = 0, kn, vn
    out = {}
    while i + 2 <= n:
        kn = (a[i] << 8) | a[i + 1]
        key = a[i + 2:i + 2 + kn].decode("utf-8", "replace")
        i += 2 + kn
        vn = (a[i] << 8) | a[i + 1]
        out[key] = a[i + 2:i + 2 + vn].decode("utf-8", "replace")
        i += 2 + vn
    return out


# ==== Frame-log buffer ================================================================

from libc.stdlib cimport malloc, calloc, realloc, free
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_FromStringAndSize


cdef inline bytearray _raw(Py_ssize_t n):
    """An uninitialised bytearray of n bytes (columns() writes every byte it exposes)."""
    return PyByteArray_FromStringAndSize(NULL, n)


cdef inline Py_ssize_t _arena_str(uint8_t* dst, const uint8_t* a) noexcept nogil:
    """Copy one arena string (u16 length, then its bytes) as UTF-8; returns its length."""
    return _utf8_copy(dst, a + 2, (a[0] << 8) | a[1])


cdef Py_ssize_t _utf8_copy(uint8_t* dst, const uint8_t* src, Py_ssize_t n) noexcept nogil:
    """Copy n bytes, each byte of an invalid UTF-8 sequence replaced by '?': a hostile
    client's resource bytes never make a frame-log file unreadable."""
    cdef Py_ssize_t i = 0, k, need
    cdef uint8_t c
    while i < n:
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


cdef class FrameLogBuffer:
    """Chunks of fixed-size frame-log records, filled on the event loop, drained by the
    frame-log writer thread (proxy/framelog_native.py).  See _framing.pxd."""

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

    def add_route(self, RouteStats stats):
        """Register a route; returns its index for FrameParser.attach_log()."""
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

    def columns(self, chunks, int64_t wall_offset_ns):
        """Chunk ``chunks`` (an index, or a list of indexes: one batch, in that order) as
        column buffers (bytearrays) for Arrow: fixed-width values, validity bitmaps (None:
        no nulls), and offsets + data for the strings.  Runs without the GIL over the
        records.  Several chunks make one table, hence one larger row group: the Parquet
        writer's cost per row falls with the row group's size."""
        cdef list idx = [chunks] if isinstance(chunks, int) else list(chunks)
        cdef Py_ssize_t nidx = len(idx), q
        cdef int ci[64]
        cdef LogChunk* c
        cdef Py_ssize_t n = 0, j, k, nb, pos, npairs = 0, m, o, arena = 0
        cdef Py_ssize_t cpos = 0, rpos = 0, kpos = 0, vpos = 0, pend, alen
        cdef LogRecord* r
        cdef FrameRecord* f
        cdef const uint8_t* a
        cdef Py_ssize_t rbytes = 0, cbytes = 0
        if nidx < 1 or nidx > 64:
            raise ValueError("columns() takes 1 to 64 chunks, not %d" % nidx)
        for q in range(nidx):
            ci[q] = idx[q]
            if ci[q] < 0 or ci[q] >= self.nchunks:
                raise IndexError("no chunk %d" % ci[q])
            n += self.chunks[ci[q]].n
            arena += self.chunks[ci[q]].alen
        nb = (n + 7) // 8
        # count attribute pairs and resource bytes first (sizes the arrays; rows of one
        # frame share one arena copy of their resource)
        for q in range(nidx):
            c = &self.chunks[ci[q]]
            for j in range(c.n):
                if c.recs[j].r.resource >= 0:
                    a = c.arena + c.recs[j].r.resource
                    rbytes += (a[0] << 8) | a[1]
                if c.recs[j].r.corr_fmt == CORR_STR:
                    a = c.arena + c.recs[j].r.corr
                    cbytes += (a[0] << 8) | a[1]
                if c.recs[j].r.attrs >= 0:
                    a = c.arena + c.recs[j].r.attrs
                    alen = (a[0] << 8) | a[1]
                    k = 2
                    while k + 2 <= alen + 2:
                        m = (a[k] << 8) | a[k + 1]
                        k += 2 + m
                        m = (a[k] << 8) | a[k + 1]
                        k += 2 + m
                        npairs += 1
        # value buffers are written for every row (or up to their offsets): not zeroed;
        # the validity bitmaps are (_setbit ORs)
        ts = _raw(n * 8); conn = _raw(n * 8); route = _raw(n * 4)
        direction = _raw(n); kind = _raw(n); outcome = _raw(n)
        outcome_v = bytearray(nb); opcode = _raw(n * 4); opcode_v = bytearray(nb)
        op_idx = _raw(n * 4); req_idx = _raw(n * 4); req_v = bytearray(nb)
        st_idx = _raw(n * 4); st_v = bytearray(nb); conn_idx = _raw(n * 4)
        fbytes = _raw(n * 8); hbytes = _raw(n * 8); pbytes = _raw(n * 8)
        msgs = _raw(n * 8); lat = _raw(n * 8); lat_v = bytearray(nb)
        corr_off = _raw((n + 1) * 4); corr_data = _raw(n * 32 + cbytes + 1)
        corr_v = bytearray(nb)
        res_off = _raw((n + 1) * 4); res_data = _raw(rbytes + 1); res_v = bytearray(nb)
        map_off = _raw((n + 1) * 4); map_v = bytearray(nb)
        key_off = _raw((npairs + 1) * 4); key_data = _raw(arena + 1)
        val_off = _raw((npairs + 1) * 4); val_data = _raw(arena + 1)
        cdef Dense d_name, d_status, d_conn
        _dense_init(&d_name, 64)
        _dense_init(&d_status, 64)
        _dense_init(&d_conn, 256)
        cdef int64_t* p_ts = <int64_t*>PyByteArray_AS_STRING(ts)
        cdef int64_t* p_conn = <int64_t*>PyByteArray_AS_STRING(conn)
        cdef int32_t* p_route = <int32_t*>PyByteArray_AS_STRING(route)
        cdef int8_t* p_dir = <int8_t*>PyByteArray_AS_STRING(direction)
        cdef int8_t* p_kind = <int8_t*>PyByteArray_AS_STRING(kind)
        cdef int8_t* p_out = <int8_t*>PyByteArray_AS_STRING(outcome)
        cdef uint8_t* v_out = <uint8_t*>PyByteArray_AS_STRING(outcome_v)
        cdef int32_t* p_op = <int32_t*>PyByteArray_AS_STRING(opcode)
        cdef uint8_t* v_op = <uint8_t*>PyByteArray_AS_STRING(opcode_v)
        cdef int32_t* p_opk = <int32_t*>PyByteArray_AS_STRING(op_idx)
        cdef int32_t* p_reqk = <int32_t*>PyByteArray_AS_STRING(req_idx)
        cdef uint8_t* v_req = <uint8_t*>PyByteArray_AS_STRING(req_v)
        cdef int32_t* p_sk = <int32_t*>PyByteArray_AS_STRING(st_idx)
        cdef uint8_t* v_sk = <uint8_t*>PyByteArray_AS_STRING(st_v)
        cdef int32_t* p_ci = <int32_t*>PyByteArray_AS_STRING(conn_idx)
        cdef int64_t* p_fb = <int64_t*>PyByteArray_AS_STRING(fbytes)
        cdef int64_t* p_hb = <int64_t*>PyByteArray_AS_STRING(hbytes)
        cdef int64_t* p_pb = <int64_t*>PyByteArray_AS_STRING(pbytes)
        cdef int64_t* p_msg = <int64_t*>PyByteArray_AS_STRING(msgs)
        cdef int64_t* p_lat = <int64_t*>PyByteArray_AS_STRING(lat)
        cdef uint8_t* v_lat = <uint8_t*>PyByteArray_AS_STRING(lat_v)
        cdef int32_t* p_coff = <int32_t*>PyByteArray_AS_STRING(corr_off)
        cdef uint8_t* p_cdat = <uint8_t*>PyByteArray_AS_STRING(corr_data)
        cdef uint8_t* v_corr = <uint8_t*>PyByteArray_AS_STRING(corr_v)
        cdef int32_t* p_roff = <int32_t*>PyByteArray_AS_STRING(res_off)
        cdef uint8_t* p_rdat = <uint8_t*>PyByteArray_AS_STRING(res_data)
        cdef uint8_t* v_res = <uint8_t*>PyByteArray_AS_STRING(res_v)
        cdef int32_t* p_moff = <int32_t*>PyByteArray_AS_STRING(map_off)
        cdef uint8_t* v_map = <uint8_t*>PyByteArray_AS_STRING(map_v)
        cdef int32_t* p_koff = <int32_t*>PyByteArray_AS_STRING(key_off)
        cdef uint8_t* p_kdat = <uint8_t*>PyByteArray_AS_STRING(key_data)
        cdef int32_t* p_voff = <int32_t*>PyByteArray_AS_STRING(val_off)
        cdef uint8_t* p_vdat = <uint8_t*>PyByteArray_AS_STRING(val_data)
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
                        rpos += _arena_str(p_rdat + rpos, c.arena + f.resource)
                        _setbit(v_res, o)
                    p_roff[o + 1] = <int32_t>rpos
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
            if d_name.failed or d_status.failed or d_conn.failed:
                raise MemoryError("frame log: no memory for a batch's dictionaries")
            name_keys = _dense_keys(&d_name)
            status_keys = _dense_keys(&d_status)
            conn_keys = _dense_keys(&d_conn)
        finally:
            _dense_free(&d_name)
            _dense_free(&d_status)
            _dense_free(&d_conn)
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
            "resource": (res_off, res_data, res_v),
            "attrs": (map_off, map_v, key_off, key_data, val_off, val_data),
        }
