"""FlyMQ frame parser, pure-Python twin of _parser.pyx (same behaviour, same API)."""

from proxy.framing_common import (C2S, S2C, R_BAD_MAGIC, R_BAD_VERSION, R_TOO_LARGE,
                                  R_MISMATCH, K_REQUEST, K_RESPONSE, OUTCOME_OK,
                                  OUTCOME_ERROR)
from proxy.framing_py import FrameParser
from proxy.protocols.flymq.opcodes import OPCODES as _KNOWN
from proxy.protocols.flymq.opcodes import (MAGIC, VERSION, HEADER_SIZE, MAX_FRAME_BYTES,
                                           PRODUCE, CONSUME, FETCH, ERROR, opcode_name)
from proxy.protocols.flymq.status import OK as ST_OK, ERROR as ST_ERROR, status_name

_from_bytes = int.from_bytes


class FlyMQParser(FrameParser):
    """Counts, sizes and FIFO-correlates FlyMQ frames of one proxied connection."""

    header_size = HEADER_SIZE
    max_frame_bytes = MAX_FRAME_BYTES

    def __init__(self, stats, max_frame_bytes=None, request_timeout=30.0,
                 options=None):
        stats.describe(opcode_name, status_name, _KNOWN)   # once per route
        super().__init__(stats, max_frame_bytes, request_timeout, options)

    def on_header(self, d, h, avail):
        if h[0] != MAGIC:
            self.fail(d, R_BAD_MAGIC, "bad magic 0x%02X at offset %d (expected 0xAF)%s" % (
                h[0], self.st[d].frame_start,
                " — is this TLS on a plaintext port?" if h[0] == 0x16 else ""))
            return -1
        length = _from_bytes(h[4:8], "big")
        if length > self.max_frame_bytes:
            self.fail(d, R_TOO_LARGE, "payload length %d at offset %d exceeds the limit %d" % (
                length, self.st[d].frame_start, self.max_frame_bytes))
            return -1
        op = h[2]
        if d == S2C and op == FETCH and length >= 4 and avail < HEADER_SIZE + 4:
            return self.want_header(d, HEADER_SIZE + 4)
        if h[1] != VERSION:
            self.protocol_error(d, R_BAD_VERSION)
        if d == C2S:
            self.begin(d, self.stats.slot_for(op), K_REQUEST, HEADER_SIZE + length, HEADER_SIZE)
            if op == PRODUCE:
                self.add_messages(d, 1)
            self.expect_fifo(d, op)
            return HEADER_SIZE + length
        self.begin(d, self.stats.slot_for(op), K_RESPONSE, HEADER_SIZE + length, HEADER_SIZE)
        if op == CONSUME and length > 0:
            self.add_messages(d, 1)
        elif op == FETCH and length >= 4:
            self.add_messages(d, _from_bytes(h[8:12], "big"))
        if self.take_fifo(d) >= 0 and op != ERROR and op != self.st[d].taken.aux:
            self.protocol_error(d, R_MISMATCH)
        if op == ERROR:
            self.answer(d, ST_ERROR, OUTCOME_ERROR)
        else:
            self.answer(d, ST_OK, OUTCOME_OK)
        return HEADER_SIZE + length
