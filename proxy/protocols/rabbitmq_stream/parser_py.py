"""RabbitMQ Stream frame parser, pure-Python twin of _parser.pyx (same behaviour, same API).

Publish entries, simple messages and sub-entry batches: see _parser.pyx's docstring."""

from proxy.framing_common import (C2S, S2C, R_TOO_LARGE, R_TOO_SMALL, R_BAD_HEADER,
                                  R_UNKNOWN, R_BAD_BODY, K_REQUEST, K_RESPONSE, K_ONEWAY,
                                  OUTCOME_OK, OUTCOME_ERROR, RESOURCE_MAX, skip_some)
from proxy.framing_py import FrameParser
from proxy.protocols.rabbitmq_stream.constants import COMMANDS as _KNOWN
from proxy.protocols.rabbitmq_stream.constants import (
    MAX_FRAME_BYTES, PUBLISH, PUBLISH_CONFIRM, PUBLISH_ERROR, DELIVER, CREDIT, STORE_OFFSET,
    HEARTBEAT, METADATA_UPDATE, METADATA, TUNE, OK, SASL_CHALLENGE, CREATE, STREAM_ALREADY_EXISTS,
    RESOURCE_PROGRAMS, command_name, status_name)
from proxy.protocols.rabbitmq_stream.rewrite import MetadataRewriter

HDR = 8
RESP = 0x8000
LAST = 28
ONE_WAY = (CREDIT, STORE_OFFSET, HEARTBEAT, METADATA_UPDATE)
TAG_TUNE = 2
TAG_PUBLISHER = 256
# B_MSG_LEN: a simple message's Size u32, or a batch's type, Count and one more byte;
# B_SUB: the batch's other 3 Uncompressed bytes and its Size u32
B_PUBID, B_COUNT, B_PID, B_FILTER_LEN, B_MSG_LEN, B_CODE, B_SUB, B_DONE = range(8)
SUB_BIT = 0x80                             # first bit of an entry: a sub-entry batch
PH_FIELD, PH_SKIP, PH_NAME = range(3)      # resource reader phases
SUB_SLOT = 256                             # names: publisher ids 0..255, then subscriptions
_FIELD_SIZE = {"pub": 1, "sub": 1, "one": 4, "skip": 2, "skip2": 2, "stream": 2}


def normal_flow(cmd, code):
    """OK, a SASL challenge, and Create answered STREAM_ALREADY_EXISTS: outcome ok."""
    return code in (OK, SASL_CHALLENGE) or (cmd == CREATE and code == STREAM_ALREADY_EXISTS)


def header_need(key, version):
    """Header bytes a frame must show before it can be counted and correlated."""
    cmd = key & 0x7FFF
    if cmd == 0 or cmd > LAST:
        return HDR
    if key & RESP:
        if cmd == CREDIT:
            return HDR + 2
        if cmd == TUNE:
            return HDR + 8
        if cmd == METADATA:
            return HDR + 4
        return HDR + 6
    if cmd in (PUBLISH, PUBLISH_CONFIRM, PUBLISH_ERROR) or cmd in ONE_WAY:
        return HDR
    if cmd == DELIVER:
        return HDR + 1 + (8 if version >= 2 else 0) + 8
    if cmd == TUNE:
        return HDR + 8
    return HDR + 4


def be(b, start, n):
    return int.from_bytes(b[start:start + n], "big")


class _Body:
    __slots__ = ("kind", "state", "version", "need", "buf", "skip", "left", "pubid", "pid",
                 "slot")

    def __init__(self, kind, version, slot):
        self.kind = kind
        self.version = version
        self.slot = slot
        self.state = B_PUBID
        self.need = 1
        self.buf = bytearray()
        self.skip = 0
        self.left = 0
        self.pubid = 0
        self.pid = 0


class _Read:
    """The resource reader of one stream-naming request (constants.RESOURCE_PROGRAMS)."""
    __slots__ = ("prog", "step", "phase", "slot", "pos", "len", "skip", "want")

    def __init__(self, cmd, body_len):
        self.prog = RESOURCE_PROGRAMS[cmd] + ("end",)
        self.step = 0
        self.phase = PH_FIELD
        self.slot = -1
        self.pos = 0
        self.len = body_len
        self.skip = 0
        self.want = 0


class StreamParser(FrameParser):
    """Counts, sizes and correlates the RabbitMQ Stream frames of one proxied connection."""

    header_size = 4
    max_frame_bytes = MAX_FRAME_BYTES

    def __init__(self, stats, max_frame_bytes=None, request_timeout=30.0, options=None):
        stats.describe(command_name, status_name, _KNOWN)   # once per route
        super().__init__(stats, max_frame_bytes, request_timeout, options)
        self.tuned_max = 0
        self.local_address = None
        self.upstream_address = None
        self.b = [None, None]
        self.rr = [None, None]          # resource reader per direction (recording only)
        self.names = {}                 # slot -> stream name (bytes), recording only
        self.rewriter = MetadataRewriter.from_options(self.options)
        if self.rewriter is not None:
            self.set_hold(S2C, True)

    def on_header(self, d, h, avail):
        size = be(h, 0, 4)
        total = size + 4
        if size > self.max_frame_bytes:
            self.fail(d, R_TOO_LARGE, "frame size %d at offset %d exceeds the limit %d" % (
                size, self.st[d].frame_start, self.max_frame_bytes))
            return -1
        if size < 4:
            self.protocol_error(d, R_TOO_SMALL)
            return total
        if avail < HDR:
            return self.want_header(d, HDR)
        key = be(h, 4, 2)
        version = be(h, 6, 2)
        cmd = key & 0x7FFF
        need = header_need(key, version)
        if need <= total and avail < need:
            return self.want_header(d, need)
        if key & RESP or cmd in (PUBLISH_CONFIRM, PUBLISH_ERROR) or (cmd == TUNE and d == C2S):
            kind = K_RESPONSE
        elif cmd == PUBLISH or (cmd == TUNE and d == S2C) or need == HDR + 4:
            kind = K_REQUEST
        else:
            kind = K_ONEWAY
        self.begin(d, self.stats.slot_for(cmd), kind, total, need if need <= total else HDR)
        if self.tuned_max and total > self.tuned_max:
            self.protocol_error(d, R_TOO_LARGE)
        if cmd == 0 or cmd > LAST:
            self.protocol_error(d, R_UNKNOWN)
            return total
        if need > total:
            self.protocol_error(d, R_BAD_HEADER)
            return total
        if not key & RESP:
            if cmd in (PUBLISH, PUBLISH_CONFIRM, PUBLISH_ERROR):
                self.b[d] = _Body(cmd, version, 0)
                self.stream_body(d, HDR)       # the body starts after Key + Version
            elif cmd == DELIVER:
                self.add_messages(d, be(h, need - 4, 4))
                if self.recording:
                    self._recall(d, SUB_SLOT + h[HDR])
            elif cmd == TUNE:
                self._tune(d, h)
            else:
                if need == HDR + 4:
                    self.expect(d, d, be(h, HDR, 4), -1)
                if self.recording and cmd in RESOURCE_PROGRAMS:
                    self.rr[d] = _Read(cmd, total - need)
                    self.stream_body(d, need)   # the stream name is in the body
            return total
        if cmd == CREDIT:
            code = be(h, HDR, 2)
            self.set_status(d, code, OUTCOME_OK if code == OK else OUTCOME_ERROR)
            return total
        if cmd == TUNE:
            self._tune(d, h)
            return total
        corr = be(h, HDR, 4)
        code = OK if cmd == METADATA else be(h, HDR + 4, 2)
        self.take(d, 1 - d, corr)
        self.answer(d, code, OUTCOME_OK if normal_flow(cmd, code) else OUTCOME_ERROR)
        if self.recording and self.st[d].rec.corr_fmt == 0:
            self.set_corr(d, corr, -1)
        if cmd == METADATA and d == S2C and self.rewriter is not None:
            self.capture_frame(d)
        return total

    def _tune(self, d, h):
        if d == S2C:
            self.expect(d, TAG_TUNE, 0, -1)
        else:
            frame_max = be(h, HDR, 4)
            if frame_max:
                self.tuned_max = frame_max
            if self.take(d, TAG_TUNE, 0) >= 0:
                self.answer(d, OK, OUTCOME_OK)

    # ---- the frame log's resource: the stream (recording only) ----------------------

    def _recall(self, d, slot):
        name = self.names.get(slot)
        if name is not None:
            self.set_resource(d, name)

    def _next_op(self, d, r):
        r.step += 1
        r.phase = PH_FIELD
        op = r.prog[r.step]
        if op in ("recall", "forget"):
            if r.slot >= 0:
                self._recall(d, r.slot)
                if op == "forget":
                    self.names.pop(r.slot, None)
            r.step = -1
        elif op == "end":
            r.step = -1

    def _read(self, d, r, chunk):
        i, n = 0, len(chunk)
        while i < n and r.step >= 0:
            if r.phase == PH_SKIP:
                take, r.skip = skip_some(r.skip, n - i)
                r.pos += take
                i += take
                if r.skip == 0:
                    self._next_op(d, r)
                continue
            op = r.prog[r.step]
            want = r.want if r.phase == PH_NAME else _FIELD_SIZE[op]
            if r.pos + want > r.len:
                r.step = -1
                break
            f, used = self.gather(d, chunk[i:], want)
            if f is None:
                return
            i += used
            r.pos += want
            if r.phase == PH_NAME:
                f = bytes(f)
                self.set_resource(d, f)
                if r.slot >= 0:
                    self.names[r.slot] = f
                r.step = -1
            elif op in ("pub", "sub"):
                r.slot = f[0] + (SUB_SLOT if op == "sub" else 0)
                self._next_op(d, r)
            elif op == "one":
                if be(f, 0, 4) == 1:
                    self._next_op(d, r)
                else:
                    r.step = -1
            elif op == "skip2":
                self._next_op(d, r)
            else:
                v = int.from_bytes(f[:2], "big", signed=True)
                if op == "skip" and v == -1:
                    v = 0
                if v < 0 or r.pos + v > r.len:
                    r.step = -1
                elif op == "skip":
                    if v:
                        r.skip, r.phase = v, PH_SKIP
                    else:
                        self._next_op(d, r)
                elif v == 0:
                    self.set_resource(d, b"")
                    if r.slot >= 0:
                        self.names[r.slot] = b""
                    r.step = -1
                else:
                    r.want, r.phase = min(v, RESOURCE_MAX), PH_NAME

    def on_body(self, d, chunk):
        if self.rr[d] is not None:
            self._read(d, self.rr[d], chunk)
            return
        b = self.b[d]
        i, n = 0, len(chunk)
        while i < n:
            if b.skip > 0:
                take, b.skip = skip_some(b.skip, n - i)
                i += take
                continue
            if b.state >= B_DONE:
                b.state = B_DONE + 1
                break
            take = min(b.need - len(b.buf), n - i)
            b.buf += chunk[i:i + take]
            i += take
            if len(b.buf) < b.need:
                break
            f = bytes(b.buf)
            b.buf = bytearray()
            self._field(d, b, f)

    def _confirm(self, d, tag, pid, pubid, code, outcome):
        self.entry(d)
        self.take(d, tag, pid)
        self.answer(d, code, outcome)
        if self.recording and self.st[d].rec.corr_fmt == 0:
            self.set_corr(d, pid, pubid)

    def _field(self, d, b, f):
        if b.state == B_PUBID:
            b.pubid = f[0]
            b.state, b.need = B_COUNT, 4
            if self.recording:                 # every row carries the publisher's stream
                self._recall(d, b.pubid)
        elif b.state == B_COUNT:
            b.left = be(f, 0, 4)
            b.state, b.need = (B_PID if b.left else B_DONE), 8
        elif b.state == B_PID:
            b.pid = be(f, 0, 8)
            if b.kind == PUBLISH:
                self.entry(d)
                self.expect(d, TAG_PUBLISHER + b.pubid, b.pid, b.pubid)
                b.state, b.need = (B_FILTER_LEN, 2) if b.version >= 2 else (B_MSG_LEN, 4)
            elif b.kind == PUBLISH_CONFIRM:
                self._confirm(d, TAG_PUBLISHER + b.pubid, b.pid, b.pubid, OK, OUTCOME_OK)
                self._next_entry(b)
            else:
                b.state, b.need = B_CODE, 2
        elif b.state == B_FILTER_LEN:
            flen = int.from_bytes(f[:2], "big", signed=True)
            if flen > 0:
                b.skip = flen
            b.state, b.need = B_MSG_LEN, 4
        elif b.state == B_MSG_LEN:
            if f[0] & SUB_BIT:
                self._messages(d, be(f, 1, 2))
                b.state, b.need = B_SUB, 7
            else:
                self._messages(d, 1)
                b.skip = be(f, 0, 4)
                self._next_entry(b)
        elif b.state == B_SUB:
            b.skip = be(f, 3, 4)
            self._next_entry(b)
        elif b.state == B_CODE:
            self._confirm(d, TAG_PUBLISHER + b.pubid, b.pid, b.pubid, be(f, 0, 2),
                          OUTCOME_ERROR)
            self._next_entry(b)

    def _messages(self, d, n):
        """The current Publish entry carries n messages: the counter, and its row."""
        s = self.st[d]
        self.stats.messages[d][s.slot] += n
        if self.recording:
            s.rec.messages = n

    @staticmethod
    def _next_entry(b):
        b.left -= 1
        b.state, b.need = (B_PID if b.left else B_DONE), 8

    def on_body_end(self, d):
        if self.rr[d] is not None:
            self.rr[d] = None                  # a resource read never counts an error
            return
        b = self.b[d]
        if b.state != B_DONE or b.skip > 0 or b.buf:
            self.protocol_error(d, R_BAD_BODY)
        self.b[d] = None

    def rewrite(self, d, frame):
        return self.rewriter.rewrite(frame, self.local_address, self.upstream_address,
                                     self.stats)
