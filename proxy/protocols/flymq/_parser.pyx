# cython: language_level=3
"""FlyMQ frame parser (compiled).  Twin: parser_py.py.

Wire format (docs/design.md, "FlyMQ"): magic 0xAF, version, opcode, flags,
u32 big-endian payload length, payload.  No correlation id: the reference SDK keeps
one request in flight and the server answers in order, so requests and responses
pair FIFO (docs/design.md, "FlyMQ").  The server echoes the request opcode, or answers
ERROR (0xFF) with a text body.  While recording, a request that names a topic
(constants.TOPIC_FIELD) streams its payload through on_body() so the topic becomes the
frame-log resource; AUTH and the user-management requests are never read.
"""

from libc.stdint cimport uint8_t, uint16_t, int32_t, uint32_t, int64_t

from proxy._framing cimport (FrameParser, RouteStats, DirState, C2S, S2C, OUTCOME_OK,
                             OUTCOME_ERROR, K_REQUEST, K_RESPONSE, R_BAD_MAGIC, R_BAD_VERSION,
                             R_TOO_LARGE, R_MISMATCH, RESOURCE_MAX)
from proxy._framing cimport (want_header, stream_body, gather, protocol_error, begin,
                             add_messages, expect_fifo, take_fifo, answer, set_resource,
                             frame_done, Tally, tally_start, tally_answer, tally_flush, count_frame,
                             count_messages, push_fifo)
from proxy._pending cimport Pending, pt_take_fifo
from proxy._wire cimport be16, be32, skip_some
from proxy.protocols.flymq.constants import OPCODES as _KNOWN
from proxy.protocols.flymq.constants import MAX_FRAME_BYTES, TOPIC_FIELD, opcode_name
from proxy.protocols.flymq.constants import status_name

cdef enum:
    MAGIC = 0xAF
    VERSION = 0x01
    HEADER = 8
    OP_PRODUCE = 0x01
    OP_CONSUME = 0x02
    OP_FETCH = 0x07
    OP_AUTH = 0x70
    OP_AUTH_RESPONSE = 0x71
    OP_ERROR = 0xFF
    ST_OK = 0
    ST_ERROR = 1
    COMPRESSION_MASK = 0x0E    # flags bits 1-3: a compressed payload (its topic is unreadable)
    T_DONE = 0                 # topic reader states (frame-log resource, recording only)
    T_SKIP_LEN = 1             # length of a string before the topic
    T_SKIP = 2                 # that string's bytes
    T_LEN = 3                  # the topic's u16 length
    T_NAME = 4                 # its bytes (at most RESOURCE_MAX kept)


# opcode -> strings before the topic + 1 (0: the request names no topic); constants.py
cdef uint8_t TOPIC_AT[256]
for _op, _before in TOPIC_FIELD.items():
    TOPIC_AT[_op] = _before + 1


cdef struct TopicRead:
    int state
    int strings                # strings still to skip before the topic
    int64_t pos                # payload bytes read so far
    int64_t length             # payload length
    int64_t skip
    Py_ssize_t want            # bytes of the topic to keep


cdef class FlyMQParser(FrameParser):
    """Counts, sizes and FIFO-correlates FlyMQ frames of one proxied connection."""

    cdef TopicRead t

    def __init__(self, RouteStats stats, max_frame_bytes=None, request_timeout=30.0,
                 options=None):
        self.header_size = HEADER
        self.max_frame_bytes = MAX_FRAME_BYTES
        stats.describe(opcode_name, status_name, _KNOWN)   # once per route
        FrameParser.__init__(self, stats, max_frame_bytes, request_timeout, options)
        self.fast_path = True

    cdef int64_t on_header(self, int d, const uint8_t* h, Py_ssize_t avail) except -2:
        cdef uint32_t length
        cdef int op
        if h[0] != MAGIC:
            self.fail(d, R_BAD_MAGIC, "bad magic 0x%02X at offset %d (expected 0xAF)%s" % (
                h[0], self.st[d].frame_start,
                " — is this TLS on a plaintext port?" if h[0] == 0x16 else ""))
            return -1
        length = be32(h + 4)
        if length > self.max_frame_bytes:
            # Rejected from the header alone, before any payload is seen.
            self.fail(d, R_TOO_LARGE, "payload length %d at offset %d exceeds the limit %d" % (
                length, self.st[d].frame_start, self.max_frame_bytes))
            return -1
        op = h[2]
        if d == S2C and op == OP_FETCH and length >= 4 and avail < HEADER + 4:
            return want_header(self, d, HEADER + 4)     # FETCH response: message_count follows
        if h[1] != VERSION:
            protocol_error(self, d, R_BAD_VERSION)       # spec: reject, optionally close; we count
        if d == C2S and self.recording:        # apart, so counting alone keeps its code
            return recorded_request(self, d, h, avail, op, length)
        if d == C2S:
            counted_request(self, d, op, length)
        else:
            counted_response(self, d, h, op, length)
        return HEADER + length

    cdef Py_ssize_t fast_frames(self, int d, const uint8_t* buf, Py_ssize_t pos,
                                Py_ssize_t n, int64_t chunk_start) except -1:
        if self.recording or self.st[d].open:   # (a record left open: the loop ends it)
            return frames(self, <Recording>0, d, buf, pos, n, chunk_start)
        return frames(self, <Counting>0, d, buf, pos, n, chunk_start)

    cdef int on_body(self, int d, const uint8_t* p, Py_ssize_t n) except -1:
        """A topic-naming request's payload while recording: the topic (u16 length +
        bytes, after `strings` other strings) becomes the frame's resource when it lies
        whole inside the payload."""
        cdef TopicRead* t = &self.t
        cdef Py_ssize_t i = 0, used = 0, want
        cdef int64_t take
        cdef const uint8_t* f
        while i < n and t.state != T_DONE:
            if t.state == T_SKIP:
                take = skip_some(&t.skip, n - i)
                t.pos += take
                i += take
                if t.skip == 0:
                    t.state = T_SKIP_LEN if t.strings else T_LEN
                continue
            want = t.want if t.state == T_NAME else 2
            if gather(self, d, p + i, n - i, want, &f, &used) <= 0:
                return 0                       # the rest of the field is in the next piece
            i += used
            t.pos += want
            if t.state == T_NAME:
                set_resource(self, d, f, want)
                t.state = T_DONE
            elif t.state == T_SKIP_LEN:
                t.skip = be16(f)
                t.strings -= 1
                t.state = T_SKIP if t.skip else (T_SKIP_LEN if t.strings else T_LEN)
                if t.pos + t.skip + 2 > t.length:
                    t.state = T_DONE           # no room left for the topic
            else:
                want = be16(f)
                if t.pos + want > t.length:
                    t.state = T_DONE           # the topic is cut short: none
                elif want == 0:
                    set_resource(self, d, f, 0)
                    t.state = T_DONE
                else:
                    t.want = want if want < RESOURCE_MAX else RESOURCE_MAX
                    t.state = T_NAME
        return 0

    cdef int on_body_end(self, int d) except -1:
        self.t.state = T_DONE
        return 0


# fast_frames() in two compiled loops, chosen once a read: counting alone keeps its short
# code (one loop with a run-time flag cost it ~20 instructions a request)
ctypedef uint8_t Counting
ctypedef uint16_t Recording
ctypedef fused Mode:
    Counting
    Recording


cdef inline Py_ssize_t frames(FlyMQParser self, Mode mode, int d, const uint8_t* buf,
                              Py_ssize_t pos, Py_ssize_t n, int64_t chunk_start) except -1:
    """fast_frames(), the core's loop for a read's frames (proxy/_framing.pxd): on_header's
    checks and the same inline counting, frame after frame; a bad magic, an oversized
    length or a FETCH response whose message count is not in this read go back to
    on_header().  Recorded requests too: a topic that streams through on_body() ends
    the loop past its header, as the core's own loop would."""
    cdef DirState* s = &self.st[d]
    cdef const uint8_t* h
    cdef uint32_t length
    cdef int op
    cdef Py_ssize_t cap = self.frame_cap
    cdef Tally t                               # counting: answers added up by run
    tally_start(&t)
    while n - pos >= HEADER:
        if cap and self.feed_frames + self.feed_work >= cap:
            break
        h = buf + pos
        length = be32(h + 4)
        op = h[2]
        if h[0] != MAGIC or length > self.max_frame_bytes or (
                d == S2C and op == OP_FETCH and length >= 4 and n - pos < HEADER + 4):
            break
        s.frame_start = chunk_start + pos
        if h[1] != VERSION:
            protocol_error(self, d, R_BAD_VERSION)
        self.feed_frames += 1
        if Mode is Counting:
            if d == S2C:
                tallied_response(self, &t, d, h, op, length)
            else:
                tallied_request(self, d, op, length)
        elif d == S2C:
            counted_response(self, d, h, op, length)
        else:
            recorded_request(self, d, h, n - pos, op, length)
            if s.body:                         # stream_body(): on_body() gets the rest
                s.remaining = HEADER + length - s.skip
                return pos + s.skip
        if HEADER + length > n - pos:          # the payload runs on into later reads
            s.remaining = HEADER + length - (n - pos)
            pos = n
            break
        pos += HEADER + length
        if Mode is Recording and s.open:
            frame_done(self, d)
    tally_flush(self, &t)                      # (recording: none held)
    return pos


# What FlyMQ's frames count, shared by the recorded path (on_header, the Recording loop)
# and the counting loop below.

cdef inline int request_messages(int op) noexcept:
    return 1 if op == OP_PRODUCE else 0


cdef inline int64_t response_messages(const uint8_t* h, int op, uint32_t length) noexcept:
    """Messages a response carries (h holds the FETCH count when length >= 4)."""
    if op == OP_CONSUME and length > 0:
        return 1
    if op == OP_FETCH and length >= 4:
        return be32(h + HEADER)
    return 0


cdef inline bint mismatched(int op, int32_t asked) noexcept:
    """A response that does not answer the oldest request, opcode `asked`: the server
    echoes the opcode, answers ERROR to anything, and AUTH with AUTH_RESPONSE."""
    return op != OP_ERROR and op != asked and not (op == OP_AUTH_RESPONSE and asked == OP_AUTH)


cdef inline int counted_request(FlyMQParser self, int d, int op, uint32_t length) except -1:
    """A well-formed request's counts and record (on_header): queued FIFO."""
    begin(self, d, self.stats.slot_for(op), K_REQUEST, HEADER + length, HEADER)
    if request_messages(op):
        add_messages(self, d, request_messages(op))
    expect_fifo(self, d, op)
    return 0


cdef inline void counted_response(FlyMQParser self, int d, const uint8_t* h, int op,
                                  uint32_t length) noexcept:
    """A well-formed response's counts and record (on_header, the Recording loop): it
    answers the oldest request."""
    cdef int64_t m = response_messages(h, op, length)
    begin(self, d, self.stats.slot_for(op), K_RESPONSE, HEADER + length, HEADER)
    if m:
        add_messages(self, d, m)
    if take_fifo(self, d) >= 0 and mismatched(op, self.st[d].taken.aux):
        protocol_error(self, d, R_MISMATCH)
    if op == OP_ERROR:
        answer(self, d, ST_ERROR, OUTCOME_ERROR)
    else:
        answer(self, d, ST_OK, OUTCOME_OK)


cdef inline int tallied_request(FlyMQParser self, int d, int op, uint32_t length) except -1:
    """counted_request() while recording is off: the counts without a record."""
    cdef int slot = self.stats.slot_for(op)
    count_frame(self, d, slot, HEADER + length)
    if request_messages(op):
        count_messages(self, d, slot, request_messages(op))
    return push_fifo(self, d, slot, op)


cdef inline void tallied_response(FlyMQParser self, Tally* t, int d, const uint8_t* h, int op,
                                  uint32_t length) noexcept:
    """counted_response() while recording is off: its answer is added to the run in t."""
    cdef int slot = self.stats.slot_for(op)
    cdef int64_t m = response_messages(h, op, length)
    cdef const Pending* p = pt_take_fifo(&self.pt)
    count_frame(self, d, slot, HEADER + length)
    if m:
        count_messages(self, d, slot, m)
    if p is not NULL and mismatched(op, p.aux):
        protocol_error(self, d, R_MISMATCH)
    if op == OP_ERROR:
        tally_answer(self, t, p, ST_ERROR, OUTCOME_ERROR)
    else:
        tally_answer(self, t, p, ST_OK, OUTCOME_OK)


cdef inline int64_t recorded_request(FlyMQParser self, int d, const uint8_t* h,
                                     Py_ssize_t avail, int op, int64_t length) except -2:
    """on_header() of a request while recording: the same reports, then the topic of a
    topic-naming request becomes the frame's resource, read in place when this read
    holds it (the usual case), else from the payload as it streams through
    on_body()."""
    cdef Py_ssize_t tlen
    begin(self, d, self.stats.slot_for(op), K_REQUEST, HEADER + length, HEADER)
    if request_messages(op):
        add_messages(self, d, request_messages(op))
    expect_fifo(self, d, op)
    if not TOPIC_AT[op] or h[3] & COMPRESSION_MASK or length < 2:
        return HEADER + length
    if TOPIC_AT[op] == 1 and avail >= HEADER + 2:
        tlen = be16(h + HEADER)
        if 2 + tlen > length:
            return HEADER + length         # the topic runs past the payload: none
        if tlen > RESOURCE_MAX:
            tlen = RESOURCE_MAX
        if avail >= HEADER + 2 + tlen:
            set_resource(self, d, h + HEADER + 2, tlen)
            return HEADER + length
    self.t.state = T_SKIP_LEN if TOPIC_AT[op] > 1 else T_LEN
    self.t.strings = TOPIC_AT[op] - 1
    self.t.pos = 0
    self.t.length = length
    stream_body(self, d, HEADER)
    return HEADER + length
