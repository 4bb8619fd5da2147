# cython: language_level=3
# The framing core shared by every protocol: read this file first.
#
# RouteStats holds every per-route counter in fixed C arrays; the hot path bumps
# them without creating Python objects and proxy/metrics.py reads them at scrape
# time.  FrameParser turns the two byte streams of one proxied connection into
# frames across arbitrary read boundaries and calls the protocol's on_header()
# once per frame with a pointer to (at least) the header bytes.

from libc.stdint cimport uint8_t, int16_t, int32_t, int64_t, uint64_t

cdef enum:
    C2S = 0                  # direction: client -> server
    S2C = 1                  # direction: server -> client
    OPCODE_SLOTS = 257       # 256 distinct opcodes per route (DESIGN.md) + "other"
    OTHER_SLOT = 256         # slot of every opcode after the first 256
    CODE_TABLE = 65536       # opcodes 0..65535 map through a direct table
    STATUS_SLOTS = 32        # distinct status values per route; the last is "other"
    REASON_SLOTS = 32        # protocol-error reasons (framing.REASONS)
    N_BUCKETS = 17           # latency histogram bounds (DESIGN.md); +Inf is bucket 17
    HDR_MAX = 64             # most header bytes a protocol may ask to see at once
    OUTCOME_OK = 0
    OUTCOME_ERROR = 1

cdef struct Pending:
    int64_t t_ns             # monotonic time of the read that carried the request
    int64_t key              # correlation key (unused by FIFO protocols)
    int32_t slot             # opcode slot of the request
    int32_t expired          # 1 once counted as a timeout; the late answer is not observed

cdef struct MapEntry:
    uint64_t key             # correlation id, publishing id, ...
    int32_t tag              # namespace of key (protocol-defined: direction, publisher id)
    int32_t used             # 1 when the entry holds a pending request
    Pending p

cdef struct DirState:
    int64_t remaining        # bytes of the current frame still to pass (payload)
    int body                 # 1: pass the rest of this frame to on_body() (protocol sets it)
    int capture              # 1: hold this whole frame and forward rewrite()'s result instead
    int64_t frame_start      # stream offset where the current frame began
    int64_t offset           # stream offset of the next byte to be fed
    Py_ssize_t have          # header bytes held in hdr (only when a header spans reads)
    Py_ssize_t need          # header bytes needed before on_header() can decide
    uint8_t hdr[HDR_MAX]     # copy of a header split across reads


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
    cdef int status_slot(self, int64_t code) noexcept
    cdef void observe(self, int slot, int outcome, int64_t dt_ns) noexcept
    cdef void response(self, int slot, int64_t status) noexcept
    cdef void error(self, int direction, int reason) noexcept


cdef class FrameParser:
    cdef readonly RouteStats stats
    cdef DirState st[2]
    cdef public Py_ssize_t header_size  # bytes every frame starts with (protocol's fixed header)
    cdef public int64_t max_frame_bytes # limit on a frame's declared size (protocol-defined)
    cdef public int64_t timeout_ns      # request_timeout
    cdef int64_t now_ns                 # one clock read per feed() call
    cdef readonly object error          # FrameError after a fatal protocol error, else None
    cdef readonly bint closed
    cdef public object options          # the route's [routes.options] table (dict)

    # Rewriting (address rewriting): with hold[d] set, a header split across reads is
    # not forwarded until complete, so the frame can still be captured; feed() then
    # leaves the bytes to forward in ``output`` (a list) instead of "forward data".
    cdef bint hold[2]
    cdef public object output           # list of bytes to forward for the last feed(), or None
    cdef list captured                  # per direction: bytearray of the frame being captured

    # Correlation by key (RabbitMQ Stream, RocketMQ...): open addressing, linear
    # probing, backward-shift deletion; grows to map_limit entries.
    cdef MapEntry* map
    cdef Py_ssize_t map_cap             # power of two
    cdef Py_ssize_t map_len
    cdef public Py_ssize_t map_limit

    # FIFO of requests awaiting their responses (ring buffer, grows to fifo_limit)
    cdef Pending* fifo
    cdef Py_ssize_t fifo_head
    cdef Py_ssize_t fifo_len
    cdef Py_ssize_t fifo_cap
    cdef public Py_ssize_t fifo_limit

    cpdef Py_ssize_t feed(self, int direction, object data) except -1
    cdef Py_ssize_t _feed(self, int d, const uint8_t* buf, Py_ssize_t n) except -1
    cdef Py_ssize_t _feed_rewriting(self, int d, object data, const uint8_t* buf,
                                    Py_ssize_t n) except -1
    cdef object _rewrite(self, int d)
    cdef int _map_grow(self) except -1

    # Protocol hook, called once per frame at a frame boundary with `avail` (>= need)
    # contiguous bytes starting at the frame's first byte.  Returns the frame's total
    # length (> 0), 0 after raising st[d].need to see more header bytes, -1 after
    # fail() recorded a fatal error; -2 propagates a Python exception.
    cdef int64_t on_header(self, int d, const uint8_t* h, Py_ssize_t avail) except -2

    # Body hook for frames flagged st[d].body: the frame's bytes after its header
    # (need bytes), in arrival order, in pieces.  on_body_end() follows the last piece.
    cdef int on_body(self, int d, const uint8_t* p, Py_ssize_t n) except -1
    cdef int on_body_end(self, int d) except -1

    cdef int fail(self, int d, int reason, str message) except -1
    cdef int map_put(self, int32_t tag, uint64_t key, int32_t slot) except -1
    cdef int map_take(self, int32_t tag, uint64_t key, Pending* out) noexcept
    cdef int fifo_push(self, int32_t slot, int64_t key) except -1
    cdef Pending* fifo_pop(self) noexcept
    cdef void settle(self, Pending* p, int outcome) noexcept
