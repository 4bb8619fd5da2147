"""fleximq frame parser, pure-Python twin of _parser.pyx (same behaviour, same API).

The header is summarized with ``msgpack`` (header.summarize), which the compiled
parser's in-place scanner must agree with.
"""

from proxy.framing_common import (R_BAD_HEADER, R_BAD_VERSION, R_HEADER_TOO_LARGE, R_HEADER_RULE,
                                  R_TOO_LARGE, R_UNKNOWN, K_REQUEST, K_RESPONSE, K_ONEWAY,
                                  OUTCOME_OK, OUTCOME_ERROR)
from proxy.framing_py import FrameParser
from proxy.protocols.fleximq.header import (JOIN, REQ, REP, NOTIF, BCAST, PUB, PING, PONG,
                                            STATUS, summarize, rule_violation)
from proxy.protocols.fleximq.constants import (PREFIX, MAX_HEADER_BYTES, MAX_FRAME_BYTES,
                                           VERSION, INVALID_STATUS, TAG_JOIN, TAG_PING,
                                           PING_DUP_MAX, opcode_name, status_name, id_key)

MESSAGE_TYPES = (REQ, REP, NOTIF, BCAST, PUB)     # frames that carry one message


class FlexiMQParser(FrameParser):
    """Counts, sizes and correlates the fleximq frames of one connection."""

    header_size = PREFIX
    max_frame_bytes = MAX_FRAME_BYTES

    def __init__(self, stats, max_frame_bytes=None, request_timeout=30.0, options=None):
        stats.describe(opcode_name, status_name, range(10))
        super().__init__(stats, max_frame_bytes, request_timeout, options)
        self.header_limit = PREFIX + MAX_HEADER_BYTES
        # per direction a PING travelled: [timestamp or None, PINGs sent, PONGs matched]
        self.pings = [[None, 0, 0], [None, 0, 0]]

    def on_header(self, d, h, avail):
        version, mtype = h[0], h[1]
        cid = int.from_bytes(h[2:6], "big")
        hlen = int.from_bytes(h[22:26], "big")
        plen = int.from_bytes(h[26:34], "big")
        start = self.st[d].frame_start
        if hlen > MAX_HEADER_BYTES:
            self.fail(d, R_HEADER_TOO_LARGE, "header length %d at offset %d exceeds the "
                      "limit %d" % (hlen, start, MAX_HEADER_BYTES))
            return -1
        total = PREFIX + hlen + plen
        if total > self.max_frame_bytes:
            self.fail(d, R_TOO_LARGE, "frame of %d bytes at offset %d exceeds the limit %d"
                      % (total, start, self.max_frame_bytes))
            return -1
        hb = PREFIX + hlen
        if version != VERSION or mtype > PONG:
            self.protocol_error(d, R_BAD_VERSION if version != VERSION else R_UNKNOWN)
            self.begin(d, self.stats.slot_for(mtype), K_ONEWAY, total, hb)
            if self.recording:
                self.add_attr(d, b"client_id", b"%d" % cid)
            return total
        if avail < hb:
            return self.want_header(d, hb)
        self._frame(d, mtype, cid, summarize(h[PREFIX:hb]), total, hb)
        return total

    def _frame(self, d, t, cid, s, total, hb):
        slot = self.stats.slot_for(t)
        if s.malformed:
            self.begin(d, slot, K_ONEWAY, total, hb)
            self.protocol_error(d, R_BAD_HEADER)
            if self.recording:
                self.add_attr(d, b"client_id", b"%d" % cid)
            return
        if s.badtype:
            self.protocol_error(d, R_BAD_HEADER)
        join_answer = False
        key = id_key(s.rr_id) if s.rr_id is not None else 0
        if (t == REQ and s.rr_id is not None) or t == JOIN:
            self.begin(d, slot, K_REQUEST, total, hb)
            self.expect(d, d if t == REQ else TAG_JOIN + d, key, -1)
            self.set_corr_str(d, s.rr_id)                        # reqrep.id, or null
        elif t == REP:
            req = -1
            if s.rr_id is not None:
                req = self.take(d, 1 - d, key)
            if req < 0:
                req = self.take(d, TAG_JOIN + 1 - d, key)
                join_answer = req >= 0
            self.begin(d, slot, K_RESPONSE, total, hb)
            if not s.present & STATUS:
                status = 200
            elif s.badtype & STATUS:
                status = INVALID_STATUS
            else:
                status = s.status
            self.answer(d, status, OUTCOME_OK if 200 <= status <= 299 else OUTCOME_ERROR)
            self.set_corr_str(d, s.rr_id)
        elif t == PING and s.has_ts:
            p = self.pings[d]
            if p[0] != s.ts:
                p[0], p[1], p[2] = s.ts, 0, 0
            k = p[1]
            if p[1] < PING_DUP_MAX:
                p[1] += 1
            self.begin(d, slot, K_REQUEST, total, hb)
            self.expect(d, TAG_PING + d + 2 * k, s.ts, -1)
            if self.recording:
                self.set_corr_str(d, b"%d" % s.ts, b"ping:")
        elif t == PONG:
            req = -1
            if s.has_ts:
                p = self.pings[1 - d]
                k = 0
                if p[0] == s.ts and p[2] < p[1]:
                    k = p[2]
                    p[2] += 1
                req = self.take(d, TAG_PING + 1 - d + 2 * k, s.ts)
            self.begin(d, slot, K_RESPONSE, total, hb)
            self.answer(d, 200, OUTCOME_OK)
            if s.has_ts and self.recording:
                self.set_corr_str(d, b"%d" % s.ts, b"ping:")
        else:
            self.begin(d, slot, K_ONEWAY, total, hb)
        if t in MESSAGE_TYPES:
            self.add_messages(d, 1)
        if rule_violation(t, cid, s, join_answer):
            self.protocol_error(d, R_HEADER_RULE)
        if self.recording:
            self._record(d, cid, s)

    def _record(self, d, cid, s):
        """Frame-log resource (topic, else routing[0].path) and attrs (the base header's
        ClientID, the routing targets; the reqrep.id is the row's correlation_id).  Never
        anything from ``auth``."""
        if s.topic is not None:
            self.set_resource(d, s.topic)
        elif s.path is not None:
            self.set_resource(d, s.path)
        self.add_attr(d, b"client_id", b"%d" % cid)
        if s.targets:
            self.add_attr(d, b"targets", b",".join(b"%d" % c for c in s.targets))
