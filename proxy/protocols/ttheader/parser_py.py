"""Thrift (Kitex TTHeader, Apache THeader, framed, unframed) frame parser: the
pure-Python twin of _parser.pyx — same algorithm, same results, same API.  The
compiled parser's docstring documents the wire formats and every place where the
seed document and the real implementations differ.  The walks both twins share are
walk_py.py, run here as Python (the compiled twin cimports the same source compiled);
the classes below are its states, field for field walk_c.pxd's structs."""

import zlib

from proxy.framing_common import (C2S, R_HEADER_TOO_LARGE, R_BAD_MAGIC, R_TOO_LARGE, R_TOO_SMALL, R_BAD_HEADER,
                                  R_BAD_BODY, R_MISMATCH, K_REQUEST, K_RESPONSE, K_ONEWAY,
                                  OUTCOME_OK, OUTCOME_ERROR, OTHER_SLOT)
from proxy.framing_py import CORR_HI_SIGNED, FrameParser
from proxy.protocols.ttheader.constants import (
    MAX_FRAME_BYTES, HEADER_LIMIT, TT_MAX_HEADER, MAGIC_TTHEADER, MAGIC_THEADER, PROTO_BINARY,
    PROTO_PROTOBUF, INFO_INTKEYVALUE, INT_KEY_NAMES, CALL, REPLY, EXCEPTION, ONEWAY,
    ST_OK, ST_UNDECODED, UNKNOWN_NAME, ZOUT_MAX, opcode_name, status_name)
from proxy.protocols.ttheader.walk_py import (
    M_OK, M_NEED, M_BAD, P_PROTOBUF, MAX_DEPTH, TT_META, X_NONE, X_ZLIB, X_OPAQUE, INFO_BATCH,
    read_message, reply_status, exception_status, walk_binary, info_scan, info_walk)
from proxy.wire_py import be16_at, be32_at, be32s_at

HDR = 8                       # bytes every frame is first looked at with
F_TTHEADER, F_THEADER, F_FRAMED = 1, 2, 3
ZSTEP = 64                                  # first compressed-input step of _zlib()


# The walker's states (walk_py.py; the structs of walk_c.pxd, field for field).

class Msg:
    """What the message reader found."""
    __slots__ = ("ptype", "mtype", "name_off", "name_len", "seq", "body", "status", "need",
                 "var", "end")

    def __init__(self):
        self.ptype = self.mtype = self.name_off = self.name_len = self.seq = 0
        self.body = self.status = self.need = self.var = self.end = 0


class Info:
    """What the header's info section held."""
    __slots__ = ("proto", "xform", "tom_off", "tom_len", "err")

    def __init__(self):
        self.proto = self.xform = self.err = 0
        self.tom_off = self.tom_len = -1


# ---- walks that go on across reads (issue 19; the compiled parser's Resume, XWalk and
# SkipWalk): a direction's saved walk belongs to the frame being read until on_header()
# returns a length or fails.
W_NONE, W_UNFRAMED, W_FRAMED = 0, 1, 2


class InfoWalk:
    """info_walk(): where the info blocks' walk stopped, and its batch of key/values."""
    __slots__ = ("i", "left", "iid", "kid", "key", "ko", "kl", "vo", "vl")

    def __init__(self):
        self.i = self.left = self.iid = 0
        self.kid, self.key, self.ko, self.kl, self.vo, self.vl = (
            [0] * INFO_BATCH for _ in range(6))


class XWalk:
    """exception_status(): the field to go on from (``last``: the compact id before it)."""
    __slots__ = ("i", "last")

    def __init__(self, i=0):
        self.i = i
        self.last = 0


class WLevel:
    """walk_binary(): one open struct (ft 12), map (13) or list/set (14)."""
    __slots__ = ("left", "ft", "kt", "vt")

    def __init__(self):
        self.left = self.ft = self.kt = self.vt = 0


class SkipWalk:
    """walk_binary(): where an unframed message's walk stopped; ``stack[:sp]`` are the
    open levels (the outermost struct first); ``cur`` is the type of the value that
    starts at ``pos`` (-1: the top level's next field or element)."""
    __slots__ = ("pos", "sp", "cur", "stack")

    def __init__(self):
        self.pos = self.sp = 0
        self.cur = 12
        self.stack = [WLevel() for _ in range(MAX_DEPTH + 1)]


class Resume:
    """Per direction: the frame being read across reads."""
    __slots__ = ("stage", "framing", "total", "p0", "hb", "hi", "x", "sk")

    def __init__(self):
        self.stage = W_NONE
        self.framing = self.total = self.p0 = self.hb = 0
        self.hi = None           # (proto, xform, tom_off, tom_len, err) of the header read
        self.x = XWalk()
        self.sk = None


class TTHeaderParser(FrameParser):
    """Counts, sizes and correlates the Thrift messages of one connection, whatever
    their framing (see the compiled parser's docstring)."""

    header_size = HDR
    max_frame_bytes = MAX_FRAME_BYTES

    def __init__(self, stats, max_frame_bytes=None, request_timeout=30.0, options=None):
        stats.describe(opcode_name, status_name, ())     # once per route
        super().__init__(stats, max_frame_bytes, request_timeout, options)
        self.header_limit = HEADER_LIMIT
        self.m = Msg()
        self.hi = Info()
        self.iw = InfoWalk()
        self.rs = (Resume(), Resume())          # per direction: a walk under way

    # ---- framing ----------------------------------------------------------------

    def on_header(self, d, h, avail):
        rs = self.rs[d]
        if rs.stage == W_FRAMED:                # the header was read: go on with the message
            hi = self.hi
            hi.proto, hi.xform, hi.tom_off, hi.tom_len, hi.err = rs.hi
            return self._framed_message(d, h, rs.p0, min(avail, rs.total), rs.total, rs.hb,
                                        rs.framing)
        start = self.st[d].frame_start
        if h[0] == 0x80 and h[1] == 0x01:
            return self._unframed(d, h, avail)
        length = be32_at(h, 0)
        magic = be16_at(h, 4)
        if magic == MAGIC_TTHEADER:
            framing = F_TTHEADER
        elif magic == MAGIC_THEADER:
            framing = F_THEADER
        elif (h[4] == 0x80 and h[5] == 0x01) or (h[4] == 0x82 and h[5] & 0x1F == 1) or \
                (h[4] == 0x90 and h[5] == 0x01):     # Kitex protobuf, framed
            framing = F_FRAMED
        elif h[4] < 0x80 and be32s_at(h, 4) + 9 <= length:
            framing = F_FRAMED                     # non-strict binary: name length first
        else:
            self.fail(d, R_BAD_MAGIC, "bytes %s at offset %d are not Thrift (TTHeader 0x1000, "
                      "THeader 0x0FFF, framed or unframed binary/compact) — TLS or HTTP on a "
                      "Thrift port?" % (bytes(h[:8]).hex(), start))
            return -1
        total = length + 4
        if total > self.max_frame_bytes:
            self.fail(d, R_TOO_LARGE, "frame length %d at offset %d exceeds the limit %d" % (
                total, start, self.max_frame_bytes))
            return -1
        if length < (10 if framing != F_FRAMED else 4):
            self.fail(d, R_TOO_SMALL, "frame length %d at offset %d is below the minimum of "
                      "its framing" % (length, start))
            return -1
        hi = self.hi
        hi.proto, hi.xform, hi.err, hi.tom_off, hi.tom_len = PROTO_BINARY, X_NONE, 0, -1, -1
        if framing == F_FRAMED:
            p0 = 4
        else:
            if avail < TT_META:
                return self.want_header(d, TT_META)
            hsz = be16_at(h, 12) * 4
            if hsz == 0 or TT_META + hsz > total or (framing == F_TTHEADER
                                                      and hsz > TT_MAX_HEADER):
                self.fail(d, R_BAD_HEADER, "header size %d at offset %d does not fit the "
                          "frame of %d bytes" % (hsz, start, total))
                return -1
            p0 = TT_META + hsz
            if p0 > self.header_limit:             # decided before buffering, whatever the reads
                self.fail(d, R_HEADER_TOO_LARGE, "a header of %d bytes at offset %d exceeds "
                          "the header limit %d" % (p0, start, self.header_limit))
                return -1
            if avail < p0:
                return self.want_header(d, p0)
            info_scan(hi, self.m, self.iw, h, framing == F_TTHEADER, p0)
        hb = p0
        lim = min(avail, total)
        if hi.proto == PROTO_PROTOBUF and hi.xform == X_NONE and lim < p0 + 2 <= total:
            return self.want_header(d, p0 + 2)
        if hi.xform == X_OPAQUE or (hi.proto == PROTO_PROTOBUF and (
                hi.xform == X_ZLIB or p0 + 2 > total or h[p0] != 0x90 or h[p0 + 1] != 0x01)):
            self._count_opaque(d, h, total, hb, framing)
            return total
        if hi.xform == X_ZLIB:
            return self._zlib(d, h, p0, lim, total, hb, framing)
        if p0 + 4 <= total:                        # Kitex TTHeaderFramed: u32 length first
            if p0 + 4 > lim:
                return self.want_header(d, p0 + 4)
            if be32s_at(h, p0) == total - p0 - 4:
                p0 += 4
                hb += 4
        self.rs[d].x.i = -1                        # the message's walk not started
        return self._framed_message(d, h, p0, lim, total, hb, framing)

    def _framed_message(self, d, h, p0, lim, total, hb, framing):
        """The message of a framed frame whose header is read (self.hi).  When it needs
        more bytes, what the header held and how far the message was read are kept
        (self.rs[d]), so the next call does not read the header's infos again."""
        rs = self.rs[d]
        hi = self.hi
        r = self._message(h, p0, lim, total, hi.proto == PROTO_PROTOBUF or framing == F_FRAMED,
                          rs.x)
        if r == M_NEED:
            if rs.stage != W_FRAMED:
                rs.stage, rs.framing, rs.total, rs.p0, rs.hb = W_FRAMED, framing, total, p0, hb
                rs.hi = (hi.proto, hi.xform, hi.tom_off, hi.tom_len, hi.err)
            r = self.want_header(d, self.m.need)
            if r < 0:
                rs.stage = W_NONE
            return r
        rs.stage = W_NONE
        if r == M_BAD:
            self._count_bad(d, h, total, hb, framing)
        else:
            self._count(d, h, h, total, hb, framing)
        return total

    def _message(self, h, p0, lim, fend, allow_pb, x):
        # Never look past header_limit, so that what is read does not depend on how the
        # bytes were split into reads: a need beyond it is a malformed message, or for
        # an application exception's type, UNKNOWN.  An EXCEPTION's walk goes on from x
        # (x.i -1: not started, it begins at the message body).
        m = self.m
        cap = self.header_limit
        if lim > cap:
            lim = cap
        r = read_message(m, h, p0, lim, fend, allow_pb)
        if r == M_OK:
            if m.mtype == REPLY:
                r = reply_status(m, h, m.body, lim, fend)
            elif m.mtype == EXCEPTION:
                if x.i < 0:
                    x.i, x.last = m.body, 0
                r = exception_status(m, h, x, lim, fend)
                if r == M_NEED and m.need > cap:
                    m.status = 0
                    return M_OK
        if r == M_NEED and m.need > cap:
            return M_BAD
        return r

    def _zlib(self, d, h, p0, lim, total, hb, framing):
        """Inflate a prefix of the payload and read the message from it.  Compressed
        input is taken in fixed steps (64, 128, 256... bytes, then the whole frame or
        header_limit), smallest first, so the result never depends on how the frame was
        split into reads."""
        cap = min(total, self.header_limit)
        grow = ZSTEP
        while True:
            step = min(p0 + grow, cap)
            if step > lim:
                return self.want_header(d, step)
            try:
                z = zlib.decompressobj()
                out = z.decompress(bytes(h[p0:step]), ZOUT_MAX)
                eof = z.eof
            except zlib.error:
                self._count_bad(d, h, total, hb, framing)
                return total
            n = len(out)
            more = not eof and n < ZOUT_MAX and step < cap
            r = self._message(out, 0, n, -1 if more else n, False, XWalk(-1))
            if r == M_BAD:
                self._count_bad(d, h, total, hb, framing)
                return total
            if r == M_OK:
                self._count(d, h, out, total, hb, framing)
                return total
            grow *= 2

    def _unframed(self, d, h, avail):
        """An unframed message: its end is where its struct ends, walked (at most
        header_limit bytes) once however the message is split into reads."""
        m = self.m
        rs = self.rs[d]
        lim = min(avail, self.header_limit)        # the whole message within the limit
        r = read_message(m, h, 0, lim, -1, False)
        if r == M_OK:
            if rs.stage != W_UNFRAMED:
                if rs.sk is None:
                    rs.sk = SkipWalk()
                rs.stage = W_UNFRAMED
                rs.sk.pos, rs.sk.sp, rs.sk.cur = m.body, 0, 12
            end = walk_binary(m, h, lim, rs.sk)
            if end == -2:
                r = M_NEED
            elif end < 0:
                r = M_BAD
            else:
                if m.mtype == REPLY:
                    reply_status(m, h, m.body, end, end)
                elif m.mtype == EXCEPTION:
                    exception_status(m, h, XWalk(m.body), end, end)
        if r == M_NEED:
            r = self.want_header(d, m.need)
            if r < 0:
                rs.stage = W_NONE
            return r
        rs.stage = W_NONE
        if r == M_BAD:
            self.fail(d, R_BAD_BODY, "unframed Thrift message at offset %d is malformed" %
                      self.st[d].frame_start)
            return -1
        self._count(d, h, h, end, 0, 0)
        return end

    # ---- the header's info section ------------------------------------------------

    def _infos(self, d, h, framing, end):
        """The info blocks' key/values of h[14:end] to the frame log (recording, the
        frame begun)."""
        w = self.iw
        w.i = 0
        while True:
            n = info_walk(self.hi, self.m, w, h, framing == F_TTHEADER, end, True)
            for k in range(n):
                if w.kid[k] == INFO_INTKEYVALUE:
                    key = w.key[k]
                    name = INT_KEY_NAMES[key] if key < len(INT_KEY_NAMES) else ""
                    self.add_attr(d, name.encode() if name else b"%d" % key,
                                  h[w.vo[k]:w.vo[k] + w.vl[k]])
                else:
                    self.add_attr(d, h[w.ko[k]:w.ko[k] + w.kl[k]], h[w.vo[k]:w.vo[k] + w.vl[k]])
            if n < INFO_BATCH:
                return

    # ---- counting ---------------------------------------------------------------

    def _finish(self, d, h, framing, name_buf, name_off, name_len):
        if self.hi.err:
            self.protocol_error(d, R_BAD_HEADER)
        if self.recording:
            if name_len > 0:
                self.set_resource(d, name_buf[name_off:name_off + name_len])
            if framing == F_TTHEADER or framing == F_THEADER:
                self._infos(d, h, framing, TT_META + be16_at(h, 12) * 4)

    def _count(self, d, h, buf, total, hb, framing):
        m = self.m
        hi = self.hi
        st = self.stats
        if m.ptype == P_PROTOBUF and hi.tom_len >= 0:
            slot = st.slot_for_name(h[hi.tom_off:hi.tom_off + hi.tom_len]) \
                if hi.tom_len > 0 else st.slot_for_name(UNKNOWN_NAME)
        elif m.name_len > 0:
            slot = st.slot_for_name(buf[m.name_off:m.name_off + m.name_len])
        else:
            slot = st.slot_for_name(UNKNOWN_NAME)
        mt, seq = m.mtype, m.seq
        if mt == CALL or mt == ONEWAY:
            self.begin(d, slot, K_REQUEST if mt == CALL else K_ONEWAY, total, hb)
            self.add_messages(d, 1)
            if mt == CALL:
                self.expect(d, d, seq, CORR_HI_SIGNED)
            else:
                self.set_corr(d, seq, CORR_HI_SIGNED)
        else:
            rs = self.take(d, 1 - d, seq)
            if rs >= 0 and mt == REPLY and m.ptype != P_PROTOBUF and rs != slot \
                    and rs != OTHER_SLOT and slot != OTHER_SLOT:
                self.protocol_error(d, R_MISMATCH)
            self.begin(d, rs if rs >= 0 else slot, K_RESPONSE, total, hb)
            self.add_messages(d, 1)
            self.answer(d, m.status, OUTCOME_OK if m.status == ST_OK else OUTCOME_ERROR)
            if rs < 0:
                self.set_corr(d, seq, CORR_HI_SIGNED)
        self._finish(d, h, framing, buf, m.name_off, m.name_len)

    def _count_opaque(self, d, h, total, hb, framing):
        """A payload the parser cannot read (snappy, an unknown transform, Kitex protobuf
        without its meta): the method from TO_METHOD, the header's seq id, the direction."""
        hi = self.hi
        st = self.stats
        slot = st.slot_for_name(h[hi.tom_off:hi.tom_off + hi.tom_len]) if hi.tom_len > 0 \
            else st.slot_for_name(UNKNOWN_NAME)
        seq = be32s_at(h, 8)
        if d == C2S:
            self.begin(d, slot, K_REQUEST, total, hb)
            self.add_messages(d, 1)
            self.expect(d, d, seq, CORR_HI_SIGNED)
        else:
            rs = self.take(d, 1 - d, seq)
            self.begin(d, rs if rs >= 0 else slot, K_RESPONSE, total, hb)
            self.add_messages(d, 1)
            self.answer(d, ST_UNDECODED, OUTCOME_OK)
            if rs < 0:
                self.set_corr(d, seq, CORR_HI_SIGNED)
        self._finish(d, h, framing, h, 0, 0)

    def _count_bad(self, d, h, total, hb, framing):
        """A well-framed frame whose payload is not a Thrift message: counted, forwarded."""
        self.protocol_error(d, R_BAD_BODY)
        self.begin(d, self.stats.slot_for_name(UNKNOWN_NAME), K_ONEWAY, total, hb)
        self._finish(d, h, framing, h, 0, 0)
