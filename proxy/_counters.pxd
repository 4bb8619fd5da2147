# cython: language_level=3
# What the framing core derives from a parser's recording calls (proxy/_framing.pxd):
# the bounds of every label and table, the frame-log row (FrameRecord) and the per-route
# counters (Counters), with the inline helpers that bump them.  No cdef class here: the
# frame log (proxy/_framelog.pxd) and the core both build on this file alone.

from libc.stdint cimport uint8_t, int8_t, int16_t, int32_t, int64_t, uint64_t

# Label and histogram bounds: docs/design.md, "Prometheus metrics".
cdef enum:
    C2S = 0                  # direction: client -> server
    S2C = 1                  # direction: server -> client
    OPCODE_SLOTS = 257       # 256 distinct opcodes per route + "other"
    OTHER_SLOT = 256         # slot of every opcode after the first 256
    CODE_TABLE = 65536       # numeric opcodes 0..65535 map through a direct table
    NAME_TABLE = 512         # hash table of interned opcode names (power of two)
    UNKNOWN_LABELS = 16      # unknown_<n> labels per route; later unknown codes share "unknown"
    STATUS_SLOTS = 32        # distinct status values per route; the last is "other"
    REASON_SLOTS = 32        # protocol-error reasons (framing_common.REASONS)
    N_BUCKETS = 17           # latency histogram bounds; +Inf is bucket 17
    HEADER_LIMIT = 65536     # default header_limit: most header bytes a parser may want
    RESOURCE_MAX = 256       # frame-log resource bytes kept per frame (longer: truncated)
    ATTRS_MAX = 4096         # frame-log attrs bytes per frame (further pairs are dropped)
    CORR_STR_MAX = 128       # set_corr_str(): bytes of a string correlation id kept (longer:
                             # cut at a UTF-8 character boundary, framing_common.clip_corr)
    CORR_TEXT_SLOTS = 1024   # most string ids a connection keeps for its timeout rows
    HBUF_KEEP = 4096         # framing_common.HBUF_KEEP
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
    CORR_STR = 4             # set_corr_str()'s text; in a LogRecord, corr = its arena offset
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
    R_PARSER_ERROR = 11
    R_HEADER_RULE = 12       # per-type header rules broken (required/forbidden fields)
    R_PENDING_BUDGET = 13    # a split header's buffer did not fit [proxy] max_pending_bytes
    R_WS_FIRST = 14          # 14..27: fleximq over WebSocket (framing_common.REASONS)
    N_REASONS = 28

cdef enum:
    EV_TIMEOUT = 0           # FrameRecord.status of a K_EVENT row: no answer in time
    EV_CLOSED = 1            # ... its connection closed before the answer (a cut-off)


# One frame-log row, filled by the recording calls (docs/design.md, "Frame log").  Strings
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


# Every per-route counter the hot path bumps, in one C struct inside RouteStats: parsers
# reach it through FrameParser.c, a plain pointer (no reference counting, no vtable).
cdef struct Counters:
    uint64_t frames[2][OPCODE_SLOTS]
    uint64_t frame_bytes[2][OPCODE_SLOTS]
    uint64_t messages[2][OPCODE_SLOTS]
    uint64_t relayed[2]                 # frametap_bytes_total
    uint64_t timeouts[OPCODE_SLOTS]
    uint64_t cutoffs[OPCODE_SLOTS]      # unanswered when the connection closed
    uint64_t unmatched
    int64_t in_flight
    uint64_t errors[2][REASON_SLOTS]
    # status code <-> slot (linear scan: a route sees a handful of statuses)
    int64_t status_code[STATUS_SLOTS]
    int nstatus
    # per (request opcode slot, status slot)
    uint64_t* responses                 # OPCODE_SLOTS * STATUS_SLOTS (heap)
    # latency histogram per (request opcode slot, outcome): N_BUCKETS+1 counts, sum
    uint64_t* hist                      # OPCODE_SLOTS * 2 * (N_BUCKETS + 1) (heap)
    int64_t hist_sum_ns[OPCODE_SLOTS][2]   # in ns: exact however answers are added up
                                        # (one by one or by run); seconds at scrape time
    int64_t bounds[N_BUCKETS]           # the histogram's upper bounds, ns


cdef inline int _status_slot(Counters* c, int64_t code) noexcept:
    cdef int i
    for i in range(c.nstatus):
        if c.status_code[i] == code:
            return i
    if c.nstatus < STATUS_SLOTS - 1:
        i = c.nstatus
        c.status_code[i] = code
        c.nstatus += 1
        return i
    return STATUS_SLOTS - 1


cdef inline void _count_response(Counters* c, int slot, int64_t status) noexcept:
    c.responses[slot * STATUS_SLOTS + _status_slot(c, status)] += 1


cdef inline int _bucket(const int64_t* bounds, int64_t dt_ns) noexcept:
    """Histogram bucket of dt_ns (N_BUCKETS is +Inf)."""
    cdef int b = 0
    while b < N_BUCKETS and dt_ns > bounds[b]:
        b += 1
    return b


cdef inline void _count_answers(Counters* c, int slot, int64_t status, int outcome,
                                int64_t dt_ns, int64_t k) noexcept:
    """k responses with this status to requests of opcode slot; dt_ns >= 0 is their
    latency (observed, and they leave in_flight), < 0: the requests had timed out."""
    c.responses[slot * STATUS_SLOTS + _status_slot(c, status)] += k
    if dt_ns < 0:
        return
    c.hist[(slot * 2 + outcome) * (N_BUCKETS + 1) + _bucket(c.bounds, dt_ns)] += k
    c.hist_sum_ns[slot][outcome] += k * dt_ns
    c.in_flight -= k


cdef inline void _count_error(Counters* c, int direction, int reason) noexcept:
    if 0 <= reason < N_REASONS:
        c.errors[direction][reason] += 1


cdef inline int8_t _corr_fmt(int32_t corr_hi) noexcept:
    if corr_hi >= 0:
        return CORR_PAIR
    return CORR_SINT if corr_hi == CORR_HI_SIGNED else CORR_INT
