# cython: language_level=3
"""RocketMQ remoting frame parser (compiled).  Twin: parser_py.py.

Frame (docs/design.md, "RocketMQ remoting"): length u32 (bytes after itself; route option
``length_includes_self`` for peers that count it), header-length word u32 (high byte =
serialization: 0 JSON, 1 ROCKETMQ binary; low 24 bits = header length), header, body.
The header streams through on_body(): scanned in place when a read holds it whole,
copied only when it spans reads.  Requests and responses pair by ``opaque`` in both
directions (brokers send requests to clients too).  Batch sends and pull results
count their messages by walking the body's totalSize fields.
"""

from libc.stdint cimport uint8_t, uint16_t, int32_t, uint32_t, int64_t, uint64_t
from libc.string cimport memcpy, memcmp

from proxy._framing cimport (FrameParser, RouteStats, C2S, S2C, OUTCOME_OK, OUTCOME_ERROR,
                             K_REQUEST, K_RESPONSE, K_ONEWAY, CORR_HI_SIGNED, RESOURCE_MAX,
                             R_OVERFLOW, R_TOO_LARGE, R_TOO_SMALL,
                             R_BAD_HEADER, R_BAD_BODY)
from proxy._framing cimport (stream_body, capture_frame, gather, protocol_error, begin,
                             add_messages, set_corr, expect, take, answer, set_resource)
from proxy._wire cimport be16, be32, skip_some
from proxy.protocols.rocketmq.options import (known_codes, new_route_requests,
                                              remember_route_request)
from proxy.protocols.rocketmq import jsonscan
from proxy.protocols.rocketmq.constants import MAX_FRAME_BYTES
from proxy.protocols.rocketmq.options import (MAX_HEADER_BYTES, RouteRewriter, frame_opcode_name,
                                              response_status_name)

cdef enum:
    HDR = 8
    ST_JSON = 0
    ST_BINARY = 1
    BIN_HEADER_MIN = 13        # code u16, language u8, version u16, opaque i32, flag i32
    F_RESPONSE = 1
    F_ONEWAY = 2
    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    SEND_MESSAGE_V2 = 310
    SEND_BATCH_MESSAGE = 320
    SEND_REPLY_MESSAGE_V2 = 325
    GET_ROUTEINFO_BY_TOPIC = 105
    UNMATCHED_RESPONSE = 65535  # opcode of a response frame that matched no request
    UNDECODABLE = 65534         # opcode of a frame whose header could not be read
    SUCCESS = 0
    P_HEADER = 0               # phases of a frame's body stream
    P_SKIP = 1
    P_MESSAGES = 2


cdef struct RState:
    int64_t hlen               # header length of the current frame
    int stype                  # serialization type
    int phase
    int64_t total              # frame size
    # message walker (batch sends, pull results): totalSize i32 then skip
    int64_t wskip
    uint8_t wbuf[4]
    int whave


cdef inline bint is_ok(int code) noexcept:
    # SUCCESS, and the answers of a normal flow: an idle pull (PULL_NOT_FOUND,
    # PULL_RETRY_IMMEDIATELY) or a group with no committed offset (QUERY_NOT_FOUND).
    # The status label keeps the exact code either way.
    return code == 0 or code == 19 or code == 20 or code == 22


# ---- JSON scanning (same algorithm as jsonscan.py) --------------------------------

cdef enum:
    SCAN_OK = 0
    SCAN_FALLBACK = 1
    SCAN_ERROR = 2

cdef inline bint is_ws(uint8_t c) noexcept:
    return c == 0x20 or c == 0x09 or c == 0x0D or c == 0x0A

cdef inline Py_ssize_t skip_ws(const uint8_t* b, Py_ssize_t i, Py_ssize_t n) noexcept:
    while i < n and is_ws(b[i]):
        i += 1
    return i

cdef inline Py_ssize_t string_end(const uint8_t* b, Py_ssize_t i, Py_ssize_t n, int* esc) noexcept:
    """i at the opening quote: index after the closing quote, or -1."""
    i += 1
    while i < n:
        if b[i] == 0x22:
            return i + 1
        if b[i] == 0x5C:
            esc[0] = 1
            i += 2
            continue
        if b[i] < 0x20:
            return -1
        i += 1
    return -1

cdef inline Py_ssize_t skip_value(const uint8_t* b, Py_ssize_t i, Py_ssize_t n) noexcept:
    """Index after the value starting at (or after whitespace from) i, or -1."""
    cdef int depth = 0, esc = 0
    cdef Py_ssize_t j
    i = skip_ws(b, i, n)
    if i >= n:
        return -1
    if b[i] == 0x22:
        return string_end(b, i, n, &esc)
    if b[i] == 0x7B or b[i] == 0x5B:
        while i < n:
            if b[i] == 0x22:
                i = string_end(b, i, n, &esc)
                if i < 0:
                    return -1
                continue
            if b[i] == 0x7B or b[i] == 0x5B:
                depth += 1
            elif b[i] == 0x7D or b[i] == 0x5D:
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return -1
    if n - i >= 4 and b[i] == 0x74 and b[i+1] == 0x72 and b[i+2] == 0x75 and b[i+3] == 0x65:
        return i + 4                                   # true
    if n - i >= 5 and b[i] == 0x66 and b[i+1] == 0x61 and b[i+2] == 0x6C and b[i+3] == 0x73 \
            and b[i+4] == 0x65:
        return i + 5                                   # false
    if n - i >= 4 and b[i] == 0x6E and b[i+1] == 0x75 and b[i+2] == 0x6C and b[i+3] == 0x6C:
        return i + 4                                   # null
    j = i
    while j < n and (b[j] == 0x2B or b[j] == 0x2D or b[j] == 0x2E or b[j] == 0x65
                     or b[j] == 0x45 or (0x30 <= b[j] <= 0x39)):
        j += 1
    return j if j > i else -1

cdef inline int key_slot(const uint8_t* k, Py_ssize_t n) noexcept:
    if n == 4 and k[0] == 0x63 and k[1] == 0x6F and k[2] == 0x64 and k[3] == 0x65:
        return 0                                       # code
    if n == 6 and k[0] == 0x6F and k[1] == 0x70 and k[2] == 0x61 and k[3] == 0x71 \
            and k[4] == 0x75 and k[5] == 0x65:
        return 1                                       # opaque
    if n == 4 and k[0] == 0x66 and k[1] == 0x6C and k[2] == 0x61 and k[3] == 0x67:
        return 2                                       # flag
    return -1

cdef struct NoTopic:
    char unused
cdef struct TopicAt:           # scan_json_rec(): where extFields' topic / b values start
    Py_ssize_t topic
    Py_ssize_t short_topic
ctypedef fused TopicOut:
    NoTopic
    TopicAt


cdef int _scan(const uint8_t* b, Py_ssize_t n, int64_t* out, TopicOut* t) noexcept:
    """scan_json() (NoTopic) or scan_json_rec() (TopicAt): one body, two C functions
    (a fused type), so the counting-only scan is the same code as before recording."""
    cdef Py_ssize_t i, end, j, k
    cdef int esc, slot
    cdef int64_t v
    cdef bint neg
    out[0] = out[1] = out[2] = 0
    i = skip_ws(b, 0, n)
    if i >= n or b[i] != 0x7B:
        return SCAN_ERROR
    i = skip_ws(b, i + 1, n)
    if i < n and b[i] == 0x7D:
        return SCAN_OK if skip_ws(b, i + 1, n) == n else SCAN_ERROR
    while True:
        if i >= n or b[i] != 0x22:
            return SCAN_ERROR
        esc = 0
        end = string_end(b, i, n, &esc)
        if end < 0:
            return SCAN_ERROR
        if esc:
            return SCAN_FALLBACK
        slot = key_slot(b + i + 1, end - i - 2)
        if TopicOut is TopicAt:
            if slot < 0 and end - i - 2 == 9 and memcmp(b + i + 1, b"extFields", 9) == 0:
                slot = 3
        i = skip_ws(b, end, n)
        if i >= n or b[i] != 0x3A:
            return SCAN_ERROR
        i = skip_ws(b, i + 1, n)
        if TopicOut is TopicAt and slot == 3:
            # extFields, walked member by member (the last one wins, as in json.loads);
            # when it is not a well-formed object, skipped as any value, with no topic
            j = walk_object(b, i, n, b"topic", 5, &t.topic, b"b", 1, &t.short_topic)
            if j < 0:
                t.topic = t.short_topic = -1
                j = skip_value(b, i, n)
            i = j
            if i < 0:
                return SCAN_ERROR
        elif slot < 0:
            i = skip_value(b, i, n)
            if i < 0:
                return SCAN_ERROR
        else:
            j = i
            neg = j < n and b[j] == 0x2D
            if neg:
                j += 1
            k = j
            v = 0
            while k < n and 0x30 <= b[k] <= 0x39:
                v = v * 10 + (b[k] - 0x30)
                k += 1
            if k == j or k - j > 18 or (k < n and (b[k] == 0x2E or b[k] == 0x65
                                                    or b[k] == 0x45)):
                return SCAN_FALLBACK
            if v > 0x80000000 or (v == 0x80000000 and not neg):
                return SCAN_ERROR              # code/opaque/flag are 32-bit Java ints
            out[slot] = -v if neg else v
            i = k
        i = skip_ws(b, i, n)
        if i < n and b[i] == 0x2C:
            i = skip_ws(b, i + 1, n)
            continue
        if i < n and b[i] == 0x7D:
            return SCAN_OK if skip_ws(b, i + 1, n) == n else SCAN_ERROR
        return SCAN_ERROR


cdef inline int scan_json(const uint8_t* b, Py_ssize_t n, int64_t* out) noexcept:
    """Top-level code/opaque/flag into out[0..2]; SCAN_OK, SCAN_FALLBACK or SCAN_ERROR."""
    return _scan(b, n, out, <NoTopic*>NULL)


cdef inline int scan_json_rec(const uint8_t* b, Py_ssize_t n, int64_t* out,
                              TopicAt* t) noexcept:
    """scan_json(), and (recording) where the values of extFields' last `topic` and `b`
    members start, -1 none: what jsonscan.topic() finds, in the same single pass."""
    t.topic = t.short_topic = -1
    return _scan(b, n, out, t)


# ---- the frame log's resource (recording only; twin: jsonscan.topic / binary_topic) --

cdef inline bint same(const uint8_t* a, const uint8_t* b, Py_ssize_t n) noexcept:
    """a[:n] == b[:n] for the few bytes of a key (no call into libc's memcmp)."""
    cdef Py_ssize_t i
    for i in range(n):
        if a[i] != b[i]:
            return False
    return True

cdef Py_ssize_t walk_object(const uint8_t* b, Py_ssize_t i, Py_ssize_t n,
                            const uint8_t* k1, Py_ssize_t n1, Py_ssize_t* f1,
                            const uint8_t* k2, Py_ssize_t n2, Py_ssize_t* f2) noexcept:
    """Walk the object at (or after whitespace from) i member by member (jsonscan's
    find_member): the index after it, or -1 when it is not a well-formed object.  *f1 /
    *f2: where the value of its last member named k1 / k2 (raw bytes) starts, -1 none
    (k2 NULL: one key)."""
    cdef Py_ssize_t end, kn, j
    cdef int esc = 0
    f1[0] = -1
    if k2 is not NULL:
        f2[0] = -1
    i = skip_ws(b, i, n)
    if i >= n or b[i] != 0x7B:
        return -1
    i = skip_ws(b, i + 1, n)
    if i < n and b[i] == 0x7D:
        return i + 1
    while True:
        if i >= n or b[i] != 0x22:
            return -1
        end = string_end(b, i, n, &esc)
        if end < 0:
            return -1
        kn = end - i - 2
        j = i + 1
        i = skip_ws(b, end, n)
        if i >= n or b[i] != 0x3A:
            return -1
        i = skip_ws(b, i + 1, n)
        if kn == n1 and same(b + j, k1, n1):
            f1[0] = i
        elif k2 is not NULL and kn == n2 and same(b + j, k2, n2):
            f2[0] = i
        i = skip_value(b, i, n)
        if i < 0:
            return -1
        i = skip_ws(b, i, n)
        if i < n and b[i] == 0x2C:
            i = skip_ws(b, i + 1, n)
            continue
        if i < n and b[i] == 0x7D:
            return i + 1
        return -1


cdef inline int hex4(const uint8_t* s, Py_ssize_t i, Py_ssize_t n) noexcept:
    cdef int v = 0, k
    cdef uint8_t c
    if i + 4 > n:
        return -1
    for k in range(4):
        c = s[i + k]
        if 0x30 <= c <= 0x39:
            v = v * 16 + (c - 0x30)
        elif 0x61 <= c <= 0x66:
            v = v * 16 + (c - 0x57)
        elif 0x41 <= c <= 0x46:
            v = v * 16 + (c - 0x37)
        else:
            return -1
    return v


cdef inline Py_ssize_t put(uint8_t* out, Py_ssize_t o, Py_ssize_t cap, uint8_t c) noexcept:
    if o < cap:
        out[o] = c
    return o + 1


cdef Py_ssize_t unescape(const uint8_t* s, Py_ssize_t n, uint8_t* out, Py_ssize_t cap) noexcept:
    """A JSON string's content (the bytes between its quotes) with its escapes decoded,
    as UTF-8 into out (the first cap bytes kept); a lone surrogate becomes U+FFFD.
    Returns the whole decoded length, or -1 for an invalid escape."""
    cdef Py_ssize_t i = 0, o = 0
    cdef int cp, lo
    cdef uint8_t c, e
    while i < n:
        c = s[i]
        if c != 0x5C:
            o = put(out, o, cap, c)
            i += 1
            continue
        if i + 1 >= n:
            return -1
        e = s[i + 1]
        if e != 0x75:                          # not \u
            if e == 0x22 or e == 0x5C or e == 0x2F:
                c = e
            elif e == 0x62:
                c = 0x08
            elif e == 0x66:
                c = 0x0C
            elif e == 0x6E:
                c = 0x0A
            elif e == 0x72:
                c = 0x0D
            elif e == 0x74:
                c = 0x09
            else:
                return -1
            o = put(out, o, cap, c)
            i += 2
            continue
        cp = hex4(s, i + 2, n)
        if cp < 0:
            return -1
        i += 6
        if 0xD800 <= cp <= 0xDBFF and i + 1 < n and s[i] == 0x5C and s[i + 1] == 0x75:
            lo = hex4(s, i + 2, n)
            if lo < 0:
                return -1
            if 0xDC00 <= lo <= 0xDFFF:
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00)
                i += 6
        if 0xD800 <= cp <= 0xDFFF:
            cp = 0xFFFD
        if cp < 0x80:
            o = put(out, o, cap, <uint8_t>cp)
        elif cp < 0x800:
            o = put(out, o, cap, <uint8_t>(0xC0 | (cp >> 6)))
            o = put(out, o, cap, <uint8_t>(0x80 | (cp & 0x3F)))
        elif cp < 0x10000:
            o = put(out, o, cap, <uint8_t>(0xE0 | (cp >> 12)))
            o = put(out, o, cap, <uint8_t>(0x80 | ((cp >> 6) & 0x3F)))
            o = put(out, o, cap, <uint8_t>(0x80 | (cp & 0x3F)))
        else:
            o = put(out, o, cap, <uint8_t>(0xF0 | (cp >> 18)))
            o = put(out, o, cap, <uint8_t>(0x80 | ((cp >> 12) & 0x3F)))
            o = put(out, o, cap, <uint8_t>(0x80 | ((cp >> 6) & 0x3F)))
            o = put(out, o, cap, <uint8_t>(0x80 | (cp & 0x3F)))
    return o


cdef Py_ssize_t binary_topic(const uint8_t* b, Py_ssize_t n, const uint8_t* key, Py_ssize_t kn,
                             Py_ssize_t* vlen) noexcept:
    """extFields[key] of a ROCKETMQ binary header: its offset (length in *vlen), or -1
    (absent, or anything cut short or overlong, as the codec rejects it)."""
    cdef Py_ssize_t pos = 17, end, kl, found = -1
    cdef int64_t rl, el, vl
    cdef bint match
    if n < 21:
        return -1
    rl = <int32_t>be32(b + 13)
    if rl < 0 or pos + rl + 4 > n:
        return -1
    pos += rl
    el = <int32_t>be32(b + pos)
    pos += 4
    if el < 0 or pos + el > n:
        return -1
    end = pos + el
    while pos < end:
        if pos + 2 > end:
            return -1
        kl = be16(b + pos)
        pos += 2
        if pos + kl + 4 > end:
            return -1
        match = kl == kn and memcmp(b + pos, key, kn) == 0
        pos += kl
        vl = <int32_t>be32(b + pos)
        pos += 4
        if vl < 0 or pos + vl > end:
            return -1
        if match:
            found = pos
            vlen[0] = vl
        pos += vl
    return found


cdef class RocketMQParser(FrameParser):
    """Counts, sizes and correlates the RocketMQ remoting frames of one connection."""

    cdef RState r[2]
    cdef public int64_t max_header_bytes
    cdef bint includes_self
    cdef int route_pending                 # GET_ROUTEINFO_BY_TOPIC requests awaiting answers
    cdef object rewriter
    cdef readonly object route_opaques  # an OrderedDict
    cdef public object local_address
    cdef public object upstream_address

    def __init__(self, RouteStats stats, max_frame_bytes=None, request_timeout=30.0,
                 options=None):
        self.header_size = HDR
        self.max_frame_bytes = MAX_FRAME_BYTES
        stats.describe(frame_opcode_name, response_status_name, known_codes())   # once per route
        FrameParser.__init__(self, stats, max_frame_bytes, request_timeout, options)
        self.max_header_bytes = self.options.get("max_header_bytes", MAX_HEADER_BYTES)
        self.header_limit = max(self.max_header_bytes, HDR)
        self.includes_self = self.options.get("length_includes_self", False)
        self.rewriter = RouteRewriter.from_options(self.options)
        self.route_opaques = new_route_requests()   # opaque -> None, oldest first
        if self.rewriter is not None:
            self.set_hold(S2C, True)

    cdef int64_t on_header(self, int d, const uint8_t* h, Py_ssize_t avail) except -2:
        cdef uint32_t length = be32(h)
        cdef uint32_t hw = be32(h + 4)
        cdef int64_t total = <int64_t>length if self.includes_self else <int64_t>length + 4
        cdef int64_t hlen = hw & 0xFFFFFF
        cdef int stype = hw >> 24
        cdef RState* r = &self.r[d]
        if total > self.max_frame_bytes:
            self.fail(d, R_TOO_LARGE, "frame length %d at offset %d exceeds the limit %d" % (
                total, self.st[d].frame_start, self.max_frame_bytes))
            return -1
        if total < HDR:
            self.fail(d, R_TOO_SMALL, "frame length %d at offset %d is below the 8-byte minimum"
                      " (is length_includes_self set right?)" % (total, self.st[d].frame_start))
            return -1
        if stype != ST_JSON and stype != ST_BINARY:
            self.fail(d, R_BAD_HEADER, "serialization type %d at offset %d (expected 0 JSON or "
                      "1 ROCKETMQ)" % (stype, self.st[d].frame_start))
            return -1
        if hlen > total - HDR:
            self.fail(d, R_BAD_HEADER, "header length %d at offset %d is larger than the frame "
                      "(%d bytes)" % (hlen, self.st[d].frame_start, total))
            return -1
        if hlen > self.max_header_bytes:
            self.fail(d, R_TOO_LARGE, "header length %d at offset %d exceeds the limit %d" % (
                hlen, self.st[d].frame_start, self.max_header_bytes))
            return -1
        r.hlen = hlen
        r.stype = stype
        r.total = total
        r.phase = P_HEADER
        if d == S2C and self.route_pending and self.rewriter is not None:
            capture_frame(self, d)              # maybe route data: rewrite() decides
            return total
        stream_body(self, d, HDR)
        if hlen == 0:
            self._header(d, h, 0)
        return total

    cdef int on_body(self, int d, const uint8_t* p, Py_ssize_t n) except -1:
        cdef RState* r = &self.r[d]
        cdef const uint8_t* h
        cdef Py_ssize_t used = 0
        if r.phase == P_HEADER:                # in place when this piece holds it whole
            if gather(self, d, p, n, r.hlen, &h, &used) <= 0:
                return 0
            self._header(d, h, r.hlen)
        if r.phase == P_MESSAGES and used < n:
            self._walk(d, p + used, n - used)
        return 0

    cdef int _walk(self, int d, const uint8_t* p, Py_ssize_t n) except -1:
        """Count messages: each starts with totalSize i32 that includes itself."""
        cdef RState* r = &self.r[d]
        cdef Py_ssize_t i = 0, take
        cdef uint32_t size
        while i < n:
            if r.wskip > 0:
                i += skip_some(&r.wskip, n - i)
                continue
            take = 4 - r.whave
            if take > n - i:
                take = n - i
            memcpy(r.wbuf + r.whave, p + i, take)
            r.whave += take
            i += take
            if r.whave < 4:
                break
            r.whave = 0
            size = be32(r.wbuf)
            if size < 4:
                r.phase = P_SKIP
                protocol_error(self, d, R_BAD_BODY)
                return 0
            add_messages(self, d, 1)
            r.wskip = size - 4
        return 0

    cdef int on_body_end(self, int d) except -1:
        cdef RState* r = &self.r[d]
        if r.phase == P_MESSAGES and (r.wskip > 0 or r.whave > 0):
            protocol_error(self, d, R_BAD_BODY)  # the last message ran past the frame
        return 0

    cdef int _header(self, int d, const uint8_t* h, Py_ssize_t n) except -1:
        """A whole header: decode code/opaque/flag, count, correlate, pick the body walk."""
        cdef RouteStats st = self.stats
        cdef RState* r = &self.r[d]
        cdef int64_t f[3]
        cdef int rc, slot, code, flag
        cdef uint64_t opaque                   # i32, sign-extended: the id clients log
        cdef TopicAt tv                        # extFields topic / b values (recording)
        cdef uint64_t overflows
        r.phase = P_SKIP
        if r.stype == ST_BINARY:
            if n < BIN_HEADER_MIN:
                self._bad_header(d)
                return 0
            f[0] = (<int>h[0] << 8) | h[1]
            f[1] = <int32_t>be32(h + 5)
            f[2] = <int32_t>be32(h + 9)
        else:
            if self.recording:
                rc = scan_json_rec(h, n, f, &tv)
            else:
                rc = scan_json(h, n, f)
            if rc == SCAN_FALLBACK:
                tv.topic = -2                  # not known: _topic() walks the header
                try:
                    f[0], f[1], f[2] = jsonscan._fallback(h[:n])
                except ValueError:
                    rc = SCAN_ERROR
            if rc == SCAN_ERROR:
                self._bad_header(d)
                return 0
        code = <int>f[0]
        opaque = <uint64_t><int64_t><int32_t>f[1]
        flag = <int>f[2]
        if flag & F_RESPONSE:
            # A response answers a request that went the other way.  A c2s frame with
            # flag 1 that answers nothing is a Go client's oneway request
            # (docs/design.md, "RocketMQ remoting").
            slot = take(self, d, 1 - d, opaque)
            if slot >= 0:                      # counted under the request's opcode
                begin(self, d, slot, K_RESPONSE, r.total, HDR + r.hlen)
                answer(self, d, code, OUTCOME_OK if is_ok(code) else OUTCOME_ERROR)
                if st.slot_code[slot] == GET_ROUTEINFO_BY_TOPIC and self.route_pending:
                    self.route_pending -= 1
                if st.slot_code[slot] == PULL_MESSAGE and code == SUCCESS:
                    self._start_walk(d)
                return 0
            if d == S2C or flag & F_ONEWAY:
                begin(self, d, st.slot_for(UNMATCHED_RESPONSE), K_RESPONSE, r.total,
                           HDR + r.hlen)
                answer(self, d, code, OUTCOME_OK if is_ok(code) else OUTCOME_ERROR)
                set_corr(self, d, opaque, CORR_HI_SIGNED)
                return 0
            flag = F_ONEWAY                    # Go's oneway request
        begin(self, d, st.slot_for(code), K_ONEWAY if flag & F_ONEWAY else K_REQUEST,
                   r.total, HDR + r.hlen)
        if self.recording:
            self._topic(d, h, n, code, &tv)
        if code == SEND_MESSAGE or code == SEND_MESSAGE_V2:
            add_messages(self, d, 1)
        elif code == SEND_BATCH_MESSAGE:
            self._start_walk(d)
        if flag & F_ONEWAY:
            set_corr(self, d, opaque, CORR_HI_SIGNED)
        elif code == GET_ROUTEINFO_BY_TOPIC and d == C2S and self.rewriter is not None:
            overflows = self.c.errors[d][<int>R_OVERFLOW]
            expect(self, d, d, opaque, CORR_HI_SIGNED)
            self.route_pending += 1
            if remember_route_request(self.route_opaques, opaque & 0xFFFFFFFF):
                self.route_pending -= 1            # the oldest will never be rewritten:
                if self.c.errors[d][<int>R_OVERFLOW] == overflows:   # one count a request
                    protocol_error(self, d, R_OVERFLOW)
        else:
            expect(self, d, d, opaque, CORR_HI_SIGNED)
        return 0

    cdef void _topic(self, int d, const uint8_t* h, Py_ssize_t n, int code,
                     TopicAt* tv) noexcept:
        """The request's topic as its frame-log resource: extFields `topic`, or `b` in
        the short-key header of SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE /
        SEND_REPLY_MESSAGE_V2 (SendMessageRequestHeaderV2).  tv: where scan_json_rec()
        found their values (tv.topic == -2: the header took the json.loads fallback).  Read
        in place; a topic written with JSON escapes is decoded into a small buffer."""
        cdef bint short_key = (code == SEND_MESSAGE_V2 or code == SEND_BATCH_MESSAGE
                               or code == SEND_REPLY_MESSAGE_V2)
        cdef Py_ssize_t v, end, vlen = 0, ext
        cdef int esc = 0
        cdef uint8_t buf[RESOURCE_MAX]
        if self.r[d].stype == ST_BINARY:
            v = binary_topic(h, n, b"b" if short_key else b"topic", 1 if short_key else 5,
                             &vlen)
            if v >= 0:
                set_resource(self, d, h + v, vlen)
            return
        if tv.topic == -2:                     # walk the header: top level, then extFields
            if walk_object(h, 0, n, b"extFields", 9, &ext, NULL, 0, NULL) < 0 or ext < 0:
                return
            if walk_object(h, ext, n, b"topic", 5, &tv.topic, b"b", 1, &tv.short_topic) < 0:
                return
        v = tv.short_topic if short_key else tv.topic
        if v < 0 or h[v] != 0x22:
            return
        end = string_end(h, v, n, &esc)
        if end < 0:
            return
        if not esc:
            set_resource(self, d, h + v + 1, end - v - 2)
            return
        vlen = unescape(h + v + 1, end - v - 2, buf, RESOURCE_MAX)
        if vlen >= 0:
            set_resource(self, d, buf, vlen)

    cdef void _start_walk(self, int d) noexcept:
        cdef RState* r = &self.r[d]
        r.phase = P_MESSAGES
        r.wskip = 0
        r.whave = 0

    cdef void _bad_header(self, int d) noexcept:
        begin(self, d, self.stats.slot_for(UNDECODABLE), K_ONEWAY, self.r[d].total,
                   HDR + self.r[d].hlen)
        protocol_error(self, d, R_BAD_HEADER)

    def rewrite(self, int d, bytes frame):
        """A captured s2c frame: account for it, then rewrite it if it is route data."""
        cdef RState* r = &self.r[d]
        cdef const uint8_t* b = frame
        self._header(d, b + HDR, r.hlen)
        if r.phase == P_MESSAGES:
            self._walk(d, b + HDR + r.hlen, len(frame) - HDR - r.hlen)
            self.on_body_end(d)
        return self.rewriter.rewrite(frame, self.route_opaques, self.includes_self,
                                     self.stats)
