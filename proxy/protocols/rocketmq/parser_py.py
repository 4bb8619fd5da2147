"""RocketMQ remoting frame parser, pure-Python twin of _parser.pyx (same behaviour, same API)."""

import struct

from proxy.framing_common import (S2C, R_OVERFLOW, R_TOO_LARGE, R_TOO_SMALL, R_BAD_HEADER,
                                  R_BAD_BODY, K_REQUEST, K_RESPONSE, K_ONEWAY, OUTCOME_OK,
                                  OUTCOME_ERROR, skip_some)
from proxy.framing_py import CORR_HI_SIGNED, FrameParser
from proxy.protocols.rocketmq import jsonscan
from proxy.protocols.rocketmq.constants import MAX_FRAME_BYTES
from proxy.protocols.rocketmq.options import (MAX_HEADER_BYTES, UNDECODABLE,
                                              UNMATCHED_RESPONSE, RouteRewriter, known_codes,
                                              frame_opcode_name, new_route_requests,
                                              remember_route_request,
                                              response_status_name)

HDR = 8
F_RESPONSE, F_ONEWAY = 1, 2
SEND_MESSAGE, PULL_MESSAGE, GET_ROUTEINFO_BY_TOPIC = 10, 11, 105
SEND_MESSAGE_V2, SEND_BATCH_MESSAGE, SEND_REPLY_MESSAGE_V2 = 310, 320, 325
SHORT_KEY_CODES = (SEND_MESSAGE_V2, SEND_BATCH_MESSAGE, SEND_REPLY_MESSAGE_V2)
P_HEADER, P_SKIP, P_MESSAGES = 0, 1, 2
# SUCCESS, and normal-flow answers: PULL_NOT_FOUND, PULL_RETRY_IMMEDIATELY, QUERY_NOT_FOUND
OK_CODES = (0, 19, 20, 22)


class _R:
    __slots__ = ("hlen", "stype", "phase", "total", "wskip", "wbuf")

    def __init__(self):
        self.hlen = 0
        self.stype = 0
        self.phase = P_HEADER
        self.total = 0
        self.wskip = 0
        self.wbuf = bytearray()


class RocketMQParser(FrameParser):
    """Counts, sizes and correlates the RocketMQ remoting frames of one connection."""

    header_size = HDR
    max_frame_bytes = MAX_FRAME_BYTES

    def __init__(self, stats, max_frame_bytes=None, request_timeout=30.0, options=None):
        stats.describe(frame_opcode_name, response_status_name, known_codes())   # once per route
        super().__init__(stats, max_frame_bytes, request_timeout, options)
        self.max_header_bytes = self.options.get("max_header_bytes", MAX_HEADER_BYTES)
        self.header_limit = max(self.max_header_bytes, HDR)
        self.includes_self = self.options.get("length_includes_self", False)
        self.rewriter = RouteRewriter.from_options(self.options)
        self.route_pending = 0
        self.route_opaques = new_route_requests()   # opaque -> None, oldest first
        self.local_address = None
        self.upstream_address = None
        self.r = (_R(), _R())
        if self.rewriter is not None:
            self.set_hold(S2C, True)

    def on_header(self, d, h, avail):
        length, hw = struct.unpack_from(">II", bytes(h[:8]))
        total = length if self.includes_self else length + 4
        hlen, stype = hw & 0xFFFFFF, hw >> 24
        start = self.st[d].frame_start
        if total > self.max_frame_bytes:
            self.fail(d, R_TOO_LARGE, "frame length %d at offset %d exceeds the limit %d" % (
                total, start, self.max_frame_bytes))
            return -1
        if total < HDR:
            self.fail(d, R_TOO_SMALL, "frame length %d at offset %d is below the 8-byte minimum"
                      " (is length_includes_self set right?)" % (total, start))
            return -1
        if stype not in (0, 1):
            self.fail(d, R_BAD_HEADER, "serialization type %d at offset %d (expected 0 JSON or "
                      "1 ROCKETMQ)" % (stype, start))
            return -1
        if hlen > total - HDR:
            self.fail(d, R_BAD_HEADER, "header length %d at offset %d is larger than the frame "
                      "(%d bytes)" % (hlen, start, total))
            return -1
        if hlen > self.max_header_bytes:
            self.fail(d, R_TOO_LARGE, "header length %d at offset %d exceeds the limit %d" % (
                hlen, start, self.max_header_bytes))
            return -1
        r = self.r[d]
        r.hlen, r.stype, r.total, r.phase = hlen, stype, total, P_HEADER
        if d == S2C and self.route_pending and self.rewriter is not None:
            self.capture_frame(d)              # maybe route data: rewrite() decides
            return total
        self.stream_body(d, HDR)
        if hlen == 0:
            self._header(d, b"")
        return total

    def on_body(self, d, chunk):
        r = self.r[d]
        i = 0
        if r.phase == P_HEADER:
            h, i = self.gather(d, chunk, r.hlen)
            if h is None:
                return
            self._header(d, bytes(h))
        if r.phase == P_MESSAGES and i < len(chunk):
            self._walk(d, chunk[i:])

    def _walk(self, d, chunk):
        r = self.r[d]
        i, n = 0, len(chunk)
        while i < n:
            if r.wskip > 0:
                take, r.wskip = skip_some(r.wskip, n - i)
                i += take
                continue
            take = min(4 - len(r.wbuf), n - i)
            r.wbuf += chunk[i:i + take]
            i += take
            if len(r.wbuf) < 4:
                break
            size = int.from_bytes(r.wbuf, "big")
            r.wbuf = bytearray()
            if size < 4:
                r.phase = P_SKIP
                self.protocol_error(d, R_BAD_BODY)
                return
            self.add_messages(d, 1)
            r.wskip = size - 4

    def on_body_end(self, d):
        r = self.r[d]
        if r.phase == P_MESSAGES and (r.wskip > 0 or r.wbuf):
            self.protocol_error(d, R_BAD_BODY)

    def _header(self, d, h):
        st = self.stats
        r = self.r[d]
        r.phase = P_SKIP
        try:
            if r.stype == 1:
                if len(h) < 13:
                    raise ValueError("short binary header")
                code = int.from_bytes(h[0:2], "big")
                opaque = int.from_bytes(h[5:9], "big", signed=True)
                flag = int.from_bytes(h[9:13], "big", signed=True)
            else:
                code, opaque, flag = jsonscan.scan(h)
        except ValueError:
            self._bad_header(d)
            return
        opaque = ((opaque + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)   # i32: the id clients log
        code = ((code + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)     # as the C int
        flag = ((flag + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)
        outcome = OUTCOME_OK if code in OK_CODES else OUTCOME_ERROR
        hb = HDR + r.hlen
        if flag & F_RESPONSE:
            # A response answers a request that went the other way.  A c2s frame with
            # flag 1 that answers nothing is a Go client's oneway request
            # (docs/design.md, "RocketMQ remoting").
            slot = self.take(d, 1 - d, opaque)
            if slot >= 0:                      # counted under the request's opcode
                self.begin(d, slot, K_RESPONSE, r.total, hb)
                self.answer(d, code, outcome)
                req_code = st.slot_opcode(slot)
                if req_code == GET_ROUTEINFO_BY_TOPIC and self.route_pending:
                    self.route_pending -= 1
                if req_code == PULL_MESSAGE and code == 0:
                    self._start_walk(d)
                return
            if d == S2C or flag & F_ONEWAY:
                self.begin(d, st.slot_for(UNMATCHED_RESPONSE), K_RESPONSE, r.total, hb)
                self.answer(d, code, outcome)
                self.set_corr(d, opaque, CORR_HI_SIGNED)
                return
            flag = F_ONEWAY                    # Go's oneway request
        self.begin(d, st.slot_for(code), K_ONEWAY if flag & F_ONEWAY else K_REQUEST,
                   r.total, hb)
        if self.recording:
            self._topic(d, h, code)
        if code in (SEND_MESSAGE, SEND_MESSAGE_V2):
            self.add_messages(d, 1)
        elif code == SEND_BATCH_MESSAGE:
            self._start_walk(d)
        if flag & F_ONEWAY:
            self.set_corr(d, opaque, CORR_HI_SIGNED)
        elif code == GET_ROUTEINFO_BY_TOPIC and d == 0 and self.rewriter is not None:
            overflows = self.stats.errors[d][R_OVERFLOW]
            self.expect(d, d, opaque, CORR_HI_SIGNED)
            self.route_pending += 1
            if remember_route_request(self.route_opaques, opaque & 0xFFFFFFFF):
                self.route_pending -= 1            # the oldest will never be rewritten:
                if self.stats.errors[d][R_OVERFLOW] == overflows:   # one count a request
                    self.protocol_error(d, R_OVERFLOW)
        else:
            self.expect(d, d, opaque, CORR_HI_SIGNED)

    def _topic(self, d, h, code):
        """The request's topic as its frame-log resource: extFields ``topic``, or ``b``
        in the short-key header of SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE /
        SEND_REPLY_MESSAGE_V2 (SendMessageRequestHeaderV2)."""
        key = b"b" if code in SHORT_KEY_CODES else b"topic"
        if self.r[d].stype == 1:
            t = jsonscan.binary_topic(h, key)
        else:
            t = jsonscan.topic(h, key)
        if t is not None:
            self.set_resource(d, t)

    def _start_walk(self, d):
        r = self.r[d]
        r.phase, r.wskip, r.wbuf = P_MESSAGES, 0, bytearray()

    def _bad_header(self, d):
        self.begin(d, self.stats.slot_for(UNDECODABLE), K_ONEWAY, self.r[d].total,
                   HDR + self.r[d].hlen)
        self.protocol_error(d, R_BAD_HEADER)

    def rewrite(self, d, frame):
        r = self.r[d]
        self._header(d, frame[HDR:HDR + r.hlen])
        if r.phase == P_MESSAGES:
            self._walk(d, frame[HDR + r.hlen:])
            self.on_body_end(d)
        return self.rewriter.rewrite(frame, self.route_opaques, self.includes_self, self.stats)
