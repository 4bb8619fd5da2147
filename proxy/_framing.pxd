# cython: language_level=3
# The framing core shared by every protocol: read this file first, then
# docs/adding-a-protocol.md.
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
# Timeouts (request_timeout, connection closed, limits) are settled by the core.
#
# State transitions (instead of writing DirState fields):
#   want_header(d, n)      see n header bytes before deciding (bounded by header_limit)
#   stream_body(d, skip)   hand the frame's bytes after the first `skip` to on_body()
#   capture_frame(d)       hold the whole frame and forward rewrite()'s result instead
#   gather(d, p, n, want, &out, &used)   first `want` body bytes, copied only when split

from libc.stdint cimport uint8_t, int8_t, int16_t, int32_t, int64_t, uint64_t

cdef enum:
    C2S = 0                  # direction: client -> server
    S2C = 1                  # direction: server -> client
    OPCODE_SLOTS = 257       # 256 distinct opcodes per route (DESIGN.md) + "other"
    OTHER_SLOT = 256         # slot of every opcode after the first 256
    CODE_TABLE = 65536       # numeric opcodes 0..65535 map through a direct table
    NAME_TABLE = 512         # hash table of interned opcode names (power of two)
    STATUS_SLOTS = 32        # distinct status values per route; the last is "other"
    REASON_SLOTS = 32        # protocol-error reasons (framing_common.REASONS)
    N_BUCKETS = 17           # latency histogram bounds (DESIGN.md); +Inf is bucket 17
    HEADER_LIMIT = 65536     # default header_limit: most header bytes a parser may want
    OUTCOME_OK = 0
    OUTCOME_ERROR = 1
    OUTCOME_NONE = -1

# Frame kinds (frame log `kind`; framing_common.KINDS)
cdef enum:
    K_REQUEST = 0
    K_RESPONSE = 1
    K_ONEWAY = 2
    K_EVENT = 3

# Correlation id formats of a record (frame log `correlation_id`)
cdef enum:
    CORR_NONE = 0
    CORR_INT = 1             # str(corr) as unsigned 64-bit        (corr_hi == -1)
    CORR_PAIR = 2            # "%d:%d" % (corr_hi, corr)            (corr_hi >= 0: Stream publishes)
    CORR_SINT = 3            # str(corr) as signed 64-bit          (corr_hi == -2: RocketMQ opaque)
    CORR_HI_SIGNED = -2

# Error reasons (frametap_protocol_errors_total{reason}); names in framing_common.REASONS,
# same order (tests/test_conformance.py checks).  Append only.
cdef enum Reason:
    R_BAD_MAGIC = 0
    R_BAD_VERSION = 1
    R_TOO_LARGE = 2
    R_TOO_SMALL = 3
    R_TRUNCATED = 4
    R_OVERFLOW = 5
    R_MISMATCH = 6
    R_BAD_HEADER = 7
    R_UNKNOWN = 8
    R_BAD_BODY = 9
    R_HEADER_TOO_LARGE = 10
    N_REASONS = 11

cdef struct Pending:
    int64_t t_ns             # monotonic time of the read that carried the request
    int64_t key              # correlation id (map) or request sequence number (FIFO)
    int32_t slot             # opcode slot of the request
    int32_t aux              # map: corr_hi (-1 none); FIFO: the parser's value (e.g. opcode)
    int16_t expired          # 1 once counted as a timeout; the late answer is not observed
    int8_t fifo              # 1: from the FIFO (correlation id = sequence number)
    int8_t dir               # direction the request travelled

cdef struct MapEntry:
    uint64_t key             # correlation id, publishing id, ...
    int32_t tag              # namespace of key (protocol-defined: direction, publisher id)
    int32_t used             # 1 when the entry holds a pending request
    Pending p

# One frame-log row, filled by the recording calls (DESIGN.md "Frame log").  Strings
# are table lookups done by the writer: opcode name from `slot`/`opcode`, request
# opcode name from `req_slot`, status name from `status` via the route's namer,
# route/protocol/peer/run id from the connection.  `resource` and `attrs` are
# references into a per-connection side arena (-1: none), filled by protocols that
# have them.
cdef struct FrameRecord:
    int64_t t_ns             # monotonic ns of the read that completed the frame's header
    int64_t frame_bytes      # whole frame (0 on the extra rows of a multi-entry frame)
    int64_t header_bytes
    int64_t messages
    int64_t latency_ns       # -1: none (only on a response matched to its request)
    int64_t corr             # correlation id (see corr_fmt)
    int64_t status           # protocol status code (has_status)
    int64_t opcode           # the protocol's numeric opcode (-1 for an interned name)
    int32_t corr_hi
    int32_t resource         # side-arena offset, -1 none
    int32_t attrs            # side-arena offset, -1 none
    int16_t slot             # opcode slot (names: RouteStats)
    int16_t req_slot         # slot of the request answered / timed out, -1 none
    int8_t direction
    int8_t kind              # K_*
    int8_t outcome           # OUTCOME_*; OUTCOME_NONE when no status
    int8_t corr_fmt          # CORR_*
    int8_t has_status

cdef struct DirState:
    int64_t remaining        # bytes of the current frame still to pass (payload)
    int64_t frame_start      # stream offset where the current frame began
    int64_t offset           # stream offset of the next byte to be fed
    Py_ssize_t have          # header bytes held in hbuf (only when a header spans reads)
    Py_ssize_t need          # header bytes needed before on_header() can decide
    Py_ssize_t skip          # stream_body(): body starts this many bytes into the frame
    Py_ssize_t ghave         # gather(): body bytes held in hbuf
    int body                 # 1: the rest of this frame goes to on_body()
    int capture              # 1: hold this whole frame and forward rewrite()'s result
    int open                 # 1: rec holds a frame begun and not yet emitted
    int rows                 # entry(): rows this frame has produced
    uint8_t* hbuf            # split header / gathered body bytes (heap, <= header_limit)
    Py_ssize_t hcap
    FrameRecord rec          # the frame being recorded
    Pending taken            # take()/take_fifo(): the request this frame answers
    int has_taken


cdef class RouteStats:
    # Names and identity (Python objects, touched at scrape time only).
    cdef readonly str route
    cdef readonly str protocol
    cdef public object opcode_namer     # callable code -> name, set by the parser
    cdef public object status_namer     # callable status code -> name

    # opcode code <-> slot.  slot_of[code] is -1 until first seen.
    cdef int16_t* slot_of               # CODE_TABLE entries (heap)
    cdef int64_t slot_code[OPCODE_SLOTS]
    cdef int nslots
    # interned opcode names (Thrift methods...): hash -> slot, names kept in an arena
    cdef int16_t name_slot_of[NAME_TABLE]
    cdef uint64_t name_hash[OPCODE_SLOTS]
    cdef list slot_label                # str per slot for interned names, else None

    # status code <-> slot (linear scan: a route sees a handful of statuses)
    cdef int64_t status_code[STATUS_SLOTS]
    cdef int nstatus

    # per (direction, opcode slot)
    cdef uint64_t frames[2][OPCODE_SLOTS]
    cdef uint64_t frame_bytes[2][OPCODE_SLOTS]
    cdef uint64_t messages[2][OPCODE_SLOTS]
    cdef uint64_t relayed[2]            # frametap_bytes_total
    # per (request opcode slot, status slot)
    cdef uint64_t *responses            # OPCODE_SLOTS * STATUS_SLOTS (heap)
    # latency histogram per (request opcode slot, outcome): N_BUCKETS+1 counts, sum
    cdef uint64_t *hist                 # OPCODE_SLOTS * 2 * (N_BUCKETS + 1) (heap)
    cdef double hist_sum[OPCODE_SLOTS][2]
    cdef uint64_t timeouts[OPCODE_SLOTS]
    cdef public uint64_t unmatched
    cdef public int64_t in_flight
    cdef uint64_t errors[2][REASON_SLOTS]

    # connection-level (bumped from Python by the relay, once per connection)
    cdef public int64_t conn_active
    cdef public uint64_t conn_total
    cdef public uint64_t conn_rejected
    cdef public uint64_t connect_failures
    cdef uint64_t connect_hist[N_BUCKETS + 1]
    cdef double connect_sum

    cdef int slot_for(self, int64_t code) noexcept
    cdef int slot_for_name(self, const uint8_t* name, Py_ssize_t n) except -1
    cdef int status_slot(self, int64_t code) noexcept
    cdef void observe(self, int slot, int outcome, int64_t dt_ns) noexcept
    cdef void response(self, int slot, int64_t status) noexcept
    cdef void error(self, int direction, int reason) noexcept


cdef class FrameParser:
    cdef readonly RouteStats stats
    cdef DirState st[2]
    cdef public Py_ssize_t header_size  # bytes every frame starts with (protocol's fixed header)
    cdef public Py_ssize_t header_limit # most bytes want_header()/gather() may ask for
    cdef public int64_t max_frame_bytes # limit on a frame's declared size (protocol-defined)
    cdef public int64_t timeout_ns      # request_timeout
    cdef public int64_t conn_id         # frame-log conn_id (set by the relay)
    cdef int64_t now_ns                 # one clock read per feed() call
    cdef readonly object error          # FrameError after a fatal protocol error, else None
    cdef readonly bint closed
    cdef public object options          # the route's [routes.options] table (dict)
    cdef public object tracer           # callable(dict) per record (tests), or None

    # Rewriting (address rewriting): with hold[d] set, a header split across reads is
    # not forwarded until complete, so the frame can still be captured; feed() then
    # leaves the bytes to forward in ``output`` (a list) instead of "forward data".
    cdef bint hold[2]
    cdef public object output           # list of bytes to forward for the last feed(), or None
    cdef list captured                  # per direction: bytearray of the frame being captured

    # Correlation by key (RabbitMQ Stream, RocketMQ...): open addressing, linear
    # probing, backward-shift deletion; at most map_limit pending entries.
    cdef MapEntry* map
    cdef Py_ssize_t map_cap             # power of two
    cdef Py_ssize_t map_len
    cdef public Py_ssize_t map_limit

    # FIFO of requests awaiting their responses (ring buffer, at most fifo_limit)
    cdef Pending* fifo
    cdef Py_ssize_t fifo_head
    cdef Py_ssize_t fifo_len
    cdef Py_ssize_t fifo_cap
    cdef public Py_ssize_t fifo_limit
    cdef int64_t fifo_seq               # requests pushed so far (1-based correlation ids)

    cpdef Py_ssize_t feed(self, int direction, object data) except -1
    cdef Py_ssize_t _feed(self, int d, object data, const uint8_t* buf,
                          Py_ssize_t n) except -1
    cdef int _frame_end(self, int d, list out) except -1
    cdef int _header_done(self, int d, int64_t r, Py_ssize_t seen,
                          const uint8_t* h) except -1
    cdef int _hbuf_reserve(self, int d, Py_ssize_t n) except -1
    cdef Py_ssize_t _fatal_prefix(self, int d, int64_t chunk_start, Py_ssize_t emit,
                                  object mv, list out) except -1
    cdef int _short_frame(self, int d, int64_t r, Py_ssize_t asked) except -1
    cdef dict _record_dict(self, FrameRecord* rec)
    cdef int _map_grow(self) except -1
    cdef void _emit(self, FrameRecord* rec) noexcept
    cdef void _timeout(self, Pending* p, int tag) noexcept

    # ---- protocol hooks -------------------------------------------------------
    # on_header: called once per frame at a frame boundary with `avail` (>= need)
    # contiguous bytes starting at the frame's first byte.  Returns the frame's total
    # length (> 0), 0 after want_header() asked to see more, -1 after fail() recorded
    # a fatal error; -2 propagates a Python exception.
    cdef int64_t on_header(self, int d, const uint8_t* h, Py_ssize_t avail) except -2
    # on_body: for frames flagged by stream_body(), the frame's bytes after `skip`, in
    # arrival order, in pieces.  on_body_end() follows the last piece.
    cdef int on_body(self, int d, const uint8_t* p, Py_ssize_t n) except -1
    cdef int on_body_end(self, int d) except -1

    # ---- state transitions ----------------------------------------------------
    cdef int want_header(self, int d, Py_ssize_t n) except -2
    cdef int stream_body(self, int d, Py_ssize_t skip) noexcept
    cdef int capture_frame(self, int d) except -1
    cdef int gather(self, int d, const uint8_t* p, Py_ssize_t n, Py_ssize_t want,
                    const uint8_t** out, Py_ssize_t* used) except -2
    cdef int fail(self, int d, int reason, str message) except -1
    cdef void protocol_error(self, int d, int reason) noexcept

    # ---- recording --------------------------------------------------------------
    cdef void begin(self, int d, int slot, int kind, int64_t frame_bytes,
                    int64_t header_bytes) noexcept
    cdef void add_messages(self, int d, int64_t n) noexcept
    cdef void entry(self, int d) noexcept
    cdef int expect(self, int d, int32_t tag, uint64_t key, int32_t corr_hi) except -1
    cdef int expect_fifo(self, int d, int32_t aux) except -1
    cdef int take(self, int d, int32_t tag, uint64_t key) noexcept
    cdef int take_fifo(self, int d) noexcept
    cdef void answer(self, int d, int64_t status, int outcome) noexcept
    cdef void set_status(self, int d, int64_t status, int outcome) noexcept
    cdef void set_corr(self, int d, int64_t corr, int32_t corr_hi) noexcept
