# cython: language_level=3
"""RabbitMQ Stream frame parser (compiled).  Twin: parser_py.py.

Frame (PROTOCOL.adoc "Frame Structure"): Size u32 (bytes after it), Key u16 (bit 15 =
response), Version u16, then CorrelationId u32 for request/response commands and, in
most responses, ResponseCode u16.  Publish, PublishConfirm and PublishError carry one
publishing id per entry, so their bodies stream through on_body() and every entry
is paired with its confirm by (publisher id, publishing id).  A Metadata response can
be captured whole and rewritten (address rewriting, see rewrite()).

A Publish entry (rabbit_stream_utils.erl write_messages/…) is ``PublishingId u64``,
[v2: ``FilterValue`` string], then a simple message ``0:1 Size:31 bytes`` or a
sub-entry batch ``1:1 Compression:3 Reserved:4 Count u16 Uncompressed u32 Size u32
bytes`` (rstream send_sub_entry, the Java client's subEntrySize): one publishing id,
one confirm, Count messages.  The real server takes batches in v1 only (its v2 clauses
have a filter value and a simple message; a v2 batch fails its function clause and
drops the connection); the layout is unambiguous, so a v2 batch is read the same way,
as codec.py and faults.py read it.  frametap_messages_total counts each entry's
messages once its type is known (1, or Count; a frame cut short counts the entries
it got to), and a batch's frame-log row has messages = Count.

While recording, the frame log's resource is the stream: requests that name one stream
their body through on_body() far enough to read it (constants.RESOURCE_PROGRAMS), and
DeclarePublisher / Subscribe remember it per publisher / subscription id (a lazily
allocated table of 512 names) so Publish, PublishConfirm, PublishError, Deliver and
Credit carry it too.  SASL frames are never read.
"""

from libc.stdint cimport uint8_t, uint16_t, int16_t, int32_t, uint32_t, int64_t, uint64_t
from libc.stdlib cimport malloc, calloc, free
from libc.string cimport memcpy

from proxy._framing cimport (FrameParser, RouteStats, C2S, S2C, OUTCOME_OK, OUTCOME_ERROR,
                             K_REQUEST, K_RESPONSE, K_ONEWAY, R_TOO_LARGE, R_TOO_SMALL,
                             R_BAD_HEADER, R_UNKNOWN, R_BAD_BODY, RESOURCE_MAX)
from proxy._framing cimport (want_header, stream_body, capture_frame, gather, protocol_error,
                             begin, add_messages, entry, set_corr, set_status, expect, take,
                             answer, set_resource)
from proxy._wire cimport be16, be32, be64, skip_some
from proxy.protocols.rabbitmq_stream.constants import COMMANDS as _KNOWN
from proxy.protocols.rabbitmq_stream.constants import (MAX_FRAME_BYTES, RESOURCE_OPS,
                                                       RESOURCE_PROGRAMS, command_name,
                                                       status_name)
from proxy.protocols.rabbitmq_stream.rewrite import MetadataRewriter

cdef enum:
    HDR = 8                    # Size + Key + Version
    K_PUBLISH = 2
    K_CONFIRM = 3
    K_ERROR = 4
    K_DELIVER = 8
    K_CREDIT = 9
    K_STORE_OFFSET = 10
    K_METADATA = 15
    K_METADATA_UPDATE = 16
    K_TUNE = 20
    K_HEARTBEAT = 23
    K_LAST = 28
    RESP = 0x8000
    ST_OK = 0x01
    ST_SASL_CHALLENGE = 0x0A
    ST_STREAM_ALREADY_EXISTS = 0x05
    K_CREATE = 13
    TAG_TUNE = 2               # map tags: 0/1 = direction of an RPC request,
    TAG_PUBLISHER = 256        # 2 = server's Tune, 256 + publisher id = a message
    # body states
    B_PUBID = 0
    B_COUNT = 1
    B_PID = 2
    B_FILTER_LEN = 3
    B_MSG_LEN = 4              # simple Size u32, or a batch's type, Count, 1 byte more
    B_CODE = 5
    B_SUB = 6                  # a batch's other 3 Uncompressed bytes + Size u32
    B_DONE = 7
    SUB_BIT = 0x80             # first bit of an entry: a sub-entry batch
    # resource reader (constants.RESOURCE_PROGRAMS; RESOURCE_OPS order)
    OP_END = 0
    OP_PUB = 1
    OP_SUB = 2
    OP_SKIP = 3
    OP_SKIP2 = 4
    OP_ONE = 5
    OP_STREAM = 6
    OP_RECALL = 7
    OP_FORGET = 8
    PROG_LEN = 4
    PH_FIELD = 0               # reading the op's fixed field
    PH_SKIP = 1                # passing over a string's bytes
    PH_NAME = 2                # the stream name's bytes
    SUB_SLOT = 256             # names[]: publisher ids 0..255, then subscription ids
    NAME_SLOTS = 512


# command -> its resource program (OP_END-terminated), from constants.RESOURCE_PROGRAMS
cdef uint8_t PROG[K_LAST + 1][PROG_LEN]
for _cmd, _ops in RESOURCE_PROGRAMS.items():
    for _i, _op in enumerate(_ops):
        PROG[_cmd][_i] = RESOURCE_OPS.index(_op)


cdef struct RRead:
    int cmd
    int step                   # index into PROG[cmd]; -1 done
    int phase
    int slot                   # names[] slot of the id read, -1 none
    int64_t pos                # body bytes read so far
    int64_t len                # body bytes of the frame
    int64_t skip
    Py_ssize_t want


cdef struct Body:
    int kind                   # K_PUBLISH / K_CONFIRM / K_ERROR
    int state
    int version
    int need                   # bytes of the fixed field being read
    int have                   # of those, held in buf (field split across reads)
    uint8_t buf[8]
    int64_t skip               # bytes to pass over (a message, a filter value)
    uint32_t left              # messages / ids still to read
    uint32_t pubid
    uint64_t pid
    int slot                   # opcode slot of this frame (unused)


cdef inline bint normal_flow(int cmd, int code) noexcept:
    """Answers of a normal flow count as outcome ok (the status label keeps the code):
    OK, a SASL challenge, and Create answered STREAM_ALREADY_EXISTS (clients declare
    their streams on every start, as RocketMQ clients pull from empty queues)."""
    return (code == ST_OK or code == ST_SASL_CHALLENGE
            or (cmd == K_CREATE and code == ST_STREAM_ALREADY_EXISTS))


cdef inline int header_need(int key, int version) noexcept:
    """Header bytes a frame must show before it can be counted and correlated."""
    cdef int cmd = key & 0x7FFF
    if cmd == 0 or cmd > K_LAST:
        return HDR
    if key & RESP:
        if cmd == K_CREDIT:
            return HDR + 2                     # ResponseCode (no correlation id)
        if cmd == K_TUNE:
            return HDR + 8
        if cmd == K_METADATA:
            return HDR + 4                     # CorrelationId, no ResponseCode
        return HDR + 6                         # CorrelationId + ResponseCode
    if cmd == K_PUBLISH or cmd == K_CONFIRM or cmd == K_ERROR:
        return HDR                             # the body streams through on_body()
    if cmd == K_DELIVER:                       # SubscriptionId, [CommittedChunkId v2],
        return HDR + 1 + (8 if version >= 2 else 0) + 8   # chunk header to NumRecords
    if cmd == K_TUNE:
        return HDR + 8                         # FrameMax, Heartbeat
    if (cmd == K_CREDIT or cmd == K_STORE_OFFSET or cmd == K_HEARTBEAT
            or cmd == K_METADATA_UPDATE):
        return HDR                             # one-way commands
    return HDR + 4                             # CorrelationId


cdef class StreamParser(FrameParser):
    """Counts, sizes and correlates the RabbitMQ Stream frames of one proxied connection."""

    cdef Body b[2]
    cdef int64_t tuned_max                 # frame max the client agreed in Tune (0: none)
    cdef public object local_address       # (host, port) the client connected to
    cdef public object upstream_address    # (host, port) of the route's upstream
    cdef object rewriter                   # MetadataRewriter, or None
    cdef RRead rr[2]                       # resource reader per direction (recording only)
    cdef bint reading[2]                   # this frame's body goes to the resource reader
    cdef uint8_t** names                   # NAME_SLOTS of (u16 length + name) or NULL; lazy

    def __init__(self, RouteStats stats, max_frame_bytes=None, request_timeout=30.0,
                 options=None):
        self.header_size = 4
        self.max_frame_bytes = MAX_FRAME_BYTES
        stats.describe(command_name, status_name, _KNOWN)   # once per route
        FrameParser.__init__(self, stats, max_frame_bytes, request_timeout, options)
        self.rewriter = MetadataRewriter.from_options(self.options)
        if self.rewriter is not None:
            self.set_hold(S2C, True)

    def __dealloc__(self):
        cdef int i
        if self.names is not NULL:
            for i in range(NAME_SLOTS):
                free(self.names[i])
            free(self.names)

    cdef int64_t on_header(self, int d, const uint8_t* h, Py_ssize_t avail) except -2:
        cdef RouteStats st = self.stats
        cdef uint32_t size = be32(h)
        cdef int64_t total = <int64_t>size + 4
        cdef int key, cmd, version, slot, need, kind
        cdef uint32_t corr
        cdef int code
        if size > self.max_frame_bytes:
            self.fail(d, R_TOO_LARGE, "frame size %d at offset %d exceeds the limit %d" % (
                size, self.st[d].frame_start, self.max_frame_bytes))
            return -1
        if size < 4:                           # no room for Key + Version: skip it
            protocol_error(self, d, R_TOO_SMALL)
            return total
        if avail < HDR:
            return want_header(self, d, HDR)
        key = be16(h + 4)
        version = be16(h + 6)
        cmd = key & 0x7FFF
        need = header_need(key, version)
        if need <= total and avail < need:     # decide only once the fields are here
            return want_header(self, d, need)
        # from here on: exactly once per frame
        if key & RESP or cmd == K_CONFIRM or cmd == K_ERROR or (cmd == K_TUNE and d == C2S):
            kind = K_RESPONSE
        elif cmd == K_PUBLISH or (cmd == K_TUNE and d == S2C) or need == HDR + 4:
            kind = K_REQUEST
        else:
            kind = K_ONEWAY
        begin(self, d, st.slot_for(cmd), kind, total, need if need <= total else HDR)
        if self.tuned_max and total > self.tuned_max:
            protocol_error(self, d, R_TOO_LARGE)   # the server closes such a connection
        if cmd == 0 or cmd > K_LAST:
            protocol_error(self, d, R_UNKNOWN)
            return total
        if need > total:                       # too short for its own fixed fields
            protocol_error(self, d, R_BAD_HEADER)
            return total
        if not key & RESP:
            if cmd == K_PUBLISH or cmd == K_CONFIRM or cmd == K_ERROR:
                self._start_body(d, cmd, version)
                stream_body(self, d, HDR)       # the body starts after Key + Version
            elif cmd == K_DELIVER:             # chunk header's NumRecords ends at need
                add_messages(self, d, be32(h + need - 4))
                if self.recording:
                    self._recall(d, SUB_SLOT + h[HDR])
            elif cmd == K_TUNE:
                self._tune(d, h)
            else:
                if need == HDR + 4:            # a request with a correlation id
                    expect(self, d, d, be32(h + HDR), -1)
                if self.recording and PROG[cmd][0] != OP_END:
                    self._start_read(d, cmd, total - need)
                    stream_body(self, d, need)  # the stream name is in the body
            return total
        if cmd == K_CREDIT:                    # ResponseCode u16, SubscriptionId u8
            code = be16(h + HDR)
            set_status(self, d, code, OUTCOME_OK if code == ST_OK else OUTCOME_ERROR)
            return total
        if cmd == K_TUNE:
            self._tune(d, h)
            return total
        corr = be32(h + HDR)
        code = ST_OK if cmd == K_METADATA else be16(h + HDR + 4)
        take(self, d, 1 - d, corr)              # the request went the other way
        answer(self, d, code, OUTCOME_OK if normal_flow(cmd, code) else OUTCOME_ERROR)
        if self.st[d].rec.corr_fmt == 0:
            set_corr(self, d, corr, -1)
        if cmd == K_METADATA and d == S2C and self.rewriter is not None:
            capture_frame(self, d)
        return total

    cdef int _tune(self, int d, const uint8_t* h) except -1:
        """The server proposes Tune (a request, s2c); the client's Tune answers it."""
        cdef uint32_t frame_max
        if d == S2C:
            expect(self, d, TAG_TUNE, 0, -1)
        else:
            frame_max = be32(h + HDR)
            if frame_max:
                self.tuned_max = frame_max
            if take(self, d, TAG_TUNE, 0) >= 0:
                answer(self, d, ST_OK, OUTCOME_OK)
        return 0

    # ---- the frame log's resource: the stream (recording only) ----------------------

    cdef void _start_read(self, int d, int cmd, int64_t body_len) noexcept:
        cdef RRead* r = &self.rr[d]
        r.cmd = cmd
        r.step = 0
        r.phase = PH_FIELD
        r.slot = -1
        r.pos = 0
        r.len = body_len
        r.skip = 0
        self.reading[d] = 1

    cdef void _remember(self, int slot, const uint8_t* p, Py_ssize_t n) noexcept:
        """names[slot] = p[:n] (n <= RESOURCE_MAX); on no memory the slot is just empty."""
        cdef uint8_t* e
        if self.names is NULL:
            self.names = <uint8_t**>calloc(NAME_SLOTS, sizeof(uint8_t*))
            if self.names is NULL:
                return
        free(self.names[slot])
        e = <uint8_t*>malloc(2 + n)
        self.names[slot] = e
        if e is NULL:
            return
        e[0] = <uint8_t>(n >> 8)
        e[1] = <uint8_t>n
        memcpy(e + 2, p, n)

    cdef void _recall(self, int d, int slot) noexcept:
        """The current frame's resource is the stream remembered for slot, if any."""
        cdef uint8_t* e
        if self.names is NULL:
            return
        e = self.names[slot]
        if e is not NULL:
            set_resource(self, d, e + 2, (e[0] << 8) | e[1])

    cdef void _next_op(self, int d, RRead* r) noexcept:
        """Step to the next op; the ones that read nothing run at once."""
        cdef int op
        r.step += 1
        r.phase = PH_FIELD
        op = PROG[r.cmd][r.step]
        if op == OP_RECALL or op == OP_FORGET:
            if r.slot >= 0:
                self._recall(d, r.slot)
                if op == OP_FORGET and self.names is not NULL:
                    free(self.names[r.slot])
                    self.names[r.slot] = NULL
            r.step = -1
        elif op == OP_END:
            r.step = -1

    cdef int _read(self, int d, const uint8_t* p, Py_ssize_t n) except -1:
        """A stream-naming request's body, in pieces: walk its program to the stream."""
        cdef RRead* r = &self.rr[d]
        cdef Py_ssize_t i = 0, used = 0, want
        cdef int64_t take, v
        cdef int op
        cdef const uint8_t* f
        while i < n and r.step >= 0:
            if r.phase == PH_SKIP:
                take = skip_some(&r.skip, n - i)
                r.pos += take
                i += take
                if r.skip == 0:
                    self._next_op(d, r)
                continue
            op = PROG[r.cmd][r.step]
            if r.phase == PH_NAME:
                want = r.want
            elif op == OP_PUB or op == OP_SUB:
                want = 1
            elif op == OP_ONE:
                want = 4
            else:
                want = 2                       # a string's length, or skip2
            if r.pos + want > r.len:
                r.step = -1                    # the field runs past the frame: no resource
                break
            if gather(self, d, p + i, n - i, want, &f, &used) <= 0:
                return 0                       # the rest of the field is in the next piece
            i += used
            r.pos += want
            if r.phase == PH_NAME:
                set_resource(self, d, f, want)
                if r.slot >= 0:
                    self._remember(r.slot, f, want)
                r.step = -1
            elif op == OP_PUB:
                r.slot = f[0]
                self._next_op(d, r)
            elif op == OP_SUB:
                r.slot = SUB_SLOT + f[0]
                self._next_op(d, r)
            elif op == OP_ONE:
                if be32(f) == 1:
                    self._next_op(d, r)
                else:
                    r.step = -1
            elif op == OP_SKIP2:
                self._next_op(d, r)
            else:
                v = <int16_t>be16(f)
                if op == OP_SKIP and v == -1:
                    v = 0                      # a null reference
                if v < 0 or r.pos + v > r.len:
                    r.step = -1                # null stream, or cut short: none
                elif op == OP_SKIP:
                    if v:
                        r.skip = v
                        r.phase = PH_SKIP
                    else:
                        self._next_op(d, r)
                elif v == 0:
                    set_resource(self, d, f, 0)
                    if r.slot >= 0:
                        self._remember(r.slot, f, 0)
                    r.step = -1
                else:
                    r.want = v if v < RESOURCE_MAX else RESOURCE_MAX
                    r.phase = PH_NAME
        return 0

    cdef int _start_body(self, int d, int kind, int version) except -1:
        cdef Body* b = &self.b[d]
        b.kind = kind
        b.version = version
        b.state = B_PUBID
        b.need = 1
        b.have = 0
        b.skip = 0
        b.left = 0
        return 0

    cdef int on_body(self, int d, const uint8_t* p, Py_ssize_t n) except -1:
        cdef Body* b = &self.b[d]
        cdef Py_ssize_t i = 0, take
        cdef const uint8_t* f
        if self.reading[d]:
            return self._read(d, p, n)
        while i < n:
            if b.skip > 0:
                i += skip_some(&b.skip, n - i)
                continue
            if b.state == B_PID and b.have == 0:
                i = self._entries(d, b, p, i, n)   # whole entries in place, no copying
                continue
            if b.state == B_DONE:
                b.state = B_DONE + 1           # bytes after the declared entries
                break
            if b.state > B_DONE:
                break
            if b.have == 0 and n - i >= b.need:
                f = p + i                      # field contiguous: read in place
                i += b.need
            else:
                take = b.need - b.have
                if take > n - i:
                    take = n - i
                memcpy(b.buf + b.have, p + i, take)
                b.have += take
                i += take
                if b.have < b.need:
                    break
                b.have = 0
                f = b.buf
            self._field(d, b, f)
        return 0

    cdef Py_ssize_t _entries(self, int d, Body* b, const uint8_t* p, Py_ssize_t i,
                             Py_ssize_t n) except -1:
        """Fast path of _field() for entries lying whole in this read; returns the new i.

        Stops (leaving the state machine exactly where _field() would) at the first
        entry that does not fit, at a Publish v2 filter value, or when done.
        """
        cdef uint32_t mlen, sub
        cdef int32_t tag = TAG_PUBLISHER + b.pubid
        cdef uint64_t simple = 0
        if b.kind == K_PUBLISH:
            if b.version >= 2:
                return self._field_at(d, b, p, i, n)
            while b.left and n - i >= 12:
                mlen = be32(p + i + 8)
                sub = mlen & (<uint32_t>SUB_BIT << 24)     # a sub-entry batch
                if sub and n - i < 19:
                    break                      # its header is split: the general path
                entry(self, d)
                expect(self, d, tag, be64(p + i), b.pubid)
                if sub:
                    self._messages(d, be16(p + i + 9))
                    mlen = be32(p + i + 15)
                    i += 19
                else:
                    simple += 1                # rows already say 1: the counter at the end
                    i += 12
                b.left -= 1
                if n - i >= mlen:
                    i += mlen
                else:
                    b.skip = mlen - (n - i)
                    i = n
            if simple:
                self.c.messages[d][self.st[d].rec.slot] += simple
            b.state = B_PID if b.left else B_DONE
            if b.left and n - i > 0 and b.skip == 0:
                return self._field_at(d, b, p, i, n)
            return i
        if b.kind == K_CONFIRM:
            while b.left and n - i >= 8:
                entry(self, d)
                self._confirm(d, tag, be64(p + i), b.pubid)
                i += 8
                b.left -= 1
            b.state = B_PID if b.left else B_DONE
            if b.left and n - i > 0:
                return self._field_at(d, b, p, i, n)
            return i
        return self._field_at(d, b, p, i, n)

    cdef Py_ssize_t _field_at(self, int d, Body* b, const uint8_t* p, Py_ssize_t i,
                              Py_ssize_t n) except -1:
        """One fixed field by the general path (copying it when split); returns new i."""
        cdef Py_ssize_t take = b.need - b.have
        if take > n - i:
            take = n - i
        memcpy(b.buf + b.have, p + i, take)
        b.have += take
        i += take
        if b.have == b.need:
            b.have = 0
            self._field(d, b, b.buf)
        return i

    cdef inline void _confirm(self, int d, int32_t tag, uint64_t pid, uint32_t pubid) noexcept:
        take(self, d, tag, pid)
        answer(self, d, ST_OK, OUTCOME_OK)
        if self.st[d].rec.corr_fmt == 0:
            set_corr(self, d, pid, pubid)

    cdef int _field(self, int d, Body* b, const uint8_t* f) except -1:
        cdef int16_t flen
        cdef int code
        if b.state == B_PUBID:
            b.pubid = f[0]
            b.state = B_COUNT
            b.need = 4
            if self.recording:                 # every row carries the publisher's stream
                self._recall(d, b.pubid)
        elif b.state == B_COUNT:
            b.left = be32(f)
            b.state = B_PID if b.left else B_DONE
            b.need = 8
        elif b.state == B_PID:
            b.pid = be64(f)
            if b.kind == K_PUBLISH:
                entry(self, d)
                expect(self, d, TAG_PUBLISHER + b.pubid, b.pid, b.pubid)
                if b.version >= 2:
                    b.state = B_FILTER_LEN
                    b.need = 2
                else:
                    b.state = B_MSG_LEN
                    b.need = 4
            elif b.kind == K_CONFIRM:
                entry(self, d)
                self._confirm(d, TAG_PUBLISHER + b.pubid, b.pid, b.pubid)
                self._next_entry(b)
            else:
                b.state = B_CODE
                b.need = 2
        elif b.state == B_FILTER_LEN:
            flen = <int16_t>be16(f)
            if flen > 0:
                b.skip = flen
            b.state = B_MSG_LEN
            b.need = 4
        elif b.state == B_MSG_LEN:
            if f[0] & SUB_BIT:
                self._messages(d, be16(f + 1))
                b.state = B_SUB
                b.need = 7
            else:
                self._messages(d, 1)
                b.skip = be32(f)
                self._next_entry(b)
        elif b.state == B_SUB:
            b.skip = be32(f + 3)
            self._next_entry(b)
        elif b.state == B_CODE:
            code = be16(f)
            entry(self, d)
            take(self, d, TAG_PUBLISHER + b.pubid, b.pid)
            answer(self, d, code, OUTCOME_ERROR)
            if self.st[d].rec.corr_fmt == 0:
                set_corr(self, d, b.pid, b.pubid)
            self._next_entry(b)
        return 0

    cdef inline void _messages(self, int d, uint32_t n) noexcept:
        """The current Publish entry carries n messages: the counter, and its row."""
        self.c.messages[d][self.st[d].rec.slot] += n
        self.st[d].rec.messages = n

    cdef inline void _next_entry(self, Body* b) noexcept:
        b.left -= 1
        b.state = B_PID if b.left else B_DONE
        b.need = 8

    cdef int on_body_end(self, int d) except -1:
        cdef Body* b = &self.b[d]
        if self.reading[d]:
            self.reading[d] = 0                # a resource read never counts an error
            return 0
        if b.state != B_DONE or b.skip > 0 or b.have:
            protocol_error(self, d, R_BAD_BODY)  # the frame ended before its entries did
        return 0

    def rewrite(self, int d, bytes frame):
        """Re-frame a Metadata response with broker addresses mapped to frametap listeners."""
        return self.rewriter.rewrite(frame, self.local_address, self.upstream_address,
                                     self.stats)
