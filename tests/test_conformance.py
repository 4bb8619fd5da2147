"""One conformance suite for every protocol parser and both twins.

Each protocol package supplies ``conformance.py`` (see proxy/conformance.py): golden
conversations with the counters and frame-log records they must produce, garbage, a
request generator and a hypothesis strategy of random conversations.  This suite feeds
them whole, cut at every split point and byte by byte, and drives the compiled parser
and its pure-Python twin with the same random input, asserting that they agree on every
counter, every record, every return value and every error.
"""

import os
import pkgutil
import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import proxy.protocols
from proxy import framing_common, framing_py

HAVE_C = not os.environ.get("FRAMETAP_NO_EXTENSIONS")
if HAVE_C:
    from proxy import _framing


SPECS = {spec.package.rsplit(".", 1)[1]: spec for spec in proxy.protocols.specs()}
PROTOCOLS = {pkg: spec.load_conformance() for pkg, spec in SPECS.items()}


def impls(pkg):
    """[(label, RouteStats, Parser)]: the twin always, the compiled parser when built."""
    spec = SPECS[pkg]
    out = [("py", framing_py.RouteStats, spec.load_parser(pure_python=True))]
    if HAVE_C:
        out.append(("c", _framing.RouteStats, spec.load_parser(pure_python=False)))
    return out


def counters(stats):
    s = stats.snapshot()
    c = {k: s[k] for k in ("frames", "frame_bytes", "messages", "responses", "timeouts", "cutoffs",
                           "unmatched", "in_flight", "errors", "bytes")}
    c["hist"] = {k: sum(v[0]) for k, v in s["hist"].items()}   # times differ, counts not
    return c


def normal(rec):
    rec = dict(rec)
    del rec["t_ns"]
    rec["latency_ns"] = rec["latency_ns"] is not None
    return rec


def events_sorted(records):
    """Timeout events settled together (expire(), close()) come in the order of each
    twin's pending table; sort each run of them (direction, correlation id, the rest)."""
    out, run = [], []
    for r in records + [None]:
        if r is not None and r["kind"] == "event":
            run.append(r)
            continue
        out.extend(sorted(run, key=lambda e: (e["direction"], e["correlation_id"] or "",
                                              repr(sorted(e.items())))))
        run = []
        if r is not None:
            out.append(r)
    return out


class Run:
    """One parser fed one conversation; keeps counters, records, returns and error."""

    def __init__(self, impl, pkg, options=None, limits=None, trace=True):
        _, RouteStats, Parser = impl
        self.stats = RouteStats("route", pkg)
        self.p = Parser(self.stats, options=dict(options or {}))
        if limits:
            self.p.fifo_limit, self.p.map_limit = limits
        self.records = []
        if trace:
            self.p.tracer = self.records.append
        self.returns = []

    def feed(self, d, pieces):
        for piece in pieces:
            self.returns.append(self.p.feed(d, piece))
            if self.p.error is not None:
                return False
        return True

    def result(self, close=True):
        if close:
            self.p.close()
        err = self.p.error
        return {"counters": counters(self.stats), "returns": self.returns,
                "records": events_sorted([normal(r) for r in self.records]),
                "error": None if err is None else (err.reason, err.direction, err.offset)}


def run(impl, pkg, bursts, split=None, options=None, limits=None, close=True, trace=True):
    r = Run(impl, pkg, options, limits, trace)
    for i, (d, data) in enumerate(bursts):
        if not r.feed(d, split(i, data) if split else [data]):
            break
    return r.result(close)


def _cases():
    for pkg, mod in sorted(PROTOCOLS.items()):
        for conv in mod.conversations():
            yield pytest.param(pkg, conv, id=f"{pkg}-{conv.name}")


def _subset(actual, expected, where):
    for k, v in expected.items():
        if k == "latency_ns":                  # normal(): present or not
            v = v is not None and v is not False
        assert actual[k] == v, f"{where}: {k}: {actual[k]!r} != {v!r}"


def _options(pkg, conv):
    return {**getattr(PROTOCOLS[pkg], "PARSER_OPTIONS", {}), **conv.options}


# ---- golden conversations ---------------------------------------------------------

@pytest.mark.parametrize("pkg, conv", list(_cases()))
def test_golden_conversation(pkg, conv):
    results = {}
    for impl in impls(pkg):
        res = run(impl, pkg, conv.bursts(), options=_options(pkg, conv), close=conv.close)
        assert res["error"] is None, f"{impl[0]}: {res['error']}"
        assert res["returns"] == [len(b) for _, b in conv.bursts()]
        _subset(res["counters"], conv.counters, impl[0])
        total = {"c2s": 0, "s2c": 0}
        for d, data in conv.bursts():
            total[framing_common.DIRECTIONS[d]] += len(data)
        assert res["counters"]["bytes"] == total
        if conv.records is not None:
            recs = res["records"]
            assert len(recs) == len(conv.records), \
                f"{impl[0]}: {len(recs)} records, expected {len(conv.records)}: {recs}"
            for i, (got, want) in enumerate(zip(recs, conv.records)):
                _subset(got, want, f"{impl[0]} record {i}")
        results[impl[0]] = res
    if len(results) == 2:
        assert results["c"] == results["py"]


@pytest.mark.slow
@pytest.mark.parametrize("pkg, conv", list(_cases()))
def test_every_split_point(pkg, conv):
    """Each burst cut at every offset gives what one read gives, on both twins."""
    for impl in impls(pkg):
        whole = run(impl, pkg, conv.bursts(), options=_options(pkg, conv))
        bursts = conv.bursts()
        for b, (_, data) in enumerate(bursts):
            for cut in range(1, len(data)):
                def split(i, chunk, b=b, cut=cut):
                    return [chunk[:cut], chunk[cut:]] if i == b else [chunk]
                res = run(impl, pkg, bursts, split, options=_options(pkg, conv))
                assert res["counters"] == whole["counters"], f"{impl[0]} burst {b} cut {cut}"
                assert res["records"] == whole["records"], f"{impl[0]} burst {b} cut {cut}"


@pytest.mark.parametrize("pkg, conv", list(_cases()))
def test_one_byte_at_a_time(pkg, conv):
    for impl in impls(pkg):
        whole = run(impl, pkg, conv.bursts(), options=_options(pkg, conv))
        res = run(impl, pkg, conv.bursts(),
                  lambda i, data: [data[k:k + 1] for k in range(len(data))],
                  options=_options(pkg, conv))
        assert res["counters"] == whole["counters"]
        assert res["records"] == whole["records"]


def test_accepts_bytearray_and_memoryview():
    for pkg, mod in PROTOCOLS.items():
        conv = mod.conversations()[0]
        for impl in impls(pkg):
            whole = run(impl, pkg, conv.bursts(), options=_options(pkg, conv))
            for wrap in (bytearray, memoryview):
                res = run(impl, pkg, [(d, wrap(b)) for d, b in conv.bursts()],
                          options=_options(pkg, conv))
                assert res["counters"] == whole["counters"], (pkg, impl[0], wrap)


# ---- garbage, limits --------------------------------------------------------------

def _garbage_cases():
    for pkg, mod in sorted(PROTOCOLS.items()):
        for g in mod.garbage():
            yield pytest.param(pkg, g, id=f"{pkg}-{g.name}")


@pytest.mark.parametrize("pkg, g", list(_garbage_cases()))
def test_garbage_is_counted_never_raised(pkg, g):
    results = []
    for impl in impls(pkg):
        for split in (None, lambda i, data: [data[k:k + 1] for k in range(len(data))]):
            res = run(impl, pkg, [(g.direction, g.data)], split)
            errors = res["counters"]["errors"]
            assert errors.get((framing_common.DIRECTIONS[g.direction], g.reason), 0) >= 1, \
                f"{impl[0]}: {errors}"
            if g.fatal:
                assert res["error"] is not None and res["error"][0] == g.reason
                assert sum(res["returns"]) < len(g.data)
            else:
                assert res["error"] is None and sum(res["returns"]) == len(g.data)
            results.append(res["counters"])
    assert all(r == results[0] for r in results[::2])     # whole feeds agree across twins


@pytest.mark.parametrize("pkg", sorted(PROTOCOLS))
@pytest.mark.parametrize("limit", [1, 3, 5, 7, 12])
def test_pending_limits_not_power_of_two(pkg, limit):
    """fifo_limit / map_limit bound pending requests by count, the same on both twins."""
    reqs = PROTOCOLS[pkg].requests(20)
    results = []
    for impl in impls(pkg):
        r = Run(impl, pkg, limits=(limit, limit))
        for f in reqs:
            assert r.feed(0, [f])
        assert r.p.pending == limit
        res = r.result()
        assert res["counters"]["errors"] == {("c2s", "in_flight_overflow"): 20 - limit}
        results.append(res)
    assert all(r == results[0] for r in results)


# ---- the twins agree on random conversations ----------------------------------------

@st.composite
def _fuzz_case(draw, pkg):
    steps = draw(PROTOCOLS[pkg].frames())
    if steps and draw(st.booleans()):           # mutate one byte of one frame
        i = draw(st.integers(0, len(steps) - 1))
        d, data = steps[i]
        if data:
            k = draw(st.integers(0, len(data) - 1))
            data = data[:k] + bytes([draw(st.integers(0, 255))]) + data[k + 1:]
            steps[i] = (d, data)
    seed = draw(st.integers(0, 2**32 - 1))
    limits = draw(st.sampled_from([None, (3, 3), (5, 7), (1, 2)]))
    return steps, seed, limits


def _random_split(seed):
    rng = random.Random(seed)

    def split(i, data):
        pieces, k = [], 0
        while k < len(data):
            n = rng.choice([1, 2, 3, 7, 16, 64, 1 << 20])
            pieces.append(data[k:k + n])
            k += n
        return pieces
    return split


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_C, reason="the twin-agreement fuzzer needs the compiled parsers")
@pytest.mark.parametrize("pkg", sorted(PROTOCOLS))
def test_fuzz_twins_agree(pkg):
    c_impl, py_impl = impls(pkg)[1], impls(pkg)[0]

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=_fuzz_case(pkg))
    def check(case):
        steps, seed, limits = case
        bursts = [(d, b) for d, b in steps]
        a = run(c_impl, pkg, bursts, _random_split(seed), limits=limits)
        b = run(py_impl, pkg, bursts, _random_split(seed), limits=limits)
        assert a == b
        # recording records must not change a counter: the same without a tracer
        for impl, traced in ((c_impl, a), (py_impl, b)):
            quiet = run(impl, pkg, bursts, _random_split(seed), limits=limits, trace=False)
            assert quiet["records"] == []
            assert {k: v for k, v in quiet.items() if k != "records"} == \
                {k: v for k, v in traced.items() if k != "records"}
    check()


def test_reason_and_kind_tables_match_the_compiled_enums():
    if not HAVE_C:
        pytest.skip("compiled core not built (FRAMETAP_NO_EXTENSIONS=1)")
    assert {n: i for i, n in enumerate(framing_common.REASONS)} == _framing.REASON_IDS
    assert {n: i for i, n in enumerate(framing_common.KINDS)} == _framing.KIND_IDS


def test_every_protocol_folder_is_covered():
    folders = {info.name for info in pkgutil.iter_modules(proxy.protocols.__path__)
               if info.ispkg}
    assert folders and folders == set(PROTOCOLS)
