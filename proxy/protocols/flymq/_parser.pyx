# cython: language_level=3
"""FlyMQ frame parser (compiled).  Twin: parser_py.py.

Wire format (flymq-binary.md, "Wire Format"): magic 0xAF, version, opcode, flags,
u32 big-endian payload length, payload.  No correlation id: the reference SDK keeps
one request in flight and the server answers in order, so requests and responses
pair FIFO (DESIGN.md, "FlyMQ").  The server echoes the request opcode, or answers
ERROR (0xFF) with a text body.
"""

from libc.stdint cimport uint8_t, uint32_t, int64_t

from proxy._framing cimport (FrameParser, RouteStats, Pending, C2S, S2C,
                             OUTCOME_OK, OUTCOME_ERROR)
from proxy.framing_common import R_BAD_MAGIC, R_BAD_VERSION, R_TOO_LARGE, R_MISMATCH
from proxy.protocols.flymq.opcodes import (MAX_FRAME_BYTES, opcode_name,
                                           OPCODES as _OPCODES)
from proxy.protocols.flymq.status import status_name

cdef enum:
    MAGIC = 0xAF
    VERSION = 0x01
    HEADER = 8
    OP_PRODUCE = 0x01
    OP_CONSUME = 0x02
    OP_FETCH = 0x07
    OP_ERROR = 0xFF
    ST_OK = 0
    ST_ERROR = 1

cdef int _r_magic = R_BAD_MAGIC
cdef int _r_version = R_BAD_VERSION
cdef int _r_large = R_TOO_LARGE
cdef int _r_mismatch = R_MISMATCH


cdef inline uint32_t be32(const uint8_t* p) noexcept:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef class FlyMQParser(FrameParser):
    """Counts, sizes and FIFO-correlates FlyMQ frames of one proxied connection."""

    def __init__(self, RouteStats stats, max_frame_bytes=None, request_timeout=30.0,
                 options=None):
        self.header_size = HEADER
        self.max_frame_bytes = MAX_FRAME_BYTES
        if stats.opcode_namer is None:
            stats.opcode_namer = opcode_name
        if stats.status_namer is None:
            stats.status_namer = status_name
        FrameParser.__init__(self, stats, max_frame_bytes, request_timeout, options)

    cdef int64_t on_header(self, int d, const uint8_t* h, Py_ssize_t avail) except -2:
        cdef RouteStats st = self.stats
        cdef uint32_t length
        cdef int op, slot, outcome
        cdef Pending* p
        if h[0] != MAGIC:
            self.fail(d, _r_magic, "bad magic 0x%02X at offset %d (expected 0xAF)%s" % (
                h[0], self.st[d].frame_start,
                " — is this TLS on a plaintext port?" if h[0] == 0x16 else ""))
            return -1
        length = be32(h + 4)
        if length > self.max_frame_bytes:
            # Rejected from the header alone, before any payload is seen.
            self.fail(d, _r_large, "payload length %d at offset %d exceeds the limit %d" % (
                length, self.st[d].frame_start, self.max_frame_bytes))
            return -1
        op = h[2]
        if d == S2C and op == OP_FETCH and length >= 4 and avail < HEADER + 4:
            self.st[d].need = HEADER + 4      # FETCH response: message_count follows
            return 0
        if h[1] != VERSION:
            st.error(d, _r_version)           # spec: reject, optionally close; we count
        slot = st.slot_for(op)
        st.frames[d][slot] += 1
        st.frame_bytes[d][slot] += HEADER + length
        if d == C2S:
            if op == OP_PRODUCE:
                st.messages[d][slot] += 1
            self.fifo_push(slot, op)
            return HEADER + length
        # server -> client: the response to the oldest request
        if op == OP_CONSUME and length > 0:
            st.messages[d][slot] += 1
        elif op == OP_FETCH and length >= 4:
            st.messages[d][slot] += be32(h + HEADER)
        p = self.fifo_pop()
        if p is NULL:
            st.unmatched += 1
            return HEADER + length
        if op == OP_ERROR:
            outcome = OUTCOME_ERROR
            st.response(p.slot, ST_ERROR)
        else:
            outcome = OUTCOME_OK
            st.response(p.slot, ST_OK)
            if op != p.key:
                st.error(d, _r_mismatch)
        self.settle(p, outcome)
        return HEADER + length
