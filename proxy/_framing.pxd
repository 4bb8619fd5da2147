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

from cpython.mem cimport PyMem_Malloc, PyMem_Free
from libc.stdint cimport uint8_t, int8_t, int16_t, int32_t, int64_t, uint64_t
from libc.string cimport memmove, memcpy

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
    P_EXPIRED = 1            # Pending.flags: counted as a timeout; the late answer is not observed
    P_FIFO = 2               # from the FIFO (correlation id = sequence number)
    P_S2C = 4                # the request travelled server -> client

# DirState.capture bits: why the current frame is held whole (docs/design.md, "Faults")
cdef enum:
    CAP_REWRITE = 1          # capture_frame(): rewrite() returns what to forward
    CAP_FAULT = 2            # its opcode is armed: fault_hook(d, frame) decides
    CAP_UNDECIDED = 4        # an armed direction holds every frame until its opcode slot
                             # is known (begin()); then it is kept (CAP_FAULT) or let go
    CAP_NEXT = 8             # armed, nothing held: the next frame is decided at its header
                             # (set while a frame that was let go finishes, too)
    FAULT_WORDS = 5          # fault_bits words: OPCODE_SLOTS bits

# Longest probe an insert walks before the map is rehashed under a new seed: at most half
# full, linear probing with a keyed hash makes a 128-slot chain vanishingly rare.
cdef enum:
    EV_TIMEOUT = 0           # FrameRecord.status of a K_EVENT row: no answer in time
    EV_CLOSED = 1            # ... its connection closed before the answer (a cut-off)
cdef enum:
    MAP_PROBE_LIMIT = 128
    HBUF_KEEP = 4096         # framing_common.HBUF_KEEP


cdef struct Pending:         # 24 bytes
    int64_t t_ns             # monotonic time of the read that carried the request
    int64_t key              # correlation id (map) or request sequence number (FIFO)
    int32_t aux              # map: corr_hi (-1 none); FIFO: the parser's value (e.g. opcode)
    int16_t slot             # opcode slot of the request
    uint8_t flags            # P_*
    uint8_t spare

cdef struct MapEntry:        # 32 bytes; the key is p.key
    int32_t tag              # namespace of key (protocol-defined: direction, publisher id)
    int32_t used             # 0: empty; else 1 + the entry's slot in the request ring
    Pending p

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
    double hist_sum[OPCODE_SLOTS][2]
    int64_t bounds[N_BUCKETS]           # the histogram's upper bounds, ns


cdef class RouteStats:
    # Names and identity (Python objects, touched at scrape time only).
    cdef readonly str route
    cdef readonly str protocol
    cdef public object opcode_namer     # callable code -> name, set by the parser
    cdef public object status_namer     # callable status code -> name

    # opcode code <-> slot.  slot_of[code]: the slot once seen; before, -2 for a code of
    # the protocol's table (set_known), -1 for any other.  Unknown codes take at most
    # UNKNOWN_LABELS slots, then share one labelled "unknown": garbage cannot use up the
    # labels of real opcodes.
    cdef int16_t* slot_of               # CODE_TABLE entries (heap)
    cdef int64_t slot_code[OPCODE_SLOTS]
    cdef int nslots
    cdef readonly bint has_known        # set_known() was called: unknown codes are capped
    cdef int n_unknown
    cdef int unknown_slot               # the shared "unknown" slot, -1 until needed
    # interned opcode names (Thrift methods...): hash -> slot, names kept as bytes
    cdef int16_t name_slot_of[NAME_TABLE]
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

    cdef int slot_for(self, int64_t code) noexcept
    cdef int _shared_unknown(self) noexcept
    cdef int slot_for_name(self, const uint8_t* name, Py_ssize_t n) except -1
    cdef void error(self, int direction, int reason) noexcept


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
    cdef void append(self, FrameRecord* rec, int64_t conn_id, int32_t route,
                     const uint8_t* res, Py_ssize_t res_len,
                     const uint8_t* attrs, Py_ssize_t alen, bint same_frame,
                     const uint8_t* cid, Py_ssize_t cid_len) noexcept
    cdef int _next_chunk(self) noexcept
    cdef void _chunk_full(self) noexcept


cdef class FrameParser:
    cdef readonly RouteStats stats
    cdef Counters* c                    # &stats.c (stats is kept alive by the reference above)
    cdef DirState st[2]
    cdef public Py_ssize_t header_size  # bytes every frame starts with (protocol's fixed header)
    cdef public Py_ssize_t header_limit # most bytes want_header()/gather() may ask for
    cdef public int64_t max_frame_bytes # limit on a frame's declared size (protocol-defined)
    cdef public int64_t timeout_ns      # request_timeout
    cdef public int64_t conn_id         # frame-log conn_id (set by the relay)
    cdef int64_t now_ns                 # one clock read per feed() call
    cdef readonly object error          # FrameError after a fatal protocol error, else None
    cdef readonly bint closed
    cdef readonly Py_ssize_t feed_frames # headers parsed by the last feed() (the relay's yield)
    cdef public object options          # the route's [routes.options] table (dict)
    cdef object _tracer                 # callable(dict) per record (tests), or None
    cdef object _tracer_error           # what the tracer raised, re-raised when feed()/close()/expire() return
    cdef readonly bint recording        # records are wanted (a tracer or the frame log)
    cdef FrameLogBuffer log             # the frame log this connection writes to, or None
    cdef int32_t log_route              # this route's index in log

    # Rewriting (address rewriting): with hold[d] set, a header split across reads is
    # not forwarded until complete, so the frame can still be captured; feed() then
    # leaves the bytes to forward in ``output`` (a list) instead of "forward data".
    cdef bint hold[2]
    cdef public object output           # list of bytes to forward for the last feed(), or None
    cdef list captured                  # per direction: bytearray of the frame being captured

    # Correlation by key (RabbitMQ Stream, RocketMQ...): open addressing, linear
    # probing, backward-shift deletion; at most map_limit pending entries.  The request
    # ring (map_cap slots) holds the entries' indexes in the order their requests were
    # read, -1 where the request was answered since (take() only marks its slot; the
    # ring is compacted when it fills up): ring_head..ring_live the expired ones,
    # ring_live..ring_tail the live ones (ring_live may lag behind ring_head: take()
    # moves only the head; readers clamp it), so expiry walks only what expires (and the
    # answered slots among them, once) and a full map evicts its oldest expired entry.
    # Positions count up; the slot is position & (map_cap - 1).
    cdef MapEntry* map
    cdef Py_ssize_t map_cap             # power of two
    cdef uint64_t map_seed              # keys the hash (_mix): secret, per connection, new
                                        # when a probe passes MAP_PROBE_LIMIT (hash flooding)
    cdef readonly int64_t map_reseeds   # times this map was rehashed under a new seed
    cdef Py_ssize_t map_len
    cdef public Py_ssize_t map_limit
    cdef int32_t* ring
    cdef int64_t ring_head              # oldest request still in the ring
    cdef int64_t ring_live              # oldest one expire() has not counted
    cdef int64_t ring_tail              # where the next request goes

    # FIFO of requests awaiting their responses (ring buffer, at most fifo_limit)
    cdef Pending* fifo
    cdef Py_ssize_t fifo_head
    cdef Py_ssize_t fifo_len
    cdef Py_ssize_t fifo_cap            # power of two (indexes wrap with & (fifo_cap - 1))
    cdef public Py_ssize_t fifo_limit
    cdef int64_t fifo_seq               # requests pushed so far (1-based correlation ids)
    cdef int64_t fifo_live              # sequence number of the oldest request expire() has
                                        # not counted (those before it are expired)

    # String correlation ids (set_corr_str), only while recording: the rows' texts and
    # those of pending requests, for their timeout rows (direct-mapped on (direction,
    # slot, key), grown while at most half full up to CORR_TEXT_SLOTS, then a newer id
    # evicts an older one, whose timeout row then has a null correlation_id).  NULL
    # until first used.
    cdef CorrState* cs

    # Faults (proxy/faults.py): an armed direction holds each frame until its opcode slot
    # is known; a frame whose slot is armed goes whole to fault_hook, any other is
    # forwarded without a Python call.  Unarmed directions never look at these fields.
    cdef uint8_t fault_mode[2]          # 0 off; 1 slots in fault_bits; 2 every frame
    cdef uint64_t fault_bits[2][FAULT_WORDS]   # armed opcode slots
    cdef bint fault_hold[2]             # hold[d] was turned on by set_faults()
    cdef bint fault_rec                 # recording forced on while armed (kind, resource)
    cdef public object fault_hook       # callable(d, frame) -> bytes or a fault marker
    # (last: the fields above keep the offsets the parsers were compiled against)
    cdef bint fault_marking[2]          # frames fed now were made by the fault engine
    cdef int64_t fault_marked[2]        # 1 + frame_start of the last frame so marked
    cdef list fault_names               # per direction: the rule (bytes) of marked frames, or None
    cdef bint fault_record[2]           # rules of direction d need kind / resource: record
    cdef int64_t fault_fifo_mark[2]     # fifo_seq when direction d's frame began (FIFO
                                        # requests are known without recording)

    cpdef Py_ssize_t feed(self, int direction, object data) except -1
    cdef Py_ssize_t _feed(self, int d, object data, const uint8_t* buf,
                          Py_ssize_t n) except -1
    cdef int _frame_end(self, int d, list out) except -1
    cdef int _fault_decide(self, int d) noexcept
    cdef void _fault_rearm(self, int d) noexcept
    cdef void _mark_injected(self, int d) noexcept
    cdef int _hold_tail(self, int d, Py_ssize_t n, Py_ssize_t emit, object data,
                        const uint8_t* buf, list out) except -1
    cdef Py_ssize_t _capture_head(self, int d, int64_t r, Py_ssize_t pos, Py_ssize_t emit,
                                  Py_ssize_t n, const uint8_t* buf, list out) except -2
    cdef Py_ssize_t _capture_more(self, int d, const uint8_t* p, Py_ssize_t pos,
                                  Py_ssize_t take, Py_ssize_t emit) except -1
    cdef bint _fault_wants(self, int d) noexcept
    cdef int _header_done(self, int d, int64_t r, Py_ssize_t seen,
                          const uint8_t* h) except -1
    cdef Py_ssize_t _fatal_prefix(self, int d, int64_t chunk_start, Py_ssize_t emit,
                                  const uint8_t* buf, list out) except -1
    cdef int _short_frame(self, int d, int64_t r, Py_ssize_t asked) except -1
    cdef Py_ssize_t _contract_error(self, int d, int64_t r, Py_ssize_t asked, Py_ssize_t pos,
                                    Py_ssize_t emit, const uint8_t* buf, list out) except -1
    cdef dict _record_dict(self, FrameRecord* rec, const uint8_t* res, Py_ssize_t res_len,
                           const uint8_t* attrs, Py_ssize_t alen)
    cdef int _map_grow(self) except -1
    cdef int _map_resize(self, Py_ssize_t new_cap) except -1
    cdef int _map_reseed(self) except -1
    cdef int _fifo_grow(self) except -1
    cdef int _fifo_resize(self, Py_ssize_t new_cap) except -1
    cdef int _shrink(self) except -1
    cdef void _ring_compact(self) noexcept
    cdef bint _has_expired(self) noexcept
    cdef int _expect_key(self, int d, int32_t tag, uint64_t key, int32_t corr_hi) except -1
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

    cdef int fail(self, int d, int reason, str message) except -1
    cdef int _hbuf_reserve(self, int d, Py_ssize_t n) except -1
    cdef void _hbuf_release(self, int d) noexcept
    # string correlation ids (set_corr_str), recording only
    cdef CorrState* _corr_state(self) noexcept
    cdef int _ctext_keep(self, int d, FrameRecord* rec) except -1
    cdef CorrText* _ctext_find(self, int d, int slot, int64_t key) noexcept


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
    self.c.frames[d][slot] += 1
    self.c.frame_bytes[d][slot] += frame_bytes
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
    self.c.messages[d][rec.slot] += n
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


cdef inline void _ring_push(FrameParser self, Py_ssize_t i) noexcept:
    """Entry i (a live request) becomes the newest in the request ring."""
    cdef Py_ssize_t r
    if self.ring_tail - self.ring_head == self.map_cap:
        self._ring_compact()               # full: at least half its slots are answered
    r = <Py_ssize_t>self.ring_tail & (self.map_cap - 1)
    self.ring[r] = <int32_t>i
    self.map[i].used = <int32_t>(r + 1)
    self.ring_tail += 1


cdef inline void _map_remove(FrameParser self, Py_ssize_t i) noexcept:
    """Delete entry i (its ring slot already marked -1): backward-shift deletion keeps
    probe chains intact without tombstones; a moved entry's ring slot follows it."""
    cdef Py_ssize_t j, k, mask = self.map_cap - 1
    j = i
    while True:
        j = (j + 1) & mask
        if not self.map[j].used:
            break
        k = _mix(self.map_seed, self.map[j].tag, <uint64_t>self.map[j].p.key) & mask
        if (j > i and (k <= i or k > j)) or (j < i and (k <= i and k > j)):
            self.map[i] = self.map[j]
            self.ring[self.map[i].used - 1] = <int32_t>i
            i = j
    self.map[i].used = 0
    self.map_len -= 1


cdef inline void _map_insert(FrameParser self, int d, Py_ssize_t i, int32_t tag, uint64_t key,
                             int32_t corr_hi) noexcept:
    """A new pending request in free slot i of the map (the newest in request order)."""
    cdef MapEntry* e = &self.map[i]
    e.tag = tag
    self.map_len += 1
    self.c.in_flight += 1
    _pending_set(&e.p, self.now_ns, key, self.st[d].rec.slot, corr_hi, 0, d)
    _ring_push(self, i)


cdef inline int expect(FrameParser self, int d, int32_t tag, uint64_t key, int32_t corr_hi) except -1:
    """The current frame is a request answered by key (tag = namespace).  Inline only
    the common case, a new key in a table with room; growing, a full table and a key
    already pending go to FrameParser._expect_key."""
    cdef Py_ssize_t i, mask, probes = 0
    cdef MapEntry* e
    set_corr(self, d, <int64_t>key, corr_hi)
    if (self.map_len + 1) * 2 > self.map_cap or self.map_len >= self.map_limit:
        return self._expect_key(d, tag, key, corr_hi)
    mask = self.map_cap - 1
    i = _mix(self.map_seed, tag, key) & mask
    while self.map[i].used:                # one probe: the key, or where it goes
        e = &self.map[i]
        if e.tag == tag and <uint64_t>e.p.key == key:
            return self._expect_key(d, tag, key, corr_hi)
        i = (i + 1) & mask
        probes += 1
        if probes == MAP_PROBE_LIMIT:      # chosen colliding keys, or astronomically bad
            self._map_reseed()             # luck: a new secret seed breaks the cluster
            return self._expect_key(d, tag, key, corr_hi)
    _map_insert(self, d, i, tag, key, corr_hi)
    return 0


cdef inline int expect_fifo(FrameParser self, int d, int32_t aux) except -1:
    """The current frame is a request answered in order; aux comes back in take_fifo()."""
    cdef Pending* p
    self.fifo_seq += 1
    set_corr(self, d, self.fifo_seq, -1)
    if self.fifo_len == self.fifo_cap and self.fifo_len < self.fifo_limit:
        self._fifo_grow()                  # the pending budget may refuse
    if self.fifo_len >= self.fifo_limit or self.fifo_len == self.fifo_cap:
        # Too many unanswered requests: give up on the oldest (a timeout).
        p = &self.fifo[self.fifo_head]
        self.fifo_head = (self.fifo_head + 1) & (self.fifo_cap - 1)
        self.fifo_len -= 1
        if not p.flags & P_EXPIRED:
            self._timeout(p, 0)
        _count_error(self.c, d, R_OVERFLOW)
    p = &self.fifo[(self.fifo_head + self.fifo_len) & (self.fifo_cap - 1)]
    _pending_set(p, self.now_ns, self.fifo_seq, self.st[d].rec.slot, aux, 1, d)
    self.fifo_len += 1
    self.c.in_flight += 1
    return 0


cdef inline int take(FrameParser self, int d, int32_t tag, uint64_t key) noexcept:
    """Remove the request pending under (tag, key) for answer(); returns its opcode
    slot, or -1 when there is none (answer() then counts an unmatched response)."""
    cdef Py_ssize_t i, mask
    cdef MapEntry* e
    cdef DirState* s = &self.st[d]
    s.taken = NULL
    if self.map_len == 0:
        return -1
    mask = self.map_cap - 1
    i = _mix(self.map_seed, tag, key) & mask
    while True:
        e = &self.map[i]
        if not e.used:
            return -1
        if e.tag == tag and <uint64_t>e.p.key == key:
            break
        i = (i + 1) & mask
    s.held = e.p
    s.taken = &s.held
    if e.used - 1 == (self.ring_head & mask):
        self.ring_head += 1                # answered in request order: the ring moves on
    else:
        self.ring[e.used - 1] = -1         # answered: expire() and eviction skip it
    _map_remove(self, i)
    return s.held.slot


cdef inline int take_fifo(FrameParser self, int d) noexcept:
    """Remove the oldest request for answer(); returns its slot or -1 (none)."""
    cdef DirState* s = &self.st[d]
    if self.fifo_len == 0:
        s.taken = NULL
        return -1
    s.taken = &self.fifo[self.fifo_head]
    self.fifo_head = (self.fifo_head + 1) & (self.fifo_cap - 1)
    self.fifo_len -= 1
    return s.taken.slot


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
    _count_response(self.c, p.slot, status)
    if self.recording:
        rec.req_slot = <int16_t>p.slot
        rec.corr = p.key
        rec.corr_hi = p.aux if not p.flags & P_FIFO else -1
        rec.corr_fmt = _corr_fmt(rec.corr_hi)
    if not p.flags & P_EXPIRED:
        dt = self.now_ns - p.t_ns
        if dt < 0:
            dt = 0
        rec.latency_ns = dt
        _observe(self.c, p.slot, outcome, dt)
        self.c.in_flight -= 1


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


cdef inline void _observe(Counters* c, int slot, int outcome, int64_t dt_ns) noexcept:
    if dt_ns < 0:
        dt_ns = 0
    c.hist[(slot * 2 + outcome) * (N_BUCKETS + 1) + _bucket(c.bounds, dt_ns)] += 1
    c.hist_sum[slot][outcome] += dt_ns * 1e-9


cdef inline void _count_error(Counters* c, int direction, int reason) noexcept:
    if 0 <= reason < N_REASONS:
        c.errors[direction][reason] += 1


cdef inline void _pending_set(Pending* p, int64_t t_ns, uint64_t key, int slot,
                              int32_t aux, int fifo, int d) noexcept:
    p.t_ns = t_ns
    p.key = <int64_t>key
    p.slot = <int16_t>slot
    p.aux = aux
    p.flags = (P_FIFO if fifo else 0) | (P_S2C if d else 0)


cdef inline void _ctext_drop(CorrText* t, FrameParser self) noexcept:
    if t is not NULL:
        t.refs -= 1
        if t.refs <= 0:
            t.slot = -1
            self.cs.len -= 1


cdef inline Py_ssize_t _ctext_index(int d, int slot, int64_t key, Py_ssize_t cap) noexcept:
    # framing_py.ctext_index: the same bits in the twin
    cdef uint64_t z = (<uint64_t>key ^ (<uint64_t>(slot * 2 + d) << 48)) * 0x9E3779B97F4A7C15ULL
    return <Py_ssize_t>((z >> 32) & <uint64_t>(cap - 1))


cdef inline int8_t _corr_fmt(int32_t corr_hi) noexcept:
    if corr_hi >= 0:
        return CORR_PAIR
    return CORR_SINT if corr_hi == CORR_HI_SIGNED else CORR_INT


cdef inline uint64_t _mix(uint64_t seed, int32_t tag, uint64_t key) noexcept:
    # splitmix64 finalizer of the key under a secret per-map seed: spreads sequential ids
    # over the table, and a client cannot pick ids that share a probe chain without the
    # seed (the finalizer alone is invertible: colliding ids were found offline)
    cdef uint64_t z = (key ^ seed) + (<uint64_t>tag << 56) + 0x9E3779B97F4A7C15ULL
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL
    return z ^ (z >> 31)
