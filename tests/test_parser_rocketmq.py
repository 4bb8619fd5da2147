"""RocketMQ remoting parser specifics on both twins: idle pulls, oneway (Go style), the
length_includes_self option, the JSON scanner against json.loads, route-data rewriting,
and bad input.  The golden conversation, every split point, byte-at-a-time feeding and
the twin-agreement fuzzer are in tests/test_conformance.py (data: rocketmq/conformance.py).
"""

import json
import struct

import pytest
from hypothesis import given, settings, strategies as st

from tests.parsers import impl_fixture, make as make_parser
from proxy.protocols.rocketmq import jsonscan
from proxy.protocols.rocketmq.conformance import jframe, req, resp

C2S, S2C = 0, 1


impl, IMPLS = impl_fixture("rocketmq")


def make(impl, **kw):
    return make_parser(impl, "rocketmq", "rmq", **kw)


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
            out.extend(p.output if p.output is not None else [stream[a:b]])   # None: forwarded as fed
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


@pytest.mark.slow
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


HOSTILE_HEADERS = [
    b'{"code":99999999999999999999,"opaque":1,"flag":0}',      # past int64: fallback
    b'{"code":4294967296,"opaque":1,"flag":0}',                # past int32, fast path
    b'{"code":10,"opaque":-2147483649,"flag":0}',
    b'{"code":1e999,"opaque":1,"flag":0}',                     # float('inf')
    b'{"code":Infinity,"opaque":1,"flag":0}',
    b'{"code":NaN,"opaque":1,"flag":0}',
    b'{"code":1.5,"opaque":1,"flag":0}',
    b'{"c\\u006fde":10,"x":' + b"[" * 5000 + b"]" * 5000 + b',"opaque":1,"flag":0}',
    b'{"code":10,"opaque":1,"flag":0,"k\\"":' + b'{"a":' * 3000 + b"1" + b"}" * 3000 + b"}",
]


@pytest.mark.parametrize("header", HOSTILE_HEADERS, ids=range(len(HOSTILE_HEADERS)))
def test_hostile_json_headers_are_bad_headers_on_both_twins(header):
    """Out-of-range, non-finite or too deeply nested values: bad_header, forwarded, never
    an exception out of feed(), and the twins agree (issue 8, defect 1)."""
    frame = jframe(header) + req(11, 2)
    results = []
    for RouteStats, Parser in IMPLS.values():
        stats = RouteStats("r", "rocketmq")
        p = Parser(stats, options={"max_header_bytes": 1 << 20})
        assert p.feed(C2S, frame) == len(frame) and p.error is None
        snap = stats.snapshot()
        assert snap["errors"] == {("c2s", "bad_header"): 1}
        assert snap["frames"][("c2s", "PULL_MESSAGE")] == 1     # the next frame still parses
        results.append(snap["frames"])
    assert all(r == results[0] for r in results)


def test_in_range_fallback_values_still_decode():
    assert jsonscan.scan(b'{"c\\u006fde":2147483647,"opaque":-2147483648,"flag":1.0}') == \
        (2147483647, -2147483648, 1)


def test_route_rewrite_state_is_bounded_when_the_upstream_never_answers(impl):
    """Issue 8, defect 3: every unanswered GET_ROUTEINFO opaque was kept forever."""
    from proxy.protocols.rocketmq.options import ROUTE_REQUESTS_MAX
    stats, p = make(impl, options={"advertise": {"10.0.0.7:10911": "127.0.0.1:1"}})
    n = ROUTE_REQUESTS_MAX + 500
    p.feed(C2S, b"".join(req(105, i + 1, topic="T") for i in range(n)))
    assert len(p.route_opaques) == ROUTE_REQUESTS_MAX
    assert stats.snapshot()["errors"] == {("c2s", "in_flight_overflow"): 500}
    # the newest requests are still rewritten when answered
    out = p.feed(S2C, resp(0, n, b'{"brokerDatas":[{"brokerAddrs":{0:"10.0.0.7:10911"}}]}'))
    assert out > 0 and b"127.0.0.1:1" in b"".join(p.output)


def test_a_route_request_the_pending_map_refused_counts_one_overflow_not_two(impl):
    """A GET_ROUTEINFO that the full pending map refuses (an overflow) and that also
    pushes the oldest opaque out of the rewrite memory counts once: the black-hole soak
    counted 19.8 M overflows for 10 M requests."""
    from proxy.protocols.rocketmq.options import ROUTE_REQUESTS_MAX
    stats, p = make(impl, options={"advertise": {"10.0.0.7:10911": "127.0.0.1:1"}})
    p.map_limit = 100
    n = ROUTE_REQUESTS_MAX + 500
    p.feed(C2S, b"".join(req(105, i + 1, topic="T") for i in range(n)))
    assert p.pending == 100 and len(p.route_opaques) == ROUTE_REQUESTS_MAX
    # n - 100 refused by the map; the rewrite memory's 500 drops fall on those requests
    assert stats.snapshot()["errors"] == {("c2s", "in_flight_overflow"): n - 100}


# ---- the frame log's resource: the request's topic ----------------------------------

def _records(impl, frames, **kw):
    stats, p = make(impl, **kw)
    recs = []
    p.tracer = recs.append
    for d, f in frames:
        assert p.feed(d, f) == len(f)
    p.close()
    return recs


def test_acl_credentials_never_reach_a_record(impl):
    """AccessKey / Signature / SecurityToken ride in extFields next to the topic: the
    record carries the topic and nothing of them, in any field."""
    from proxy.protocols.rocketmq.conformance import SECRET_VALUES, bframe
    frames = [(C2S, req(10, 1, AccessKey=SECRET_VALUES[0].decode(),
                        Signature=SECRET_VALUES[1].decode(),
                        SecurityToken=SECRET_VALUES[2].decode(), topic="AclTopic")),
              (C2S, bframe(310, 2, 0, {b"AccessKey": SECRET_VALUES[0],
                                        b"Signature": SECRET_VALUES[1], b"b": b"BinV2"})),
              (S2C, resp(0, 1)), (S2C, resp(0, 2))]
    recs = _records(impl, frames)
    assert [r["resource"] for r in recs] == ["AclTopic", "BinV2", None, None]
    text = repr(recs)
    for secret in SECRET_VALUES:
        assert secret.decode() not in text


def test_topic_only_while_recording(impl):
    stats, p = make(impl)
    p.feed(C2S, req(10, 1, topic="T"))
    assert stats.snapshot()["frames"] == {("c2s", "SEND_MESSAGE"): 1}
    recs = []
    p.tracer = recs.append
    p.feed(C2S, req(10, 2, topic="T2"))
    assert [r["resource"] for r in recs] == ["T2"]


def test_topic_survives_any_split_of_a_long_header(impl):
    frame = req(310, 1, a="g" * 3000, b="SplitTopic", c="TBW102")
    for cut in (1, 9, 100, len(frame) - 20, len(frame) - 1):
        recs = _records(impl, [(C2S, frame[:cut]), (C2S, frame[cut:])])
        assert recs[0]["resource"] == "SplitTopic", cut


def test_long_topic_is_truncated_to_256_bytes(impl):
    recs = _records(impl, [(C2S, req(10, 1, topic="x" * 1000))])
    assert recs[0]["resource"] == "x" * 256


@settings(max_examples=300, deadline=None)
@given(topic=st.text(st.characters(exclude_categories=()), max_size=40),
       ascii_only=st.booleans(), short=st.booleans(),
       extra=st.dictionaries(st.text(max_size=6), json_values, max_size=3))
def test_topic_matches_json_loads(topic, ascii_only, short, extra):
    """Whatever escapes json.dumps writes, the topic is json.loads' value as UTF-8 (a
    lone surrogate, which UTF-8 cannot carry, as U+FFFD) on both twins."""
    if not ascii_only:             # raw surrogates are not UTF-8: only escaped ones
        topic = "".join(c for c in topic if not 0xD800 <= ord(c) <= 0xDFFF)
    key = "b" if short else "topic"
    ext = dict(extra)
    ext[key] = topic
    raw = json.dumps({"code": 310 if short else 10, "opaque": 1, "flag": 0,
                      "extFields": ext}, ensure_ascii=ascii_only).encode()
    loaded = json.loads(raw)["extFields"][key]      # escaped surrogate pairs combine
    want = "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in loaded).encode()
    assert jsonscan.topic(raw, key.encode()) == want
    for impl in IMPLS.values():
        recs = _records(impl, [(C2S, jframe(raw))])
        assert recs[0]["resource"] == want[:256].decode("utf-8", "replace")
