# cython: language_level=3
# distutils: libraries = z
"""Thrift frame parser (compiled): Kitex TTHeader, Apache THeader, framed and unframed
Thrift on one route.  Twin: parser_py.py (same algorithm, same results).  The walks
both twins share (the message header, a reply's status, an exception's type, an
unframed message's end, the header's info section) are written once, in walk_py.py;
this parser cimports them compiled (walk_c.py, a link to it, typed by walk_c.pxd).
This file keeps the framing, the resumable state per direction, zlib, the counting and
the frame log's attrs.

Framing, read from each frame's first bytes (a connection normally keeps one; Apache's
THeaderTransport also decides per frame):

- ``80 01 ..``: unframed strict binary Thrift.  Its end is where its argument/result
  struct ends, so the whole message is walked (at most ``header_limit`` bytes).
- LENGTH u32 (bytes after itself), then at offset 4:
  ``10 00`` Kitex TTHeader, ``0F FF`` Apache THeader — flags u16, seq id u32, header
  size u16 in 4-byte words counted from offset 14, then protocol id, transforms, info
  blocks, padding, payload; ``80 01`` framed strict binary; ``82`` + version 1 framed
  compact; ``90 01`` framed Kitex protobuf (its meta names the method); otherwise a name length that fits the frame: framed non-strict binary.
  Anything else fails ``bad_magic``; LENGTH is checked against ``max_frame_bytes``
  before a byte more is buffered.

The payload's Thrift message header (strict binary, non-strict binary, compact) gives
the method name (the opcode, interned through ``slot_for_name``), the message type
(CALL -> request, ONEWAY -> oneway, REPLY/EXCEPTION -> response) and the seq id.
Requests and responses pair by the payload's seq id in both directions (duplex), in any
order, many in flight.  A REPLY is ``OK`` when its result struct's first field is id 0
or it is void, ``EXCEPTION`` (a declared exception) otherwise; an EXCEPTION message's
TApplicationException type names its status, ``UNKNOWN`` when the type is missing.
Oneway calls expect nothing, so they never time out.

Where the seed document (docs/design.md, "TTHeader") and the real implementations
differ, this parser follows Kitex's ``header_codec.go`` and Apache's
``THeaderTransport``:

- Correlation uses the Thrift message's seq id, not the header's (Apache's Node
  library writes 0 there; Kitex only logs a mismatch).  The header's seq id is used
  only for payloads the parser cannot read (snappy, unknown transforms, Kitex protobuf
  without its meta).
- The header's protocol id is not trusted to tell binary from compact: Kitex always
  writes 0; the payload's first bytes decide (0x80 0x01 binary, 0x82 compact).  Ids
  other than 0 (binary), 2 (compact) and — TTHeader only — 3 (Kitex protobuf) are
  counted as ``bad_header`` and the payload is still read.
- Kitex protobuf payloads (protocol id 3) carry Kitex's meta (0x9001 magic + message
  type, u32-length method name, seq id): the opcode is the header's TO_METHOD (int
  key 9) when present, else the meta's name; without the meta, TO_METHOD or
  ``unknown``, correlated by the header's seq id.  A protobuf EXCEPTION's status is
  Kitex's pbError TypeID (field 1).
- Kitex's ACL token block (0x11) is one u16-length string, not a key/value list (the
  document says key/value); it is skipped and never read into the frame log.
- Header flags are not reserved in Kitex (0x01 out-of-order, 0x02 streaming, 0x08
  duplex, 0x10 SASL); the parser never relies on in-order replies anyway.
- A 0x00 info id is padding wherever it appears (Kitex skips it and continues); an
  unknown info id is an error in Kitex (``bad_header`` here, the frame still counted
  by its payload).  Apache THeader instead stops reading infos at padding or any id
  but INFO_KEYVALUE (its Python and C++ libraries ignore the rest), so that is no
  error there.  Kitex rejects an info section over 64 KiB or under 2 bytes: such a
  TTHeader is a fatal ``bad_header``, as is a header size that points past LENGTH.
- Kitex's TTHeaderFramed: a u32 length (= the rest of the payload) before the Thrift
  message inside the payload; recognised and unwrapped (4 more header bytes).
- Transforms: Kitex writes none (the document names ZLIB 0x01 and SNAPPY 0x03).  A
  zlib payload is inflated (at most ZOUT_MAX bytes, the prefix the message header
  needs) so its method name is still read; snappy payloads are counted by TO_METHOD or
  ``unknown`` with status ``UNDECODED``; any other transform id is also ``bad_header``.
- Info key/values go to the frame log's ``attrs``: INFO_KEYVALUE keys as written,
  INFO_INTKEYVALUE keys by Kitex's names (FROM_SERVICE, TO_METHOD, LOG_ID...) or
  their number.

Malformed input never raises: a broken frame boundary (bad magic, lengths, header
size) is fatal for the connection (``fail``); a well-framed frame whose payload is not
a Thrift message (or whose method name is over NAME_MAX bytes) is counted under
``unknown`` with ``bad_body`` and forwarded.  The hot path allocates nothing per frame:
fields are read in place from the core's contiguous header bytes (copied by the core
only when a header spans reads).
"""

cimport cython
from libc.stdint cimport uint8_t, uint16_t, int32_t, uint32_t, int64_t, uint64_t
from libc.string cimport memset, strlen

from proxy._framing cimport (FrameParser, RouteStats, C2S, OUTCOME_OK, OUTCOME_ERROR,
                             K_REQUEST, K_RESPONSE, K_ONEWAY, CORR_HI_SIGNED, OTHER_SLOT,
                             R_BAD_MAGIC, R_TOO_LARGE, R_TOO_SMALL, R_BAD_HEADER,
                             R_HEADER_TOO_LARGE, R_BAD_BODY, R_MISMATCH)
from proxy._framing cimport (want_header, protocol_error, begin, add_messages, set_corr,
                             expect, take, answer, set_resource, add_attr)
from cpython.mem cimport PyMem_Malloc, PyMem_Free
from proxy._wire cimport be16, be32, be32s_at
from proxy.protocols.ttheader.walk_c cimport (
    Msg, Info, InfoWalk, XWalk, WLevel, SkipWalk, read_message, reply_status,
    exception_status, walk_binary, info_scan, info_walk, INFO_BATCH, M_OK, M_NEED, M_BAD, P_PROTOBUF,
    MAX_DEPTH, CALL, REPLY, EXCEPTION, ONEWAY, ST_OK, TT_META, PROTO_BINARY, PROTO_PROTOBUF,
    INFO_INTKEYVALUE, X_NONE, X_ZLIB, X_OPAQUE)
from proxy.protocols.ttheader.constants import (MAX_FRAME_BYTES, HEADER_LIMIT, opcode_name,
                                                status_name)


cdef extern from "zlib.h":
    ctypedef struct z_stream:
        uint8_t* next_in
        unsigned int avail_in
        uint8_t* next_out
        unsigned int avail_out
        void* zalloc
        void* zfree
        void* opaque
    int inflateInit(z_stream* strm)
    int inflateReset(z_stream* strm)
    int inflate(z_stream* strm, int flush)
    int inflateEnd(z_stream* strm)
    enum:
        Z_OK
        Z_STREAM_END
        Z_BUF_ERROR
        Z_NO_FLUSH


cdef enum:
    HDR = 8
    TT_MAX_HEADER = 65536
    ZOUT_MAX = 8192
    MAGIC_TTHEADER = 0x1000
    MAGIC_THEADER = 0x0FFF
    ST_UNDECODED = -3
    F_TTHEADER = 1
    F_THEADER = 2
    F_FRAMED = 3
    ZSTEP = 64


# ---- walks that go on across reads (issue 19: linear time however a message is split)
#
# A message whose end (unframed) or status (an EXCEPTION's type field) is found by
# walking it may need many reads: on_header() asks want_header() for the end of the next
# element only, and is called again with more bytes.  Each walk keeps where it stopped
# (per direction, in Resume; the walks' own states are walk_c.pxd's XWalk and SkipWalk)
# and goes on from there, so every byte is walked once.  The
# core calls on_header() again for the same frame after it returned 0 (want_header()),
# so a direction's saved walk belongs to the frame being read until on_header() returns
# a length or fails.

cdef enum:
    W_NONE = 0                   # Resume.stage: no walk under way
    W_UNFRAMED = 1               # an unframed message's end is being walked (sk)
    W_FRAMED = 2                 # a framed message's header is read (framing, total, p0,
                                 # hb, hi); its message is being read (x)


cdef struct Resume:              # per direction: the frame being read across reads
    int stage                    # W_*
    int framing
    int64_t total
    Py_ssize_t p0
    Py_ssize_t hb
    Info hi
    XWalk x                      # x.i -1: not started (it begins at the message body)
    SkipWalk sk


cdef const char* int_key_name(int key) noexcept:
    if key == 1:
        return b"TRANSPORT_TYPE"
    if key == 2:
        return b"LOG_ID"
    if key == 3:
        return b"FROM_SERVICE"
    if key == 4:
        return b"FROM_CLUSTER"
    if key == 5:
        return b"FROM_IDC"
    if key == 6:
        return b"TO_SERVICE"
    if key == 7:
        return b"TO_CLUSTER"
    if key == 8:
        return b"TO_IDC"
    if key == 9:
        return b"TO_METHOD"
    if key == 10:
        return b"ENV"
    if key == 11:
        return b"DEST_ADDRESS"
    if key == 12:
        return b"RPC_TIMEOUT"
    if key == 13:
        return b"READ_TIMEOUT"
    return NULL


cdef class TTHeaderParser(FrameParser):
    """Counts, sizes and correlates the Thrift messages of one connection, whatever
    their framing (see the module docstring)."""

    cdef Msg m
    cdef Info hi
    cdef Resume rs[2]            # per direction: a walk under way across reads
    cdef z_stream zs
    cdef bint zready             # zs initialised (on the first zlib frame)
    cdef uint8_t* zbuf           # ZOUT_MAX bytes, allocated on the first zlib frame

    def __init__(self, RouteStats stats, max_frame_bytes=None, request_timeout=30.0,
                 options=None):
        self.header_size = HDR
        self.max_frame_bytes = MAX_FRAME_BYTES
        stats.describe(opcode_name, status_name, ())      # once per route
        FrameParser.__init__(self, stats, max_frame_bytes, request_timeout, options)
        self.header_limit = HEADER_LIMIT

    def __dealloc__(self):
        if self.zready:
            inflateEnd(&self.zs)
        if self.zbuf is not NULL:
            PyMem_Free(self.zbuf)
        PyMem_Free(self.rs[0].sk.stack)         # one block for both directions

    cdef int _stacks(self) except -1:
        """The unframed walks' level stacks (both directions, one block), on the first
        unframed message of the connection."""
        cdef WLevel* p
        if self.rs[0].sk.stack is NULL:
            p = <WLevel*>PyMem_Malloc(2 * (MAX_DEPTH + 1) * sizeof(WLevel))
            if p is NULL:
                raise MemoryError()
            self.rs[0].sk.stack = p
            self.rs[1].sk.stack = p + (MAX_DEPTH + 1)
        return 0

    # ---- framing ----------------------------------------------------------------

    cdef int64_t on_header(self, int d, const uint8_t* h, Py_ssize_t avail) except -2:
        cdef Msg* m = &self.m
        cdef Info* hi = &self.hi
        cdef Resume* rs = &self.rs[d]
        cdef InfoWalk iw
        cdef int64_t length, total, start = self.st[d].frame_start
        cdef int framing, magic, r
        cdef Py_ssize_t hsz, p0, hb, lim
        if rs.stage == W_FRAMED:                # the header was read: go on with the message
            hi[0] = rs.hi
            total = rs.total
            lim = avail if avail < total else <Py_ssize_t>total
            return self._framed_message(d, h, rs.p0, lim, total, rs.hb, rs.framing)
        if h[0] == 0x80 and h[1] == 0x01:
            return self._unframed(d, h, avail)
        length = be32(h)
        magic = be16(h + 4)
        if magic == MAGIC_TTHEADER:
            framing = F_TTHEADER
        elif magic == MAGIC_THEADER:
            framing = F_THEADER
        elif (h[4] == 0x80 and h[5] == 0x01) or (h[4] == 0x82 and h[5] & 0x1F == 1) or \
                (h[4] == 0x90 and h[5] == 0x01):     # Kitex protobuf, framed
            framing = F_FRAMED
        elif h[4] < 0x80 and <int64_t>be32s_at(h, 4) + 9 <= length:
            framing = F_FRAMED                     # non-strict binary: name length first
        else:
            self.fail(d, R_BAD_MAGIC, "bytes %s at offset %d are not Thrift (TTHeader 0x1000, "
                      "THeader 0x0FFF, framed or unframed binary/compact) — TLS or HTTP on a "
                      "Thrift port?" % ((<const char*>h)[:8].hex(), start))
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
        hi.proto = PROTO_BINARY
        hi.xform = X_NONE
        hi.err = 0
        hi.tom_off = -1
        hi.tom_len = -1
        if framing == F_FRAMED:
            p0 = 4
        else:
            if avail < TT_META:
                return want_header(self, d, TT_META)
            hsz = be16(h + 12) * 4
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
                return want_header(self, d, p0)
            info_scan(hi, m, &iw, h, framing == F_TTHEADER, p0)
        hb = p0
        lim = avail if avail < total else <Py_ssize_t>total
        if hi.proto == PROTO_PROTOBUF and hi.xform == X_NONE and lim < p0 + 2 <= total:
            return want_header(self, d, p0 + 2)
        if hi.xform == X_OPAQUE or (hi.proto == PROTO_PROTOBUF and (
                hi.xform == X_ZLIB or p0 + 2 > total or h[p0] != 0x90 or h[p0 + 1] != 0x01)):
            self._count_opaque(d, h, total, hb, framing)
            return total
        if hi.xform == X_ZLIB:
            return self._zlib(d, h, p0, lim, total, hb, framing)
        if p0 + 4 <= total:                        # Kitex TTHeaderFramed: u32 length first
            if p0 + 4 > lim:
                return want_header(self, d, p0 + 4)
            if <int64_t>be32s_at(h, p0) == total - p0 - 4:
                p0 += 4
                hb += 4
        rs.x.i = -1                                # the message's walk not started
        return self._framed_message(d, h, p0, lim, total, hb, framing)

    @cython.final
    cdef inline int64_t _framed_message(self, int d, const uint8_t* h, Py_ssize_t p0, Py_ssize_t lim,
                                 int64_t total, Py_ssize_t hb, int framing) except -2:
        """The message of a framed frame whose header is read (self.hi).  When it needs
        more bytes, what the header held and how far the message was read are kept
        (self.rs[d]), so the next call does not read the header's infos again."""
        cdef Resume* rs = &self.rs[d]
        cdef Info* hi = &self.hi
        cdef int r = self._message(h, p0, lim, total,
                                   hi.proto == PROTO_PROTOBUF or framing == F_FRAMED, &rs.x)
        if r == M_NEED:
            if rs.stage != W_FRAMED:
                rs.stage = W_FRAMED
                rs.framing = framing
                rs.total = total
                rs.p0 = p0
                rs.hb = hb
                rs.hi = hi[0]
            r = want_header(self, d, self.m.need)
            if r < 0:
                rs.stage = W_NONE
            return r
        rs.stage = W_NONE
        if r == M_BAD:
            self._count_bad(d, h, total, hb, framing)
        else:
            self._count(d, h, h, total, hb, framing)
        return total

    @cython.final
    cdef inline int _message(self, const uint8_t* h, Py_ssize_t p0, Py_ssize_t lim, Py_ssize_t fend,
                             bint allow_pb, XWalk* x) noexcept:
        # Never look past header_limit, so that what is read does not depend on how the
        # bytes were split into reads: a need beyond it is a malformed message, or for
        # an application exception's type, UNKNOWN.  The message header is read again on
        # every call (a few fixed-size reads); an EXCEPTION's walk goes on from x (x.i -1:
        # not started, it begins at the message body).
        cdef Msg* m = &self.m
        cdef Py_ssize_t cap = self.header_limit
        cdef int r
        if lim > cap:
            lim = cap
        r = read_message(m, h, p0, lim, fend, allow_pb)
        if r == M_OK:
            if m.mtype == REPLY:
                r = reply_status(m, h, m.body, lim, fend)
            elif m.mtype == EXCEPTION:
                if x.i < 0:
                    x.i = m.body
                    x.last = 0
                r = exception_status(m, h, x, lim, fend)
                if r == M_NEED and m.need > cap:
                    m.status = 0
                    return M_OK
        if r == M_NEED and m.need > cap:
            return M_BAD
        return r

    cdef int64_t _zlib(self, int d, const uint8_t* h, Py_ssize_t p0, Py_ssize_t lim,
                       int64_t total, Py_ssize_t hb, int framing) except -2:
        """Inflate a prefix of the payload and read the message from it.  Compressed
        input is taken in fixed steps (64, 128, 256... bytes, then the whole frame or
        header_limit), smallest first, so the result never depends on how the frame was
        split into reads."""
        cdef Py_ssize_t cap = <Py_ssize_t>(total if total < self.header_limit
                                           else self.header_limit)
        cdef Py_ssize_t grow = ZSTEP, step, n
        cdef int ret, r
        cdef bint more
        cdef XWalk fresh
        if self.zbuf is NULL:
            self.zbuf = <uint8_t*>PyMem_Malloc(ZOUT_MAX)
            if self.zbuf is NULL:
                raise MemoryError()
        while True:
            step = p0 + grow if p0 + grow < cap else cap
            if step > lim:
                return want_header(self, d, step)
            if not self.zready:
                memset(&self.zs, 0, sizeof(z_stream))
                if inflateInit(&self.zs) != Z_OK:
                    raise MemoryError()
                self.zready = True
            else:
                inflateReset(&self.zs)
            self.zs.next_in = <uint8_t*>(h + p0)
            self.zs.avail_in = <unsigned int>(step - p0)
            self.zs.next_out = self.zbuf
            self.zs.avail_out = ZOUT_MAX
            ret = inflate(&self.zs, Z_NO_FLUSH)
            if ret != Z_OK and ret != Z_STREAM_END and ret != Z_BUF_ERROR:
                self._count_bad(d, h, total, hb, framing)
                return total
            n = ZOUT_MAX - self.zs.avail_out
            more = ret != Z_STREAM_END and n < ZOUT_MAX and step < cap
            fresh.i = -1                            # inflated anew each step: walked anew
            r = self._message(self.zbuf, 0, n, -1 if more else n, False, &fresh)
            if r == M_BAD:
                self._count_bad(d, h, total, hb, framing)
                return total
            if r == M_OK:
                self._count(d, h, self.zbuf, total, hb, framing)
                return total
            grow *= 2

    cdef int64_t _unframed(self, int d, const uint8_t* h, Py_ssize_t avail) except -2:
        """An unframed message: its end is where its struct ends, walked (at most
        header_limit bytes) once however the message is split into reads: the walk goes
        on from where the previous call stopped (self.rs[d].sk)."""
        cdef Msg* m = &self.m
        cdef Resume* rs = &self.rs[d]
        cdef SkipWalk* sk = &rs.sk
        cdef XWalk x
        cdef Py_ssize_t end = 0
        cdef Py_ssize_t lim = avail if avail < self.header_limit else self.header_limit
        cdef int r = read_message(m, h, 0, lim, -1, False)
        if r == M_OK:
            if rs.stage != W_UNFRAMED:
                if sk.stack is NULL:
                    self._stacks()
                rs.stage = W_UNFRAMED
                sk.pos = m.body
                sk.sp = 0
                sk.cur = 12
            end = walk_binary(m, h, lim, sk)
            if end == -2:
                r = M_NEED
            elif end < 0:
                r = M_BAD
            else:
                x.i = m.body
                x.last = 0
                if m.mtype == REPLY:
                    reply_status(m, h, m.body, end, end)
                elif m.mtype == EXCEPTION:
                    exception_status(m, h, &x, end, end)
        if r == M_NEED:
            r = want_header(self, d, m.need)
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

    cdef int _infos(self, int d, const uint8_t* h, int framing, Py_ssize_t end) except -1:
        """The info blocks' key/values of h[14:end] to the frame log (recording, the
        frame begun)."""
        cdef InfoWalk w
        cdef const char* kname
        cdef char num[8]
        cdef int nn, kk, n, k
        w.i = 0
        while True:
            n = info_walk(&self.hi, &self.m, &w, h, framing == F_TTHEADER, end, True)
            for k in range(n):
                if w.kid[k] == INFO_INTKEYVALUE:
                    kname = int_key_name(w.key[k])
                    if kname is not NULL:
                        add_attr(self, d, <const uint8_t*>kname, strlen(kname), h + w.vo[k],
                                 w.vl[k])
                    else:
                        nn = 0                  # the key's decimal number
                        kk = w.key[k]
                        while True:
                            num[nn] = <char>(0x30 + kk % 10)
                            nn += 1
                            kk //= 10
                            if kk == 0:
                                break
                        for kk in range(nn // 2):
                            num[kk], num[nn - 1 - kk] = num[nn - 1 - kk], num[kk]
                        add_attr(self, d, <const uint8_t*>num, nn, h + w.vo[k], w.vl[k])
                else:
                    add_attr(self, d, h + w.ko[k], w.kl[k], h + w.vo[k], w.vl[k])
            if n < INFO_BATCH:
                return 0

    # ---- counting ---------------------------------------------------------------

    cdef int _finish(self, int d, const uint8_t* h, int framing, const uint8_t* name_buf,
                     Py_ssize_t name_off, Py_ssize_t name_len) except -1:
        if self.hi.err:
            protocol_error(self, d, R_BAD_HEADER)
        if self.recording:
            if name_len > 0:
                set_resource(self, d, name_buf + name_off, name_len)
            if framing == F_TTHEADER or framing == F_THEADER:
                self._infos(d, h, framing, TT_META + be16(h + 12) * 4)
        return 0

    cdef int _count(self, int d, const uint8_t* h, const uint8_t* buf, int64_t total,
                    Py_ssize_t hb, int framing) except -1:
        cdef Msg* m = &self.m
        cdef Info* hi = &self.hi
        cdef RouteStats st = self.stats
        cdef int slot, rs, mt = m.mtype
        cdef int32_t seq = m.seq
        if m.ptype == P_PROTOBUF and hi.tom_len >= 0:
            if hi.tom_len > 0:
                slot = st.slot_for_name(h + hi.tom_off, hi.tom_len)
            else:
                slot = st.slot_for_name(<const uint8_t*><const char*>b"unknown", 7)
        elif m.name_len > 0:
            slot = st.slot_for_name(buf + m.name_off, m.name_len)
        else:
            slot = st.slot_for_name(<const uint8_t*><const char*>b"unknown", 7)
        if mt == CALL or mt == ONEWAY:
            begin(self, d, slot, K_REQUEST if mt == CALL else K_ONEWAY, total, hb)
            add_messages(self, d, 1)
            if mt == CALL:
                expect(self, d, d, <uint64_t><int64_t>seq, CORR_HI_SIGNED)
            else:
                set_corr(self, d, seq, CORR_HI_SIGNED)
        else:
            rs = take(self, d, 1 - d, <uint64_t><int64_t>seq)
            if rs >= 0 and mt == REPLY and m.ptype != P_PROTOBUF and rs != slot \
                    and rs != OTHER_SLOT and slot != OTHER_SLOT:
                protocol_error(self, d, R_MISMATCH)
            begin(self, d, rs if rs >= 0 else slot, K_RESPONSE, total, hb)
            add_messages(self, d, 1)
            answer(self, d, m.status, OUTCOME_OK if m.status == ST_OK else OUTCOME_ERROR)
            if rs < 0:
                set_corr(self, d, seq, CORR_HI_SIGNED)
        return self._finish(d, h, framing, buf, m.name_off, m.name_len)

    cdef int _count_opaque(self, int d, const uint8_t* h, int64_t total, Py_ssize_t hb,
                           int framing) except -1:
        """A payload the parser cannot read (snappy, an unknown transform, Kitex
        protobuf without its meta): the method from TO_METHOD, the header's seq id, the
        direction."""
        cdef Info* hi = &self.hi
        cdef RouteStats st = self.stats
        cdef int slot, rs
        cdef int32_t seq = be32s_at(h, 8)
        if hi.tom_len > 0:
            slot = st.slot_for_name(h + hi.tom_off, hi.tom_len)
        else:
            slot = st.slot_for_name(<const uint8_t*><const char*>b"unknown", 7)
        if d == C2S:
            begin(self, d, slot, K_REQUEST, total, hb)
            add_messages(self, d, 1)
            expect(self, d, d, <uint64_t><int64_t>seq, CORR_HI_SIGNED)
        else:
            rs = take(self, d, 1 - d, <uint64_t><int64_t>seq)
            begin(self, d, rs if rs >= 0 else slot, K_RESPONSE, total, hb)
            add_messages(self, d, 1)
            answer(self, d, ST_UNDECODED, OUTCOME_OK)
            if rs < 0:
                set_corr(self, d, seq, CORR_HI_SIGNED)
        return self._finish(d, h, framing, h, 0, 0)

    cdef int _count_bad(self, int d, const uint8_t* h, int64_t total, Py_ssize_t hb,
                        int framing) except -1:
        """A well-framed frame whose payload is not a Thrift message: counted, forwarded."""
        protocol_error(self, d, R_BAD_BODY)
        begin(self, d, self.stats.slot_for_name(<const uint8_t*><const char*>b"unknown", 7), K_ONEWAY,
              total, hb)
        return self._finish(d, h, framing, h, 0, 0)
