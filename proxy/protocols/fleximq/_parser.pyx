# cython: language_level=3
"""fleximq frame parser (compiled).  Twin: parser_py.py.

Frame (docs/design.md, "fleximq"): a 34-byte prefix (version u8, type u8, client_id u32,
16 reserved bytes that are ignored, header_length u32, payload_length u64, big-endian),
then the MessagePack header, then the payload, which is never read.  The limits are
checked on the prefix, before anything is buffered.  The header is read in place (copied
by the core only when it spans reads) by a scanner that looks at the six keys of the
document's §2.2.1 and only as far as the proxy needs; anything unusual (extension types,
container keys, a known key given twice, nesting past 32 levels) goes to
header.summarize(), the msgpack reference that the property test holds this scanner to.
"""

from libc.stdint cimport uint8_t, uint32_t, int32_t, int64_t, uint64_t
from libc.string cimport memcpy

from proxy._framing cimport (FrameParser, RouteStats, OUTCOME_OK, OUTCOME_ERROR, K_REQUEST,
                             K_RESPONSE, K_ONEWAY, R_BAD_HEADER, R_BAD_VERSION,
                             R_HEADER_TOO_LARGE, R_TOO_LARGE, R_UNKNOWN, R_HEADER_RULE)
from proxy._framing cimport (want_header, protocol_error, begin, add_messages,
                             expect, take, answer, set_resource, add_attr, set_corr_str)
from proxy._wire cimport be32, be64, le64
from proxy.protocols.fleximq import header as _header
from proxy.protocols.fleximq.constants import MAX_FRAME_BYTES, opcode_name, status_name

cdef enum:
    PREFIX = 34
    MAX_HEADER = 65536
    VERSION = 1
    T_JOIN = 0
    T_REQ = 1
    T_REP = 2
    T_NOTIF = 3
    T_BCAST = 4
    T_PUB = 5
    T_SUB = 6
    T_UNSUB = 7
    T_PING = 8
    T_PONG = 9
    # header keys (header.py)
    ROUTING = 1
    REQREP = 2
    TOPIC = 4
    STATUS = 8
    AUTH = 16
    KEEPALIVE = 32
    RR_NONE = 0
    RR_REQUEST = 1
    RR_CORRELATION = 2
    RR_OTHER = 3
    MAX_TARGETS = 32
    INVALID_STATUS = -1
    TAG_JOIN = 2
    TAG_PING = 4
    PING_DUP_MAX = 1048576
    # scanner results
    SCAN_OK = 0
    SCAN_MALFORMED = 1
    SCAN_FALLBACK = 2
    DEPTH_MAX = 32
    # MessagePack item kinds
    I_INT = 0
    I_STR = 1
    I_BIN = 2
    I_ARRAY = 3
    I_MAP = 4
    I_EXT = 5
    I_OTHER = 6        # nil, bool, float

# per type: the keys a header must have / may have (header.REQUIRED / ALLOWED)
cdef int REQUIRED[10]
cdef int ALLOWED[10]
REQUIRED[:] = [0, ROUTING | REQREP, ROUTING | REQREP, ROUTING, 0, TOPIC, TOPIC, TOPIC,
               KEEPALIVE, KEEPALIVE]
ALLOWED[:] = [AUTH | REQREP, ROUTING | REQREP | STATUS, ROUTING | REQREP | STATUS,
              ROUTING | STATUS, STATUS, TOPIC | ROUTING | STATUS, TOPIC, TOPIC, KEEPALIVE,
              KEEPALIVE]


cdef struct Hdr:
    int malformed
    int present
    int badtype
    int64_t nroute
    int noid
    const uint8_t* path
    Py_ssize_t path_len            # -1 none
    uint32_t targets[MAX_TARGETS]
    int ntargets
    int rr_type
    const uint8_t* rr_id
    Py_ssize_t rr_id_len           # -1 none
    const uint8_t* topic
    Py_ssize_t topic_len           # -1 none
    int64_t status
    int has_ts
    uint64_t ts


cdef struct Item:
    int kind
    Py_ssize_t start               # str/bin/ext: where the content starts
    Py_ssize_t end                 # after the item (containers: after their header)
    uint64_t count                 # container entries, or str/bin/ext length
    int neg                        # I_INT: negative
    uint64_t u                     # I_INT: the value when not negative


cdef inline void hdr_init(Hdr* o) noexcept:
    o.malformed = 0
    o.present = 0
    o.badtype = 0
    o.nroute = -1
    o.noid = 0
    o.path = NULL
    o.path_len = -1
    o.ntargets = 0
    o.rr_type = RR_NONE
    o.rr_id = NULL
    o.rr_id_len = -1
    o.topic = NULL
    o.topic_len = -1
    o.status = 0
    o.has_ts = 0
    o.ts = 0


cdef inline bint cont(uint8_t c) noexcept:
    return 0x80 <= c <= 0xBF


cdef bint utf8_slow(const uint8_t* s, Py_ssize_t n) noexcept:
    """Strict UTF-8, as Python decodes it (no overlongs, no surrogates, <= U+10FFFF)."""
    cdef Py_ssize_t i = 0
    cdef uint8_t c
    cdef uint64_t w
    while i < n:
        if i + 8 <= n:                         # ASCII, 8 bytes at a time
            memcpy(&w, s + i, 8)
            if not (w & 0x8080808080808080ULL):
                i += 8
                continue
        c = s[i]
        if c < 0x80:
            i += 1
            continue
        if 0xC2 <= c <= 0xDF:
            if i + 1 >= n or not cont(s[i + 1]):
                return False
            i += 2
        elif 0xE0 <= c <= 0xEF:
            if i + 2 >= n or not cont(s[i + 2]):
                return False
            if c == 0xE0:
                if not 0xA0 <= s[i + 1] <= 0xBF:
                    return False
            elif c == 0xED:
                if not 0x80 <= s[i + 1] <= 0x9F:
                    return False
            elif not cont(s[i + 1]):
                return False
            i += 3
        elif 0xF0 <= c <= 0xF4:
            if i + 3 >= n or not cont(s[i + 2]) or not cont(s[i + 3]):
                return False
            if c == 0xF0:
                if not 0x90 <= s[i + 1] <= 0xBF:
                    return False
            elif c == 0xF4:
                if not 0x80 <= s[i + 1] <= 0x8F:
                    return False
            elif not cont(s[i + 1]):
                return False
            i += 4
        else:
            return False
    return True


cdef inline bint utf8_ok(const uint8_t* s, Py_ssize_t n) noexcept:
    """utf8_slow(), with ASCII (nearly every header string) decided inline."""
    cdef Py_ssize_t i = 0
    cdef uint64_t w
    while i + 8 <= n:
        memcpy(&w, s + i, 8)
        if w & 0x8080808080808080ULL:
            return utf8_slow(s, n)
        i += 8
    while i < n:
        if s[i] & 0x80:
            return utf8_slow(s, n)
        i += 1
    return True


cdef inline int sized(const uint8_t* b, Py_ssize_t i, Py_ssize_t n, int kind, int lb,
                      Item* it) noexcept:
    """A str/bin/ext whose length takes lb bytes after the type byte (ext: + type byte)."""
    cdef uint64_t ln
    cdef Py_ssize_t start = i + 1 + lb
    if start > n:
        return -1
    if lb == 1:
        ln = b[i + 1]
    elif lb == 2:
        ln = (<uint64_t>b[i + 1] << 8) | b[i + 2]
    else:
        ln = be32(b + i + 1)
    if kind == I_EXT:
        start += 1
    if start > n or ln > <uint64_t>(n - start):
        return -1
    it.kind = kind
    it.start = start
    it.count = ln
    it.end = start + <Py_ssize_t>ln
    return 0


cdef inline int item(const uint8_t* b, Py_ssize_t i, Py_ssize_t n, Item* it) noexcept:
    """The MessagePack item at b[i]: 0, or -1 when it is cut short or is 0xc1."""
    cdef uint8_t c
    cdef int w
    cdef uint64_t v
    if i >= n:
        return -1
    c = b[i]
    it.neg = 0
    if c <= 0x7F:
        it.kind = I_INT
        it.u = c
        it.end = i + 1
        return 0
    if c >= 0xE0:
        it.kind = I_INT
        it.neg = 1
        it.end = i + 1
        return 0
    if c <= 0x8F:
        it.kind = I_MAP
        it.count = c & 0x0F
        it.end = i + 1
        return 0
    if c <= 0x9F:
        it.kind = I_ARRAY
        it.count = c & 0x0F
        it.end = i + 1
        return 0
    if c <= 0xBF:
        it.kind = I_STR
        it.start = i + 1
        it.count = c & 0x1F
        it.end = i + 1 + (c & 0x1F)
        return 0 if it.end <= n else -1
    if c == 0xC0 or c == 0xC2 or c == 0xC3:
        it.kind = I_OTHER
        it.end = i + 1
        return 0
    if c == 0xC1:
        return -1
    if c <= 0xC6:
        return sized(b, i, n, I_BIN, 1 << (c - 0xC4), it)
    if c <= 0xC9:
        return sized(b, i, n, I_EXT, 1 << (c - 0xC7), it)
    if c == 0xCA or c == 0xCB:
        it.kind = I_OTHER
        it.end = i + (5 if c == 0xCA else 9)
        return 0 if it.end <= n else -1
    if c <= 0xD3:                              # uint8..64, int8..64
        w = 1 << ((c - 0xCC) & 3)
        if i + 1 + w > n:
            return -1
        if w == 1:
            v = b[i + 1]
        elif w == 2:
            v = (<uint64_t>b[i + 1] << 8) | b[i + 2]
        elif w == 4:
            v = be32(b + i + 1)
        else:
            v = be64(b + i + 1)
        it.kind = I_INT
        it.end = i + 1 + w
        if c >= 0xD0 and (b[i + 1] & 0x80):
            it.neg = 1
        else:
            it.u = v
        return 0
    if c <= 0xD8:                              # fixext 1..16
        it.kind = I_EXT
        it.start = i + 2
        it.count = 1 << (c - 0xD4)
        it.end = i + 2 + (1 << (c - 0xD4))
        return 0 if it.end <= n else -1
    if c <= 0xDB:
        return sized(b, i, n, I_STR, 1 << (c - 0xD9), it)
    if i + 1 + (2 if c == 0xDC or c == 0xDE else 4) > n:
        return -1
    if c == 0xDC or c == 0xDE:
        it.count = (<uint64_t>b[i + 1] << 8) | b[i + 2]
        it.end = i + 3
    else:
        it.count = be32(b + i + 1)
        it.end = i + 5
    it.kind = I_ARRAY if c <= 0xDD else I_MAP
    return 0


cdef Py_ssize_t skip_any(const uint8_t* b, Py_ssize_t i, Py_ssize_t n) noexcept:
    """The index after the value at b[i]; -1 when it is malformed (cut short, 0xc1,
    invalid UTF-8), -2 when it is for the fallback (extension, container key, deep)."""
    cdef uint64_t left[DEPTH_MAX]
    cdef uint8_t ismap[DEPTH_MAX]
    cdef int depth = 0
    cdef Item it
    left[0] = 1
    ismap[0] = 0
    while True:
        if item(b, i, n, &it) < 0:
            return -1
        if it.kind == I_EXT:
            return -2
        if it.kind == I_STR and not utf8_ok(b + it.start, <Py_ssize_t>it.count):
            return -1
        if (it.kind == I_ARRAY or it.kind == I_MAP) and ismap[depth] and not (left[depth] & 1):
            return -2                          # a container as a map key
        left[depth] -= 1
        i = it.end
        if (it.kind == I_ARRAY or it.kind == I_MAP) and it.count > 0:
            if depth + 1 >= DEPTH_MAX:
                return -2
            depth += 1
            left[depth] = it.count * 2 if it.kind == I_MAP else it.count
            ismap[depth] = it.kind == I_MAP
        while left[depth] == 0:
            if depth == 0:
                return i
            depth -= 1


cdef inline bint eq(const uint8_t* p, Py_ssize_t n, const char* lit, Py_ssize_t ln) noexcept:
    cdef Py_ssize_t k
    if n != ln:
        return False
    for k in range(n):
        if p[k] != <uint8_t>lit[k]:
            return False
    return True


cdef inline int key_bit(const uint8_t* p, Py_ssize_t n) noexcept:
    if n == 7:
        if eq(p, n, b"routing", 7):
            return ROUTING
    if n == 6 and eq(p, n, b"reqrep", 6):
        return REQREP
    if n == 5 and eq(p, n, b"topic", 5):
        return TOPIC
    if n == 6 and eq(p, n, b"status", 6):
        return STATUS
    if n == 4 and eq(p, n, b"auth", 4):
        return AUTH
    if n == 9 and eq(p, n, b"keepalive", 9):
        return KEEPALIVE
    return 0


cdef inline int read_key(const uint8_t* b, Py_ssize_t* i, Py_ssize_t n, const uint8_t** k,
                         Py_ssize_t* kn) noexcept:
    """A map key at b[i[0]]: 0 (*k/*kn set for a string, *kn = -1 otherwise), or
    SCAN_MALFORMED / SCAN_FALLBACK.  A string key is not checked for UTF-8 here."""
    cdef Item it
    if item(b, i[0], n, &it) < 0:
        return SCAN_MALFORMED
    if it.kind == I_ARRAY or it.kind == I_MAP or it.kind == I_EXT:
        return SCAN_FALLBACK
    kn[0] = -1
    if it.kind == I_STR:                       # validated by the caller unless it is
        k[0] = b + it.start                    # one of the (ASCII) names it looks for
        kn[0] = <Py_ssize_t>it.count
    i[0] = it.end
    return 0


cdef inline int skip_to(const uint8_t* b, Py_ssize_t* i, Py_ssize_t n) noexcept:
    cdef Py_ssize_t j = skip_any(b, i[0], n)
    if j == -1:
        return SCAN_MALFORMED
    if j == -2:
        return SCAN_FALLBACK
    i[0] = j
    return 0


cdef inline bint uint_ok(Item* it, uint64_t limit) noexcept:
    return it.kind == I_INT and not it.neg and it.u <= limit


cdef int routing_value(const uint8_t* b, Py_ssize_t* i, Py_ssize_t n, Hdr* o) noexcept:
    cdef Item it
    cdef uint64_t j, e, m
    cdef int rc, seen, f, have_id
    cdef const uint8_t* k = NULL
    cdef Py_ssize_t kn
    if item(b, i[0], n, &it) < 0:
        return SCAN_MALFORMED
    if it.kind != I_ARRAY:
        o.badtype |= ROUTING
        return skip_to(b, i, n)
    o.nroute = <int64_t>it.count
    i[0] = it.end
    j = 0
    while j < <uint64_t>o.nroute:
        if item(b, i[0], n, &it) < 0:
            return SCAN_MALFORMED
        if it.kind != I_MAP:
            o.badtype |= ROUTING
            rc = skip_to(b, i, n)
            if rc:
                return rc
            j += 1
            continue
        m = it.count
        i[0] = it.end
        seen = 0
        have_id = 0
        e = 0
        while e < m:
            rc = read_key(b, i, n, &k, &kn)
            if rc:
                return rc
            f = 0
            if kn == 9 and eq(k, kn, b"client_id", 9):
                f = 1
            elif kn == 4 and eq(k, kn, b"path", 4):
                f = 2
            elif kn >= 0 and not utf8_ok(k, kn):
                return SCAN_MALFORMED
            if f == 0 or seen & f:
                if seen & f:
                    return SCAN_FALLBACK
                rc = skip_to(b, i, n)
                if rc:
                    return rc
                e += 1
                continue
            seen |= f
            if item(b, i[0], n, &it) < 0:
                return SCAN_MALFORMED
            if f == 1:
                have_id = 1
                if uint_ok(&it, 0xFFFFFFFF):
                    if o.ntargets < MAX_TARGETS:
                        o.targets[o.ntargets] = <uint32_t>it.u
                        o.ntargets += 1
                    i[0] = it.end
                else:
                    o.badtype |= ROUTING
                    rc = skip_to(b, i, n)
                    if rc:
                        return rc
            else:
                if it.kind == I_STR:
                    if not utf8_ok(b + it.start, <Py_ssize_t>it.count):
                        return SCAN_MALFORMED
                    if j == 0:
                        o.path = b + it.start
                        o.path_len = <Py_ssize_t>it.count
                    i[0] = it.end
                else:
                    o.badtype |= ROUTING
                    rc = skip_to(b, i, n)
                    if rc:
                        return rc
            e += 1
        if not have_id:
            o.noid = 1
        j += 1
    return 0


cdef int object_value(const uint8_t* b, Py_ssize_t* i, Py_ssize_t n, Hdr* o, int bit) noexcept:
    """reqrep or keepalive: a map of which two members matter."""
    cdef Item it
    cdef uint64_t e, m
    cdef int rc, seen = 0, f
    cdef const uint8_t* k = NULL
    cdef Py_ssize_t kn
    if item(b, i[0], n, &it) < 0:
        return SCAN_MALFORMED
    if it.kind != I_MAP:
        o.badtype |= bit
        return skip_to(b, i, n)
    m = it.count
    i[0] = it.end
    e = 0
    while e < m:
        rc = read_key(b, i, n, &k, &kn)
        if rc:
            return rc
        f = 0
        if bit == REQREP:
            if kn == 4 and eq(k, kn, b"type", 4):
                f = 1
            elif kn == 2 and eq(k, kn, b"id", 2):
                f = 2
        else:
            if kn == 9 and eq(k, kn, b"timestamp", 9):
                f = 1
            elif kn == 8 and eq(k, kn, b"interval", 8):
                f = 2
        if f == 0 and kn >= 0 and not utf8_ok(k, kn):
            return SCAN_MALFORMED
        if f and seen & f:
            return SCAN_FALLBACK
        seen |= f
        if f == 0:
            rc = skip_to(b, i, n)
            if rc:
                return rc
            e += 1
            continue
        if item(b, i[0], n, &it) < 0:
            return SCAN_MALFORMED
        if it.kind == I_STR and not utf8_ok(b + it.start, <Py_ssize_t>it.count):
            return SCAN_MALFORMED
        if bit == REQREP and it.kind == I_STR:
            if f == 1:
                if eq(b + it.start, <Py_ssize_t>it.count, b"request", 7):
                    o.rr_type = RR_REQUEST
                elif eq(b + it.start, <Py_ssize_t>it.count, b"correlation", 11):
                    o.rr_type = RR_CORRELATION
                else:
                    o.rr_type = RR_OTHER
            else:
                o.rr_id = b + it.start
                o.rr_id_len = <Py_ssize_t>it.count
            i[0] = it.end
        elif bit == KEEPALIVE and f == 1 and uint_ok(&it, 0xFFFFFFFFFFFFFFFF):
            o.has_ts = 1
            o.ts = it.u
            i[0] = it.end
        elif bit == KEEPALIVE and f == 2 and uint_ok(&it, 0xFFFFFFFF):
            i[0] = it.end
        else:
            o.badtype |= bit
            rc = skip_to(b, i, n)
            if rc:
                return rc
        e += 1
    return 0


cdef int scan(const uint8_t* b, Py_ssize_t n, Hdr* o) noexcept:
    """Summarize a header in place (header.summarize's Summary, as a Hdr): SCAN_OK,
    SCAN_MALFORMED (o.malformed set, the rest empty) or SCAN_FALLBACK."""
    cdef Item it
    cdef Py_ssize_t i
    cdef uint64_t e, m
    cdef int rc = 0, seen = 0, bit
    cdef const uint8_t* k = NULL
    cdef Py_ssize_t kn
    hdr_init(o)
    if n == 0:
        return SCAN_OK
    if item(b, 0, n, &it) < 0 or it.kind != I_MAP:
        o.malformed = 1
        return SCAN_MALFORMED
    m = it.count
    i = it.end
    e = 0
    while e < m:
        rc = read_key(b, &i, n, &k, &kn)
        if rc:
            break
        bit = key_bit(k, kn) if kn >= 0 else 0
        if bit == 0 and kn >= 0 and not utf8_ok(k, kn):
            rc = SCAN_MALFORMED
        elif bit == 0:
            rc = skip_to(b, &i, n)
        elif seen & bit:
            rc = SCAN_FALLBACK
        else:
            seen |= bit
            o.present |= bit
            if bit == ROUTING:
                rc = routing_value(b, &i, n, o)
            elif bit == REQREP or bit == KEEPALIVE:
                rc = object_value(b, &i, n, o, bit)
            else:
                if item(b, i, n, &it) < 0:
                    rc = SCAN_MALFORMED
                elif bit == TOPIC and it.kind == I_STR:
                    if not utf8_ok(b + it.start, <Py_ssize_t>it.count):
                        rc = SCAN_MALFORMED
                    o.topic = b + it.start
                    o.topic_len = <Py_ssize_t>it.count
                    i = it.end
                elif bit == STATUS and uint_ok(&it, 0xFFFFFFFF):
                    o.status = <int64_t>it.u
                    i = it.end
                elif bit == AUTH and it.kind == I_MAP:
                    rc = skip_to(b, &i, n)       # checked, never read (secrets)
                else:
                    o.badtype |= bit
                    rc = skip_to(b, &i, n)
        if rc:
            break
        e += 1
    if rc == 0 and i != n:
        rc = SCAN_MALFORMED                      # bytes after the map
    if rc == SCAN_MALFORMED:
        hdr_init(o)
        o.malformed = 1
    return rc


cdef inline uint64_t id_key(const uint8_t* p, Py_ssize_t n) noexcept:
    """The 64-bit key of a reqrep.id (constants.id_key): 8 bytes at a time."""
    cdef uint64_t h = 0xCBF29CE484222325ULL ^ <uint64_t>n, w
    cdef Py_ssize_t i = 0, k
    while i < n:
        if i + 8 <= n:
            w = le64(p + i)
        else:
            w = 0
            for k in range(n - i):
                w |= <uint64_t>p[i + k] << (8 * k)
        h = (h ^ w) * 0x9E3779B97F4A7C15ULL
        h ^= h >> 29
        i += 8
    h ^= h >> 32
    h *= 0xBF58476D1CE4E5B9ULL
    return h ^ (h >> 29)


cdef bint rule_violation(int t, uint32_t cid, Hdr* s, bint join_answer) noexcept:
    """header.rule_violation()."""
    cdef int p = s.present
    cdef int required = 0 if join_answer else REQUIRED[t]
    if p & ~ALLOWED[t]:
        return True
    if required & ~p:
        return True
    if s.nroute >= 0:
        if s.noid:
            return True
        if (t == T_REQ or t == T_REP) and s.nroute != 1:
            return True
        if t == T_NOTIF and s.nroute == 0:
            return True
    if p & REQREP:
        if s.rr_type != (RR_CORRELATION if t == T_REP else RR_REQUEST) or s.rr_id_len < 0:
            return True
    if p & KEEPALIVE and not s.has_ts:
        return True
    if t == T_JOIN and cid != 0:
        return True
    return False


cdef inline Py_ssize_t put_dec(uint8_t* out, uint64_t v) noexcept:
    cdef uint8_t tmp[20]
    cdef Py_ssize_t n = 0, k
    while True:
        tmp[n] = <uint8_t>(0x30 + v % 10)
        n += 1
        v //= 10
        if v == 0:
            break
    for k in range(n):
        out[k] = tmp[n - 1 - k]
    return n


def scan_header(const uint8_t[:] h not None):
    """The in-place scanner's Summary of a header, or None when it defers to the
    msgpack fallback (tests: the property test compares it with header.summarize)."""
    cdef Hdr o
    cdef int rc
    cdef Py_ssize_t n = h.shape[0]
    cdef bytes data = bytes(h)
    rc = scan(<const uint8_t*>data if n else NULL, n, &o)
    if rc == SCAN_FALLBACK:
        return None
    return _summary(&o)


cdef object _summary(Hdr* o):
    if o.malformed:
        return _header.MALFORMED
    return _header.Summary(
        False, o.present, o.badtype, o.nroute, bool(o.noid),
        o.path[:o.path_len] if o.path_len >= 0 else None,
        tuple(o.targets[k] for k in range(o.ntargets)), o.rr_type,
        o.rr_id[:o.rr_id_len] if o.rr_id_len >= 0 else None,
        o.topic[:o.topic_len] if o.topic_len >= 0 else None,
        o.status, bool(o.has_ts), o.ts)


cdef class FlexiMQParser(FrameParser):
    """Counts, sizes and correlates the fleximq frames of one connection."""

    cdef object fb                         # the fallback's Summary while a frame uses it
    # per direction a PING travelled: its timestamp, PINGs sent with it, PONGs matched
    cdef bint ping_valid[2]
    cdef uint64_t ping_ts[2]
    cdef int64_t ping_sent[2]
    cdef int64_t ping_done[2]

    def __init__(self, RouteStats stats, max_frame_bytes=None, request_timeout=30.0,
                 options=None):
        self.header_size = PREFIX
        self.max_frame_bytes = MAX_FRAME_BYTES
        stats.describe(opcode_name, status_name, range(10))
        FrameParser.__init__(self, stats, max_frame_bytes, request_timeout, options)
        self.header_limit = PREFIX + MAX_HEADER
        self.fb = None

    cdef int64_t on_header(self, int d, const uint8_t* h, Py_ssize_t avail) except -2:
        cdef int version = h[0], t = h[1]
        cdef uint32_t cid = be32(h + 2)
        cdef int64_t hlen = be32(h + 22)
        cdef uint64_t plen = be64(h + 26)
        cdef int64_t total, hb = PREFIX + hlen
        cdef Hdr hd
        cdef int rc
        if hlen > MAX_HEADER:
            self.fail(d, R_HEADER_TOO_LARGE, "header length %d at offset %d exceeds the "
                      "limit %d" % (hlen, self.st[d].frame_start, MAX_HEADER))
            return -1
        if plen > <uint64_t>self.max_frame_bytes or \
                hb + <int64_t>plen > self.max_frame_bytes:
            self.fail(d, R_TOO_LARGE, "frame of %d bytes at offset %d exceeds the limit %d"
                      % (hb + <object>plen, self.st[d].frame_start, self.max_frame_bytes))
            return -1
        total = hb + <int64_t>plen
        if version != VERSION or t > T_PONG:
            protocol_error(self, d, R_BAD_VERSION if version != VERSION else R_UNKNOWN)
            begin(self, d, self.stats.slot_for(t), K_ONEWAY, total, hb)
            if self.recording:
                self._client_attr(d, cid)
            return total
        if avail < hb:
            return want_header(self, d, hb)
        rc = scan(h + PREFIX, hlen, &hd)
        if rc == SCAN_FALLBACK:
            self._fallback(h + PREFIX, hlen, &hd)
        self._frame(d, t, cid, &hd, total, hb)
        self.fb = None
        return total

    cdef int _fallback(self, const uint8_t* h, Py_ssize_t n, Hdr* o) except -1:
        """header.summarize() for what the scanner leaves alone; o points into the
        Summary's bytes, kept in self.fb until the frame is done."""
        cdef Py_ssize_t k
        s = self.fb = _header.summarize(h[:n])
        hdr_init(o)
        o.malformed = s.malformed
        o.present = s.present
        o.badtype = s.badtype
        o.nroute = s.nroute
        o.noid = s.noid
        if s.path is not None:
            o.path = s.path
            o.path_len = len(s.path)
        for k in range(len(s.targets)):
            o.targets[k] = s.targets[k]
        o.ntargets = len(s.targets)
        o.rr_type = s.rr_type
        if s.rr_id is not None:
            o.rr_id = s.rr_id
            o.rr_id_len = len(s.rr_id)
        if s.topic is not None:
            o.topic = s.topic
            o.topic_len = len(s.topic)
        o.status = s.status
        o.has_ts = s.has_ts
        o.ts = s.ts
        return 0

    cdef int _frame(self, int d, int t, uint32_t cid, Hdr* s, int64_t total,
                    int64_t hb) except -1:
        cdef int slot = self.stats.slot_for(t), req = -1, k
        cdef uint64_t key = 0
        cdef int64_t status
        cdef bint join_answer = False
        if s.malformed:
            begin(self, d, slot, K_ONEWAY, total, hb)
            protocol_error(self, d, R_BAD_HEADER)
            if self.recording:
                self._client_attr(d, cid)
            return 0
        if s.badtype:
            protocol_error(self, d, R_BAD_HEADER)
        if s.rr_id_len >= 0:
            key = id_key(s.rr_id, s.rr_id_len)
        if (t == T_REQ and s.rr_id_len >= 0) or t == T_JOIN:
            begin(self, d, slot, K_REQUEST, total, hb)
            expect(self, d, d if t == T_REQ else TAG_JOIN + d, key, -1)
            set_corr_str(self, d, NULL, 0, s.rr_id, s.rr_id_len)     # reqrep.id, or null
        elif t == T_REP:
            if s.rr_id_len >= 0:
                req = take(self, d, 1 - d, key)
            if req < 0:
                req = take(self, d, TAG_JOIN + 1 - d, key)
                join_answer = req >= 0
            begin(self, d, slot, K_RESPONSE, total, hb)
            if not s.present & STATUS:
                status = 200
            elif s.badtype & STATUS:
                status = INVALID_STATUS
            else:
                status = s.status
            answer(self, d, status, OUTCOME_OK if 200 <= status <= 299 else OUTCOME_ERROR)
            set_corr_str(self, d, NULL, 0, s.rr_id, s.rr_id_len)
        elif t == T_PING and s.has_ts:
            if not self.ping_valid[d] or self.ping_ts[d] != s.ts:
                self.ping_valid[d] = True
                self.ping_ts[d] = s.ts
                self.ping_sent[d] = 0
                self.ping_done[d] = 0
            k = <int>self.ping_sent[d]
            if self.ping_sent[d] < PING_DUP_MAX:
                self.ping_sent[d] += 1
            begin(self, d, slot, K_REQUEST, total, hb)
            expect(self, d, TAG_PING + d + 2 * k, s.ts, -1)
            if self.recording:
                self._ping_corr(d, s.ts)
        elif t == T_PONG:
            if s.has_ts:
                k = 0
                if self.ping_valid[1 - d] and self.ping_ts[1 - d] == s.ts and \
                        self.ping_done[1 - d] < self.ping_sent[1 - d]:
                    k = <int>self.ping_done[1 - d]
                    self.ping_done[1 - d] += 1
                req = take(self, d, TAG_PING + 1 - d + 2 * k, s.ts)
            begin(self, d, slot, K_RESPONSE, total, hb)
            answer(self, d, 200, OUTCOME_OK)
            if s.has_ts and self.recording:
                self._ping_corr(d, s.ts)
        else:
            begin(self, d, slot, K_ONEWAY, total, hb)
        if t == T_REQ or t == T_REP or t == T_NOTIF or t == T_BCAST or t == T_PUB:
            add_messages(self, d, 1)
        if rule_violation(t, cid, s, join_answer):
            protocol_error(self, d, R_HEADER_RULE)
        if self.recording:
            self._record(d, cid, s)
        return 0

    cdef int _ping_corr(self, int d, uint64_t ts) except -1:
        """A PING/PONG row's correlation_id: ``ping:<timestamp>`` (constants.log_correlation_id)."""
        cdef uint8_t buf[20]
        set_corr_str(self, d, b"ping:", 5, buf, put_dec(buf, ts))
        return 0

    cdef int _client_attr(self, int d, uint32_t cid) except -1:
        cdef uint8_t buf[12]
        add_attr(self, d, b"client_id", 9, buf, put_dec(buf, cid))
        return 0

    cdef int _record(self, int d, uint32_t cid, Hdr* s) except -1:
        """Frame-log resource (topic, else routing[0].path) and attrs (the base header's
        ClientID, the routing targets; the reqrep.id is the row's correlation_id).  Never
        anything from ``auth``."""
        cdef uint8_t buf[MAX_TARGETS * 11]
        cdef Py_ssize_t n = 0
        cdef int k
        if s.topic_len >= 0:
            set_resource(self, d, s.topic, s.topic_len)
        elif s.path_len >= 0:
            set_resource(self, d, s.path, s.path_len)
        self._client_attr(d, cid)
        if s.ntargets:
            for k in range(s.ntargets):
                if k:
                    buf[n] = 0x2C
                    n += 1
                n += put_dec(buf + n, s.targets[k])
            add_attr(self, d, b"targets", 7, buf, n)
        return 0
