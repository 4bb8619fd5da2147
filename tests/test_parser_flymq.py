"""FlyMQ parser specifics on the compiled parser and its pure-Python twin (flymq_impl).

The golden conversation, every split point, byte-at-a-time feeding, garbage and the
twin-agreement fuzzer are in tests/test_conformance.py (data: flymq/conformance.py).
"""

import struct

from hypothesis import given, settings, strategies as st

from proxy.errors import FlyMQFrameError
from proxy.protocols.flymq.conformance import frame, produce
from tests.parsers import make as make_parser

C2S, S2C = 0, 1


def make(impl, **kw):
    return make_parser(impl, "flymq", "r1", **kw)


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
    assert s["timeouts"] == {} and s["in_flight"] == 0
    assert s["cutoffs"] == {"PRODUCE": 1}        # its connection closed before the answer


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


# ---- the frame log's resource: the request's topic ----------------------------------

def _records(impl, frames):
    stats, p = make(impl)
    recs = []
    p.tracer = recs.append
    for d, f in frames:
        assert p.feed(d, f) == len(f)
    p.close()
    return recs


def test_auth_password_never_reaches_a_record(flymq_impl):
    from proxy.protocols.flymq import codec
    from proxy.protocols.flymq.conformance import AUTH_PASSWORD
    auth = codec.AuthRequest("alice", AUTH_PASSWORD.decode()).to_frame()
    ok = codec.AuthResponse(True, "", "alice", ["admin"]).to_frame()
    for cut in range(1, len(auth)):
        recs = _records(flymq_impl, [(C2S, auth[:cut]), (C2S, auth[cut:]), (S2C, ok)])
        assert [(r["kind"], r["resource"], r["attrs"]) for r in recs] == [
            ("request", None, None), ("response", None, None)]
        assert AUTH_PASSWORD.decode() not in repr(recs) and "alice" not in repr(recs)


def test_topic_only_while_recording(flymq_impl):
    stats, p = make(flymq_impl)
    p.feed(C2S, produce(topic=b"quiet"))
    recs = []
    p.tracer = recs.append
    p.feed(C2S, produce(topic=b"loud"))
    assert [r["resource"] for r in recs] == ["loud"]
    assert stats.snapshot()["frames"] == {("c2s", "PRODUCE"): 2}


def test_topic_split_anywhere(flymq_impl):
    f = produce(value=b"v" * 50, topic=b"split-topic")
    for cut in range(1, len(f)):
        recs = _records(flymq_impl, [(C2S, f[:cut]), (C2S, f[cut:])])
        assert recs[0]["resource"] == "split-topic", cut
