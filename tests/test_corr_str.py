"""String correlation ids in the core (set_corr_str; docs/design.md, "Frame log"): the
row's correlation_id is the text while requests are matched by their integer key; a
request's text is kept, only while recording and in a bounded table, for its timeout row;
both twins agree row for row, and the frame-log files carry the text."""

import glob
import os

import pyarrow.parquet as pq
import pytest

from proxy import framing_py
from proxy.framelog import FrameLog
from proxy.framelog_native import make_source
from proxy.framing_common import CORR_STR_MAX, CORR_TEXT_SLOTS, K_REQUEST, K_RESPONSE, \
    OUTCOME_OK, clip_corr
from tests.test_conformance import HAVE_C, events_sorted


class PyCorrProbe(framing_py.FrameParser):
    """Twin of tests/probe/probe_parser.pyx's CorrProbe."""
    header_size = 5

    def __init__(self, stats):
        super().__init__(stats, 1 << 20, 30.0, None)

    def _text(self, d, text, prefix):
        self.set_corr_str(d, text, prefix)

    def request(self, d, key, text, prefix=b""):
        self.begin(d, self.stats.slot_for(1), K_REQUEST, 10, 5)
        self.expect(d, 0, key, -1)
        self._text(d, text, prefix)
        self.st[d].open = False
        self._emit(self.st[d].rec)

    def response(self, d, key, text, prefix=b""):
        self.take(d, 0, key)
        self.begin(d, self.stats.slot_for(2), K_RESPONSE, 10, 5)
        self.answer(d, 0, OUTCOME_OK)
        self._text(d, text, prefix)
        self.st[d].open = False
        self._emit(self.st[d].rec)


def impls():
    out = [("py", framing_py.RouteStats, PyCorrProbe)]
    if HAVE_C and not os.environ.get("FRAMETAP_NO_EXTENSIONS"):
        from proxy import _framing
        from tests.probe_build import probe_module
        out.append(("c", _framing.RouteStats, probe_module().CorrProbe))
    return out


def probe(impl, record=True):
    label, RouteStats, Probe = impl
    p = Probe(RouteStats("r", "probe"))
    recs = []
    if record:
        p.tracer = recs.append
    return p, recs


def rows(recs):
    return [(r["direction"], r["kind"], r["opcode_name"], r["request_opcode_name"],
             r["correlation_id"], r["latency_ns"] is not None, r["status"])
            for r in events_sorted(recs)]


def both(run):
    """run(parser, records) on each twin; the twins' rows must agree."""
    results = {}
    for impl in impls():
        p, recs = probe(impl)
        run(p, recs)
        results[impl[0]] = rows(recs)
    if len(results) == 2:
        assert results["c"] == results["py"]
    assert len(impls()) == 2 or os.environ.get("FRAMETAP_NO_EXTENSIONS")
    return results["py"]


def test_rows_carry_the_text_and_timeouts_keep_it():
    def run(p, recs):
        p.request(0, 11, b"req-a")
        p.request(0, 12, b"req-b")
        p.request(1, 13, b"7", b"ping:")               # a prefix (fleximq's pings)
        p.request(0, 14, None)                        # no id: null on every row
        p.response(1, 11, b"req-a")                   # answered: its text is dropped
        p.response(1, 99, b"nobody")                  # unmatched: still its own text
        p.request(0, 12, b"req-b2")                   # same key: the older one times out
        assert p.expire(1 << 62) == 3                 # req-b2, ping:7, the null one
        p.close()
    got = both(run)
    assert got == [
        ("c2s", "request", "unknown_1", None, "req-a", False, None),
        ("c2s", "request", "unknown_1", None, "req-b", False, None),
        ("s2c", "request", "unknown_1", None, "ping:7", False, None),
        ("c2s", "request", "unknown_1", None, None, False, None),
        ("s2c", "response", "unknown_2", "unknown_1", "req-a", True, "0"),
        ("s2c", "response", "unknown_2", None, "nobody", False, "0"),
        ("c2s", "event", "unknown_1", "unknown_1", "req-b", False, "timeout"),
        ("c2s", "request", "unknown_1", None, "req-b2", False, None),
        ("c2s", "event", "unknown_1", "unknown_1", None, False, "timeout"),
        ("c2s", "event", "unknown_1", "unknown_1", "req-b2", False, "timeout"),
        ("s2c", "event", "unknown_1", "unknown_1", "ping:7", False, "timeout"),
    ]


def test_long_ids_are_clipped_at_a_character_boundary():
    long_id = "é".encode() * 70                        # 140 bytes
    assert clip_corr(long_id) == "é".encode() * 64
    assert clip_corr(b"x" + long_id) == b"x" + "é".encode() * 63   # 127 bytes: no half
    assert len(clip_corr(b"a" * 500)) == CORR_STR_MAX

    def run(p, recs):
        p.request(0, 1, long_id)
        p.request(0, 2, long_id, b"x")
        p.request(0, 3, b"b" * 300, b"p:")
        p.close()
    got = both(run)
    want = ["é" * 64, "x" + "é" * 63, "p:" + "b" * 126]
    assert [r[4] for r in got[:3]] == want
    assert sorted(r[4] for r in got[3:]) == sorted(want)       # the timeout rows too


def test_kept_ids_are_bounded_and_the_twins_evict_alike():
    n = CORR_TEXT_SLOTS * 3

    def run(p, recs):
        for k in range(n):
            p.request(0, k * 7919 + 1, b"id-%d" % k)
        p.close()
    got = both(run)
    timeouts = [r for r in got if r[1] == "event"]
    assert len(timeouts) == n
    kept = [r for r in timeouts if r[4] is not None]
    assert all(r[4] == "id-%d" % ((int(r[4][3:]))) for r in kept)
    # an evicted id is null on its timeout row, never the integer key
    # at most the table's size, and most of it used: the newest ids survive eviction
    assert CORR_TEXT_SLOTS // 2 <= len(kept) <= CORR_TEXT_SLOTS


def test_nothing_is_kept_while_not_recording():
    for impl in impls():
        p, recs = probe(impl, record=False)
        p.request(0, 5, b"quiet")                     # counted, no text copied
        recs = []
        p.tracer = recs.append                        # recording starts afterwards
        p.request(0, 6, b"loud")
        p.close()
        got = {r["correlation_id"] for r in recs if r["kind"] == "event"}
        assert got == {None, "loud"}, impl[0]         # the quiet one: no text, null


def test_frame_log_files_carry_the_text(tmp_path):
    if not HAVE_C:
        pytest.skip("compiled extensions not built (FRAMETAP_NO_EXTENSIONS)")
    from proxy import _framing
    impl = [i for i in impls() if i[0] == "c"][0]
    p, recs = probe(impl)
    buf = _framing.FrameLogBuffer(4, 3)               # 3 rows a chunk: texts span chunks
    fl = FrameLog(str(tmp_path), "proxy", flush_interval=0.05)
    src = fl.add_source(make_source(buf, "r"))
    buf.wake = fl.wake
    p.conn_id = 7
    p.attach_log(buf, buf.add_route(p.stats))
    src.connection(7, "127.0.0.1:1")
    fl.start()
    p.request(0, 1, b"one")
    p.request(0, 2, b"bad\xff\xfe")                   # invalid UTF-8: '?' in the file
    p.request(0, 3, None)
    p.response(1, 1, b"one")
    p.request(0, 4, b"4", b"ping:")
    p.close()
    fl.close()
    got = []
    for path in sorted(glob.glob(os.path.join(str(tmp_path), "*.parquet"))):
        got.extend(pq.read_table(path).to_pylist())
    assert len(got) == len(recs) == 8
    ids = [(r["kind"], r["correlation_id"]) for r in events_sorted(got)]
    assert ids[:5] == [("request", "one"), ("request", "bad??"), ("request", None),
                       ("response", "one"), ("request", "ping:4")]
    assert sorted(ids[5:], key=repr) == sorted(
        [("event", "bad??"), ("event", None), ("event", "ping:4")], key=repr)
