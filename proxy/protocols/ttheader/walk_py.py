"""The Thrift walkers, written once for both parser twins: the message header (strict
binary, non-strict binary, compact, Kitex protobuf meta) gives the method name, message
type and seq id; a REPLY's result struct its status; an EXCEPTION's
TApplicationException its type; an unframed message's binary struct its end; a
TTHeader / THeader header's info section its protocol id, transforms and key/values.

Compiled, this file is ``walk_c.py`` (a link to this one) with ``walk_c.pxd`` beside it
giving every function and local its C type (aiohttp's ``reader_py.py`` /
``reader_c.pxd`` shape): ``m`` is a ``Msg*``, ``h`` a ``const uint8_t*``, the walks'
states structs, and ``_parser.pyx`` cimports it.  Run as Python (``parser_py.py``),
``m``, ``x`` and ``w`` are the objects ``parser_py.py`` defines with the same fields and
``h`` any buffer of bytes.  Write only what means the same in both: integer arithmetic
within int64, no Python objects, the byte readers of ``proxy/_wire.pxd`` /
``proxy/wire_py.py`` (the ``_at`` forms) for anything C and Python read differently.

Every function reads h[i:lim] and answers M_OK, M_BAD (the frame, when it is known to
end at ``fend >= 0``, ends first, or the bytes are not Thrift), or M_NEED with
``m.need`` the index of the byte wanted.  A walk across reads keeps its place (``x``,
``w``) so that every byte is walked once however a message is split into reads
(issue 19: linear time)."""

try:
    import cython
except ImportError:                      # run as Python without Cython installed
    from types import SimpleNamespace
    cython = SimpleNamespace(compiled=False)

if not cython.compiled:                  # compiled: C enums and inline readers (walk_c.pxd)
    from proxy.protocols.ttheader.constants import (
        NAME_MAX, CALL, REPLY, EXCEPTION, ONEWAY, ST_OK, ST_EXCEPTION, PROTO_BINARY,
        PROTO_COMPACT, PROTO_PROTOBUF, ZLIB, SNAPPY, INFO_KEYVALUE, INFO_INTKEYVALUE,
        INFO_ACL_TOKEN, TO_METHOD)
    from proxy.wire_py import be16_at, be32s_at, i32, unzigzag, uvarint_at
    M_OK, M_NEED, M_BAD = 0, 1, 2
    P_BINARY, P_COMPACT, P_PROTOBUF = 0, 2, 3   # how the payload's message header is encoded
    MAX_DEPTH = 64                              # nesting the unframed walk follows
    TT_META = 14                                # LENGTH, magic, flags, seq id, header size
    X_NONE, X_ZLIB, X_OPAQUE = 0, 1, 2          # payload transforms, as far as reading goes
    INFO_BATCH = 8                              # key/values info_walk() hands over at once


def chk(m, k, lim, fend):
    """Are bytes up to index k there?  M_OK; M_BAD when the frame ends first (fend >= 0);
    else M_NEED with m.need = k."""
    if k <= lim:
        return M_OK
    if fend >= 0 and k > fend:
        return M_BAD
    m.need = k
    return M_NEED


def uvar(m, h, i, lim, fend, maxlen):
    """Unsigned varint at h[i:] into m.var: (M_OK, the index after it); (M_BAD, i) when
    it is longer than maxlen bytes or the frame ends first; else (M_NEED, i) with
    m.need = lim + 1."""
    k, v = uvarint_at(h, i, lim, maxlen)
    if k > 0:
        m.var = v
        return M_OK, i + k
    if k < 0 or (fend >= 0 and lim >= fend):
        return M_BAD, i
    m.need = lim + 1
    return M_NEED, i


def read_message(m, h, i, lim, fend, allow_pb):
    """The Thrift message header at h[i:]: strict binary (0x80 0x01), compact (0x82),
    Kitex protobuf meta (0x90 0x01, when allow_pb) or non-strict binary."""
    r = chk(m, i + 1, lim, fend)
    if r:
        return r
    b0 = h[i]
    if b0 == 0x80 or (b0 == 0x90 and allow_pb):
        r = chk(m, i + 8, lim, fend)
        if r:
            return r
        if h[i + 1] != 0x01:
            return M_BAD
        m.mtype = h[i + 3]
        n = be32s_at(h, i + 4)
        if n < 0 or n > NAME_MAX:
            return M_BAD
        r = chk(m, i + 12 + n, lim, fend)
        if r:
            return r
        m.name_off = i + 8
        m.name_len = n
        m.seq = be32s_at(h, i + 8 + n)
        m.body = i + 12 + n
        m.ptype = P_PROTOBUF if b0 == 0x90 else P_BINARY
    elif b0 == 0x82:
        r = chk(m, i + 2, lim, fend)
        if r:
            return r
        if h[i + 1] & 0x1F != 1:
            return M_BAD
        m.mtype = h[i + 1] >> 5
        r, j = uvar(m, h, i + 2, lim, fend, 5)
        if r:
            return r
        m.seq = i32(m.var)
        r, j = uvar(m, h, j, lim, fend, 5)
        if r:
            return r
        if m.var > NAME_MAX:
            return M_BAD
        n = m.var
        r = chk(m, j + n, lim, fend)
        if r:
            return r
        m.name_off = j
        m.name_len = n
        m.body = j + n
        m.ptype = P_COMPACT
    elif b0 & 0x80:
        return M_BAD
    else:
        r = chk(m, i + 4, lim, fend)
        if r:
            return r
        n = be32s_at(h, i)
        if n > NAME_MAX:
            return M_BAD
        r = chk(m, i + 9 + n, lim, fend)
        if r:
            return r
        m.name_off = i + 4
        m.name_len = n
        m.mtype = h[i + 4 + n]
        m.seq = be32s_at(h, i + 5 + n)
        m.body = i + 9 + n
        m.ptype = P_BINARY
    if m.mtype < CALL or m.mtype > ONEWAY:
        return M_BAD
    return M_OK


def reply_status(m, h, i, lim, fend):
    """REPLY: the result struct's first field id — 0 (or a void reply) is OK, any
    other a declared exception."""
    if m.ptype == P_PROTOBUF:
        m.status = ST_OK
        return M_OK
    r = chk(m, i + 1, lim, fend)
    if r:
        return r
    b = h[i]
    if m.ptype == P_BINARY:
        if b == 0:
            m.status = ST_OK
            return M_OK
        r = chk(m, i + 3, lim, fend)
        if r:
            return r
        fid = be16_at(h, i + 1)
    else:
        if b & 0x0F == 0:
            m.status = ST_OK
            return M_OK
        fid = b >> 4
        if fid == 0:
            r, j = uvar(m, h, i + 1, lim, fend, 3)
            if r:
                return r
            fid = unzigzag(m.var)
    m.status = ST_OK if fid == 0 else ST_EXCEPTION
    return M_OK


# Bytes of a fixed-size value by type id, -1: not fixed-size.  Binary protocol: bool,
# byte 1, double, i64 8, i16 2, i32 4, uuid 16.  Compact field values: bools live in the
# field header (0), byte 1, double 8, uuid 16 (the varint types are read, not skipped).
BIN_FIXED = (-1, -1, 1, 1, 8, -1, 2, -1, 4, -1, 8, -1, -1, -1, -1, -1, 16)
CPT_FIXED = (-1, 0, 0, 1, -1, -1, -1, 8, -1, -1, -1, -1, -1, 16, -1, -1, -1)


def bin_fixed(ft):
    return BIN_FIXED[ft] if 0 <= ft <= 16 else -1


def cpt_fixed(ft):
    return CPT_FIXED[ft] if 0 <= ft <= 16 else -1


def give_up(r):
    """An exception's type that cannot be read is UNKNOWN, not an error: M_NEED stays
    (more may come), anything else is M_OK."""
    return M_NEED if r == M_NEED else M_OK


def exception_status(m, h, x, lim, fend):
    """EXCEPTION: the TApplicationException's type (field 2, i32) into m.status; a
    missing type (Node's), or a struct that cannot be walked, is 0 (UNKNOWN).  Returns
    M_NEED only while more of the frame may still come.

    Resumable: the walk starts at field x.i (x.last: the compact id before it) and,
    on M_NEED, leaves x at the field it could not finish, so the next call with more
    bytes goes on from there instead of from the struct's first field (a message
    split into many reads costs what it costs in one; issue 19)."""
    i = x.i
    last = x.last
    m.status = 0
    if m.ptype == P_PROTOBUF:                   # Kitex pbError: TypeID is field 1, varint
        r = chk(m, i + 1, lim, fend)
        if r:
            return give_up(r)
        if h[i] == 0x08:
            r, j = uvar(m, h, i + 1, lim, fend, 10)
            if r == M_NEED:
                return r
            if r == M_OK:
                m.status = i32(m.var)
        return M_OK
    while True:
        x.i = i                                 # the field to go on from
        x.last = last
        r = chk(m, i + 1, lim, fend)
        if r:
            return give_up(r)
        b = h[i]
        if m.ptype == P_BINARY:
            ft = b
            if ft == 0:
                return M_OK
            r = chk(m, i + 3, lim, fend)
            if r:
                return give_up(r)
            fid = be16_at(h, i + 1)
            i += 3
            if fid == 2 and ft == 8:
                r = chk(m, i + 4, lim, fend)
                if r:
                    return give_up(r)
                m.status = be32s_at(h, i)
                return M_OK
            if ft == 11:
                r = chk(m, i + 4, lim, fend)
                if r:
                    return give_up(r)
                n = be32s_at(h, i)
                if n < 0:
                    return M_OK
                i += 4 + n
            else:
                size = bin_fixed(ft)
                if size < 0:
                    return M_OK
                i += size
        else:
            ft = b & 0x0F
            if ft == 0:
                return M_OK
            i += 1
            if b >> 4:
                fid = last + (b >> 4)
            else:
                r, i = uvar(m, h, i, lim, fend, 3)
                if r:
                    return give_up(r)
                fid = unzigzag(m.var)
            last = fid
            if ft == 4 or ft == 5 or ft == 6 or ft == 8:
                r, i = uvar(m, h, i, lim, fend, 10)
                if r:
                    return give_up(r)
                if fid == 2 and ft == 5:
                    m.status = i32(unzigzag(m.var))
                    return M_OK
                if ft == 8:
                    big = lim + 0x7FFFFFFF          # past any frame: a length no walk follows
                    if m.var > big:
                        return M_OK
                    i += m.var
            else:
                size = cpt_fixed(ft)
                if size < 0:
                    return M_OK
                i += size


def walk_binary(m, h, lim, w):
    """Index after the binary-protocol struct that w's walk started (w.pos, w.sp = 0,
    w.cur = 12); -1 malformed, -2 more bytes needed (m.need), with w left where the walk
    stopped, so the call with more bytes goes on from there.  Only unframed messages
    need this: their end is where their struct ends.  It asks for the same bytes, and
    decides the same, as walking the value recursively (nesting past MAX_DEPTH is
    malformed).  w.stack[0 : w.sp] are the open levels (the outermost struct first):
    ft 12 struct, 13 map (left counts keys and values), 14 list or set; kt, vt the
    key / element and value types."""
    i = w.pos
    sp = w.sp
    t = w.cur
    stack = w.stack
    while True:
        if t >= 0:                              # the value of type t at i, depth sp
            if sp > MAX_DEPTH:
                return -1
            size = bin_fixed(t)
            if size >= 0:
                if i + size > lim:
                    m.need = i + size
                    break
                i += size
            elif t == 11:
                if i + 4 > lim:
                    m.need = i + 4
                    break
                n = be32s_at(h, i)
                if n < 0:
                    return -1
                if i + 4 + n > lim:
                    m.need = i + 4 + n
                    break
                i += 4 + n
            elif t == 12:
                stack[sp].ft = 12
                sp += 1
            elif t == 13:
                if i + 6 > lim:
                    m.need = i + 6
                    break
                n = be32s_at(h, i + 2)
                if n < 0:
                    return -1
                stack[sp].ft = 13
                stack[sp].kt = h[i]
                stack[sp].vt = h[i + 1]
                stack[sp].left = 2 * n
                sp += 1
                i += 6
            elif t == 14 or t == 15:
                if i + 5 > lim:
                    m.need = i + 5
                    break
                n = be32s_at(h, i + 1)
                if n < 0:
                    return -1
                stack[sp].ft = 14
                stack[sp].kt = h[i]
                stack[sp].left = n
                sp += 1
                i += 5
            else:
                return -1
            t = -1
        if sp == 0:
            return i                            # the message's struct ended
        top = sp - 1
        if stack[top].ft == 12:                 # a field header, or STOP
            if i + 1 > lim:
                m.need = i + 1
                break
            if h[i] == 0:
                i += 1
                sp -= 1
                continue
            if i + 3 > lim:
                m.need = i + 3
                break
            t = h[i]
            i += 3
        elif stack[top].left == 0:
            sp -= 1
        else:
            if sp <= MAX_DEPTH:                 # fixed-size elements: every whole one here
                if stack[top].ft == 13:
                    size = bin_fixed(stack[top].kt)
                    vs = bin_fixed(stack[top].vt)
                    if size > 0 and vs > 0 and not stack[top].left & 1:
                        k = (lim - i) // (size + vs)
                        if k > stack[top].left >> 1:
                            k = stack[top].left >> 1
                        i += k * (size + vs)
                        stack[top].left -= 2 * k
                else:
                    size = bin_fixed(stack[top].kt)
                    if size > 0:
                        k = (lim - i) // size
                        if k > stack[top].left:
                            k = stack[top].left
                        i += k * size
                        stack[top].left -= k
                if stack[top].left == 0:
                    sp -= 1
                    continue
            if stack[top].ft == 13:
                t = stack[top].kt if (stack[top].left & 1) == 0 else stack[top].vt
            else:
                t = stack[top].kt
            stack[top].left -= 1
    w.pos = i
    w.sp = sp
    w.cur = t
    return -2


# ---- the TTHeader / THeader info section --------------------------------------------

def xform(hi, t):
    """A transform id into hi.xform: one zlib is read (inflated); snappy, or zlib twice,
    is not; any other id is not either and is an error (hi.err)."""
    if t == ZLIB and hi.xform == X_NONE:
        hi.xform = X_ZLIB
    elif t == ZLIB or t == SNAPPY:
        hi.xform = X_OPAQUE                  # snappy, or zlib twice: not read
    else:
        hi.xform = X_OPAQUE
        hi.err = 1


def info_scan(hi, m, w, h, tt, end):
    """info_walk() of a whole info section without its key/values (the hot path)."""
    w.i = 0
    info_walk(hi, m, w, h, tt, end, False)


def info_walk(hi, m, w, h, tt, end, each):
    """The info section of the header h[14:end] (tt: Kitex TTHeader, u8 counts and u16
    lengths; else Apache THeader, varints), from where w stopped (w.i = 0: from its
    start, the protocol id and transforms into hi), TO_METHOD (INFO_INTKEYVALUE key 9)
    into hi.tom_off / tom_len; an error sets hi.err and ends the walk.  With each, the
    key/values found go to w's batch, k < the count returned: w.kid[k] INFO_KEYVALUE
    (key h[w.ko[k] : w.ko[k] + w.kl[k]]) or INFO_INTKEYVALUE (key w.key[k]), the value
    h[w.vo[k] : w.vo[k] + w.vl[k]]; a full batch (INFO_BATCH) means call again for more.
    Without each, returns 0 (the hot path only wants hi).

    Kitex (tt): a 0x00 id is padding wherever it is, the ACL token (0x11) one u16-length
    string, any other id an error (invalidInfoIDType).  Apache: padding or any id but
    INFO_KEYVALUE ends the infos (its Python and C++ libraries ignore the rest)."""
    i = w.i                                     # the walk's state in locals, stored
    left = w.left                               # back in w when a batch is full
    iid = w.iid
    n = 0
    if i == 0:
        i = TT_META
        if tt:
            hi.proto = h[i]
            nt = h[i + 1]
            i += 2
            if i + nt > end:
                hi.err = 1
                return n
            for k in range(nt):
                xform(hi, h[i + k])
            i += nt
        else:
            r, i = uvar(m, h, i, end, end, 5)
            if r:
                hi.err = 1
                return n
            hi.proto = m.var if m.var < 256 else 256
            r, i = uvar(m, h, i, end, end, 5)
            if r:
                hi.err = 1
                return n
            cnt = m.var
            c = 0
            while c < cnt:
                r, i = uvar(m, h, i, end, end, 5)
                if r:
                    hi.err = 1
                    return n
                xform(hi, m.var if m.var < 256 else 256)
                c += 1
        if not (hi.proto == PROTO_BINARY or hi.proto == PROTO_COMPACT or
                hi.proto == PROTO_PROTOBUF) or (not tt and hi.proto == PROTO_PROTOBUF):
            hi.err = 1
        left = 0
    while True:
        while left == 0:                        # the next block
            if i >= end:
                return n
            if tt:
                iid = h[i]
                i += 1
                if iid == 0:
                    continue                    # padding, wherever it is
                if iid == INFO_KEYVALUE or iid == INFO_INTKEYVALUE:
                    if i + 2 > end:
                        hi.err = 1
                        return n
                    left = be16_at(h, i)
                    i += 2
                elif iid == INFO_ACL_TOKEN:     # Kitex: one u16-length string
                    if i + 2 > end:
                        hi.err = 1
                        return n
                    i += 2 + be16_at(h, i)
                    if i > end:
                        hi.err = 1
                        return n
                else:
                    hi.err = 1                  # Kitex: invalid infoIDType
                    return n
            else:
                r, i = uvar(m, h, i, end, end, 5)
                if r:
                    hi.err = 1
                    return n
                if m.var != INFO_KEYVALUE:
                    return n                    # Apache: padding / unknown ends infos
                r, i = uvar(m, h, i, end, end, 5)
                if r:
                    hi.err = 1
                    return n
                iid = INFO_KEYVALUE
                left = m.var
        left -= 1
        key = ko = kl = 0
        if tt:
            if i + 2 > end:
                hi.err = 1
                return n
            key = be16_at(h, i)
            i += 2
            if iid == INFO_KEYVALUE:
                ko = i
                kl = key
                i += kl
            if i + 2 > end:
                hi.err = 1
                return n
            vl = be16_at(h, i)
            vo = i + 2
            i = vo + vl
            if i > end:
                hi.err = 1
                return n
            if iid == INFO_INTKEYVALUE and key == TO_METHOD:
                hi.tom_off = vo
                hi.tom_len = vl
        else:
            r, i = uvar(m, h, i, end, end, 5)
            room = end - i
            if r or m.var > room:
                hi.err = 1
                return n
            ko = i
            kl = m.var
            i += kl
            r, i = uvar(m, h, i, end, end, 5)
            room = end - i
            if r or m.var > room:
                hi.err = 1
                return n
            vo = i
            vl = m.var
            i += vl
        if each:
            w.kid[n] = iid
            w.key[n] = key
            w.ko[n] = ko
            w.kl[n] = kl
            w.vo[n] = vo
            w.vl[n] = vl
            n += 1
            if n == INFO_BATCH:
                w.i = i
                w.left = left
                w.iid = iid
                return n
