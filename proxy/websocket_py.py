"""The WebSocket deframer, pure Python: twin of proxy/_websocket.pyx (same decisions, same
counts, same error messages; tests marked ``twins`` hold them to it).

See proxy/websocket.py for what the layer does.  Per read of a direction in its frame
phase: walk RFC 6455 frames (a header split across reads is kept, at most 14 bytes);
binary payload bytes go to the fleximq parser, either straight through (the parser is
inside a fleximq payload: it only counts them, so they are not unmasked) or unmasked
into a gather buffer that is fed to the parser when it holds GATHER_BYTES or
GATHER_SEGMENTS pieces, after the first GATHER_SPLIT bytes of a longer piece, before any
WebSocket error is counted, and at the end of the read.  Those flush points decide where a fatal fleximq error cuts the stream (the
WebSocket frame that carried the failing fleximq frame's first gathered byte), so both
twins flush at the same points.
"""

from proxy.framing_common import DIRECTIONS, REASONS
from proxy.websocket import (PH_FRAMES, PH_HEAD, PH_PASS, close_code_ok, feed_head)

GATHER_BYTES = 4096       # gather buffer (the compiled twin's GCAP)
GATHER_SEGMENTS = 32      # pieces of WebSocket payload in one gather (SEGS)
GATHER_SPLIT = 512        # a longer piece is gathered this far, then fed (SPLIT)

K_FEED, K_TEXT, K_SKIP, K_CLOSE = range(4)


class _WsDir:
    __slots__ = ("remaining", "kind", "in_message", "msg_text", "msg_bytes", "closed",
                 "masked", "mask", "mpos", "hdr", "ctl", "ctl_len", "frame_off")

    def __init__(self):
        self.remaining = 0       # payload bytes of the current frame still to come
        self.kind = K_SKIP
        self.in_message = False  # a fragmented data message is open
        self.msg_text = False
        self.msg_bytes = 0       # payload bytes of the open message so far
        self.closed = False      # this direction sent its close frame
        self.masked = False
        self.mask = b"\0\0\0\0"
        self.mpos = 0            # mask phase of the next payload byte
        self.hdr = bytearray()   # a header split across reads
        self.ctl = bytearray()   # a close frame's first two payload bytes (its code)
        self.ctl_len = 0
        self.frame_off = 0       # wire offset (this direction) where the frame began


def _unmask(chunk, mask, mpos):
    n = len(chunk)
    m = mask[mpos:] + mask[:mpos]
    key = (m * (n // 4 + 1))[:n]
    return (int.from_bytes(chunk, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")


def header_size(b1):
    n = 2 + (2 if b1 & 0x7F == 126 else 8 if b1 & 0x7F == 127 else 0)
    return n + 4 if b1 & 0x80 else n


R = {name: REASONS.index(name) for name in REASONS if name.startswith("ws_")}


class WsLayer:
    """The WebSocket layer over a pure-Python fleximq parser (proxy/websocket.py)."""

    def __init__(self, parser, upgrade):
        self.parser = parser
        self.upgrade = upgrade
        self.output = None
        self.feed_frames = 0
        self.phase = [PH_HEAD, PH_HEAD]
        self.w = (_WsDir(), _WsDir())
        self.wire = [0, 0]
        self.max_bytes = parser.max_frame_bytes
        self._gather = bytearray()
        self._segs = []          # (gather offset, wire start in this read of its frame)

    def __getattr__(self, name):             # expire, close's helpers, attach_log, ...
        return getattr(self.parser, name)

    @property
    def error(self):
        return self.parser.error

    @property
    def bytes_fed(self):
        return self.wire[0] + self.wire[1]

    def phases(self):
        return tuple(self.phase)

    # ---- what feed_head() uses --------------------------------------------------------

    def set_phase(self, d, ph):
        self.phase[d] = ph

    def count_bytes(self, d, n):
        self.parser.stats.relayed[d] += n

    def ws_count(self, d, reason):
        self.parser.stats.error(d, R[reason])

    def ws_fail(self, d, reason, message):
        self.parser.fail(d, R[reason], message)

    def feed_frames_of(self, d, data):
        return self._frames(d, memoryview(data).cast("B"), self.wire[d] - len(data))

    # ---- the relay's calls --------------------------------------------------------------

    def feed(self, direction, data):
        if direction not in (0, 1):
            raise ValueError("direction must be 0 (c2s) or 1 (s2c)")
        d = direction
        self.output = None
        p = self.parser
        if p.error is not None or p.closed:
            return 0
        n = len(data)
        self.wire[d] += n
        self.feed_frames = 0
        ph = self.phase[d]
        if ph == PH_FRAMES:
            r = self._frames(d, memoryview(data).cast("B"), self.wire[d] - n)
        elif ph == PH_PASS:
            self.count_bytes(d, n)
            r = n
        else:
            r = feed_head(self, d, bytes(data))
        if p._tracer_error is not None:
            p._raise_tracer_error()
        return r

    def close(self):
        p = self.parser
        if not p.closed and p.error is None:
            for d in range(2):
                w = self.w[d]
                if self.phase[d] == PH_FRAMES and (w.remaining > 0 or w.hdr):
                    self.ws_count(d, "ws_truncated_frame")
                elif self.phase[d] == PH_HEAD and self.upgrade.heads[d]:
                    self.ws_count(d, "ws_truncated_frame")
        p.close()

    # ---- frames -------------------------------------------------------------------------

    def _flush(self, d):
        """Feed the gathered payload; -1, or after a fatal fleximq error the wire offset
        (in this read) of the frame that carried the failing fleximq frame's first
        gathered byte."""
        if not self._gather:
            return -1
        p = self.parser
        data, segs = bytes(self._gather), self._segs
        self._gather = bytearray()
        self._segs = []
        r = p._feed(d, data)
        self.feed_frames += p.feed_frames
        if p.error is None:
            return -1
        i = len(segs) - 1
        while i > 0 and segs[i][0] > r:
            i -= 1
        return segs[i][1]

    def _fatal(self, d, cur, reason, message):
        pre = self._flush(d)
        if pre >= 0:
            return pre
        self.parser.fail(d, R[reason], message)
        return cur

    def _payload(self, d, mv, cur, w):
        """Binary payload bytes ``mv`` of the frame that began at ``cur``; -1 or a cut."""
        p = self.parser
        s = p.st[d]
        pos, n, mpos = 0, len(mv), w.mpos
        while pos < n:
            if not self._gather and s.remaining > 0 and not s.capture and not s.body:
                k = min(n - pos, s.remaining)    # inside a fleximq payload: count only
                p._feed(d, bytes(k))
                self.feed_frames += p.feed_frames
                pos += k
                mpos = (mpos + k) & 3
                continue
            if not self._segs or self._segs[-1][1] != cur:
                if len(self._segs) == GATHER_SEGMENTS:
                    pre = self._flush(d)
                    if pre >= 0:
                        return pre
                    continue
                self._segs.append((len(self._gather), cur))
            k = min(n - pos, GATHER_BYTES - len(self._gather))
            big = k > GATHER_SPLIT
            if big:                  # a long piece: let the parser see its start first
                k = GATHER_SPLIT
            chunk = mv[pos:pos + k]
            self._gather += _unmask(chunk, w.mask, mpos) if w.masked else chunk
            pos += k
            mpos = (mpos + k) & 3
            if len(self._gather) == GATHER_BYTES or big:
                pre = self._flush(d)
                if pre >= 0:
                    return pre
        return -1

    def _frames(self, d, mv, base):
        """Walk the frames of one read (``base``: its wire offset); the valid prefix."""
        w = self.w[d]
        n = len(mv)
        pos = 0
        extra = 0                # wire bytes not fed to the parser
        cur = 0                  # where the current frame began in this read
        cut = -1
        while pos < n:
            if w.remaining > 0:
                take = min(n - pos, w.remaining)
                if w.kind == K_FEED:
                    cut = self._payload(d, mv[pos:pos + take], cur, w)
                    if cut >= 0:
                        break
                else:
                    if w.kind == K_CLOSE and len(w.ctl) < 2:
                        k = min(take, 2 - len(w.ctl))
                        w.ctl += _unmask(mv[pos:pos + k], w.mask, w.mpos) if w.masked \
                            else mv[pos:pos + k]
                    extra += take
                w.mpos = (w.mpos + take) & 3
                w.remaining -= take
                pos += take
                if w.remaining == 0:
                    cut = self._frame_end(d, w, cur)
                    if cut >= 0:
                        break
                continue
            if not w.hdr:
                cur = pos
                w.frame_off = base + pos
            take = 2 - len(w.hdr) if len(w.hdr) < 2 else header_size(w.hdr[1]) - len(w.hdr)
            take = min(take, n - pos)
            w.hdr += mv[pos:pos + take]
            pos += take
            extra += take
            if len(w.hdr) < 2 or len(w.hdr) < header_size(w.hdr[1]):
                continue
            cut = self._header(d, w, bytes(w.hdr), cur)
            w.hdr = bytearray()
            if cut >= 0:
                break
            if w.remaining == 0:
                cut = self._frame_end(d, w, cur)
                if cut >= 0:
                    break
        else:
            cut = self._flush(d)
        self.count_bytes(d, extra)
        return n if cut < 0 else cut

    def _header(self, d, w, h, cur):
        b0, b1 = h[0], h[1]
        fin, op, masked, ln = b0 & 0x80, b0 & 0x0F, b1 & 0x80, b1 & 0x7F
        at = "at offset %d" % w.frame_off
        if ln == 126:
            ln = int.from_bytes(h[2:4], "big")
        elif ln == 127:
            ln = int.from_bytes(h[2:10], "big")
        if w.closed:
            return self._fatal(d, cur, "ws_frame_after_close",
                               "WebSocket frame (opcode %d) %s after this side's close frame"
                               % (op, at))
        if b0 & 0x70:
            return self._fatal(d, cur, "ws_reserved_bits",
                               "WebSocket frame %s sets reserved bits 0x%02x (no extension "
                               "was negotiated)" % (at, b0 & 0x70))
        if 3 <= op <= 7 or op >= 11:
            return self._fatal(d, cur, "ws_bad_opcode",
                               "WebSocket frame %s has opcode %d (RFC 6455 defines 0-2, 8-10)"
                               % (at, op))
        if d == 0 and not masked:
            return self._fatal(d, cur, "ws_unmasked_client_frame",
                               "unmasked WebSocket frame from the client %s (RFC 6455 §5.1)"
                               % at)
        if d == 1 and masked:
            return self._fatal(d, cur, "ws_masked_server_frame",
                               "masked WebSocket frame from the server %s (RFC 6455 §5.1)" % at)
        if op >= 8:
            if not fin or ln > 125:
                return self._fatal(d, cur, "ws_bad_control_frame",
                                   "WebSocket control frame (opcode %d) %s is %s" % (
                                       op, at, "fragmented" if not fin else
                                       "%d bytes (at most 125)" % ln))
        elif op == 0:
            if not w.in_message:
                return self._fatal(d, cur, "ws_bad_continuation",
                                   "WebSocket continuation frame %s outside a message" % at)
        elif w.in_message:
            return self._fatal(d, cur, "ws_bad_continuation",
                               "WebSocket data frame (opcode %d) %s inside a fragmented "
                               "message" % (op, at))
        if ln > self.max_bytes or (op < 8 and (w.msg_bytes if op == 0 else 0) + ln >
                                   self.max_bytes):
            return self._fatal(d, cur, "ws_oversized",
                               "WebSocket %s of %d bytes %s is over max_frame_bytes %d" % (
                                   "frame" if ln > self.max_bytes else "message",
                                   ln if ln > self.max_bytes else w.msg_bytes + ln, at,
                                   self.max_bytes))
        w.masked = bool(masked)
        w.mask = h[-4:] if masked else b"\0\0\0\0"
        w.mpos = 0
        w.remaining = ln
        self.feed_frames += 1
        if op >= 8:
            w.kind = K_CLOSE if op == 8 else K_SKIP
            w.ctl = bytearray()
            w.ctl_len = ln
            return -1
        if op != 0:
            w.in_message = True
            w.msg_text = op == 1
            w.msg_bytes = 0
            if op == 1:
                pre = self._flush(d)
                if pre >= 0:
                    return pre
                self.ws_count(d, "ws_text_message")
        w.msg_bytes += ln
        if fin:
            w.in_message = False
        w.kind = K_TEXT if w.msg_text else K_FEED
        return -1

    def _frame_end(self, d, w, cur):
        if w.kind != K_CLOSE:
            return -1
        w.kind = K_SKIP
        w.closed = True
        if w.ctl_len == 1 or (w.ctl_len >= 2 and
                              not close_code_ok(int.from_bytes(w.ctl[:2], "big"))):
            pre = self._flush(d)
            if pre >= 0:
                return pre
            self.ws_count(d, "ws_bad_close")
        return -1


__all__ = ["WsLayer", "GATHER_BYTES", "GATHER_SEGMENTS", "GATHER_SPLIT", "DIRECTIONS"]
