"""FlyMQ parser: run against the compiled parser and its pure-Python twin (flymq_impl)."""

import struct

import pytest
from hypothesis import given, settings, strategies as st

from proxy.errors import FlyMQFrameError

C2S, S2C = 0, 1


def frame(op, payload=b"", version=1, flags=1, magic=0xAF):
    return bytes([magic, version, op, flags]) + struct.pack(">I", len(payload)) + payload


def produce(value=b"hello", topic=b"test"):
    payload = struct.pack(">H", len(topic)) + topic + struct.pack(">I", 0) \
        + struct.pack(">I", len(value)) + value + struct.pack(">i", -1)
    return frame(0x01, payload)


def fetch_response(n):
    body = struct.pack(">I", n)
    for i in range(n):
        body += struct.pack(">I", 0) + struct.pack(">I", 3) + b"abc" + struct.pack(">Q", i)
    return frame(0x07, body + struct.pack(">Q", n))


def make(impl, **kw):
    RouteStats, Parser = impl
    stats = RouteStats("r1", "flymq")
    return stats, Parser(stats, **kw)


def counters(stats):
    s = stats.snapshot()
    return {k: s[k] for k in ("frames", "frame_bytes", "messages", "responses", "timeouts",
                              "unmatched", "in_flight", "errors")} | {
        "hist_counts": {k: sum(v[0]) for k, v in s["hist"].items()}}


# A conversation: PRODUCE, FETCH (3 messages), CONSUME, an unknown opcode answered by
# ERROR, and an empty-payload LIST_TOPICS.
REQUESTS = [produce(), frame(0x07, b"\x00\x04test" + b"\0" * 16), frame(0x02, b"x" * 14),
            frame(0x99, b"?"), frame(0x08)]
RESPONSES = [frame(0x01, b"r" * 34), fetch_response(3), frame(0x02, b"k" * 12),
             frame(0xFF, b"\x00\x00\x07unknown"), frame(0x08, b"\0\0\0\0")]
C2S_STREAM = b"".join(REQUESTS)
S2C_STREAM = b"".join(RESPONSES)


def feed_all(parser, d, data, cuts):
    """Feed ``data`` cut at the given offsets; every call must accept all its bytes."""
    prev = 0
    for cut in list(cuts) + [len(data)]:
        chunk = data[prev:cut]
        assert parser.feed(d, chunk) == len(chunk)
        prev = cut


def test_conversation_counts(flymq_impl):
    stats, p = make(flymq_impl)
    feed_all(p, C2S, C2S_STREAM, [])
    assert p.pending == 5
    feed_all(p, S2C, S2C_STREAM, [])
    c = counters(stats)
    assert c["frames"] == {("c2s", "PRODUCE"): 1, ("c2s", "FETCH"): 1, ("c2s", "CONSUME"): 1,
                           ("c2s", "unknown_153"): 1, ("c2s", "LIST_TOPICS"): 1,
                           ("s2c", "PRODUCE"): 1, ("s2c", "FETCH"): 1, ("s2c", "CONSUME"): 1,
                           ("s2c", "ERROR"): 1, ("s2c", "LIST_TOPICS"): 1}
    assert c["frame_bytes"][("c2s", "PRODUCE")] == len(REQUESTS[0])
    assert c["frame_bytes"][("s2c", "FETCH")] == len(RESPONSES[1])
    assert c["messages"] == {("c2s", "PRODUCE"): 1, ("s2c", "FETCH"): 3, ("s2c", "CONSUME"): 1}
    assert c["responses"] == {("PRODUCE", "OK"): 1, ("FETCH", "OK"): 1, ("CONSUME", "OK"): 1,
                              ("unknown_153", "ERROR"): 1, ("LIST_TOPICS", "OK"): 1}
    assert c["hist_counts"] == {("PRODUCE", "ok"): 1, ("FETCH", "ok"): 1, ("CONSUME", "ok"): 1,
                                ("unknown_153", "error"): 1, ("LIST_TOPICS", "ok"): 1}
    assert c["in_flight"] == 0 and c["unmatched"] == 0 and c["errors"] == {}
    assert stats.snapshot()["bytes"] == {"c2s": len(C2S_STREAM), "s2c": len(S2C_STREAM)}


@pytest.fixture(scope="module")
def reference_counts():
    from proxy.framing_py import RouteStats
    from proxy.protocols.flymq.parser_py import FlyMQParser
    stats = RouteStats("r1", "flymq")
    p = FlyMQParser(stats)
    p.feed(C2S, C2S_STREAM)
    p.feed(S2C, S2C_STREAM)
    return counters(stats)


def test_every_split_point(flymq_impl, reference_counts):
    """Both streams cut at every byte offset give the same counts as one read."""
    for cut in range(1, max(len(C2S_STREAM), len(S2C_STREAM))):
        stats, p = make(flymq_impl)
        feed_all(p, C2S, C2S_STREAM, [c for c in (cut,) if c < len(C2S_STREAM)])
        feed_all(p, S2C, S2C_STREAM, [c for c in (cut,) if c < len(S2C_STREAM)])
        assert counters(stats) == reference_counts, f"split at {cut}"


def test_one_byte_at_a_time(flymq_impl, reference_counts):
    stats, p = make(flymq_impl)
    feed_all(p, C2S, C2S_STREAM, range(1, len(C2S_STREAM)))
    feed_all(p, S2C, S2C_STREAM, range(1, len(S2C_STREAM)))
    assert counters(stats) == reference_counts


def test_accepts_bytearray_and_memoryview(flymq_impl, reference_counts):
    stats, p = make(flymq_impl)
    assert p.feed(C2S, bytearray(C2S_STREAM)) == len(C2S_STREAM)
    assert p.feed(S2C, memoryview(S2C_STREAM)) == len(S2C_STREAM)
    assert counters(stats) == reference_counts


def test_bad_magic_is_fatal_with_clear_message(flymq_impl):
    stats, p = make(flymq_impl)
    good = produce()
    data = good + b"\x16\x03\x01\x02\x00\x01\x00\x01" + good
    assert p.feed(C2S, data) == len(good)           # the valid prefix may be forwarded
    assert isinstance(p.error, FlyMQFrameError)
    assert p.error.reason == "bad_magic" and p.error.offset == len(good)
    assert "bad magic 0x16" in str(p.error) and "expected 0xAF" in str(p.error)
    assert "TLS" in str(p.error)
    assert stats.snapshot()["errors"] == {("c2s", "bad_magic"): 1}
    assert p.feed(C2S, good) == 0                   # nothing more after a fatal error


def test_garbage_bytes(flymq_impl):
    stats, p = make(flymq_impl)
    assert p.feed(C2S, b"GET / HTTP/1.1\r\n\r\n") == 0
    assert p.error.reason == "bad_magic"


def test_over_limit_length_rejected_from_header_alone(flymq_impl):
    stats, p = make(flymq_impl, max_frame_bytes=1024)
    header = bytes([0xAF, 1, 1, 1]) + struct.pack(">I", 1025)
    assert p.feed(C2S, header) == 0                 # no payload byte needed to decide
    assert p.error.reason == "frame_too_large"
    assert "1025" in str(p.error) and "1024" in str(p.error)
    assert stats.snapshot()["errors"] == {("c2s", "frame_too_large"): 1}


def test_default_limit_is_32_mib(flymq_impl):
    stats, p = make(flymq_impl)
    ok = bytes([0xAF, 1, 1, 1]) + struct.pack(">I", 32 * 1024 * 1024)
    assert p.feed(C2S, ok) == 8 and p.error is None
    stats, p = make(flymq_impl)
    assert p.feed(C2S, bytes([0xAF, 1, 1, 1]) + struct.pack(">I", 32 * 1024 * 1024 + 1)) == 0
    assert p.error.reason == "frame_too_large"


def test_error_in_split_header_reports_frame_start(flymq_impl):
    stats, p = make(flymq_impl)
    good = produce()
    assert p.feed(C2S, good + b"\xAF\x01") == len(good) + 2
    # the rest of that header declares 64 MiB: the bad frame started in the previous read
    assert p.feed(C2S, b"\x01\x01\x04\x00\x00\x00") == 0
    assert p.error.offset == len(good)


def test_bad_version_counted_not_fatal(flymq_impl):
    stats, p = make(flymq_impl)
    data = frame(0x01, b"x", version=2)
    assert p.feed(C2S, data) == len(data)
    assert p.error is None
    assert stats.snapshot()["errors"] == {("c2s", "bad_version"): 1}


def test_unmatched_response(flymq_impl):
    stats, p = make(flymq_impl)
    p.feed(S2C, frame(0x01, b"x"))
    assert stats.snapshot()["unmatched"] == 1


def test_half_frame_then_close_is_truncated_and_timeout(flymq_impl):
    stats, p = make(flymq_impl)
    data = produce()
    p.feed(C2S, data[:5])
    p.close()
    s = stats.snapshot()
    assert s["errors"] == {("c2s", "truncated_frame"): 1}
    assert s["timeouts"] == {} and s["in_flight"] == 0   # header never completed
    stats, p = make(flymq_impl)
    p.feed(C2S, data[:-1])                          # header seen: the request is pending
    p.close()
    s = stats.snapshot()
    assert s["errors"] == {("c2s", "truncated_frame"): 1}
    assert s["timeouts"] == {"PRODUCE": 1} and s["in_flight"] == 0


def test_expire_counts_timeouts_and_late_answer_not_observed(flymq_impl):
    from proxy.framing_py import now_ns
    stats, p = make(flymq_impl, request_timeout=0.5)
    p.feed(C2S, produce() + produce())
    assert stats.snapshot()["in_flight"] == 2
    assert p.expire(now_ns()) == 0
    assert p.expire(now_ns() + 600_000_000) == 2
    assert p.expire(now_ns() + 700_000_000) == 0    # counted once
    s = stats.snapshot()
    assert s["timeouts"] == {"PRODUCE": 2} and s["in_flight"] == 0
    p.feed(S2C, frame(0x01, b"r"))                  # the late answer
    s = stats.snapshot()
    assert s["responses"] == {("PRODUCE", "OK"): 1}
    assert s["hist"] == {} and s["unmatched"] == 0


def test_latency_is_measured_between_reads(flymq_impl):
    import time
    stats, p = make(flymq_impl)
    p.feed(C2S, produce())
    time.sleep(0.02)
    p.feed(S2C, frame(0x01, b"r"))
    counts, total = stats.snapshot()["hist"][("PRODUCE", "ok")]
    assert 0.015 < total < 1.0
    assert counts[:7] == [0] * 7                    # nothing under 5 ms
    assert sum(counts) == 1


def test_response_opcode_mismatch_counted(flymq_impl):
    stats, p = make(flymq_impl)
    p.feed(C2S, produce())
    p.feed(S2C, frame(0x02, b"x"))
    s = stats.snapshot()
    assert s["errors"] == {("s2c", "response_mismatch"): 1}
    assert s["responses"] == {("PRODUCE", "OK"): 1}


def test_fifo_overflow_bounded(flymq_impl):
    stats, p = make(flymq_impl)
    p.fifo_limit = 16
    p.feed(C2S, frame(0x08) * 20)
    s = stats.snapshot()
    assert p.pending == 16
    assert s["errors"] == {("c2s", "in_flight_overflow"): 4}
    assert s["timeouts"] == {"LIST_TOPICS": 4} and s["in_flight"] == 16


def test_shared_route_stats_across_connections(flymq_impl):
    RouteStats, Parser = flymq_impl
    stats = RouteStats("r1", "flymq")
    a, b = Parser(stats), Parser(stats)
    a.feed(C2S, produce())
    b.feed(C2S, produce())
    b.feed(S2C, frame(0x01, b"r"))
    s = stats.snapshot()
    assert s["frames"][("c2s", "PRODUCE")] == 2 and s["in_flight"] == 1


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200), cut=st.integers(0, 200))
def test_random_bytes_never_crash(data, cut):
    """Garbage in either direction: a count or a FrameError, never an exception."""
    from tests.conftest import IMPLS
    for RouteStats, Parser in IMPLS.values():
        stats = RouteStats("r", "flymq")
        p = Parser(stats, max_frame_bytes=4096)
        for d in (C2S, S2C):
            a = p.feed(d, data[:cut])
            assert 0 <= a <= len(data[:cut])
            if p.error is None:
                assert p.feed(d, data[cut:]) <= len(data[cut:])
        p.close()
        assert stats.snapshot()["in_flight"] == 0


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(1, len(C2S_STREAM) - 1), max_size=8))
def test_random_splits_agree_between_twins(cuts):
    from tests.conftest import IMPLS
    results = []
    for impl in IMPLS.values():
        stats, p = make(impl)
        feed_all(p, C2S, C2S_STREAM, sorted(set(cuts)))
        feed_all(p, S2C, S2C_STREAM, sorted(set(c for c in cuts if c < len(S2C_STREAM))))
        results.append(counters(stats))
    assert all(r == results[0] for r in results)
