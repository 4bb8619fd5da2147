"""Thrift (ttheader) parser specifics on both twins: Kitex's exact layout, many calls in
flight answered in any order, the ACL token never reaching the frame log, zlib, the
method-name label bound, request_timeout with oneway calls, limits.  Golden
conversations, split points, garbage and the twin fuzzer are in tests/test_conformance.py
(data: proxy/protocols/ttheader/conformance.py)."""

import random

import pytest

from proxy.protocols.ttheader import codec
from proxy.protocols.ttheader.codec import CALL, REPLY, ONEWAY, binary_message, ttheader
from proxy.protocols.ttheader.conformance import (KITEX_GOLDEN, OK_BIN, ARGS_BIN, kitex_call,
                                                  kitex_reply)
from tests.parsers import impl_fixture, make as make_parser

C2S, S2C = 0, 1
impl, IMPLS = impl_fixture("ttheader")


def make(impl, **kw):
    return make_parser(impl, "ttheader", "thrift", **kw)


def traced(impl, **kw):
    stats, p = make(impl, **kw)
    recs = []
    p.tracer = recs.append
    return stats, p, recs


def test_codec_writes_kitex_layout_byte_for_byte():
    """The golden frame is laid out as Kitex's ttHeader.encode writes it (see
    conformance.KITEX_GOLDEN): u16 counts and lengths, str infos, int infos, padding."""
    assert codec.ttheader(binary_message("Echo", CALL, 5, b"\x00"), seq=5, flags=1,
                          strinfo={"a": "b"}, intinfo={3: "cvi", 9: "Echo"}) == KITEX_GOLDEN
    transport, fields, payload = codec.split(KITEX_GOLDEN)
    assert transport == "ttheader" and fields["strinfo"] == {"a": "b"}
    assert fields["intinfo"] == {3: "cvi", 9: "Echo"} and fields["flags"] == 1
    assert codec.parse_message_header(payload) == ("Echo", CALL, 5)


def test_golden_kitex_frame(impl):
    stats, p, recs = traced(impl)
    assert p.feed(C2S, KITEX_GOLDEN) == len(KITEX_GOLDEN)
    assert stats.snapshot()["frames"] == {("c2s", "Echo"): 1}
    p.close()
    assert recs[0]["attrs"] == {"a": "b", "FROM_SERVICE": "cvi", "TO_METHOD": "Echo"}
    assert recs[0]["header_bytes"] == 14 + 32 and recs[0]["resource"] == "Echo"


def test_many_in_flight_answered_in_any_order(impl):
    stats, p, recs = traced(impl)
    n = 500
    p.feed(C2S, b"".join(kitex_call("Echo" if i % 2 else "Get", i) for i in range(n)))
    assert p.pending == n
    order = list(range(n))
    random.Random(7).shuffle(order)
    p.feed(S2C, b"".join(kitex_reply("Echo" if i % 2 else "Get", i) for i in order))
    s = stats.snapshot()
    assert s["responses"] == {("Echo", "OK"): n // 2, ("Get", "OK"): n // 2}
    assert s["unmatched"] == 0 and s["in_flight"] == 0 and s["errors"] == {}
    replies = [r for r in recs if r["kind"] == "response"]
    assert [int(r["correlation_id"]) for r in replies] == order
    assert all(r["latency_ns"] is not None for r in replies)


def test_acl_token_never_reaches_records(impl):
    secret = b"ACL-SECRET-7f3a"
    stats, p, recs = traced(impl)
    p.feed(C2S, kitex_call("Echo", 1, acl=secret, strinfo={"k": "v"}))
    p.close()
    assert all(secret.decode() not in repr(r) for r in recs)
    assert recs[0]["attrs"] == {"k": "v"}


def test_zlib_payload_still_yields_the_method(impl):
    """A large zlib payload split across reads: the method is read from the inflated
    prefix, after asking for more compressed bytes when needed."""
    body = b"\x0b\x00\x01" + (20000).to_bytes(4, "big") + random.Random(1).randbytes(20000) \
        + b"\x00"
    frame = codec.theader(binary_message("Compressed" * 20, CALL, 9, body), seq=9,
                          transforms=[1])
    stats, p = make(impl)
    for k in range(0, len(frame), 7):
        p.feed(C2S, frame[k:k + 7])
    assert stats.snapshot()["frames"] == {("c2s", "Compressed" * 20): 1}
    assert p.pending == 1 and stats.snapshot()["errors"] == {}


def test_method_names_are_bounded_labels(impl):
    stats, p = make(impl)
    for i in range(300):
        p.feed(C2S, codec.framed(binary_message("m%d" % i, ONEWAY, i, b"\x00")))
    frames = stats.snapshot()["frames"]
    assert len(frames) == 257 and frames[("c2s", "other")] == 300 - 256


def test_oneway_never_times_out(impl):
    stats, p = make(impl, request_timeout=0.0)
    p.feed(C2S, codec.framed(binary_message("fire", ONEWAY, 1, ARGS_BIN)) +
           codec.framed(binary_message("call", CALL, 2, ARGS_BIN)))
    p.expire(now=1 << 62)
    p.close()
    assert stats.snapshot()["timeouts"] == {"call": 1}


def test_reply_naming_another_method_is_a_mismatch(impl):
    stats, p = make(impl)
    p.feed(C2S, kitex_call("Echo", 1))
    p.feed(S2C, kitex_reply("Other", 1))
    s = stats.snapshot()
    assert s["responses"] == {("Echo", "OK"): 1}          # counted under its request
    assert s["errors"] == {("s2c", "response_mismatch"): 1}


def test_a_bad_frame_leaves_the_next_one_counted(impl):
    """A well-framed frame that is not a Thrift message is counted and skipped; the
    next frame on the connection is read normally."""
    stats, p = make(impl)
    bad = ttheader(b"\x80\x07" + b"\x00" * 20)
    good = kitex_call("Echo", 3)
    assert p.feed(C2S, bad + good) == len(bad) + len(good)
    s = stats.snapshot()
    assert s["frames"] == {("c2s", "unknown"): 1, ("c2s", "Echo"): 1}
    assert s["errors"] == {("c2s", "bad_body"): 1} and p.error is None


def test_unframed_message_past_the_header_limit_fails(impl):
    stats, p = make(impl)
    big = binary_message("big", CALL, 1, b"\x0b\x00\x01" + (200000).to_bytes(4, "big")
                         + b"x" * 200000 + b"\x00")
    assert p.feed(C2S, big) < len(big)
    assert p.error is not None and p.error.reason == "header_too_large"


def test_exception_type_far_into_a_big_frame_is_unknown(impl):
    """A TApplicationException whose type lies past header_limit: status UNKNOWN,
    never a fatal error (the frame is framed, its end known)."""
    stats, p = make(impl)
    p.feed(C2S, codec.framed(binary_message("x", CALL, 1, b"\x00")))
    exc = codec.tapp_exception(1, "m" * 300000)
    p.feed(S2C, codec.framed(binary_message("x", 3, 1, exc)))
    s = stats.snapshot()
    assert p.error is None and s["responses"] == {("x", "UNKNOWN"): 1}


def test_declared_exception_and_void(impl):
    stats, p = make(impl)
    p.feed(C2S, kitex_call("a", 1) + kitex_call("b", 2) + kitex_call("c", 3))
    p.feed(S2C, kitex_reply("a", 1, OK_BIN) + kitex_reply("b", 2, b"\x00") +
           kitex_reply("c", 3, b"\x0c\x00\x02\x00\x00"))
    assert stats.snapshot()["responses"] == {("a", "OK"): 1, ("b", "OK"): 1,
                                             ("c", "EXCEPTION"): 1}


def test_zlib_and_compact_through_split_reads(impl):
    frame = codec.theader(codec.compact_message("cz", REPLY, 4, b"\x1c\x00\x00"), proto=2,
                          transforms=[1])
    assert codec.split(frame)[1]["transforms"] == [1]
    stats, p = make(impl)
    p.feed(C2S, codec.theader(codec.compact_message("cz", CALL, 4, b"\x00"), proto=2))
    for k in range(len(frame)):
        p.feed(S2C, frame[k:k + 1])
    assert stats.snapshot()["responses"] == {("cz", "EXCEPTION"): 1}


@pytest.mark.slow
def test_counts_do_not_depend_on_read_splits():
    """Random (mutated) conversations fed whole and in random pieces count the same on
    the compiled parser (zlib prefixes, unframed walks and exception types are read
    within fixed bounds, never 'whatever arrived')."""
    from hypothesis import HealthCheck, given, settings
    import tests.test_conformance as tc
    impl = tc.impls("ttheader")[-1]

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=tc._fuzz_case("ttheader"))
    def check(case):
        steps, seed, limits = case
        whole = tc.run(impl, "ttheader", steps, None, limits=limits)["counters"]
        cut = tc.run(impl, "ttheader", steps, tc._random_split(seed), limits=limits)["counters"]
        whole.pop("bytes")
        cut.pop("bytes")              # after a fatal error the feeds stop at different reads
        assert whole == cut
    check()


def _theader_raw(header, payload, seq=0):
    """A THeader frame with the header section's bytes as given (padded to words)."""
    import struct
    header += b"\x00" * (-len(header) % 4)
    return struct.pack(">IHHiH", 10 + len(header) + len(payload), 0x0FFF, 0, seq,
                       len(header) // 4) + header + payload


def test_theader_varints_tell_malformed_from_long(impl):
    """The info section's varints (proxy/_wire.pxd uvarint / proxy/wire_py.py): a
    protocol id in a 5-byte (non-minimal) varint is read; one whose first 5 bytes all
    continue is malformed (bad_header, the frame still counted by its message); the
    key/values after a well-formed prefix reach the frame log whole."""
    call = codec.binary_message("vm", CALL, 3, ARGS_BIN)
    long_zero = b"\x80\x80\x80\x80\x00"                       # 0 in five bytes
    info = b"\x01\x02" + b"\x01k\x02v1" + b"\x02kk\x01w"       # INFO_KEYVALUE, 2 pairs
    stats, p, recs = traced(impl)
    p.feed(C2S, _theader_raw(long_zero + b"\x00" + info, call, seq=3))
    p.close()
    assert stats.snapshot()["errors"] == {}
    assert stats.snapshot()["frames"] == {("c2s", "vm"): 1}
    assert recs[0]["attrs"] == {"k": "v1", "kk": "w"}
    stats, p = make(impl)
    p.feed(C2S, _theader_raw(b"\x80\x80\x80\x80\x80\x00\x00", call, seq=3))
    assert stats.snapshot()["errors"] == {("c2s", "bad_header"): 1}
    assert stats.snapshot()["frames"] == {("c2s", "vm"): 1}


def test_wire_py_uvarint_needs_more_or_is_malformed():
    from proxy.wire_py import uvarint_at
    assert uvarint_at(b"\x96\x01", 0, 2, 5) == (2, 150)
    assert uvarint_at(b"\x96\x01", 0, 1, 5) == (0, 0)        # need more: lim cut it
    assert uvarint_at(b"\xff" * 5 + b"\x01", 0, 6, 5) == (-1, 0)   # longer than 5 bytes
    assert uvarint_at(b"\xff" * 4, 0, 4, 5) == (0, 0)        # 4 of at most 5: need more
    assert uvarint_at(b"\xff" * 9 + b"\x01", 0, 10, 10) == (10, (1 << 64) - 1)
    assert uvarint_at(b"\x00\x05", 1, 2, 3) == (1, 5)
    assert uvarint_at(b"\x05", 1, 1, 3) == (0, 0)            # nothing there yet
