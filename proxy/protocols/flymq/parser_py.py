"""FlyMQ frame parser, pure-Python twin of _parser.pyx (same behaviour, same API)."""

from proxy.framing_common import (C2S, S2C, R_BAD_MAGIC, R_BAD_VERSION, R_TOO_LARGE,
                                  R_MISMATCH)
from proxy.framing_py import FrameParser
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
        if stats.opcode_namer is None:
            stats.opcode_namer = opcode_name
        if stats.status_namer is None:
            stats.status_namer = status_name
        super().__init__(stats, max_frame_bytes, request_timeout, options)

    def on_header(self, d, h, avail):
        st = self.stats
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
            self.st[d].need = HEADER_SIZE + 4
            return 0
        if h[1] != VERSION:
            st.error(d, R_BAD_VERSION)
        slot = st.slot_for(op)
        st.frames[d][slot] += 1
        st.frame_bytes[d][slot] += HEADER_SIZE + length
        if d == C2S:
            if op == PRODUCE:
                st.messages[d][slot] += 1
            self.fifo_push(slot, op)
            return HEADER_SIZE + length
        if op == CONSUME and length > 0:
            st.messages[d][slot] += 1
        elif op == FETCH and length >= 4:
            st.messages[d][slot] += _from_bytes(h[8:12], "big")
        p = self.fifo_pop()
        if p is None:
            st.unmatched += 1
            return HEADER_SIZE + length
        if op == ERROR:
            st.response(p.slot, ST_ERROR)
            self.settle(p, 1)
        else:
            st.response(p.slot, ST_OK)
            if op != p.key:
                st.error(d, R_MISMATCH)
            self.settle(p, 0)
        return HEADER_SIZE + length
