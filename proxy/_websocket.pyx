# cython: language_level=3
"""The WebSocket deframer, compiled (fleximq over WebSocket; proxy/websocket.py says what
the layer does).  Twin: proxy/websocket_py.py, same decisions, counts and messages.

Per read of a direction in its frame phase, frames are walked in place (a header split
across reads is copied, at most 14 bytes).  Binary payload goes to the fleximq parser
without a Python object per frame:

* while the parser is inside a fleximq payload (it would only count those bytes), they
  are passed over: the parser's counters advance as its own feed loop would advance
  them, and nothing is unmasked or copied;
* anything else (fleximq headers, short frames) is unmasked or copied into a reusable
  gather buffer (GCAP bytes, allocated once per layer) that is fed to the parser's
  feed loop when full, when it holds SEGS pieces, after the first SPLIT bytes of a
  longer piece (the parser then knows whether the rest is a payload it passes over),
  before any WebSocket error is counted, and at the end of the read: one clock read
  per flush, not per frame.

Control and text payloads are never copied (a close frame's first two bytes, its code,
are).  The bytes the relay forwards are the original frames.
"""

from cpython.bytes cimport PyBytes_Check, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from cpython.mem cimport PyMem_Malloc, PyMem_Free
from libc.stdint cimport uint8_t, int64_t, uint64_t
from libc.string cimport memcpy

from proxy._framing cimport FrameParser, DirState, R_WS_FIRST

from proxy.framing_common import REASONS
from proxy.websocket import PH_HEAD, PH_FRAMES, PH_PASS, close_code_ok, feed_head

cdef enum:
    GCAP = 4096              # gather buffer bytes (websocket_py.GATHER_BYTES)
    SEGS = 32                # payload pieces per gather (websocket_py.GATHER_SEGMENTS)
    SPLIT = 512              # a longer piece is gathered this far, then fed (GATHER_SPLIT)
    K_FEED = 0               # binary payload: to the parser
    K_TEXT = 1               # text payload: counted, not parsed
    K_SKIP = 2               # ping / pong payload
    K_CLOSE = 3              # close payload (its code is checked)
    F_HEAD = 0               # phases (proxy/websocket.py PH_*)
    F_FRAMES = 1
    F_PASS = 2

assert (F_HEAD, F_FRAMES, F_PASS) == (PH_HEAD, PH_FRAMES, PH_PASS)

GATHER_BYTES = GCAP
GATHER_SEGMENTS = SEGS
GATHER_SPLIT = SPLIT

cdef dict R = {name: REASONS.index(name) for name in REASONS if name.startswith("ws_")}
cdef int R_FRAME_AFTER_CLOSE = R["ws_frame_after_close"]
cdef int R_RESERVED_BITS = R["ws_reserved_bits"]
cdef int R_BAD_OPCODE = R["ws_bad_opcode"]
cdef int R_UNMASKED = R["ws_unmasked_client_frame"]
cdef int R_MASKED = R["ws_masked_server_frame"]
cdef int R_BAD_CONTROL = R["ws_bad_control_frame"]
cdef int R_BAD_CONTINUATION = R["ws_bad_continuation"]
cdef int R_OVERSIZED = R["ws_oversized"]
cdef int R_TEXT = R["ws_text_message"]
cdef int R_BAD_CLOSE = R["ws_bad_close"]
cdef int R_TRUNCATED_WS = R["ws_truncated_frame"]
assert R["ws_bad_upgrade"] == R_WS_FIRST


cdef struct WsDir:
    int64_t remaining        # payload bytes of the current frame still to come
    int64_t msg_bytes        # payload bytes of the open data message so far
    int64_t frame_off        # wire offset (this direction) where the current frame began
    int64_t ctl_len          # a close frame's payload length
    int kind                 # K_*
    int in_message           # a fragmented data message is open
    int msg_text             # ... and it is a text message
    int closed               # this direction sent its close frame
    int masked
    int mpos                 # mask phase of the next payload byte
    int hhave                # header bytes held in hdr (a header split across reads)
    int ctl_have             # close-code bytes held in ctl
    uint8_t mask[12]         # the mask key, three times over (unmask_into)
    uint8_t hdr[14]
    uint8_t ctl[2]


cdef inline Py_ssize_t header_size(uint8_t b1) noexcept:
    cdef Py_ssize_t n = 2
    if b1 & 0x7F == 126:
        n = 4
    elif b1 & 0x7F == 127:
        n = 10
    return n + 4 if b1 & 0x80 else n


cdef inline void unmask_into(uint8_t* dst, const uint8_t* src, Py_ssize_t n,
                             const uint8_t* mask12, int mpos) noexcept:
    """dst = src XOR the mask from phase mpos, eight bytes at a time (``mask12``: the
    mask key three times over, so any phase's eight bytes are one load)."""
    cdef const uint8_t* m = mask12 + mpos
    cdef uint64_t m8, x
    cdef Py_ssize_t i = 0
    memcpy(&m8, m, 8)
    while i + 8 <= n:
        memcpy(&x, src + i, 8)
        x ^= m8
        memcpy(dst + i, &x, 8)
        i += 8
    while i < n:
        dst[i] = src[i] ^ m[i & 7]
        i += 1


cdef class WsLayer:
    """The WebSocket layer over a compiled fleximq parser: what the relay calls in the
    parser's place (feed, output, error, feed_frames, bytes_fed; the rest is the
    parser's own, through __getattr__)."""

    cdef readonly FrameParser parser
    cdef readonly object upgrade         # proxy.websocket.Upgrade
    cdef public object output            # bytes to forward for the last feed(), or None
    cdef public Py_ssize_t feed_frames   # WebSocket + fleximq headers of the last feed()
    cdef int phase[2]
    cdef WsDir w[2]
    cdef int64_t wire[2]                 # bytes fed per direction
    cdef int64_t max_bytes
    cdef uint8_t* gbuf                   # the gather buffer (GCAP bytes), lazily
    cdef Py_ssize_t glen
    cdef Py_ssize_t seg_off[SEGS]        # gather offset where each piece begins ...
    cdef Py_ssize_t seg_start[SEGS]      # ... and where its frame began in this read
    cdef int nseg

    def __cinit__(self, FrameParser parser, upgrade):
        self.parser = parser
        self.upgrade = upgrade
        self.max_bytes = parser.max_frame_bytes
        self.phase[0] = F_HEAD
        self.phase[1] = F_HEAD

    def __dealloc__(self):
        if self.gbuf is not NULL:
            PyMem_Free(self.gbuf)

    def __getattr__(self, name):
        return getattr(self.parser, name)

    @property
    def error(self):
        return self.parser.error

    @property
    def bytes_fed(self):
        return self.wire[0] + self.wire[1]

    def phases(self):
        return (self.phase[0], self.phase[1])

    # ---- what proxy.websocket.feed_head() uses -----------------------------------------

    def set_phase(self, int d, int ph):
        self.phase[d] = ph

    def count_bytes(self, int d, Py_ssize_t n):
        self.parser.c.relayed[d] += n

    def ws_count(self, int d, str reason):
        self.parser.stats.error(d, R[reason])

    def ws_fail(self, int d, str reason, str message):
        self.parser.fail(d, R[reason], message)

    def feed_frames_of(self, int d, bytes data):
        cdef Py_ssize_t n = len(data)
        return self._frames(d, <const uint8_t*>PyBytes_AS_STRING(data), n, self.wire[d] - n)

    # ---- the relay's calls --------------------------------------------------------------

    cpdef Py_ssize_t feed(self, int direction, object data) except -1:
        cdef Py_buffer view
        cdef Py_ssize_t r, n
        cdef FrameParser p = self.parser
        cdef int d = direction
        if d != 0 and d != 1:
            raise ValueError("direction must be 0 (c2s) or 1 (s2c)")
        if self.output is not None:
            self.output = None
        if p.error is not None or p.closed:
            return 0
        self.feed_frames = 0
        if self.phase[d] != F_FRAMES:
            n = len(data)
            self.wire[d] += n
            if self.phase[d] == F_PASS:
                p.c.relayed[d] += n
                r = n
            else:
                r = feed_head(self, d, bytes(data))
        elif PyBytes_Check(data):
            n = PyBytes_GET_SIZE(data)
            self.wire[d] += n
            r = self._frames(d, <const uint8_t*>PyBytes_AS_STRING(data), n, self.wire[d] - n)
        else:
            PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
            try:
                n = view.len
                self.wire[d] += n
                r = self._frames(d, <const uint8_t*>view.buf, n, self.wire[d] - n)
            finally:
                PyBuffer_Release(&view)
        if p._tracer_error is not None:
            p._raise_tracer_error()
        return r

    def close(self):
        cdef FrameParser p = self.parser
        cdef int d
        if not p.closed and p.error is None:
            for d in range(2):
                if self.phase[d] == F_FRAMES and (self.w[d].remaining > 0 or
                                                  self.w[d].hhave > 0):
                    p.stats.error(d, R_TRUNCATED_WS)
                elif self.phase[d] == F_HEAD and self.upgrade.heads[d]:
                    p.stats.error(d, R_TRUNCATED_WS)
        p.close()

    # ---- frames -------------------------------------------------------------------------

    cdef Py_ssize_t _flush(self, int d) except -2:
        """Feed the gathered payload; -1, or after a fatal fleximq error the offset (in
        this read) of the frame that carried the failing fleximq frame's first gathered
        byte."""
        cdef FrameParser p = self.parser
        cdef Py_ssize_t r, n = self.glen
        cdef int i = self.nseg - 1
        if n == 0:
            return -1
        self.glen = 0
        self.nseg = 0
        r = p._feed(d, None, self.gbuf, n)
        self.feed_frames += p.feed_frames
        if p.error is None:
            return -1
        while i > 0 and self.seg_off[i] > r:
            i -= 1
        return self.seg_start[i]

    cdef Py_ssize_t _fatal(self, int d, Py_ssize_t cur, int reason, str message) except -2:
        cdef Py_ssize_t pre = self._flush(d)
        if pre >= 0:
            return pre
        self.parser.fail(d, reason, message)
        return cur

    cdef Py_ssize_t _payload(self, int d, const uint8_t* buf, Py_ssize_t n,
                             Py_ssize_t cur) except -2:
        """Binary payload bytes of the frame that began at ``cur``; -1 or a cut."""
        cdef FrameParser p = self.parser
        cdef DirState* s = &p.st[d]
        cdef WsDir* w = &self.w[d]
        cdef Py_ssize_t pos = 0, k, pre
        cdef int mpos = w.mpos
        cdef bint big
        while pos < n:
            if self.glen == 0 and s.remaining > 0 and not s.capture and not s.body:
                # inside a fleximq payload: what the parser's feed loop does with bytes
                # it passes over (_framing.pyx FrameParser._feed), without the bytes
                k = n - pos
                if k > s.remaining:
                    k = <Py_ssize_t>s.remaining
                s.offset += k
                p.c.relayed[d] += k
                p.feed_frames = 0
                s.remaining -= k
                if s.remaining == 0 and s.open:
                    p._frame_end(d, None)
                pos += k
                mpos = (mpos + k) & 3
                continue
            if self.nseg == 0 or self.seg_start[self.nseg - 1] != cur:
                if self.nseg == SEGS:
                    pre = self._flush(d)
                    if pre >= 0:
                        return pre
                    continue
                self.seg_off[self.nseg] = self.glen
                self.seg_start[self.nseg] = cur
                self.nseg += 1
            if self.gbuf is NULL:
                self.gbuf = <uint8_t*>PyMem_Malloc(GCAP)
                if self.gbuf is NULL:
                    raise MemoryError()
            k = GCAP - self.glen
            if k > n - pos:
                k = n - pos
            big = k > SPLIT
            if big:                    # a long piece: let the parser see its start, it
                k = SPLIT              # may be a payload to pass over
            if w.masked:
                unmask_into(self.gbuf + self.glen, buf + pos, k, w.mask, mpos)
            else:
                memcpy(self.gbuf + self.glen, buf + pos, k)
            self.glen += k
            pos += k
            mpos = (mpos + k) & 3
            if self.glen == GCAP or big:
                pre = self._flush(d)
                if pre >= 0:
                    return pre
        return -1

    cdef Py_ssize_t _frames(self, int d, const uint8_t* buf, Py_ssize_t n,
                            int64_t base) except -2:
        """Walk the frames of one read (``base``: its wire offset); the valid prefix."""
        cdef WsDir* w = &self.w[d]
        cdef Py_ssize_t pos = 0, take, k, hs, cur = 0, cut = -1
        cdef int64_t extra = 0
        cdef const uint8_t* h
        while pos < n:
            if w.remaining > 0:
                take = n - pos
                if take > w.remaining:
                    take = <Py_ssize_t>w.remaining
                if w.kind == K_FEED:
                    cut = self._payload(d, buf + pos, take, cur)
                    if cut >= 0:
                        break
                else:
                    if w.kind == K_CLOSE and w.ctl_have < 2:
                        k = 2 - w.ctl_have
                        if k > take:
                            k = take
                        if w.masked:
                            unmask_into(w.ctl + w.ctl_have, buf + pos, k, w.mask, w.mpos)
                        else:
                            memcpy(w.ctl + w.ctl_have, buf + pos, k)
                        w.ctl_have += <int>k
                    extra += take
                w.mpos = (w.mpos + take) & 3
                w.remaining -= take
                pos += take
                if w.remaining == 0:
                    cut = self._frame_end(d, cur)
                    if cut >= 0:
                        break
                continue
            if w.hhave == 0:
                cur = pos
                w.frame_off = base + pos
                if n - pos >= 2:
                    hs = header_size(buf[pos + 1])
                    if n - pos >= hs:          # the header is whole here: no copy
                        h = buf + pos
                        pos += hs
                        extra += hs
                        cut = self._header(d, h, cur)
                        if cut >= 0:
                            break
                        if w.remaining == 0:
                            cut = self._frame_end(d, cur)
                            if cut >= 0:
                                break
                        continue
            # a header split across reads: copy its bytes
            if w.hhave < 2:
                take = 2 - w.hhave
            else:
                take = header_size(w.hdr[1]) - w.hhave
            if take > n - pos:
                take = n - pos
            memcpy(w.hdr + w.hhave, buf + pos, take)
            w.hhave += <int>take
            pos += take
            extra += take
            if w.hhave < 2 or w.hhave < header_size(w.hdr[1]):
                continue
            w.hhave = 0
            cut = self._header(d, w.hdr, cur)
            if cut >= 0:
                break
            if w.remaining == 0:
                cut = self._frame_end(d, cur)
                if cut >= 0:
                    break
        else:
            cut = self._flush(d)
        self.parser.c.relayed[d] += extra
        return n if cut < 0 else cut

    cdef Py_ssize_t _header(self, int d, const uint8_t* h, Py_ssize_t cur) except -2:
        cdef WsDir* w = &self.w[d]
        cdef uint8_t b0 = h[0], b1 = h[1]
        cdef int fin = b0 & 0x80, op = b0 & 0x0F, masked = b1 & 0x80
        cdef uint64_t ln = b1 & 0x7F
        cdef int i, mo = 2
        cdef Py_ssize_t pre
        cdef int64_t msg
        if ln == 126:
            ln = (<uint64_t>h[2] << 8) | h[3]
            mo = 4
        elif ln == 127:
            ln = 0
            for i in range(8):
                ln = (ln << 8) | h[2 + i]
            mo = 10
        if w.closed:
            return self._fatal(d, cur, R_FRAME_AFTER_CLOSE,
                               "WebSocket frame (opcode %d) at offset %d after this side's "
                               "close frame" % (op, w.frame_off))
        if b0 & 0x70:
            return self._fatal(d, cur, R_RESERVED_BITS,
                               "WebSocket frame at offset %d sets reserved bits 0x%02x (no "
                               "extension was negotiated)" % (w.frame_off, b0 & 0x70))
        if 3 <= op <= 7 or op >= 11:
            return self._fatal(d, cur, R_BAD_OPCODE,
                               "WebSocket frame at offset %d has opcode %d (RFC 6455 defines "
                               "0-2, 8-10)" % (w.frame_off, op))
        if d == 0 and not masked:
            return self._fatal(d, cur, R_UNMASKED,
                               "unmasked WebSocket frame from the client at offset %d (RFC "
                               "6455 §5.1)" % w.frame_off)
        if d == 1 and masked:
            return self._fatal(d, cur, R_MASKED,
                               "masked WebSocket frame from the server at offset %d (RFC 6455 "
                               "§5.1)" % w.frame_off)
        if op >= 8:
            if not fin or ln > 125:
                return self._fatal(d, cur, R_BAD_CONTROL,
                                   "WebSocket control frame (opcode %d) at offset %d is %s" % (
                                       op, w.frame_off, "fragmented" if not fin else
                                       "%d bytes (at most 125)" % ln))
        elif op == 0:
            if not w.in_message:
                return self._fatal(d, cur, R_BAD_CONTINUATION,
                                   "WebSocket continuation frame at offset %d outside a "
                                   "message" % w.frame_off)
        elif w.in_message:
            return self._fatal(d, cur, R_BAD_CONTINUATION,
                               "WebSocket data frame (opcode %d) at offset %d inside a "
                               "fragmented message" % (op, w.frame_off))
        if ln > <uint64_t>self.max_bytes:
            return self._fatal(d, cur, R_OVERSIZED,
                               "WebSocket frame of %d bytes at offset %d is over "
                               "max_frame_bytes %d" % (ln, w.frame_off, self.max_bytes))
        msg = (w.msg_bytes if op == 0 else 0) + <int64_t>ln
        if op < 8 and msg > self.max_bytes:
            return self._fatal(d, cur, R_OVERSIZED,
                               "WebSocket message of %d bytes at offset %d is over "
                               "max_frame_bytes %d" % (msg, w.frame_off, self.max_bytes))
        w.masked = 1 if masked else 0
        if masked:
            memcpy(w.mask, h + mo, 4)
            memcpy(w.mask + 4, h + mo, 4)
            memcpy(w.mask + 8, h + mo, 4)
        w.mpos = 0
        w.remaining = <int64_t>ln
        self.feed_frames += 1
        if op >= 8:
            w.kind = K_CLOSE if op == 8 else K_SKIP
            w.ctl_have = 0
            w.ctl_len = <int64_t>ln
            return -1
        if op != 0:
            w.in_message = 1
            w.msg_text = op == 1
            w.msg_bytes = 0
            if op == 1:
                pre = self._flush(d)
                if pre >= 0:
                    return pre
                self.parser.stats.error(d, R_TEXT)
        w.msg_bytes += <int64_t>ln
        if fin:
            w.in_message = 0
        w.kind = K_TEXT if w.msg_text else K_FEED
        return -1

    cdef Py_ssize_t _frame_end(self, int d, Py_ssize_t cur) except -2:
        cdef WsDir* w = &self.w[d]
        cdef Py_ssize_t pre
        if w.kind != K_CLOSE:
            return -1
        w.kind = K_SKIP
        w.closed = 1
        if w.ctl_len == 1 or (w.ctl_len >= 2 and
                              not close_code_ok((w.ctl[0] << 8) | w.ctl[1])):
            pre = self._flush(d)
            if pre >= 0:
                return pre
            self.parser.stats.error(d, R_BAD_CLOSE)
        return -1
