"""fleximq conversations, garbage and random frames for the conformance suite."""

import struct

import msgpack
from hypothesis import strategies as st

from proxy.conformance import C2S, S2C, Conversation, Garbage
from proxy.protocols.fleximq import codec
from proxy.protocols.fleximq.codec import JOIN, REQ, REP, NOTIF, BCAST, PUB, SUB, PING, encode

U1, U2, U3 = "01H2XQMGPE7ZPXXNKQD9XE8S6R", "01H2XQMGPE7ZPXXNKQD9XE8S6S", "01H2XQMGPE7ZPXXNKQD9XE8S6T"
JOIN_ID = "01H2XQMGPE7ZPXXNKQD9XE8S60"
TOKEN = "never-logged-token-42"


def cid(rid):
    """A JOIN/REQ/REP row's correlation_id: the reqrep.id itself (matching uses
    constants.id_key, the frame log shows the text)."""
    return rid


# A requester's connection: JOIN with token auth (and a reqrep id, as DESIGN allows),
# the broker's REP assigning 1000, two REQs answered out of order (one 404), a PING each
# way (the client's and the broker's), SUB then a PUB delivered, a NOTIF and a BCAST in.
REQUESTER = [
    (C2S, codec.join(auth={"type": "token", "token": TOKEN}, rid=JOIN_ID)),
    (S2C, encode(REP, 1000, {"status": 200, "reqrep": {"type": "correlation", "id": JOIN_ID}})),
    (C2S, codec.req(1000, 1001, U1, "/api/users", {"q": 1})),
    (C2S, codec.req(1000, 1001, U2, "/api/orders", {"q": 2})),
    (C2S, codec.ping(1000, 1703123456789, 30)),
    (S2C, codec.pong(1, 1703123456789)),
    (S2C, codec.rep(1001, 1000, U2, status=404)),
    (S2C, codec.rep(1001, 1000, U1, payload={"r": "ok"})),
    (S2C, codec.ping(1, 1703123456790)),
    (C2S, codec.pong(1000, 1703123456790)),
    (C2S, codec.sub(1000, "news")),
    (S2C, codec.pub(1002, "news", {"a": 1})),
    (S2C, codec.notif(1003, [1000, 1004], "/alerts", {"m": "x"})),
    (S2C, codec.bcast(1005, {"b": 1}, status=200)),
    (C2S, codec.unsub(1000, "news")),
]

# A responder's connection: the broker forwards a REQ (the requester's ClientID kept),
# the responder answers; a JOIN answered without reqrep (matched to the pending JOIN).
RESPONDER = [
    (C2S, codec.join()),
    (S2C, encode(REP, 1001, {"status": 201})),
    (S2C, codec.req(1000, 1001, U3, "/api/users")),
    (C2S, codec.rep(1001, 1000, U3, status=200, path="/api/users")),
]

# Two PINGs with the same timestamp: each PONG answers the oldest unanswered one.
SAME_TS = [
    (C2S, codec.ping(1000, 42)),
    (C2S, codec.ping(1000, 42)),
    (S2C, codec.pong(1, 42)),
    (S2C, codec.pong(1, 42)),
    (S2C, codec.pong(1, 42)),                 # a third: matches nothing
]

def _rule(mtype, header, client_id=1000, **kw):
    return encode(mtype, client_id, header, **kw)


# Every header rule broken once (each counted, every frame forwarded), wrong value types,
# undecodable headers, version 2, an unknown type, non-zero reserved bytes (ignored).
VIOLATIONS = [
    (C2S, _rule(REQ, {"routing": [{"client_id": 1001}, {"client_id": 1002}],
                      "reqrep": {"type": "request", "id": U1}})),            # 2 entries
    (S2C, codec.rep(1, 1000, U1, status=602)),                              # broker's 602
    (C2S, _rule(BCAST, {"routing": [{"client_id": 1001}]})),                # forbidden
    (C2S, _rule(SUB, {"topic": "t", "status": 200})),                       # forbidden
    (C2S, _rule(PING, {"keepalive": {"interval": 5}})),                     # no timestamp
    (C2S, _rule(NOTIF, {"routing": []})),                                   # empty
    (C2S, _rule(PUB, {})),                                                  # no topic
    (C2S, _rule(REP, {"routing": [{"client_id": 1001}],
                      "reqrep": {"type": "request", "id": "nobody"}})),     # wrong type
    (C2S, _rule(REQ, {"routing": [{"client_id": 1001}], "reqrep": "r1"})),  # reqrep a string
    (C2S, _rule(NOTIF, {"routing": "1001"})),                               # not an array
    (C2S, _rule(REQ, {"routing": [{"path": "/x"}],
                      "reqrep": {"type": "request", "id": U2}})),           # no client_id
    (C2S, encode(BCAST, 1000, raw_header=b"\x81\xa3abc\xc1")),              # not MessagePack
    (C2S, encode(BCAST, 1000, raw_header=msgpack.packb([1, 2]))),           # not a map
    (C2S, encode(BCAST, 1000, {"status": 200}, reserved=b"\xff" * 16)),     # ignored
    (C2S, encode(BCAST, 1000, {}, version=2)),
    (C2S, encode(12, 1000, {"topic": "t"})),
    (S2C, codec.rep(1, 1000, "matches-nothing")),
]


def conversations():
    requester = Conversation(
        "requester", REQUESTER,
        counters={
            "frames": {("c2s", "JOIN"): 1, ("s2c", "REP"): 3, ("c2s", "REQ"): 2,
                       ("c2s", "PING"): 1, ("s2c", "PONG"): 1, ("s2c", "PING"): 1,
                       ("c2s", "PONG"): 1, ("c2s", "SUB"): 1, ("s2c", "PUB"): 1,
                       ("s2c", "NOTIF"): 1, ("s2c", "BCAST"): 1, ("c2s", "UNSUB"): 1},
            "messages": {("c2s", "REQ"): 2, ("s2c", "REP"): 3, ("s2c", "PUB"): 1,
                         ("s2c", "NOTIF"): 1, ("s2c", "BCAST"): 1},
            "responses": {("JOIN", "200"): 1, ("REQ", "200"): 1, ("REQ", "404"): 1,
                          ("PING", "200"): 2},
            "unmatched": 0, "in_flight": 0, "errors": {}, "timeouts": {}},
        records=[
            {"direction": "c2s", "opcode_name": "JOIN", "kind": "request",
             "correlation_id": cid(JOIN_ID), "attrs": {"client_id": "0"}},
            {"direction": "s2c", "opcode_name": "REP", "kind": "response",
             "request_opcode_name": "JOIN", "status": "200", "outcome": "ok",
             "correlation_id": cid(JOIN_ID), "attrs": {"client_id": "1000"}},
            {"opcode_name": "REQ", "kind": "request", "correlation_id": cid(U1),
             "resource": "/api/users", "messages": 1,
             "attrs": {"client_id": "1000", "targets": "1001"}},
            {"opcode_name": "REQ", "correlation_id": cid(U2), "resource": "/api/orders"},
            {"opcode_name": "PING", "kind": "request", "correlation_id": "ping:1703123456789",
             "resource": None, "attrs": {"client_id": "1000"}},
            {"opcode_name": "PONG", "kind": "response", "correlation_id": "ping:1703123456789",
             "request_opcode_name": "PING", "status": "200"},
            {"opcode_name": "REP", "correlation_id": cid(U2), "status": "404",
             "outcome": "error", "request_opcode_name": "REQ"},
            {"opcode_name": "REP", "correlation_id": cid(U1), "status": "200",
             "outcome": "ok", "request_opcode_name": "REQ", "latency_ns": True},
            {"direction": "s2c", "opcode_name": "PING", "correlation_id": "ping:1703123456790"},
            {"direction": "c2s", "opcode_name": "PONG", "correlation_id": "ping:1703123456790",
             "request_opcode_name": "PING"},
            {"opcode_name": "SUB", "kind": "oneway", "resource": "news"},
            {"opcode_name": "PUB", "kind": "oneway", "resource": "news",
             "attrs": {"client_id": "1002"}},
            {"opcode_name": "NOTIF", "resource": "/alerts",
             "attrs": {"client_id": "1003", "targets": "1000,1004"}},
            {"opcode_name": "BCAST", "status": None, "resource": None},
            {"opcode_name": "UNSUB", "resource": "news"}])
    responder = Conversation(
        "responder", RESPONDER,
        counters={"responses": {("JOIN", "201"): 1, ("REQ", "200"): 1}, "unmatched": 0,
                  "errors": {}, "in_flight": 0},
        records=[{"opcode_name": "JOIN", "correlation_id": None},     # no reqrep: no id
                 {"opcode_name": "REP", "request_opcode_name": "JOIN", "status": "201",
                  "correlation_id": None},
                 {"direction": "s2c", "opcode_name": "REQ", "kind": "request",
                  "correlation_id": cid(U3)},
                 {"direction": "c2s", "opcode_name": "REP", "request_opcode_name": "REQ",
                  "correlation_id": cid(U3), "resource": "/api/users"}])
    same_ts = Conversation(
        "same-timestamp-pings", SAME_TS,
        counters={"responses": {("PING", "200"): 2}, "unmatched": 1, "in_flight": 0,
                  "timeouts": {}},
        records=[{"opcode_name": "PING", "correlation_id": "ping:42"},
                 {"opcode_name": "PING", "correlation_id": "ping:42"},
                 {"opcode_name": "PONG", "correlation_id": "ping:42", "latency_ns": True},
                 {"opcode_name": "PONG", "correlation_id": "ping:42", "latency_ns": True},
                 {"opcode_name": "PONG", "correlation_id": "ping:42", "latency_ns": None}])
    violations = Conversation(
        "header-rules", VIOLATIONS,
        counters={
            # header_rule: 2 entries, BCAST routing, SUB status, no timestamp, empty
            # NOTIF, PUB without topic, REP typed request, reqrep string, no client_id;
            # bad_header: reqrep string and routing string (types), undecodable: 2
            "errors": {("c2s", "header_rule"): 9, ("c2s", "bad_header"): 4,
                       ("c2s", "bad_version"): 1,
                       ("c2s", "unknown_command"): 1},
            "responses": {("REQ", "602"): 1},     # unmatched REPs count no response
            "unmatched": 2,
            "timeouts": {}, "cutoffs": {"REQ": 1},   # U2 (no client_id): unanswered at close
            "frames": {("c2s", "REQ"): 3, ("s2c", "REP"): 2, ("c2s", "BCAST"): 5,
                       ("c2s", "SUB"): 1, ("c2s", "PING"): 1, ("c2s", "NOTIF"): 2,
                       ("c2s", "PUB"): 1, ("c2s", "REP"): 1, ("c2s", "unknown_12"): 1}},
        records=None)
    bad_join = Conversation(
        "join-with-client-id",
        [(C2S, encode(JOIN, 5, {})), (S2C, encode(REP, 1000, {"status": 400}))],
        counters={"errors": {("c2s", "header_rule"): 1}, "responses": {("JOIN", "400"): 1},
                  "unmatched": 0},
        records=[{"opcode_name": "JOIN", "attrs": {"client_id": "5"}},
                 {"opcode_name": "REP", "status": "400", "outcome": "error"}])
    secrets = Conversation(
        "auth-never-logged",
        [(C2S, codec.join(auth={"type": "basic", "username": "u", "password": TOKEN})),
         (S2C, encode(REP, 1000, {}))],
        counters={"errors": {}, "responses": {("JOIN", "200"): 1}},
        records=[{"opcode_name": "JOIN", "resource": None, "attrs": {"client_id": "0"}},
                 {"opcode_name": "REP", "status": "200"}])
    # Requests never answered: their timeout rows (close(), and the older of two REQs
    # with the same id) carry the request's own correlation_id text.
    unanswered = Conversation(
        "unanswered-timeouts",
        [(C2S, codec.join()),
         (C2S, codec.req(1000, 1001, U1, "/a")),
         (C2S, codec.ping(1000, 7, 30)),
         (C2S, codec.ping(1000, 7, 30)),              # same timestamp: two pending
         (S2C, codec.req(1001, 1000, U2, "/b")),
         (S2C, codec.pong(1, 7)),                     # answers the first only
         (C2S, codec.req(1000, 1001, U1, "/a"))],
        # the first U1 is replaced by its namesake (a timeout); the rest are cut off by close()
        counters={"timeouts": {"REQ": 1}, "cutoffs": {"JOIN": 1, "REQ": 2, "PING": 1},
                  "unmatched": 0,
                  "in_flight": 0, "responses": {("PING", "200"): 1}},
        records=[{"opcode_name": "JOIN", "kind": "request", "correlation_id": None},
                 {"opcode_name": "REQ", "kind": "request", "correlation_id": U1},
                 {"opcode_name": "PING", "kind": "request", "correlation_id": "ping:7"},
                 {"opcode_name": "PING", "kind": "request", "correlation_id": "ping:7"},
                 {"direction": "s2c", "opcode_name": "REQ", "correlation_id": U2},
                 {"direction": "s2c", "opcode_name": "PONG", "correlation_id": "ping:7",
                  "request_opcode_name": "PING", "latency_ns": True},
                 {"direction": "c2s", "kind": "event", "status": "timeout",
                  "request_opcode_name": "REQ", "correlation_id": U1},
                 {"opcode_name": "REQ", "kind": "request", "correlation_id": U1},
                 {"kind": "event", "request_opcode_name": "JOIN", "correlation_id": None,
                  "status": "closed"},
                 {"kind": "event", "request_opcode_name": "REQ", "correlation_id": U1,
                  "status": "closed"},
                 {"kind": "event", "request_opcode_name": "PING",
                  "correlation_id": "ping:7", "status": "closed"},
                 {"direction": "s2c", "kind": "event", "request_opcode_name": "REQ",
                  "correlation_id": U2, "status": "closed"}])
    return [requester, responder, same_ts, violations, bad_join, secrets, unanswered]


def _prefix(version=1, mtype=1, client_id=0, hlen=0, plen=0, reserved=b"\0" * 16):
    return struct.pack(">BBI16sIQ", version, mtype, client_id, reserved, hlen, plen)


def garbage():
    return [
        Garbage("header-over-64KiB", C2S, _prefix(hlen=65537) + b"\x80" * 64,
                "header_too_large"),
        Garbage("payload-over-limit", C2S, _prefix(plen=(1 << 30)), "frame_too_large"),
        Garbage("payload-u64-max", S2C, _prefix(plen=(1 << 64) - 1), "frame_too_large"),
        Garbage("http", C2S, b"GET / HTTP/1.1\r\nHost: example\r\n\r\n" + b"x" * 40,
                "header_too_large"),
        Garbage("invalid-msgpack", C2S, encode(REQ, 1000, raw_header=b"\xc1\xc1"),
                "bad_header", fatal=False),
        Garbage("header-not-a-map", C2S, encode(REQ, 1000, raw_header=b"\xa3abc"),
                "bad_header", fatal=False),
        Garbage("truncated-map", S2C, encode(REP, 1000, raw_header=b"\x82\xa5topic"),
                "bad_header", fatal=False),
        Garbage("bad-utf8", C2S, encode(SUB, 1000, raw_header=b"\x81\xa5topic\xa2\xc3\x28"),
                "bad_header", fatal=False),
        Garbage("trailing-bytes", C2S, encode(SUB, 1000, raw_header=b"\x81\xa5topic\xa1t\x00"),
                "bad_header", fatal=False),
        Garbage("version-2", C2S, encode(SUB, 1000, {"topic": "t"}, version=2),
                "bad_version", fatal=False),
        Garbage("unknown-type", S2C, encode(200, 1, {}), "unknown_command", fatal=False),
        Garbage("wrong-types", C2S, encode(REQ, 1000, {"routing": {"client_id": 1},
                                                       "reqrep": 7}),
                "bad_header", fatal=False),
    ]


def requests(n):
    return [codec.req(1000, 1001, "req-%d" % i, "/p") for i in range(n)]


# ---- random conversations -------------------------------------------------------------

_IDS = ["a", "b", U1, "", "\u00e9t\u00e9", "\u00e9" * 70]     # the last: clipped to 128 bytes
_TS = [0, 1, 1703123456789, (1 << 64) - 1]
_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 63, 2 ** 64 - 1),
                    st.text(max_size=6), st.binary(max_size=4),
                    st.floats(allow_nan=False), st.just([1, "x"]), st.just({"k": [1]}))


@st.composite
def header_dict(draw):
    """A header with the six keys in any mix, right and wrong types, unknown keys."""
    h = {}
    if draw(st.booleans()):
        h["routing"] = draw(st.one_of(
            st.lists(st.fixed_dictionaries({}, optional={
                "client_id": st.one_of(st.integers(0, 2 ** 32 + 1), _VALUES),
                "path": st.one_of(st.sampled_from(["/a", "/b/c", ""]), _VALUES)}),
                max_size=3),
            _VALUES))
    if draw(st.booleans()):
        h["reqrep"] = draw(st.one_of(
            st.fixed_dictionaries({}, optional={
                "type": st.sampled_from(["request", "correlation", "other", 5]),
                "id": st.one_of(st.sampled_from(_IDS), _VALUES)}),
            _VALUES))
    if draw(st.booleans()):
        h["topic"] = draw(st.one_of(st.sampled_from(["news", "t", ""]), _VALUES))
    if draw(st.booleans()):
        h["status"] = draw(st.one_of(st.sampled_from([200, 404, 600, 2 ** 32]), _VALUES))
    if draw(st.integers(0, 5)) == 0:
        h["auth"] = draw(st.one_of(st.just({"type": "token", "token": "s"}), _VALUES))
    if draw(st.booleans()):
        h["keepalive"] = draw(st.one_of(
            st.fixed_dictionaries({}, optional={
                "timestamp": st.one_of(st.sampled_from(_TS), _VALUES),
                "interval": st.one_of(st.integers(0, 2 ** 33), _VALUES)}),
            _VALUES))
    if draw(st.integers(0, 4)) == 0:
        h[draw(st.sampled_from(["x", 1, b"topic", "routingX"]))] = draw(_VALUES)
    return h


@st.composite
def _frame(draw):
    d = draw(st.sampled_from([C2S, S2C]))
    mtype = draw(st.sampled_from(list(range(10)) + [11]))
    client_id = draw(st.sampled_from([0, 1, 1000, 1001, 2 ** 32 - 1]))
    shape = draw(st.integers(0, 9))
    if shape == 0:                                       # raw, maybe broken, header
        raw = draw(st.binary(max_size=24))
        return d, encode(mtype, client_id, raw_header=raw,
                         raw_payload=draw(st.binary(max_size=8)))
    version = 2 if shape == 1 else 1
    reserved = b"\x01" * 16 if shape == 2 else b"\0" * 16
    header = draw(header_dict())
    return d, encode(mtype, client_id, header, draw(st.one_of(st.none(), st.integers(-2 ** 63, 2 ** 64 - 1))),
                     version=version, reserved=reserved)


def frames():
    return st.lists(_frame(), max_size=24)
