# cython: language_level=3
"""FlyMQ frame parser (compiled).  Twin: parser_py.py.

Wire format (docs/design.md, "FlyMQ"): magic 0xAF, version, opcode, flags,
u32 big-endian payload length, payload.  No correlation id: the reference SDK keeps
one request in flight and the server answers in order, so requests and responses
pair FIFO (docs/design.md, "FlyMQ").  The server echoes the request opcode, or answers
ERROR (0xFF) with a text body.
"""

from libc.stdint cimport uint8_t, uint32_t, int64_t

from proxy._framing cimport (FrameParser, RouteStats, C2S, S2C, OUTCOME_OK, OUTCOME_ERROR,
                             K_REQUEST, K_RESPONSE, R_BAD_MAGIC, R_BAD_VERSION,
                             R_TOO_LARGE, R_MISMATCH)
from proxy._framing cimport (want_header, protocol_error, begin, add_messages, expect_fifo,
                             take_fifo, answer)
from proxy._wire cimport be32
from proxy.protocols.flymq.opcodes import OPCODES as _KNOWN
from proxy.protocols.flymq.opcodes import MAX_FRAME_BYTES, opcode_name
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


cdef class FlyMQParser(FrameParser):
    """Counts, sizes and FIFO-correlates FlyMQ frames of one proxied connection."""

    def __init__(self, RouteStats stats, max_frame_bytes=None, request_timeout=30.0,
                 options=None):
        self.header_size = HEADER
        self.max_frame_bytes = MAX_FRAME_BYTES
        stats.describe(opcode_name, status_name, _KNOWN)   # once per route
        FrameParser.__init__(self, stats, max_frame_bytes, request_timeout, options)

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
        if d == C2S:
            begin(self, d, self.stats.slot_for(op), K_REQUEST, HEADER + length, HEADER)
            if op == OP_PRODUCE:
                add_messages(self, d, 1)
            expect_fifo(self, d, op)
            return HEADER + length
        # server -> client: the response to the oldest request
        begin(self, d, self.stats.slot_for(op), K_RESPONSE, HEADER + length, HEADER)
        if op == OP_CONSUME and length > 0:
            add_messages(self, d, 1)
        elif op == OP_FETCH and length >= 4:
            add_messages(self, d, be32(h + HEADER))
        if take_fifo(self, d) >= 0 and op != OP_ERROR and op != self.st[d].taken.aux:
            protocol_error(self, d, R_MISMATCH)
        if op == OP_ERROR:
            answer(self, d, ST_ERROR, OUTCOME_ERROR)
        else:
            answer(self, d, ST_OK, OUTCOME_OK)
        return HEADER + length
