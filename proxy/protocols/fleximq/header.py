"""What the proxy reads from a fleximq MessagePack header, decoded with ``msgpack``.

This is the reference: the pure-Python parser uses it for every frame, the compiled
parser falls back to it for anything its in-place scanner leaves alone (extension
types, keys that are containers, known keys given twice, nesting deeper than 32), and
the property test holds the scanner to it (docs/design.md, "fleximq").

``summarize(header) -> Summary``; the header is well formed when it decodes as one
MessagePack value (nothing after it, every string valid UTF-8) that is a map.  Of that
map only the six keys of the document's §2.2.1 matter, and of their values only what the
proxy counts, correlates or logs.  ``auth`` is checked to be a map and never read further:
no secret leaves the header.
"""

from typing import NamedTuple

import msgpack

from proxy.protocols.fleximq.constants import (  # noqa: F401  (codec and server read them here)
    JOIN, REQ, REP, NOTIF, BCAST, PUB, SUB, UNSUB, PING, PONG, TYPE_NAMES)

# Header keys, as bits of Summary.present / Summary.badtype.
ROUTING, REQREP, TOPIC, STATUS, AUTH, KEEPALIVE = 1, 2, 4, 8, 16, 32
KEYS = (("routing", ROUTING), ("reqrep", REQREP), ("topic", TOPIC), ("status", STATUS),
        ("auth", AUTH), ("keepalive", KEEPALIVE))
KEY_NAMES = {bit: name for name, bit in KEYS}

# reqrep.type
RR_NONE, RR_REQUEST, RR_CORRELATION, RR_OTHER = 0, 1, 2, 3

MAX_TARGETS = 32          # routing client ids kept for the frame log's attrs
U32 = 0xFFFFFFFF
U64 = 0xFFFFFFFFFFFFFFFF


class Summary(NamedTuple):
    malformed: bool       # not MessagePack, trailing bytes, bad UTF-8, or not a map
    present: int          # bits of the keys present
    badtype: int          # bits of the keys whose value has the wrong type (inside too)
    nroute: int           # routing entries (-1: routing absent or not an array)
    noid: bool            # a routing entry without client_id
    path: bytes | None    # routing[0].path (UTF-8)
    targets: tuple        # routing[].client_id, the first MAX_TARGETS valid ones
    rr_type: int          # RR_*
    rr_id: bytes | None   # reqrep.id (UTF-8)
    topic: bytes | None
    status: int           # valid status (0..2**32-1), else 0
    has_ts: bool          # keepalive.timestamp present and an unsigned 64-bit integer
    ts: int


EMPTY = Summary(False, 0, 0, -1, False, None, (), RR_NONE, None, None, 0, False, 0)
MALFORMED = EMPTY._replace(malformed=True)


def _uint(v, limit):
    return type(v) is int and 0 <= v <= limit     # bool is not an integer here


def summarize(header) -> Summary:
    """The Summary of one header (bytes-like); an empty header is an empty map."""
    if not len(header):
        return EMPTY
    try:
        obj = msgpack.unpackb(bytes(header), raw=False, strict_map_key=False)
    except Exception:                 # ValueError family, TypeError (unhashable key), ...
        return MALFORMED
    if type(obj) is not dict:
        return MALFORMED
    present = badtype = 0
    nroute, noid, path, targets = -1, False, None, []
    rr_type, rr_id, topic, status, has_ts, ts = RR_NONE, None, None, 0, False, 0
    for name, bit in KEYS:
        if name not in obj:
            continue
        present |= bit
        v = obj[name]
        if bit == ROUTING:
            if type(v) is not list:
                badtype |= bit
                continue
            nroute = len(v)
            for j, e in enumerate(v):
                if type(e) is not dict:
                    badtype |= bit
                    continue
                if "client_id" in e:
                    c = e["client_id"]
                    if _uint(c, U32):
                        if len(targets) < MAX_TARGETS:
                            targets.append(c)
                    else:
                        badtype |= bit
                else:
                    noid = True
                if "path" in e:
                    p = e["path"]
                    if type(p) is str:
                        if j == 0:
                            path = p.encode()
                    else:
                        badtype |= bit
        elif bit == REQREP:
            if type(v) is not dict:
                badtype |= bit
                continue
            if "type" in v:
                t = v["type"]
                if type(t) is str:
                    rr_type = (RR_REQUEST if t == "request" else
                               RR_CORRELATION if t == "correlation" else RR_OTHER)
                else:
                    badtype |= bit
            if "id" in v:
                i = v["id"]
                if type(i) is str:
                    rr_id = i.encode()
                else:
                    badtype |= bit
        elif bit == TOPIC:
            if type(v) is str:
                topic = v.encode()
            else:
                badtype |= bit
        elif bit == STATUS:
            if _uint(v, U32):
                status = v
            else:
                badtype |= bit
        elif bit == AUTH:
            if type(v) is not dict:
                badtype |= bit
        else:                                           # keepalive
            if type(v) is not dict:
                badtype |= bit
                continue
            if "timestamp" in v:
                t = v["timestamp"]
                if _uint(t, U64):
                    has_ts, ts = True, t
                else:
                    badtype |= bit
            if "interval" in v and not _uint(v["interval"], U32):
                badtype |= bit
    return Summary(False, present, badtype, nroute, noid, path, tuple(targets), rr_type,
                   rr_id, topic, status, has_ts, ts)


# ---- the per-type rules (document §2.2.3 and §7.3.1) ---------------------------------

# message types: JOIN, REQ, … PONG and TYPE_NAMES come from constants.py
ALL = ROUTING | REQREP | TOPIC | STATUS | AUTH | KEEPALIVE
REQUIRED = (0, ROUTING | REQREP, ROUTING | REQREP, ROUTING, 0, TOPIC, TOPIC, TOPIC,
            KEEPALIVE, KEEPALIVE)
ALLOWED = (AUTH | REQREP,          # JOIN: reqrep too (docs/design.md, "fleximq")
           ROUTING | REQREP | STATUS, ROUTING | REQREP | STATUS, ROUTING | STATUS, STATUS,
           TOPIC | ROUTING | STATUS, TOPIC, TOPIC, KEEPALIVE, KEEPALIVE)


def rule_violation(mtype, client_id, s: Summary, join_answer=False) -> bool:
    """True when a well-formed header breaks a rule of §2.2.3 / §7.3.1 for its type.
    ``join_answer``: the REP answering a JOIN, exempt from REP's routing/reqrep
    requirement (§4.2.1)."""
    p = s.present
    if p & ~ALLOWED[mtype]:
        return True
    required = REQUIRED[mtype]
    if join_answer:
        required = 0
    if required & ~p:
        return True
    if s.nroute >= 0:
        if s.noid:
            return True
        if mtype in (REQ, REP) and s.nroute != 1:
            return True
        if mtype == NOTIF and s.nroute == 0:
            return True
    if p & REQREP:
        if s.rr_type != (RR_CORRELATION if mtype == REP else RR_REQUEST) or s.rr_id is None:
            return True
    if p & KEEPALIVE and not s.has_ts:
        return True
    if mtype == JOIN and client_id != 0:
        return True
    return False
