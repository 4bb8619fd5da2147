# cython: language_level=3
# The framing core's contract: what a protocol parser implements and what it may call.
# Read this file first, then docs/adding-a-protocol.md.  The core's other jobs live in
# their own files, which a parser author need not read: proxy/_counters.pxd (the label
# bounds, the frame-log row and the per-route counters), proxy/_pending.pxd/.pyx (the
# pending-request tables), proxy/_framelog.pxd/.pyx (the frame-log buffer and its
# transpose), and proxy/_framing.pyx (RouteStats, the splitter FrameParser.feed(), the
# recording point, faults).  framing_py.py is the pure-Python twin of all of it.
#
# A protocol parser subclasses FrameParser and implements on_header() (once per
# frame, with at least the header bytes it asked for), and optionally on_body() /
# on_body_end().  It never touches counters or core state: it *reports* what a frame
# is through the recording calls below, and the core derives every Prometheus
# counter, every latency observation and the frame-log record from those calls —
# in C here, in Python in the twin (framing_py.py), with the same results.
#
# Recording calls, in the order a parser makes them for one frame:
#   begin(d, slot, kind, frame_bytes, header_bytes)   exactly once per counted frame
#   add_messages(d, n)                                 messages the frame carries
#   expect(d, tag, key, corr_hi) / expect_fifo(d, aux) the frame is a request
#   take(d, tag, key) / take_fifo(d) + answer(d, status, outcome)   a response
#   entry(d)                                           one more row for multi-entry frames
#   set_resource(d, p, n) / add_attr(d, k, kn, v, vn)  frame-log resource and attrs
#   set_corr_str(d, pre, pn, p, n)                     a string correlation id (after
#                                                      expect()/answer(); see below)
# Timeouts (request_timeout, connection closed, limits) are settled by the core.
#
# State transitions (instead of writing DirState fields):
#   want_header(d, n)      see n header bytes before deciding (bounded by header_limit)
#   stream_body(d, skip)   hand the frame's bytes after the first `skip` to on_body()
#   capture_frame(d)       hold the whole frame and forward rewrite()'s result instead
#   gather(d, p, n, want, &out, &used)   first `want` body bytes, copied only when split

from cpython.mem cimport PyMem_Malloc
from libc.stdint cimport uint8_t, int8_t, int16_t, int32_t, int64_t, uint64_t
from libc.string cimport memmove, memcpy

# The names a parser uses (proxy/_counters.pxd defines them): directions C2S / S2C;
# frame kinds K_REQUEST, K_RESPONSE, K_ONEWAY, K_EVENT; OUTCOME_OK / OUTCOME_ERROR;
# the error reasons R_* (framing_common.REASONS, same order); limits OPCODE_SLOTS,
# OTHER_SLOT, HEADER_LIMIT, RESOURCE_MAX, ATTRS_MAX, CORR_STR_MAX; FrameRecord (a
# frame's row: DirState.rec) and Counters (FrameParser.c).
from proxy._counters cimport *
# A request's pending entry: DirState.taken points at one (aux: what expect_fifo() got).
from proxy._pending cimport (Pending, PendingTables, P_EXPIRED, P_FIFO, pending_set,
                             pt_insert_fast, pt_take, pt_push_fast, pt_take_fifo)
from proxy._framelog cimport FrameLogBuffer, CorrText, CorrState, append_plain


# DirState.capture bits: why the current frame is held whole (docs/design.md, "Faults")
cdef enum:
    CAP_REWRITE = 1          # capture_frame(): rewrite() returns what to forward
    CAP_FAULT = 2            # its opcode is armed: fault_hook(d, frame) decides
    CAP_UNDECIDED = 4        # an armed direction holds every frame until its opcode slot
                             # is known (begin()); then it is kept (CAP_FAULT) or let go
    CAP_NEXT = 8             # armed, nothing held: the next frame is decided at its header
                             # (set while a frame that was let go finishes, too)
    FAULT_WORDS = 5          # fault_bits words: OPCODE_SLOTS bits


# One direction of a connection, as the splitter sees it.  Parsers read frame_start (for
# error messages), rec (the frame being recorded) and taken (after take*()); the
# transitions above write the rest.
cdef struct DirState:
    int64_t remaining        # bytes of the current frame still to pass (payload)
    int64_t frame_start      # stream offset where the current frame began
    int64_t offset           # stream offset of the next byte to be fed
    Py_ssize_t have          # header bytes held in hbuf (only when a header spans reads)
    Py_ssize_t need          # header bytes needed before on_header() can decide
    Py_ssize_t skip          # stream_body(): body starts this many bytes into the frame
    Py_ssize_t ghave         # gather(): body bytes held in hbuf
    int body                 # 1: the rest of this frame goes to on_body()
    int capture              # CAP_* bits: hold this whole frame (rewrite() / fault_hook)
    int open                 # 1: rec holds a frame begun and not yet emitted
    int rows                 # entry(): rows this frame has produced
    uint8_t* hbuf            # split header / gathered body bytes (heap, <= header_limit)
    Py_ssize_t hcap
    FrameRecord rec          # the frame being recorded
    Pending* taken           # take()/take_fifo(): the request this frame answers, or NULL
                             # (a FIFO slot, valid until the next expect_fifo(); or `held`)
    Pending held             # take(): the map entry, copied out (deletion moves entries)
    int res_len              # set_resource(): bytes in res, -1 none (only when recording)
    uint8_t res[RESOURCE_MAX]
    uint8_t* attrs           # add_attr(): (u16 klen, key, u16 vlen, value)... (heap, lazy)
    Py_ssize_t alen


# The counters of one route, shared by its connections.  A parser gets slots from it:
# slot_for(code) for a numeric opcode, slot_for_name(p, n) for a named one (Thrift).
cdef class RouteStats:
    cdef readonly str route
    cdef readonly str protocol
    cdef public object opcode_namer     # callable code -> name, set by the parser
    cdef public object status_namer     # callable status code -> name
    # opcode code <-> slot.  slot_of[code]: the slot once seen; before, -2 for a code of
    # the protocol's table (set_known), -1 for any other.  Unknown codes take at most
    # UNKNOWN_LABELS slots, then share one labelled "unknown".
    cdef int16_t* slot_of               # CODE_TABLE entries (heap)
    cdef int64_t slot_code[OPCODE_SLOTS]
    cdef int nslots
    cdef readonly bint has_known        # set_known() was called: unknown codes are capped
    cdef int n_unknown
    cdef int unknown_slot               # the shared "unknown" slot, -1 until needed
    cdef int16_t name_slot_of[NAME_TABLE]   # interned names: hash -> slot
    cdef uint64_t name_hash[OPCODE_SLOTS]
    cdef list slot_label                # bytes per slot for interned names, else None
    cdef Counters c
    # connection-level (bumped from Python by the relay, once per connection)
    cdef public int64_t conn_active
    cdef public uint64_t conn_total
    cdef public uint64_t conn_rejected
    cdef public uint64_t connect_failures
    cdef uint64_t connect_hist[N_BUCKETS + 1]
    cdef double connect_sum

    cdef int _slot_miss(self, int64_t code) noexcept
    cdef int _shared_unknown(self) noexcept
    cdef int slot_for_name(self, const uint8_t* name, Py_ssize_t n) except -1
    cdef void error(self, int direction, int reason) noexcept

    cdef inline int slot_for(self, int64_t code) noexcept:
        """The opcode slot of a numeric code: a code already seen is one table read,
        inline in every parser's per-frame path; a first sighting (or one outside the
        table) takes _slot_miss()."""
        cdef int s
        if 0 <= code < CODE_TABLE:
            s = self.slot_of[code]
            if s >= 0:
                return s
        return self._slot_miss(code)


cdef class FrameParser:
    # ---- what a parser sets (in __init__) and reads ----------------------------------
    cdef readonly RouteStats stats
    cdef Counters* c                    # &stats.c (stats is kept alive by the reference above)
    cdef DirState st[2]
    cdef public Py_ssize_t header_size  # bytes every frame starts with (protocol's fixed header)
    cdef public Py_ssize_t header_limit # most bytes want_header()/gather() may ask for
    cdef public int64_t max_frame_bytes # limit on a frame's declared size (protocol-defined)
    cdef public int64_t timeout_ns      # request_timeout
    cdef public object options          # the route's [routes.options] table (dict)
    cdef readonly bint recording        # records are wanted (a tracer, the frame log, faults):
                                        # skip work only the frame log needs when false
    cdef bint fast_path                 # the parser overrides fast_frames()

    # ---- the core's own state (proxy/_framing.pyx) --------------------------------
    cdef public int64_t conn_id         # frame-log conn_id (set by the relay)
    cdef int64_t now_ns                 # one clock read per feed() call
    cdef readonly object error          # FrameError after a fatal protocol error, else None
    cdef readonly bint closed
    cdef readonly Py_ssize_t feed_frames # headers parsed by the last feed() (the relay's yield)
    cdef public Py_ssize_t frame_cap    # > 0: feed() stops at the first frame boundary after
                                        # frame_cap headers + messages (the relay defers the
                                        # rest: docs/design.md, "Fairness")
    cdef Py_ssize_t feed_work           # messages and pending requests of the last feed()
    cdef readonly bint more             # the last feed() stopped at frame_cap, bytes left
    cdef object _tracer                 # callable(dict) per record (tests), or None
    cdef object _tracer_error           # what the tracer raised, re-raised by the public call
    cdef FrameLogBuffer log             # the frame log this connection writes to, or None
    cdef int32_t log_route              # this route's index in log
    # Rewriting: with hold[d] set, a header split across reads is not forwarded until
    # complete, so the frame can still be captured; feed() then leaves the bytes to
    # forward in ``output`` (a list) instead of "forward data".
    cdef bint hold[2]
    cdef public object output           # list of bytes to forward for the last feed(), or None
    cdef list captured                  # per direction: bytearray of the frame being captured
    cdef PendingTables pt               # requests awaiting responses (proxy/_pending.pxd)
    cdef CorrState* cs                  # string ids (set_corr_str), recording only; NULL
                                        # until first used (proxy/_framelog.pxd)
    # Faults (proxy/faults.py): an armed direction holds each frame until its opcode slot
    # is known; a frame whose slot is armed goes whole to fault_hook, any other is
    # forwarded without a Python call.  Unarmed directions never look at these fields.
    cdef uint8_t fault_mode[2]          # 0 off; 1 slots in fault_bits; 2 every frame
    cdef uint64_t fault_bits[2][FAULT_WORDS]   # armed opcode slots
    cdef bint fault_hold[2]             # hold[d] was turned on by set_faults()
    cdef bint fault_rec                 # recording forced on while armed (kind, resource)
    cdef public object fault_hook       # callable(d, frame) -> bytes or a fault marker
    cdef bint fault_marking[2]          # frames fed now were made by the fault engine
    cdef int64_t fault_marked[2]        # 1 + frame_start of the last frame so marked
    cdef list fault_names               # per direction: the rule (bytes) of marked frames, or None
    cdef bint fault_record[2]           # rules of direction d need kind / resource: record
    cdef int64_t fault_fifo_mark[2]     # fifo_seq when direction d's frame began (FIFO
                                        # requests are known without recording)

    # ---- protocol hooks -------------------------------------------------------
    # on_header: called once per frame at a frame boundary with `avail` (>= need)
    # contiguous bytes starting at the frame's first byte.  Returns the frame's total
    # length (> 0), 0 after want_header() asked to see more, -1 after fail() recorded
    # a fatal error; -2 propagates a Python exception.
    cdef int64_t on_header(self, int d, const uint8_t* h, Py_ssize_t avail) except -2
    # fast_frames (optional; a parser that has one sets fast_path in its __init__): while
    # the direction is not held (no rewriting, no armed fault), the core hands it a read at
    # a frame boundary, buf[pos:n]; it parses the frames there exactly as on_header()
    # would, with on_header's own inline code and without a call per frame, ending each
    # whole frame with frame_done(), and returns where it stopped: at a frame it leaves
    # to on_header() (an error, a header split across reads, a header it must see more
    # of), at frame_cap, or n (a last frame that runs past n sets st[d].remaining), or
    # past the header of a frame whose body streams (stream_body(): st[d].remaining set
    # to the bytes after st[d].skip).
    cdef Py_ssize_t fast_frames(self, int d, const uint8_t* buf, Py_ssize_t pos,
                                Py_ssize_t n, int64_t chunk_start) except -1
    # on_body: for frames flagged by stream_body(), the frame's bytes after `skip`, in
    # arrival order, in pieces.  on_body_end() follows the last piece.
    cdef int on_body(self, int d, const uint8_t* p, Py_ssize_t n) except -1
    cdef int on_body_end(self, int d) except -1
    # fail: a fatal protocol error (counted; the connection closes after the valid prefix)
    cdef int fail(self, int d, int reason, str message) except -1

    # ---- the core's methods (proxy/_framing.pyx; not for parsers) ------------------
    cpdef Py_ssize_t feed(self, int direction, object data) except -1
    cdef Py_ssize_t _feed(self, int d, object data, const uint8_t* buf,
                          Py_ssize_t n) except -1
    cdef int _hbuf_reserve(self, int d, Py_ssize_t n) except -1
    cdef void _emit(self, FrameRecord* rec) noexcept
    cdef void _timeout(self, Pending* p, int tag) noexcept
    cdef int _expect_key(self, int d, int32_t tag, uint64_t key, int32_t corr_hi) except -1
    cdef int _fifo_full(self, int d) except -1
    cdef CorrState* _corr_state(self) noexcept
    cdef int _ctext_keep(self, int d, FrameRecord* rec) except -1
    cdef int end_frame(self, int d) except -1


# ==== The calls parsers make (inline: compiled into each parser, no vtable) ==========
# State transitions: want_header, stream_body, capture_frame, gather, protocol_error
# (fail() is a method: it is the rare path).  Recording: begin, add_messages, entry,
# set_corr, set_status, expect, expect_fifo, take, take_fifo, answer.  Usage from a
# parser: ``begin(self, d, slot, K_REQUEST, total, header_bytes)``; the pure-Python twin
# has the same calls as methods (``self.begin(d, ...)``).

cdef inline int want_header(FrameParser self, int d, Py_ssize_t n) except -2:
    """Ask to see n header bytes before on_header() decides; returns what
    on_header() should return: 0, or -1 after fail() when n > header_limit."""
    if n > self.header_limit:
        self.fail(d, R_HEADER_TOO_LARGE, "a header of %d bytes at offset %d exceeds the "
                  "header limit %d" % (n, self.st[d].frame_start, self.header_limit))
        return -1
    self.st[d].need = n
    return 0


cdef inline int stream_body(FrameParser self, int d, Py_ssize_t skip) noexcept:
    """Pass this frame's bytes after its first `skip` to on_body()."""
    self.st[d].body = 1
    self.st[d].skip = skip
    return 0


cdef inline int capture_frame(FrameParser self, int d) except -1:
    """Hold this whole frame; rewrite() returns what to forward instead."""
    if not self.hold[d]:
        raise RuntimeError("capture_frame() needs set_hold(%d, True) first" % d)
    self.st[d].capture |= CAP_REWRITE
    return 0


cdef inline int gather(FrameParser self, int d, const uint8_t* p, Py_ssize_t n, Py_ssize_t want,
                const uint8_t** out, Py_ssize_t* used) except -2:
    """From on_body(): the frame's next `want` body bytes, contiguous.

    Returns 1 with *out pointing at them (in place when this piece holds them all,
    else in the direction's header buffer), 0 when this piece ended first (all of it
    is kept), -1 after fail() when want > header_limit.  *used = bytes of p taken.
    """
    cdef DirState* s = &self.st[d]
    cdef Py_ssize_t take
    if s.ghave == 0 and n >= want:
        out[0] = p
        used[0] = want
        return 1
    if want > s.hcap and self._hbuf_reserve(d, want) < 0:
        used[0] = n
        return -1
    take = want - s.ghave
    if take > n:
        take = n
    memmove(s.hbuf + s.ghave, p, take)
    s.ghave += take
    used[0] = take
    if s.ghave < want:
        return 0
    s.ghave = 0
    out[0] = s.hbuf
    return 1


cdef inline int log_plain(FrameParser self, int d) except -1:
    """The usual logged frame (no capture, body, fault, tracer, attrs, string id or later
    entry row; a header buffer of the usual size) at its end: its record appended to the
    frame log in place, without _emit()'s checks.  1 when done, 0 for anything else."""
    cdef DirState* s = &self.st[d]
    if (s.open and not (s.capture or s.body or self.fault_mode[d] or self.fault_marking[d])
            and s.alen == 0 and s.rows <= 1 and s.rec.corr_fmt != CORR_STR
            and s.hcap <= HBUF_KEEP and self.cs is NULL and self._tracer is None
            and self.log is not None):
        s.ghave = 0
        s.open = 0
        if not append_plain(self.log, &s.rec, self.conn_id, self.log_route, &s.res[0],
                            s.res_len):
            self.log.append(&s.rec, self.conn_id, self.log_route, &s.res[0], s.res_len,
                            NULL, 0, 0, NULL, -1)
        return 1
    return 0


cdef inline int frame_done(FrameParser self, int d) except -1:
    """A whole frame parsed in fast_frames() has passed (no body, not held): its record,
    if one is open, goes to the frame log, in place (log_plain) or through the core's
    end of frame (FrameParser.end_frame: a tracer, attrs, a string id, a fault)."""
    if not self.st[d].open or log_plain(self, d):
        return 0
    return self.end_frame(d)


cdef inline void protocol_error(FrameParser self, int d, int reason) noexcept:
    """A non-fatal violation (the frame is still forwarded): count it."""
    _count_error(self.c, d, reason)

# ---- recording ------------------------------------------------------------


cdef inline void set_resource(FrameParser self, int d, const uint8_t* p, Py_ssize_t n) noexcept:
    """The frame's frame-log `resource` (topic, stream, routing path): n bytes of UTF-8,
    copied (at most RESOURCE_MAX).  Never a secret."""
    cdef DirState* s = &self.st[d]
    if not self.recording or n < 0:
        return
    if n > RESOURCE_MAX:
        n = RESOURCE_MAX
    memcpy(s.res, p, n)
    s.res_len = <int>n


cdef inline void set_corr_str(FrameParser self, int d, const uint8_t* pre, Py_ssize_t pn,
                              const uint8_t* p, Py_ssize_t n) noexcept:
    """The frame's frame-log `correlation_id` as text: the prefix (pn bytes, may be 0)
    then n bytes of UTF-8, at most CORR_STR_MAX in all (cut at a character boundary);
    n < 0: the row has no correlation id (null).  Call it after expect()/answer(): it
    replaces the integer id those set for the row, while requests are still matched
    by their integer key.  On a request (a frame that expect()ed) the text is also
    kept for the request's timeout row.  Copied only while recording."""
    cdef DirState* s = &self.st[d]
    cdef FrameRecord* rec = &s.rec
    cdef Py_ssize_t m
    cdef CorrState* cs
    if not self.recording or not s.open:
        return
    cs = self.cs
    if cs is NULL:
        cs = self._corr_state()
        if cs is NULL:                     # out of memory: the row keeps its integer id
            return
    if n < 0:
        cs.cid_len[d] = -1
    else:
        if pn < 0:
            pn = 0
        if pn > CORR_STR_MAX:
            pn = CORR_STR_MAX
        memcpy(&cs.cid[d][0], pre, pn)
        m = n
        if m > CORR_STR_MAX - pn:
            m = CORR_STR_MAX - pn
            while m > 0 and (p[m] & 0xC0) == 0x80:    # not inside a UTF-8 character
                m -= 1
        memcpy(&cs.cid[d][pn], p, m)
        cs.cid_len[d] = <int>(pn + m)
    if rec.kind == K_REQUEST and rec.corr_fmt != CORR_NONE and rec.corr_fmt != CORR_STR:
        self._ctext_keep(d, rec)
    rec.corr_fmt = CORR_STR if cs.cid_len[d] >= 0 else CORR_NONE


cdef inline int add_attr(FrameParser self, int d, const uint8_t* k, Py_ssize_t kn,
                         const uint8_t* v, Py_ssize_t vn) except -1:
    """One frame-log `attrs` entry (key, value: UTF-8) for the current frame; pairs
    past ATTRS_MAX bytes per frame are dropped.  Never a secret."""
    cdef DirState* s = &self.st[d]
    if not self.recording:
        return 0
    if kn > 65535 or vn > 65535 or s.alen + 4 + kn + vn > ATTRS_MAX:
        return 0
    if s.attrs is NULL:
        s.attrs = <uint8_t*>PyMem_Malloc(ATTRS_MAX)
        if s.attrs is NULL:
            raise MemoryError()
    s.attrs[s.alen] = <uint8_t>(kn >> 8)
    s.attrs[s.alen + 1] = <uint8_t>kn
    memcpy(s.attrs + s.alen + 2, k, kn)
    s.alen += 2 + kn
    s.attrs[s.alen] = <uint8_t>(vn >> 8)
    s.attrs[s.alen + 1] = <uint8_t>vn
    memcpy(s.attrs + s.alen + 2, v, vn)
    s.alen += 2 + vn
    return 0



cdef inline void begin(FrameParser self, int d, int slot, int kind, int64_t frame_bytes,
                int64_t header_bytes) noexcept:
    """A frame: count it under opcode `slot` and open its record."""
    cdef DirState* s = &self.st[d]
    cdef FrameRecord* rec = &s.rec
    if s.open:
        self._emit(rec)                    # a parser that began twice: keep both
    if slot < 0 or slot > OTHER_SLOT:
        slot = OTHER_SLOT
    count_frame(self, d, slot, frame_bytes)
    rec.slot = <int16_t>slot
    rec.messages = 0
    if not self.recording:                 # counters only: no record to fill
        return
    s.open = 1
    s.rows = 0
    rec.t_ns = self.now_ns
    rec.frame_bytes = frame_bytes
    rec.header_bytes = header_bytes
    rec.latency_ns = -1
    rec.corr = 0
    rec.status = 0
    rec.opcode = self.stats.slot_code[slot] if slot < self.stats.nslots else -1
    rec.corr_hi = -1
    rec.resource = -1
    rec.attrs = -1
    rec.req_slot = -1
    rec.direction = <int8_t>d
    rec.kind = <int8_t>kind
    rec.outcome = OUTCOME_NONE
    rec.corr_fmt = CORR_NONE
    rec.has_status = 0
    s.res_len = -1
    s.alen = 0


cdef inline void add_messages(FrameParser self, int d, int64_t n) noexcept:
    """The current frame carries n more messages (frametap_messages_total)."""
    cdef FrameRecord* rec = &self.st[d].rec
    count_messages(self, d, rec.slot, n)
    rec.messages += n


cdef inline void entry(FrameParser self, int d) noexcept:
    """One more separately acknowledged entry of the current frame: its own row
    (messages = 1); rows after the first carry no bytes (docs/design.md, "Frame log")."""
    cdef DirState* s = &self.st[d]
    cdef FrameRecord* rec = &s.rec
    if not self.recording:
        return
    if s.rows > 0:
        self._emit(rec)
        rec.frame_bytes = 0
        rec.header_bytes = 0
        rec.latency_ns = -1
        rec.corr_fmt = CORR_NONE
        rec.corr_hi = -1
        rec.has_status = 0
        rec.outcome = OUTCOME_NONE
        rec.req_slot = -1
    s.rows += 1
    rec.messages = 1


cdef inline void set_corr(FrameParser self, int d, int64_t corr, int32_t corr_hi) noexcept:
    cdef FrameRecord* rec = &self.st[d].rec
    if not self.recording:
        return
    rec.corr = corr
    rec.corr_hi = corr_hi
    rec.corr_fmt = _corr_fmt(corr_hi)


cdef inline void set_status(FrameParser self, int d, int64_t status, int outcome) noexcept:
    """A status on a frame that answers no tracked request (e.g. a Credit error):
    counted in frametap_responses_total under the frame's own opcode."""
    cdef FrameRecord* rec = &self.st[d].rec
    _count_response(self.c, rec.slot, status)
    if not self.recording:
        return
    rec.status = status
    rec.has_status = 1
    rec.outcome = <int8_t>outcome



cdef inline int expect(FrameParser self, int d, int32_t tag, uint64_t key, int32_t corr_hi) except -1:
    """The current frame is a request answered by key (tag = namespace).  Inline only
    the common case, a new key in a table with room (proxy/_pending.pxd); growing, a
    full table and a key already pending go to FrameParser._expect_key."""
    cdef Pending req
    set_corr(self, d, <int64_t>key, corr_hi)
    pending_set(&req, self.now_ns, key, self.st[d].rec.slot, corr_hi, 0, d)
    self.feed_work += 1
    if pt_insert_fast(&self.pt, tag, key, &req):
        return self._expect_key(d, tag, key, corr_hi)
    self.c.in_flight += 1
    return 0


cdef inline int expect_fifo(FrameParser self, int d, int32_t aux) except -1:
    """The current frame is a request answered in order; aux comes back in take_fifo()."""
    set_corr(self, d, self.pt.fifo_seq + 1, -1)
    return push_fifo(self, d, self.st[d].rec.slot, aux)


cdef inline int take(FrameParser self, int d, int32_t tag, uint64_t key) noexcept:
    """Remove the request pending under (tag, key) for answer(); returns its opcode
    slot, or -1 when there is none (answer() then counts an unmatched response)."""
    cdef DirState* s = &self.st[d]
    if not pt_take(&self.pt, tag, key, &s.held):
        s.taken = NULL
        return -1
    s.taken = &s.held
    return s.held.slot


cdef inline int take_fifo(FrameParser self, int d) noexcept:
    """Remove the oldest request for answer(); returns its slot or -1 (none)."""
    cdef DirState* s = &self.st[d]
    s.taken = pt_take_fifo(&self.pt)
    return s.taken.slot if s.taken is not NULL else -1


cdef inline void answer(FrameParser self, int d, int64_t status, int outcome) noexcept:
    """The current frame answers the request take*() found (or nothing): counts
    the response, observes its latency, fills the record."""
    cdef DirState* s = &self.st[d]
    cdef FrameRecord* rec = &s.rec
    cdef Pending* p = s.taken
    cdef int64_t dt
    if self.recording:
        rec.status = status
        rec.has_status = 1
        rec.outcome = <int8_t>outcome
    if p is NULL:
        self.c.unmatched += 1
        return
    s.taken = NULL
    dt = latency(self, p)
    if self.recording:
        rec.req_slot = <int16_t>p.slot
        rec.corr = p.key
        rec.corr_hi = p.aux if not p.flags & P_FIFO else -1
        rec.corr_fmt = _corr_fmt(rec.corr_hi)
        if dt >= 0:
            rec.latency_ns = dt
    _count_answers(self.c, p.slot, status, outcome, dt, 1)


# ---- counting alone (recording off): what begin(), add_messages(), expect_fifo() and
# answer() count, without a record.  A parser's fast_frames() loop uses them while
# ``recording`` is false (proxy/protocols/flymq/_parser.pyx); the calls above are built
# on them, so both paths count alike (tests/test_conformance.py: with and without a
# tracer, the same counters).

cdef inline void count_frame(FrameParser self, int d, int slot, int64_t frame_bytes) noexcept:
    """A frame under opcode slot (0..OTHER_SLOT)."""
    self.c.frames[d][slot] += 1
    self.c.frame_bytes[d][slot] += frame_bytes


cdef inline void count_messages(FrameParser self, int d, int slot, int64_t n) noexcept:
    self.c.messages[d][slot] += n
    self.feed_work += n


cdef inline int push_fifo(FrameParser self, int d, int slot, int32_t aux) except -1:
    """A request of opcode slot answered in order; aux comes back with its answer."""
    self.pt.fifo_seq += 1
    if self.pt.fifo_len == self.pt.fifo_cap or self.pt.fifo_len >= self.pt.fifo_limit:
        self._fifo_full(d)                 # grow, or give up on the oldest (a timeout)
    pending_set(pt_push_fast(&self.pt), self.now_ns, self.pt.fifo_seq, slot, aux, 1, d)
    self.c.in_flight += 1
    return 0


cdef inline int64_t latency(FrameParser self, const Pending* p) noexcept:
    """The latency of an answer to p in ns, or -1 when p had timed out (not observed)."""
    cdef int64_t dt
    if p.flags & P_EXPIRED:
        return -1
    dt = self.now_ns - p.t_ns
    return dt if dt > 0 else 0


cdef struct Tally:
    # a fast_frames() loop's run of like answers (same request opcode, status, outcome and
    # latency), counted once at its end: a read's answers to the requests of one earlier
    # read share their latency (one clock read a read), so a run of them costs one
    # histogram update instead of one each
    int64_t k                # answers in the run (0: none)
    int64_t dt               # their latency (latency(): -1 not observed)
    int64_t status
    int32_t slot
    int32_t outcome


cdef inline void tally_start(Tally* t) noexcept:
    t.k = 0
    t.dt = 0
    t.status = 0
    t.slot = 0
    t.outcome = 0


cdef inline void tally_answer(FrameParser self, Tally* t, const Pending* p, int64_t status,
                              int outcome) noexcept:
    """answer() of a counted frame (recording off) for the request p (NULL: none)."""
    cdef int64_t dt
    if p is NULL:
        self.c.unmatched += 1
        return
    dt = latency(self, p)
    if t.k and t.dt == dt and t.slot == p.slot and t.status == status \
            and t.outcome == outcome:
        t.k += 1
        return
    tally_flush(self, t)
    t.k = 1
    t.dt = dt
    t.slot = p.slot
    t.status = status
    t.outcome = outcome


cdef inline void tally_flush(FrameParser self, Tally* t) noexcept:
    """Count the run held in t (before the loop returns, and before another run)."""
    if t.k:
        _count_answers(self.c, t.slot, t.status, t.outcome, t.dt, t.k)
        t.k = 0

