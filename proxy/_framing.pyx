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

from proxy._pending cimport (PendingWalk, P_S2C, PT_DROPPED, PT_REPLACED, PT_PUSHED_OUT, pt_init,
                             pt_free, pt_map_resize, pt_expect_key, pt_fifo_room,
                             pt_expire_next, pt_live_next, pt_shrink, pt_forget_all,
                             pending_fits, pending_charge)
from proxy._framelog cimport _ctext_index, append_plain

import os

from proxy.errors import frame_error_class
from proxy.framing_common import (BUCKETS_NS, DIRECTIONS, REASONS,
                                  DEFAULT_FIFO_LIMIT, DEFAULT_MAP_LIMIT, record_dict,
                                  route_snapshot)

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


# The pending-memory budget lives with the pending tables (proxy/_pending.pyx); the
# split-header buffers here are charged to it too.
from proxy._pending import set_pending_budget, pending_bytes, pending_budget  # noqa: F401
# FrameLogBuffer (proxy/_framelog.pyx) is also reached as proxy._framing.FrameLogBuffer,
# proxy.framing's import point (a cimported type's name is not a module attribute by itself)
from proxy import _framelog as _framelog_module
globals()["FrameLogBuffer"] = _framelog_module.FrameLogBuffer


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
        _fault_rearm(self, d)               # it ends here and _frame_end() won't run
    return 1


cdef inline void _ctext_drop(CorrText* t, FrameParser self) noexcept:
    if t is not NULL:
        t.refs -= 1
        if t.refs <= 0:
            t.slot = -1
            self.cs.len -= 1


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

    cdef int _slot_miss(self, int64_t code) noexcept:
        """slot_for() past its table hit: a code out of the table, or seen first now."""
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
        """Copy every counter into plain Python data (read at scrape time;
        framing_common.route_snapshot, shared with the twin)."""
        cdef int d, s, o, b, r
        stname = self.status_namer or str
        responses, hist = [], []
        for s in range(OPCODE_SLOTS):
            for r in range(STATUS_SLOTS):
                if self.c.responses[s * STATUS_SLOTS + r]:
                    responses.append(((s, r), self.c.responses[s * STATUS_SLOTS + r]))
            for o in range(2):
                counts = [self.c.hist[(s * 2 + o) * (N_BUCKETS + 1) + b]
                          for b in range(N_BUCKETS + 1)]
                if any(counts):
                    hist.append(((s, o), (counts, self.c.hist_sum_ns[s][o] * 1e-9)))
        return route_snapshot(
            self, [self.slot_name(s) for s in range(self.nslots)],
            [stname(self.c.status_code[s]) for s in range(self.c.nstatus)],
            [self.c.frames[d] for d in range(2)], [self.c.frame_bytes[d] for d in range(2)],
            [self.c.messages[d] for d in range(2)],
            [[self.c.errors[d][r] for r in range(N_REASONS)] for d in range(2)], responses, hist,
            self.c.timeouts, self.c.cutoffs, self.c.relayed, self.c.unmatched,
            self.c.in_flight, self.connect_hist, self.connect_sum)


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
        self.c = &stats.c
        pt_init(&self.pt, DEFAULT_FIFO_LIMIT, DEFAULT_MAP_LIMIT)
        self.header_limit = HEADER_LIMIT
        self.captured = [None, None]
        memset(self.st, 0, sizeof(self.st))

    def __dealloc__(self):
        pt_free(&self.pt)
        pending_charge(-(self.st[0].hcap + self.st[1].hcap))
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
        cdef bint fast = self.fast_path and not hold
        cdef list out = None
        if hold:
            out = []
            self.output = out
            held = s.have                      # header bytes withheld from earlier reads
        if self.error is not None or self.closed:
            return 0
        s.offset += n
        self.feed_frames = 0
        self.more = False
        self.feed_work = 0
        # One clock read per read, not per frame (docs/design.md, "Performance principles").
        self.now_ns = monotonic_ns()
        self.c.relayed[d] += n
        while pos < n:
            if s.remaining > 0:                # inside a payload: pass it without copying
                take = n - pos
                if take > s.remaining:
                    take = s.remaining
                if s.capture:
                    emit = _capture_more(self, d, buf + pos, pos, take, emit)
                elif s.body:
                    self.on_body(d, buf + pos, take)
                s.remaining -= take
                pos += take
                if s.remaining == 0 and (s.capture or s.body or s.open):
                    _frame_finish(self, d, out)
                continue
            if s.have == 0:
                if self.feed_frames + self.feed_work >= self.frame_cap and self.frame_cap:
                    # enough frames for one turn: the rest is the next feed()'s
                    self.more = True
                    s.offset -= n - pos
                    self.c.relayed[d] -= n - pos
                    if hold and emit < pos:
                        out.append(_span(buf, emit, pos))
                    return pos
                if fast and s.need == self.header_size:
                    # the parser's own loop over the plain frames here (no call per frame)
                    take = self.fast_frames(d, buf, pos, n, chunk_start)
                    if take != pos:
                        pos = take
                        continue               # the checks above again, at its stop
                s.frame_start = chunk_start + pos
                if n - pos >= s.need:          # header contiguous in this read: no copy
                    asked = s.need
                    r = self.on_header(d, buf + pos, n - pos)
                    if r > 0:
                        self.feed_frames += 1
                        s.need = self.header_size
                        if r < asked or (s.body and (s.skip > n - pos or s.skip > r)):
                            return _contract_error(self, d, r, asked, pos, emit, buf, out)
                        if s.capture and not (s.capture == CAP_NEXT and
                                              _passes(self, d, r, n - pos)):
                            take = _capture_head(self, d, r, pos, emit, n, buf, out)
                            if take >= 0:      # held: the read goes on after its bytes
                                pos = emit = take
                                continue
                        if s.body:           # the body streams through on_body()
                            pos += s.skip
                            s.remaining = r - s.skip
                            if s.remaining == 0:
                                _frame_end(self, d, out)
                        elif r <= n - pos:
                            pos += r
                            if s.open:
                                _frame_finish(self, d, out)
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
                return _fatal_prefix(self, d, chunk_start, emit, buf, out)
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
                    _short_frame(self, d, r, asked)
                    return _fatal_prefix(self, d, chunk_start, emit, buf, out)
                if hold:
                    if s.capture & (CAP_UNDECIDED | CAP_NEXT):
                        _fault_decide(self, d)
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
                _header_done(self, d, r, asked, s.hbuf)
                if s.remaining == 0 and (s.capture or s.body or s.open):
                    _frame_finish(self, d, out)
            elif r < 0:
                return _fatal_prefix(self, d, chunk_start, emit, buf, out)
        if hold and emit < n:
            _hold_tail(self, d, n, emit, data, buf, out)
        return n

    cdef int _hbuf_reserve(self, int d, Py_ssize_t n) except -1:
        """Grow direction d's header buffer to n bytes; -2 after fail() past header_limit
        or the pending budget (-1 is a raised exception)."""
        cdef DirState* s = &self.st[d]
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
        if not pending_fits(cap - s.hcap):
            # partial headers are pending memory too: 10,000 connections each holding a
            # 64 KiB header would otherwise sit outside every budget
            self.fail(d, R_PENDING_BUDGET, "a header of %d bytes at offset %d does not fit "
                      "the pending-memory budget (max_pending_bytes)" % (n, s.frame_start))
            return -2
        nb = <uint8_t*>PyMem_Realloc(s.hbuf, cap)
        if nb is NULL:
            raise MemoryError()
        pending_charge(cap - s.hcap)
        s.hbuf = nb
        s.hcap = cap
        return 0

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
                    _fault_rearm(self, d)
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
        if self.pt.fifo_len and self.pt.fifo_seq != self.fault_fifo_mark[d]:
            # this frame pushed the newest FIFO entry: a request answered in order
            fifo = self.pt.fifo[(self.pt.fifo_head + self.pt.fifo_len - 1)
                                & (self.pt.fifo_cap - 1)].key == self.pt.fifo_seq
        return (rec.slot, rec.kind if s.open else -1,
                <uint64_t>self.pt.fifo_seq if fifo else (<uint64_t>rec.corr if s.open else 0),
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
        if self.pt.fifo_len == 0:
            return False
        p = &self.pt.fifo[(self.pt.fifo_head + self.pt.fifo_len - 1) & (self.pt.fifo_cap - 1)]
        if p.key != self.pt.fifo_seq or p.flags & P_EXPIRED:
            return False
        self._timeout(p, 0)
        self.pt.fifo_len -= 1
        return True

    def fault_step(self, int d):
        """(at a frame boundary, bytes to feed before the next point where it may be)."""
        cdef DirState* s = &self.st[d]
        if s.remaining > 0:
            return False, s.remaining
        return s.have == 0, s.need - s.have

    def fifo_first(self):
        """Sequence number of the oldest request awaiting its answer in order, or -1."""
        if self.pt.fifo_len == 0:
            return -1
        return self.pt.fifo[self.pt.fifo_head].key

    def set_hold(self, int d, bint on):
        """Enable frame capture in direction ``d`` (see rewrite())."""
        self.hold[d] = on

    def rewrite(self, int d, bytes frame):
        """A captured frame, whole; returns the bytes to forward in its place."""
        return frame

    # ---- protocol hooks -------------------------------------------------------

    cdef int64_t on_header(self, int d, const uint8_t* h, Py_ssize_t avail) except -2:
        raise NotImplementedError("protocol parsers override on_header")

    cdef Py_ssize_t fast_frames(self, int d, const uint8_t* buf, Py_ssize_t pos,
                                Py_ssize_t n, int64_t chunk_start) except -1:
        return pos                         # none: every frame goes through on_header()

    cdef int end_frame(self, int d) except -1:
        """frame_done()'s way to the core's end of frame, for a record it cannot append
        in place (the direction is not held: nothing to hand over)."""
        return _frame_end(self, d, None)

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
        t = _ctext_find(self, ev.direction, p.slot, p.key) if cs is not NULL and cs.len else NULL
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
                _mark_injected(self, rec.direction & 1)
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
                _ctext_drop(_ctext_find(self, 1 - (rec.direction & 1), rec.req_slot,
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
            row = _record_dict(self, rec, res, res_len, attrs, alen)
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

    # ---- pending requests (the tables: proxy/_pending.pxd/.pyx) ----------------

    @property
    def map_limit(self):
        """Most keyed requests pending at once (then the oldest expired one makes room,
        else a new one is dropped and counted)."""
        return self.pt.map_limit

    @map_limit.setter
    def map_limit(self, Py_ssize_t n):
        self.pt.map_limit = n

    @property
    def fifo_limit(self):
        """Most requests pending in order (then the oldest is given up: a timeout)."""
        return self.pt.fifo_limit

    @fifo_limit.setter
    def fifo_limit(self, Py_ssize_t n):
        self.pt.fifo_limit = n

    @property
    def map_reseeds(self):
        """Times this connection's map was rehashed under a new seed (hash flooding)."""
        return self.pt.map_reseeds

    def set_map_seed(self, uint64_t seed):
        """Tests only: key the pending map with ``seed`` (rehashing what it holds)."""
        self.pt.map_seed = seed
        if self.pt.map_cap:
            pt_map_resize(&self.pt, self.pt.map_cap)

    cdef int _expect_key(self, int d, int32_t tag, uint64_t key, int32_t corr_hi) except -1:
        """expect() when the table must grow first, is full, or already holds the key
        (set_corr() done): the table decides (pt_expect_key), the core counts."""
        cdef Pending req, old
        cdef int r
        pending_set(&req, self.now_ns, key, self.st[d].rec.slot, corr_hi, 0, d)
        r = pt_expect_key(&self.pt, tag, key, &req, &old)
        if r == PT_DROPPED:
            _count_error(self.c, d, R_OVERFLOW)
            return 0
        if r == PT_REPLACED and not old.flags & P_EXPIRED:
            self._timeout(&old, tag)           # the older request can never be answered now
        self.c.in_flight += 1
        return 0

    cdef int _fifo_full(self, int d) except -1:
        """expect_fifo() with the FIFO full: it grows, or gives up on its oldest request
        (too many unanswered: a timeout, and an overflow counted)."""
        cdef Pending old
        if pt_fifo_room(&self.pt, &old) == PT_PUSHED_OUT:
            if not old.flags & P_EXPIRED:
                self._timeout(&old, 0)
            _count_error(self.c, d, R_OVERFLOW)
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
        cdef PendingWalk w
        cdef Pending* p
        cdef int32_t tag
        cdef Py_ssize_t n = 0
        if now == 0:
            now = monotonic_ns()
        if limit <= 0:
            limit = PY_SSIZE_T_MAX
        self.now_ns = now
        w.phase = 0
        while n < limit:
            p = pt_expire_next(&self.pt, &w, now, self.timeout_ns, &tag)
            if p is NULL:
                break
            self._timeout(p, tag)
            n += 1
        if n < limit:                    # else more may be due: the caller comes back
            pt_shrink(&self.pt)
        if self._tracer_error is not None:
            self._raise_tracer_error()
        return n

    def close(self):
        """Connection ended: unanswered requests are timeouts, half frames are errors."""
        cdef PendingWalk w
        cdef Pending* p
        cdef int32_t tag
        cdef int d
        if self.closed:
            return
        self.closed = True
        self.now_ns = monotonic_ns()
        for d in range(2):                     # a frame begun but not finished
            if self.st[d].open:
                self.st[d].open = 0
                self._emit(&self.st[d].rec)
        w.phase = 0
        while True:
            p = pt_live_next(&self.pt, &w, &tag)
            if p is NULL:
                break
            self._timeout(p, tag)
        pt_forget_all(&self.pt)
        if self.error is None:
            for d in range(2):
                if self.st[d].have > 0 or self.st[d].remaining > 0:
                    _count_error(self.c, d, R_TRUNCATED)
        if self._tracer_error is not None:
            self._raise_tracer_error()

    def abandon(self):
        """Forget every pending request without counting it as a timeout (the upstream
        was never reached: the relay counts that as a connect failure)."""
        cdef PendingWalk w
        cdef int32_t tag
        w.phase = 0
        while pt_live_next(&self.pt, &w, &tag) is not NULL:
            self.c.in_flight -= 1          # only the live ones are in flight
        pt_forget_all(&self.pt)

    @property
    def pending_capacity(self):
        """(map slots, FIFO slots) allocated now (tests: tables shrink after a burst)."""
        return self.pt.map_cap, self.pt.fifo_cap

    @property
    def bytes_fed(self):
        """Bytes fed in both directions so far (the relay's idle check)."""
        return self.st[0].offset + self.st[1].offset

    @property
    def pending(self):
        """Number of requests awaiting a response (expired ones included)."""
        return self.pt.fifo_len + self.pt.map_len

    def frame_start(self, int d):
        """Stream offset where direction d's current frame began."""
        return self.st[d].frame_start



# ---- the splitter's and the recording point's helpers: module functions, called
# directly (no vtable); FrameParser's methods are what other modules call


cdef inline int _frame_finish(FrameParser self, int d, list out) except -1:
    """_frame_end() at the feed loop's frame ends, with the usual logged frame handed
    straight to the frame log (log_plain(), proxy/_framing.pxd): the same row, without
    the two calls and _emit()'s checks (a logged FlyMQ frame cost the loop ~300
    instructions)."""
    if log_plain(self, d):
        return 0
    return _frame_end(self, d, out)


cdef int _frame_end(FrameParser self, int d, list out) except -1:
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
            _fault_decide(self, d)
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
        _hbuf_release(self, d)
    if s.open:
        s.open = 0
        self._emit(&s.rec)
    if self.fault_mode[d] and self.hold[d]:
        _fault_rearm(self, d)               # decide the next frame at its header
    return 0


cdef int _fault_decide(FrameParser self, int d) noexcept:
    """At an armed frame's header (CAP_NEXT) or end: once begin() named its opcode
    slot, keep it for the fault hook (CAP_FAULT) or let it go (CAP_NEXT: the next
    frame is decided in turn); until then hold it (CAP_UNDECIDED).  Returns the bits
    that hold the frame (0: it passes).  begin() always sets rec.messages = 0, over
    the -1 _fault_rearm() left: that tells a begun frame without recording."""
    return _decide(self, d)


cdef void _fault_rearm(FrameParser self, int d) noexcept:
    """Between two frames of an armed direction: decide the next at its header."""
    self.st[d].capture = CAP_NEXT
    self.st[d].rec.messages = -1
    self.fault_fifo_mark[d] = self.pt.fifo_seq


cdef void _mark_injected(FrameParser self, int d) noexcept:
    """A row of a frame the fault engine made: attrs.injected = "1" and attrs.fault =
    its rule, once per frame (entry()'s later rows share the frame's attrs)."""
    cdef DirState* s = &self.st[d]
    cdef bytes name
    if self.fault_marked[d] == s.frame_start + 1:
        return
    self.fault_marked[d] = s.frame_start + 1
    add_attr(self, d, b"injected", 8, b"1", 1)
    name = self.fault_names[d] if self.fault_names is not None else None
    if name is not None:                   # the rule that made it (attrs.fault)
        add_attr(self, d, b"fault", 5, <const uint8_t*>PyBytes_AS_STRING(name), len(name))


cdef int _hold_tail(FrameParser self, int d, Py_ssize_t n, Py_ssize_t emit, object data,
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


cdef Py_ssize_t _capture_head(FrameParser self, int d, int64_t r, Py_ssize_t pos, Py_ssize_t emit,
                              Py_ssize_t n, const uint8_t* buf, list out) except -2:
    """A frame whose header is whole in this read, with capture bits set: hold it
    from its first byte (returns where the read goes on), or -1 when an armed
    direction's frame turns out not to be armed (it passes as usual).  Out of line,
    as _capture_more(): the feed loop stays as small as without captures."""
    cdef DirState* s = &self.st[d]
    cdef Py_ssize_t take
    if s.capture & (CAP_UNDECIDED | CAP_NEXT) and not _decide(self, d):
        if not s.body and r <= n - pos and not s.open:
            _fault_rearm(self, d)           # it ends here and _frame_end() won't run
        return -1
    if emit < pos:
        out.append(_span(buf, emit, pos))
    take = r if r <= n - pos else n - pos
    self.captured[d] = PyByteArray_FromStringAndSize(<const char*>buf + pos, take)
    if s.body and take > s.skip:           # held for faults: the body still streams
        self.on_body(d, buf + pos + s.skip, take - s.skip)
    s.remaining = r - take
    if s.remaining == 0:
        _frame_end(self, d, out)
    return pos + take


cdef Py_ssize_t _capture_more(FrameParser self, int d, const uint8_t* p, Py_ssize_t pos,
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


cdef bint _fault_wants(FrameParser self, int d) noexcept:
    cdef int slot = self.st[d].rec.slot
    if self.fault_mode[d] == 2:
        return 1
    return self.fault_mode[d] == 1 and 0 <= slot < OPCODE_SLOTS and \
        (self.fault_bits[d][slot >> 6] >> (slot & 63)) & 1


cdef int _header_done(FrameParser self, int d, int64_t r, Py_ssize_t seen,
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
        _hbuf_release(self, d)
    return 0


cdef Py_ssize_t _fatal_prefix(FrameParser self, int d, int64_t chunk_start, Py_ssize_t emit,
                              const uint8_t* buf, list out) except -1:
    cdef Py_ssize_t take = <Py_ssize_t>(self.st[d].frame_start - chunk_start)
    if take < 0:
        take = 0
    if out is not None and emit < take:
        out.append(_span(buf, emit, take))
    return take


cdef int _short_frame(FrameParser self, int d, int64_t r, Py_ssize_t asked) except -1:
    self.fail(d, R_BAD_HEADER, "frame of %d bytes at offset %d is shorter than the %d "
              "header bytes its parser read, or its body skip is longer (parser "
              "contract)" % (r, self.st[d].frame_start, asked))
    return 0


cdef Py_ssize_t _contract_error(FrameParser self, int d, int64_t r, Py_ssize_t asked,
                                Py_ssize_t pos, Py_ssize_t emit, const uint8_t* buf,
                                list out) except -1:
    _short_frame(self, d, r, asked)
    if out is not None and emit < pos:
        out.append(_span(buf, emit, pos))
    return pos


cdef void _hbuf_release(FrameParser self, int d) noexcept:
    """A big split-header buffer is given back once its header is done."""
    cdef DirState* s = &self.st[d]
    if s.hcap > HBUF_KEEP and s.ghave == 0 and s.have == 0:
        pending_charge(-s.hcap)
        PyMem_Free(s.hbuf)
        s.hbuf = NULL
        s.hcap = 0


cdef dict _record_dict(FrameParser self, FrameRecord* rec, const uint8_t* res, Py_ssize_t res_len,
                       const uint8_t* attrs, Py_ssize_t alen):
    return record_dict(
        self.stats, self.conn_id, rec[0],
        res[:res_len].decode("utf-8", "replace") if res_len >= 0 else None,
        _attrs_dict(attrs, alen) if alen > 0 else None)


cdef CorrText* _ctext_find(FrameParser self, int d, int slot, int64_t key) noexcept:
    cdef CorrText* t
    cdef CorrState* cs = self.cs
    if cs is NULL or cs.cap == 0:
        return NULL
    t = &cs.ctext[_ctext_index(d, slot, key, cs.cap)]
    if t.slot == slot and t.key == key and t.dir == d:
        return t
    return NULL


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
