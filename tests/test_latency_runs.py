"""Answers counted by run keep each request's own latency.

While nothing is recorded, FlyMQ's frame loop (fast_frames) adds a read's like answers up
as one run and counts it once (proxy/_framing.pxd, ``Tally``): answers in one read to the
requests of one earlier read share their latency, because the parser reads the clock once
a read.  A run must end where the latency, the request's opcode, the status or the outcome
changes.  Here one read answers requests from two reads SLEEP apart, with an ERROR among
them: the histogram, its sum and the response counts must be what each answer alone
gives, without a tracer (the counting loop) and with one (answer() per frame), in both
twins.
"""

import time

from proxy import framing_common
from proxy.protocols.flymq.conformance import frame, produce
from tests.test_conformance import impls

C2S, S2C = 0, 1
SLEEP = 0.6                                    # s between the two reads of requests
SPLIT = framing_common.BUCKETS.index(0.5) + 1  # buckets from here hold latencies > 0.5 s
OK = frame(0x01, b"r" * 34)
ERROR = frame(0xFF, b"no such topic", flags=0)


def parsers():
    out = []
    for label, RouteStats, Parser in impls("flymq"):
        for traced in (False, True):
            stats = RouteStats("route", "flymq")
            p = Parser(stats, options={})
            if traced:
                p.tracer = lambda rec: None
            out.append((f"{label}-{'traced' if traced else 'counting'}", stats, p))
    return out


def test_a_run_of_answers_splits_where_their_latency_differs():
    ps = parsers()
    for _, _, p in ps:                         # read 1: five requests
        assert p.feed(C2S, produce() * 5) == len(produce()) * 5
    time.sleep(SLEEP)
    answers = OK * 5 + OK + ERROR + OK         # read 2's three requests, one refused
    for _, _, p in ps:
        assert p.feed(C2S, produce() * 3) == len(produce()) * 3
        assert p.feed(S2C, answers) == len(answers)     # one read answers all eight
    seen = {}
    for label, stats, p in ps:
        snap = stats.snapshot()
        hist = {k: (list(counts), total) for k, (counts, total) in snap["hist"].items()}
        ok_counts, ok_sum = hist[("PRODUCE", "ok")]
        err_counts, err_sum = hist[("PRODUCE", "error")]
        # read 1's five answers waited SLEEP; read 2's three did not
        assert sum(ok_counts[SPLIT:]) == 5, (label, ok_counts)
        assert sum(ok_counts[:SPLIT]) == 2, (label, ok_counts)
        assert sum(err_counts[SPLIT:]) == 0 and sum(err_counts) == 1, (label, err_counts)
        assert 5 * SLEEP <= ok_sum < 5 * SLEEP + 3 * 0.5, (label, ok_sum)
        assert 0 <= err_sum < 0.5, (label, err_sum)
        assert snap["responses"] == {("PRODUCE", "OK"): 7, ("PRODUCE", "ERROR"): 1}, label
        assert snap["in_flight"] == 0 and snap["unmatched"] == 0, label
        seen[label] = (snap["frames"], snap["frame_bytes"], snap["messages"])
    first = next(iter(seen.values()))
    assert all(v == first for v in seen.values()), seen


def test_answers_to_timed_out_requests_are_counted_not_observed():
    """Answers to requests that timed out are counted but not observed, in the same read
    as answers that are: two runs, one of them without a latency."""
    for label, stats, p in parsers():
        p.feed(C2S, produce() * 2)
        p.expire(now=time.monotonic_ns() + 10**12)     # both time out
        p.feed(C2S, produce() * 2)
        answers = OK * 4
        assert p.feed(S2C, answers) == len(answers)
        snap = stats.snapshot()
        counts, _ = snap["hist"][("PRODUCE", "ok")]
        assert sum(counts) == 2, (label, counts)
        assert snap["responses"] == {("PRODUCE", "OK"): 4}, label
        assert snap["timeouts"] == {"PRODUCE": 2}, (label, snap["timeouts"])
        assert snap["in_flight"] == 0, label
