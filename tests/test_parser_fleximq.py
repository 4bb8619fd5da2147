"""fleximq parser specifics on both twins: the in-place MessagePack scanner against the
msgpack reference (header.summarize), the fallback, the limits, status labels and bad
input.  The golden conversations, every split point, byte-at-a-time feeding and the
twin-agreement fuzzer are in tests/test_conformance.py (data: fleximq/conformance.py).
"""

import struct

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from proxy.protocols.fleximq import codec, header
from proxy.protocols.fleximq.codec import REQ, REP, SUB, BCAST, encode
from proxy.protocols.fleximq.conformance import header_dict
from tests.parsers import NO_EXTENSIONS, impl_fixture, make as make_parser

C2S, S2C = 0, 1
impl, IMPLS = impl_fixture("fleximq")

if not NO_EXTENSIONS:
    from proxy.protocols.fleximq import _parser
    scan = _parser.scan_header
else:                                       # the scanner is the compiled one
    scan = None
needs_c = pytest.mark.skipif(scan is None, reason="FRAMETAP_NO_EXTENSIONS: no scanner")


def make(impl, **kw):
    return make_parser(impl, "fleximq", "fx", **kw)


# ---- the scanner against msgpack -------------------------------------------------------

@pytest.mark.slow
@needs_c
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(header_dict())
def test_scanner_equals_msgpack_on_any_header(h):
    raw = msgpack.packb(h, use_bin_type=True)
    got = scan(raw)
    assert got is not None, "a header msgpack.packb writes never needs the fallback"
    assert got == header.summarize(raw)


@pytest.mark.slow
@needs_c
@settings(max_examples=600, deadline=None)
@given(header_dict(), st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)),
                               max_size=3), st.integers(0, 400))
def test_scanner_equals_msgpack_on_mutated_bytes(h, flips, cut):
    raw = bytearray(msgpack.packb(h, use_bin_type=True))
    for pos, val in flips:
        if raw:
            raw[pos % len(raw)] = val
    raw = bytes(raw[:cut]) if cut < len(raw) else bytes(raw)
    got = scan(raw)
    if got is not None:                     # None: the parser asks msgpack itself
        assert got == header.summarize(raw)


@needs_c
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_scanner_equals_msgpack_on_random_bytes(raw):
    got = scan(raw)
    if got is not None:
        assert got == header.summarize(raw)


@needs_c
def test_unusual_headers_go_to_the_fallback():
    ext = b"\x82\xa5topic\xa1t\xa1x\xd4\x01\x00"                 # an extension value
    dup = b"\x82\xa5topic\xa1a\xa5topic\xa1b"                    # topic twice: last wins
    deep = b"\x82\xa5topic\xa1t\xa1x" + b"\x91" * 40 + b"\x01"   # 40 levels
    ckey = b"\x82\xa5topic\xa1t\x91\x01\x01"                     # a container as a key
    for raw in (ext, dup, deep, ckey):
        assert scan(raw) is None
    assert header.summarize(dup).topic == b"b"
    assert header.summarize(ext).topic == b"t"
    assert header.summarize(deep).topic == b"t"
    assert header.summarize(ckey).malformed          # unhashable key: msgpack refuses


def test_fallback_frames_count_the_same_on_both_twins():
    dup = encode(SUB, 1000, raw_header=b"\x82\xa5topic\xa1a\xa5topic\xa1b")
    ext = encode(REQ, 1000, raw_header=msgpack.packb(
        {"routing": [{"client_id": 1001}], "reqrep": {"type": "request", "id": "e"},
         "x": msgpack.ExtType(5, b"zz")}))
    results = []
    for name, im in sorted(IMPLS.items()):
        stats, p = make(im)
        recs = []
        p.tracer = recs.append
        p.feed(C2S, dup + ext)
        p.feed(S2C, codec.rep(1001, 1000, "e"))
        s = stats.snapshot()
        assert s["errors"] == {} and s["responses"] == {("REQ", "200"): 1}, name
        assert recs[0]["resource"] == "b"
        results.append([{k: v for k, v in r.items() if k not in ("t_ns", "latency_ns")}
                        for r in recs])
    assert all(r == results[0] for r in results)


# ---- limits, before anything is buffered ------------------------------------------------

def test_header_limit_is_64_kib(impl):
    big = {"topic": "t", "pad": "p" * (65536 - 16)}
    raw = msgpack.packb(big)
    raw = msgpack.packb({"topic": "t", "pad": "p" * (65536 - 16 - (len(raw) - 65536))})
    assert len(raw) == 65536
    stats, p = make(impl)
    frame = encode(SUB, 1000, raw_header=raw)
    for i in range(0, len(frame), 1000):                       # the header spans reads
        p.feed(C2S, frame[i:i + 1000])
    s = stats.snapshot()
    assert s["frames"] == {("c2s", "SUB"): 1} and s["errors"] == {}
    stats, p = make(impl)
    over = struct.pack(">BBI16sIQ", 1, SUB, 1000, b"\0" * 16, 65537, 0)
    assert p.feed(C2S, over) == 0
    assert p.error is not None and p.error.reason == "header_too_large"


def test_total_limit_is_configurable(impl):
    stats, p = make(impl, max_frame_bytes=1000)
    ok = encode(BCAST, 1000, raw_payload=b"x" * (1000 - 34))
    assert p.feed(C2S, ok) == 1000
    too = encode(BCAST, 1000, raw_payload=b"x" * (1001 - 34))
    assert p.feed(C2S, too[:34]) == 0                           # refused on the prefix
    assert p.error.reason == "frame_too_large"
    stats, p = make(impl)
    assert p.max_frame_bytes == 1 << 30


def test_payload_is_never_read(impl):
    stats, p = make(impl)
    frame = encode(REQ, 1000, {"routing": [{"client_id": 1}], "reqrep": {"type": "request",
                                                                          "id": "p"}},
                   raw_payload=b"\xc1" * 5000)                  # not MessagePack
    assert p.feed(C2S, frame) == len(frame)
    assert stats.snapshot()["errors"] == {}


# ---- status labels (docs/design.md, "Prometheus metrics") -------------------------------

def test_status_labels(impl):
    stats, p = make(impl)
    for i, status in enumerate([None, 204, 404, 600, 2 ** 32, "x"]):
        rid = "r%d" % i
        p.feed(C2S, codec.req(1000, 1001, rid))
        if status in (2 ** 32, "x"):
            p.feed(S2C, encode(REP, 1001, {"routing": [{"client_id": 1000}],
                                           "reqrep": {"type": "correlation", "id": rid},
                                           "status": status}))
        else:
            p.feed(S2C, codec.rep(1001, 1000, rid, status=status))
    s = stats.snapshot()
    assert s["responses"] == {("REQ", "200"): 1, ("REQ", "204"): 1, ("REQ", "404"): 1,
                              ("REQ", "600"): 1, ("REQ", "invalid"): 2}
    assert {k: sum(v[0]) for k, v in s["hist"].items()} == {("REQ", "ok"): 2,
                                                            ("REQ", "error"): 4}
    assert s["errors"] == {("s2c", "bad_header"): 2}          # the two ill-typed statuses


# ---- bad input: counted, the stream goes on, other connections unaffected ----------------

BAD = [
    ("invalid msgpack", encode(REQ, 1000, raw_header=b"\xc1"), "bad_header"),
    ("not a map", encode(REQ, 1000, raw_header=msgpack.packb("str")), "bad_header"),
    ("reqrep a string", encode(REQ, 1000, {"routing": [{"client_id": 1}], "reqrep": "x"}),
     "bad_header"),
    ("routing not an array", encode(REQ, 1000, {"routing": 5, "reqrep": {
        "type": "request", "id": "y"}}), "bad_header"),
    ("unknown type", encode(77, 1000, {}), "unknown_command"),
    ("version 3", encode(REQ, 1000, {}, version=3), "bad_version"),
]


@pytest.mark.parametrize("name,frame,reason", BAD, ids=[b[0] for b in BAD])
def test_bad_header_counted_and_stream_continues(impl, name, frame, reason):
    stats, p = make(impl)
    other = type(p)(stats)                                     # another connection
    good = codec.req(1000, 1001, "g")
    assert p.feed(C2S, frame + good) == len(frame) + len(good)
    other.feed(C2S, codec.req(1000, 1001, "o"))
    other.feed(S2C, codec.rep(1001, 1000, "o"))
    p.feed(S2C, codec.rep(1001, 1000, "g"))
    s = stats.snapshot()
    assert s["errors"].get(("c2s", reason), 0) >= 1
    assert s["responses"] == {("REQ", "200"): 2}
    assert p.error is None and other.error is None


def test_reserved_bytes_are_ignored(impl):
    stats, p = make(impl)
    p.feed(C2S, encode(SUB, 1000, {"topic": "t"}, reserved=bytes(range(1, 17))))
    s = stats.snapshot()
    assert s["frames"] == {("c2s", "SUB"): 1} and s["errors"] == {}


def test_rep_matching_nothing_is_unmatched(impl):
    stats, p = make(impl)
    recs = []
    p.tracer = recs.append
    p.feed(S2C, codec.rep(1001, 1000, "ghost"))
    s = stats.snapshot()
    assert s["unmatched"] == 1 and s["errors"] == {}
    assert recs[0]["kind"] == "response" and recs[0]["latency_ns"] is None
    assert recs[0]["correlation_id"] == codec.log_correlation_id("ghost")


def test_secrets_never_reach_the_record(impl):
    for auth in ({"type": "token", "token": "SeCrEt1"},
                 {"type": "basic", "username": "bob", "password": "SeCrEt1"},
                 {"type": "api_key", "api_key": "SeCrEt1"}):
        stats, p = make(impl)
        recs = []
        p.tracer = recs.append
        p.feed(C2S, codec.join(auth=auth))
        p.close()
        assert recs and "SeCrEt1" not in repr(recs) and "bob" not in repr(recs)


UTF8_CASES = [b"plain-ascii-longer-than-8", "\u00e9t\u00e9 caf\u00e9 na\u00efve".encode(),
              "\U0001F600 emoji after eight bytes".encode(), b"12345678\xc3\xa9",
              b"\xc0\xaf", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
              b"\xf0\x9f\x98", b"abcdefg\xff", b"abcdefgh\x80ijklmnop", b"\xc3"]


@needs_c
@pytest.mark.parametrize("raw", UTF8_CASES)
def test_scanner_utf8_matches_python(raw):
    """Strict UTF-8 as Python decodes it, in values and in keys, across the scanner's
    8-byte ASCII steps."""
    s = (bytes([0xa0 | len(raw)]) if len(raw) < 32 else b"\xd9" + bytes([len(raw)])) + raw
    for h in (b"\x81\xa5topic" + s,                         # a value the proxy reads
              b"\x82\xa5topic\xa1t" + s + b"\x01",          # an unknown key
              b"\x82\xa5topic\xa1t\xa1x" + s,                # an unknown key's value
              b"\x81\xa7routing\x91\x81" + s + b"\x01"):    # a key in a routing entry
        got = scan(h)
        assert got is not None and got == header.summarize(h), h
    valid = True
    try:
        raw.decode()
    except UnicodeDecodeError:
        valid = False
    assert scan(b"\x81\xa5topic" + s).malformed is not valid
