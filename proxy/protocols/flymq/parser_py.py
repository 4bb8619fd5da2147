"""FlyMQ frame parser, pure-Python twin of _parser.pyx (same behaviour, same API)."""

from proxy.framing_common import (C2S, S2C, R_BAD_MAGIC, R_BAD_VERSION, R_TOO_LARGE,
                                  R_MISMATCH, K_REQUEST, K_RESPONSE, OUTCOME_OK,
                                  OUTCOME_ERROR, RESOURCE_MAX, skip_some)
from proxy.framing_py import FrameParser
from proxy.protocols.flymq.constants import OPCODES as _KNOWN
from proxy.protocols.flymq.constants import (MAGIC, VERSION, HEADER_SIZE, MAX_FRAME_BYTES,
                                           PRODUCE, CONSUME, FETCH, ERROR, AUTH,
                                           AUTH_RESPONSE, COMPRESSION_MASK,
                                           TOPIC_FIELD, opcode_name)
from proxy.protocols.flymq.constants import ST_OK, ST_ERROR, status_name

_from_bytes = int.from_bytes
T_DONE, T_SKIP_LEN, T_SKIP, T_LEN, T_NAME = range(5)    # topic reader (recording only)


class _TopicRead:
    __slots__ = ("state", "strings", "pos", "length", "skip", "want")

    def __init__(self, strings, length):
        self.state = T_SKIP_LEN if strings else T_LEN
        self.strings = strings
        self.pos = 0
        self.length = length
        self.skip = 0
        self.want = 0


class FlyMQParser(FrameParser):
    """Counts, sizes and FIFO-correlates FlyMQ frames of one proxied connection."""

    header_size = HEADER_SIZE
    max_frame_bytes = MAX_FRAME_BYTES

    def __init__(self, stats, max_frame_bytes=None, request_timeout=30.0,
                 options=None):
        stats.describe(opcode_name, status_name, _KNOWN)   # once per route
        super().__init__(stats, max_frame_bytes, request_timeout, options)
        self.t = None

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
            if (self.recording and op in TOPIC_FIELD and not h[3] & COMPRESSION_MASK
                    and length >= 2):
                self._topic(d, h, avail, op, length)
            return HEADER_SIZE + length
        self.begin(d, self.stats.slot_for(op), K_RESPONSE, HEADER_SIZE + length, HEADER_SIZE)
        if op == CONSUME and length > 0:
            self.add_messages(d, 1)
        elif op == FETCH and length >= 4:
            self.add_messages(d, _from_bytes(h[8:12], "big"))
        if (self.take_fifo(d) >= 0 and op != ERROR and op != self.st[d].taken.aux
                and not (op == AUTH_RESPONSE and self.st[d].taken.aux == AUTH)):
            self.protocol_error(d, R_MISMATCH)      # AUTH is answered by AUTH_RESPONSE
        if op == ERROR:
            self.answer(d, ST_ERROR, OUTCOME_ERROR)
        else:
            self.answer(d, ST_OK, OUTCOME_OK)
        return HEADER_SIZE + length

    def _topic(self, d, h, avail, op, length):
        """Recording, a topic-naming request: its topic becomes the frame's resource,
        read in place when this read holds it, else from the payload as it streams
        through on_body()."""
        if TOPIC_FIELD[op] == 0 and avail >= HEADER_SIZE + 2:
            tlen = _from_bytes(h[HEADER_SIZE:HEADER_SIZE + 2], "big")
            if 2 + tlen > length:
                return
            tlen = min(tlen, RESOURCE_MAX)
            if avail >= HEADER_SIZE + 2 + tlen:
                self.set_resource(d, h[HEADER_SIZE + 2:HEADER_SIZE + 2 + tlen])
                return
        self.t = _TopicRead(TOPIC_FIELD[op], length)
        self.stream_body(d, HEADER_SIZE)

    def on_body(self, d, chunk):
        """A topic-naming request's payload while recording: the topic (u16 length +
        bytes, after ``strings`` other strings) becomes the frame's resource when it
        lies whole inside the payload."""
        t = self.t
        i, n = 0, len(chunk)
        while i < n and t.state != T_DONE:
            if t.state == T_SKIP:
                take, t.skip = skip_some(t.skip, n - i)
                t.pos += take
                i += take
                if t.skip == 0:
                    t.state = T_SKIP_LEN if t.strings else T_LEN
                continue
            want = t.want if t.state == T_NAME else 2
            f, used = self.gather(d, chunk[i:], want)
            if f is None:
                return
            i += used
            t.pos += want
            if t.state == T_NAME:
                self.set_resource(d, f)
                t.state = T_DONE
            elif t.state == T_SKIP_LEN:
                t.skip = _from_bytes(f[:2], "big")
                t.strings -= 1
                t.state = T_SKIP if t.skip else (T_SKIP_LEN if t.strings else T_LEN)
                if t.pos + t.skip + 2 > t.length:
                    t.state = T_DONE
            else:
                want = _from_bytes(f[:2], "big")
                if t.pos + want > t.length:
                    t.state = T_DONE
                elif want == 0:
                    self.set_resource(d, b"")
                    t.state = T_DONE
                else:
                    t.want = min(want, RESOURCE_MAX)
                    t.state = T_NAME

    def on_body_end(self, d):
        self.t = None
