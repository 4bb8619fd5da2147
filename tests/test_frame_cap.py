"""The frame cap (docs/design.md, "Fairness"): with ``frame_cap`` set, feed() stops at the
first frame boundary once the frames and pending requests it parsed reach the cap,
sets ``more`` and consumes only the bytes before that boundary; the relay feeds the
rest later.  Cutting a read that way must change nothing a parser counts: every
protocol's conformance conversations and garbage, fed whole and fed cap by cap, give
the same counters, records, errors and forwarded bytes (held directions included), in
both twins."""

import pytest

import proxy.protocols
from proxy import framing_py
from proxy.framing import HAVE_EXTENSIONS

NAMES = sorted(s.name for s in proxy.protocols.specs())


def twins(name):
    spec = proxy.protocols.load(name)
    out = [("py", framing_py.RouteStats, spec.load_parser(pure_python=True))]
    if HAVE_EXTENSIONS:
        from proxy import _framing
        out.append(("c", _framing.RouteStats, spec.load_parser(pure_python=False)))
    return out


def reads_of(name):
    """Each conversation as reads: consecutive frames of one direction in one read (so a
    read holds several frames to cut), then each garbage case on its own."""
    spec = proxy.protocols.load(name)
    conf = spec.load_conformance()
    cases = []
    for conv in conf.conversations():
        reads = []
        for d, f in conv.steps:
            if reads and reads[-1][0] == d:
                reads[-1] = (d, reads[-1][1] + bytes(f))
            else:
                reads.append((d, bytes(f)))
        cases.append(reads)
    good = cases[0] if cases else []
    for g in conf.garbage():               # a valid prefix, then the garbage, one read
        prefix = b"".join(f for d, f in good if d == g.direction)
        cases.append([(g.direction, prefix + bytes(g.data))])
    samples = spec.load_samples()
    _desc, reqs, resps = samples.bench_frames(16, 64)
    cases.append([(0, b"".join(bytes(f) for f in reqs[:40])),
                  (1, b"".join(bytes(f) for f in resps[:40]))])
    return cases


def run(stats_cls, parser_cls, name, reads, cap, trace=True):
    """Without `trace` nothing is recorded: a parser with a fast_frames() loop
    (proxy/_framing.pxd) counts the plain frames there, and must stop at the cap too."""
    stats = stats_cls("cap", name)
    p = parser_cls(stats, None, 30.0, {})
    records = []
    if trace:
        p.tracer = records.append
    p.frame_cap = cap
    cuts = most = 0
    forwarded = [bytearray(), bytearray()]     # what the relay would send on, by direction
    for d, data in reads:
        pos = 0
        while pos < len(data) and p.error is None:
            piece = memoryview(data)[pos:] if pos else data
            ok = p.feed(d, piece)
            # a held direction (address rewriting) hands its bytes over in ``output``
            forwarded[d] += b"".join(p.output) if p.output is not None else piece[:ok]
            most = max(most, p.feed_frames)
            pos += ok
            if not p.more:
                break
            assert p.error is None and 0 < ok
            cuts += 1
        if p.error is not None:
            break
    p.close()
    s = stats.snapshot()
    counters = {k: s[k] for k in ("frames", "frame_bytes", "messages", "responses",
                                  "timeouts", "unmatched", "in_flight", "errors", "bytes")}
    for r in records:                      # clock readings differ run to run
        for k in [k for k in r if k.endswith("_ns")]:
            del r[k]
    err = p.error
    return ((counters, records, None if err is None else (err.reason, err.offset),
             [bytes(f) for f in forwarded]), cuts, most)


@pytest.mark.parametrize("name", NAMES)
def test_cutting_reads_at_the_frame_cap_changes_nothing_counted(name):
    cut_somewhere = False
    for impl, stats_cls, parser_cls in twins(name):
        for case in reads_of(name):
            whole, cuts, _ = run(stats_cls, parser_cls, name, case, 0)
            assert cuts == 0                     # no cap: never cut
            quiet, cuts, _ = run(stats_cls, parser_cls, name, case, 0, trace=False)
            assert cuts == 0
            assert quiet[1] == [] and quiet[0] == whole[0] and quiet[2:] == whole[2:], \
                (impl, "recording changed a counter", case)
            for cap in (1, 2, 3, 7):
                for trace, want in ((True, whole), (False, quiet)):
                    got, cuts, most = run(stats_cls, parser_cls, name, case, cap, trace)
                    assert got == want, (impl, cap, trace, case)
                    assert most <= cap
                    cut_somewhere |= cuts > 0
    assert cut_somewhere, "no read held two frames: the test cut nothing"


@pytest.mark.parametrize("name", NAMES)
def test_more_is_set_only_when_bytes_are_left(name):
    _desc, reqs, _ = proxy.protocols.load(name).load_samples().bench_frames(16, 64)
    data = b"".join(bytes(f) for f in reqs[:10])
    for impl, stats_cls, parser_cls in twins(name):
        p = parser_cls(stats_cls("cap", name), None, 30.0, {})
        p.frame_cap = 1
        ok = p.feed(0, data)
        assert p.more and 0 < ok < len(data), impl
        assert p.stats.snapshot()["bytes"]["c2s"] == ok     # the rest is not counted yet
        p.frame_cap = 0
        assert p.feed(0, memoryview(data)[ok:]) == len(data) - ok
        assert not p.more
        assert p.stats.snapshot()["bytes"]["c2s"] == len(data)
