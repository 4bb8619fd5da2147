"""RocketMQ remoting parser on both twins: JSON and binary headers, golden frames split at
every byte, opaque correlation both ways, oneway (bit and Go style), batch/pull message
counts, the JSON scanner against json.loads, route-data rewriting, and bad input."""

import json
import os
import struct

import pytest
from hypothesis import given, settings, strategies as st

from proxy import framing_py
from proxy.protocols.rocketmq import jsonscan, parser_py

IMPLS = {"py-parser": (framing_py.RouteStats, parser_py.RocketMQParser)}
if not os.environ.get("FRAMETAP_NO_EXTENSIONS"):
    from proxy import _framing
    from proxy.protocols.rocketmq import _parser
    IMPLS["c-parser"] = (_framing.RouteStats, _parser.RocketMQParser)

C2S, S2C = 0, 1


@pytest.fixture(params=sorted(IMPLS))
def impl(request):
    return IMPLS[request.param]


def make(impl, **kw):
    RouteStats, Parser = impl
    stats = RouteStats("rmq", "rocketmq")
    return stats, Parser(stats, **kw)


def jframe(header, body=b"", includes_self=False):
    h = json.dumps(header).encode() if isinstance(header, dict) else header
    length = 4 + len(h) + len(body) + (4 if includes_self else 0)
    return struct.pack(">II", length, len(h)) + h + body


def bframe(code, opaque, flag, ext=None, body=b"", remark=b""):
    ext = ext or {}
    e = b"".join(struct.pack(">H", len(k)) + k + struct.pack(">i", len(v)) + v
                 for k, v in ext.items())
    h = struct.pack(">HBHii", code, 6, 1, opaque, flag) + struct.pack(">i", len(remark)) + \
        remark + struct.pack(">i", len(e)) + e
    return struct.pack(">II", 4 + len(h) + len(body), (1 << 24) | len(h)) + h + body


def req(code, opaque, flag=0, **ext):
    return jframe({"code": code, "language": "JAVA", "version": 433, "opaque": opaque,
                   "flag": flag, "extFields": {k: str(v) for k, v in ext.items()}})


def resp(code, opaque, body=b"", **ext):
    return jframe({"code": code, "language": "JAVA", "version": 433, "opaque": opaque,
                   "flag": 1, "remark": None, "extFields": ext, "serializeTypeCurrentRPC": "JSON"},
                  body)


def message(body):
    """A minimal message entry: totalSize (includes itself) then content."""
    return struct.pack(">i", 4 + 20 + len(body)) + b"\0" * 20 + body


# A producer talking to the name server then the broker: the route lookup, a V2 send with
# the short keys (nested extFields repeating "code"/"flag" names, escapes, odd key order,
# whitespace), a batch of 3, a pull answered with 2 messages, a oneway offset update, a
# broker->client request (NOTIFY_CONSUMER_IDS_CHANGED) answered by the client, a binary
# header send, and a failed send.
V2_HEADER = (b'{ "extFields" : {"a":"grp","b":"TopicTest","flag":"0","code":"7",'
             b'"i":"KEYS\\u0001k1\\u0002TAGS\\u0001t\\"a\\"g"} , "flag":0,'
             b'"opaque" : 3, "language":"CPP","code":310 ,"version":1}')
C2S_FRAMES = [
    req(105, 1, topic="TopicTest"),
    jframe(V2_HEADER, b"hello"),
    jframe({"code": 320, "opaque": 4, "flag": 0, "extFields": {"b": "TopicTest"}},
           message(b"one") + message(b"two") + message(b"three!")),
    req(11, 5, topic="TopicTest", queueId=0, queueOffset=0),
    req(15, 6, flag=2, topic="TopicTest"),                       # oneway (bit 1)
    resp(0, 900),                                                # answers the broker's request
    bframe(10, 7, 0, {b"topic": b"TopicTest"}, b"payload"),
    req(310, 8, b="TopicTest"),
]
S2C_FRAMES = [
    resp(0, 1, b'{"brokerDatas":[{"brokerAddrs":{0:"10.0.0.7:10911"}}]}'),
    resp(0, 3, msgId="AC11", queueId="1", queueOffset="0"),
    resp(0, 4),
    resp(0, 5, message(b"m1") + message(b"m2"), nextBeginOffset="2"),
    req(40, 900, consumerGroup="g"),                             # broker -> client request
    bframe(0, 7, 1),
    resp(17, 8),                                                 # TOPIC_NOT_EXIST
]
C2S_STREAM = b"".join(C2S_FRAMES)
S2C_STREAM = b"".join(S2C_FRAMES)


def _at(frames, i):
    return len(b"".join(frames[:i]))


SCHEDULE = [(C2S, 0, 5), (S2C, 0, 5), (C2S, 5, 8), (S2C, 5, 7)]


def feed_conversation(p, c2s_cuts=(), s2c_cuts=()):
    for d, i, j in SCHEDULE:
        frames, data, cuts = ((C2S_FRAMES, C2S_STREAM, c2s_cuts) if d == C2S
                              else (S2C_FRAMES, S2C_STREAM, s2c_cuts))
        lo, hi = _at(frames, i), _at(frames, j)
        points = [lo] + sorted(c for c in cuts if lo < c < hi) + [hi]
        for a, b in zip(points, points[1:]):
            assert p.feed(d, data[a:b]) == b - a


def counters(stats):
    s = stats.snapshot()
    return {k: s[k] for k in ("frames", "messages", "responses", "timeouts", "unmatched",
                              "in_flight", "errors")} | {
        "hist": {k: sum(v[0]) for k, v in s["hist"].items()}}


def test_conversation(impl):
    stats, p = make(impl)
    feed_conversation(p)
    c = counters(stats)
    assert c["frames"] == {
        ("c2s", "GET_ROUTEINFO_BY_TOPIC"): 1, ("c2s", "SEND_MESSAGE_V2"): 2,
        ("c2s", "SEND_BATCH_MESSAGE"): 1, ("c2s", "PULL_MESSAGE"): 1,
        ("c2s", "UPDATE_CONSUMER_OFFSET"): 1, ("c2s", "NOTIFY_CONSUMER_IDS_CHANGED"): 1,
        ("c2s", "SEND_MESSAGE"): 1,
        ("s2c", "GET_ROUTEINFO_BY_TOPIC"): 1, ("s2c", "SEND_MESSAGE_V2"): 2,
        ("s2c", "SEND_BATCH_MESSAGE"): 1, ("s2c", "PULL_MESSAGE"): 1,
        ("s2c", "NOTIFY_CONSUMER_IDS_CHANGED"): 1, ("s2c", "SEND_MESSAGE"): 1}
    assert c["messages"] == {("c2s", "SEND_MESSAGE_V2"): 2, ("c2s", "SEND_BATCH_MESSAGE"): 3,
                             ("c2s", "SEND_MESSAGE"): 1, ("s2c", "PULL_MESSAGE"): 2}
    assert c["responses"] == {
        ("GET_ROUTEINFO_BY_TOPIC", "SUCCESS"): 1, ("SEND_MESSAGE_V2", "SUCCESS"): 1,
        ("SEND_MESSAGE_V2", "TOPIC_NOT_EXIST"): 1, ("SEND_BATCH_MESSAGE", "SUCCESS"): 1,
        ("PULL_MESSAGE", "SUCCESS"): 1, ("NOTIFY_CONSUMER_IDS_CHANGED", "SUCCESS"): 1,
        ("SEND_MESSAGE", "SUCCESS"): 1}
    assert c["hist"][("SEND_MESSAGE_V2", "error")] == 1
    assert c["hist"][("NOTIFY_CONSUMER_IDS_CHANGED", "ok")] == 1   # correlated s2c->c2s
    assert c["unmatched"] == 0 and c["in_flight"] == 0 and c["errors"] == {}


@pytest.fixture(scope="module")
def reference():
    stats, p = make(IMPLS["py-parser"])
    feed_conversation(p)
    return counters(stats)


def test_every_split_point(impl, reference):
    for cut in range(1, max(len(C2S_STREAM), len(S2C_STREAM))):
        stats, p = make(impl)
        feed_conversation(p, [cut], [cut])
        assert counters(stats) == reference, f"cut at {cut}"


def test_one_byte_at_a_time(impl, reference):
    stats, p = make(impl)
    feed_conversation(p, range(len(C2S_STREAM)), range(len(S2C_STREAM)))
    assert counters(stats) == reference


def test_idle_pull_is_not_an_error(impl):
    stats, p = make(impl)
    p.feed(C2S, req(11, 1) + req(11, 2) + req(14, 3))
    p.feed(S2C, resp(19, 1) + resp(21, 2) + resp(22, 3))   # not found, moved, no offset
    s = stats.snapshot()
    assert s["responses"] == {("PULL_MESSAGE", "PULL_NOT_FOUND"): 1,
                              ("PULL_MESSAGE", "PULL_OFFSET_MOVED"): 1,
                              ("QUERY_CONSUMER_OFFSET", "QUERY_NOT_FOUND"): 1}
    assert {k: sum(v[0]) for k, v in s["hist"].items()} == {
        ("PULL_MESSAGE", "ok"): 1, ("PULL_MESSAGE", "error"): 1,
        ("QUERY_CONSUMER_OFFSET", "ok"): 1}


def test_go_style_oneway(impl):
    """flag 1 on a c2s frame answering no server request is a oneway request."""
    stats, p = make(impl)
    p.feed(C2S, req(15, 9, flag=1))
    s = stats.snapshot()
    assert s["frames"] == {("c2s", "UPDATE_CONSUMER_OFFSET"): 1}
    assert s["unmatched"] == 0 and s["in_flight"] == 0


def test_unknown_opaque_response(impl):
    stats, p = make(impl)
    p.feed(S2C, resp(0, 4242))
    s = stats.snapshot()
    assert s["unmatched"] == 1 and s["frames"] == {("s2c", "unmatched_response"): 1}


def test_length_includes_self_option(impl):
    stats, p = make(impl, options={"length_includes_self": True})
    f = jframe({"code": 34, "opaque": 1, "flag": 0}, b"{}", includes_self=True)
    assert p.feed(C2S, f + f) == 2 * len(f)
    assert stats.snapshot()["frames"] == {("c2s", "HEART_BEAT"): 2}


@pytest.mark.parametrize("data, reason", [
    (struct.pack(">II", 20, 100) + b"x" * 20, "bad_header"),              # header > frame
    (struct.pack(">II", 20, (2 << 24) | 4) + b"x" * 20, "bad_header"),    # serialization 2
    (struct.pack(">II", 2, 0), "frame_too_small"),                        # below minimum
    (struct.pack(">II", 0xFFFFFFF0, 4), "frame_too_large"),               # huge length
    (struct.pack(">II", 70000 + 4, 70000), "frame_too_large"),            # header over 64 KiB
])
def test_fatal_framing_errors(impl, data, reason):
    stats, p = make(impl)
    assert p.feed(C2S, data) == 0
    assert p.error.reason == reason and "offset 0" in str(p.error)
    assert stats.snapshot()["errors"] == {("c2s", reason): 1}


def test_invalid_json_counted_and_forwarded(impl):
    stats, p = make(impl)
    bad = jframe(b'{"code": 10, "opaque": ')
    good = req(34, 2)
    assert p.feed(C2S, bad + good) == len(bad + good) and p.error is None
    s = stats.snapshot()
    assert s["errors"] == {("c2s", "bad_header"): 1}
    assert s["frames"] == {("c2s", "undecodable"): 1, ("c2s", "HEART_BEAT"): 1}


def test_rewrites_route_data(impl):
    stats, p = make(impl, options={"advertise": {"10.0.0.7:10911": "127.0.0.1:20911"}})
    p.feed(C2S, req(105, 1, topic="T"))
    body = b'{"brokerDatas":[{"brokerAddrs":{0:"10.0.0.7:10911"},"brokerName":"b"}]}'
    frame = resp(0, 1, body)
    other = resp(0, 77)
    for cut in [None] + list(range(1, len(frame))):
        stats, p = make(impl, options={"advertise": {"10.0.0.7:10911": "127.0.0.1:20911"}})
        p.feed(C2S, req(105, 1, topic="T") + req(34, 77))
        out = []
        stream = frame + other
        for a, b in ([(0, len(stream))] if cut is None else [(0, cut), (cut, len(stream))]):
            p.feed(S2C, stream[a:b])
            out.extend(p.output)
        got = b"".join(out)
        length = struct.unpack(">I", got[:4])[0]
        first = got[:4 + length]
        assert b'"127.0.0.1:20911"' in first and b"10.0.0.7" not in first
        assert got[4 + length:] == other, f"cut {cut}"
        s = stats.snapshot()
        assert s["responses"] == {("GET_ROUTEINFO_BY_TOPIC", "SUCCESS"): 1,
                                  ("HEART_BEAT", "SUCCESS"): 1}, f"cut {cut}"


# ---- the JSON scanner agrees with json.loads on every valid header -----------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False,
                                                                        allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=8)


@settings(max_examples=400, deadline=None)
@given(extra=st.dictionaries(st.text(max_size=6), json_values, max_size=4),
       code=st.integers(-2**31, 2**31 - 1), opaque=st.integers(0, 2**31 - 1),
       flag=st.integers(0, 3), indent=st.sampled_from([None, 0, 2]),
       ascii_only=st.booleans())
def test_scanner_matches_json_loads(extra, code, opaque, flag, indent, ascii_only):
    doc = dict(extra)
    doc.update({"code": code, "opaque": opaque, "flag": flag})
    doc["extFields"] = {"code": "x", "flag": {"opaque": 5}}
    items = list(doc.items())
    raw = json.dumps(dict(reversed(items)), indent=indent, ensure_ascii=ascii_only).encode()
    assert jsonscan.scan(raw) == (code, opaque, flag)
    for RouteStats, Parser in IMPLS.values():
        stats = RouteStats("r", "rocketmq")
        p = Parser(stats)
        p.feed(C2S, jframe(raw))
        assert stats.snapshot()["errors"] == {}, raw


def test_escaped_key_uses_fallback():
    raw = b'{"c\\u006fde": 34, "opaque": 2, "flag": 0}'
    assert jsonscan.scan(raw) == (34, 2, 0)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300), cut=st.integers(0, 300))
def test_random_bytes_never_crash_and_twins_agree(data, cut):
    results = []
    for RouteStats, Parser in IMPLS.values():
        stats = RouteStats("r", "rocketmq")
        p = Parser(stats, max_frame_bytes=4096)
        for d in (C2S, S2C):
            p.feed(d, data[:cut])
            if p.error is None:
                p.feed(d, data[cut:])
        p.close()
        s = stats.snapshot()
        assert s["in_flight"] == 0
        results.append((s["frames"], s["errors"], s["unmatched"]))
    assert all(r == results[0] for r in results)


@settings(max_examples=200, deadline=None)
@given(header=st.binary(max_size=60))
def test_random_headers_twins_agree(header):
    results = []
    for RouteStats, Parser in IMPLS.values():
        stats = RouteStats("r", "rocketmq")
        Parser(stats).feed(C2S, jframe(header))
        s = stats.snapshot()
        results.append((s["frames"], s["errors"]))
    assert all(r == results[0] for r in results)
