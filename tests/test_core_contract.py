"""The core's contract with parsers: header requests are bounded by header_limit and
never touch the other direction's state; gather() hands back split body bytes."""

import struct
from pathlib import Path

import pytest

from proxy import framing_py
from proxy.framing_common import K_ONEWAY

HERE = Path(__file__).resolve().parent


class PyProbe(framing_py.FrameParser):
    header_size = 5
    max_frame_bytes = 1 << 20

    def __init__(self, stats, want=100):
        self.want = want
        super().__init__(stats)

    def on_header(self, d, h, avail):
        if avail < self.want:
            return self.want_header(d, self.want)
        total = int.from_bytes(h[:4], "big")
        self.begin(d, self.stats.slot_for(h[4]), K_ONEWAY, total, self.want)
        return total


@pytest.fixture(scope="session")
def c_probe():
    """ProbeParser compiled against proxy/_framing.pxd (tests/probe_build.py)."""
    from proxy import _framing
    from tests.probe_build import probe_module
    return _framing.RouteStats, probe_module().ProbeParser


def impls(c_probe=None):
    out = [(framing_py.RouteStats, PyProbe)]
    if c_probe is not None:
        out.append(c_probe)
    return out


def frame(n, op=7):
    return struct.pack(">IB", n, op) + bytes(range(256))[:n - 5] * 1


def _check_probe(RouteStats, Probe):
    # 1. a 100-byte header request, fed across reads, while s2c is mid-frame
    stats = RouteStats("r", "probe")
    p = Probe(stats, want=100)
    s2c, c2s = frame(200, op=1), frame(150, op=2)
    assert p.feed(1, s2c[:120]) == 120                  # s2c: 80 bytes still to come
    assert p.feed(0, c2s[:50]) == 50                    # header split: 50 of 100 held
    assert p.feed(0, c2s[50:]) == 100
    assert p.feed(1, s2c[120:]) == 80                   # s2c state untouched
    assert p.feed(1, frame(60, op=3)[:5]) == 5
    snap = stats.snapshot()
    assert snap["frames"] == {("s2c", "unknown_1"): 1, ("c2s", "unknown_2"): 1}
    assert snap["errors"] == {} and p.error is None
    # 2. past header_limit: a clear error on that direction, never an overwrite
    stats = RouteStats("r", "probe")
    p = Probe(stats, want=100)
    p.header_limit = 64
    assert p.feed(1, s2c[:120]) == 120
    assert p.feed(0, c2s[:3]) == 3                      # less than the fixed header: held
    assert p.feed(0, c2s[3:50]) == 0                    # the request for 100 is refused
    assert p.error is not None and p.error.reason == "header_too_large"
    assert p.error.direction == "c2s" and "exceeds the header limit 64" in str(p.error)
    assert p.error.offset == 0
    assert stats.snapshot()["errors"] == {("c2s", "header_too_large"): 1}
    assert stats.snapshot()["frames"] == {("s2c", "unknown_1"): 1}     # s2c untouched


def test_probe_twin():
    _check_probe(*impls()[0])


@pytest.mark.slow
def test_probe_compiled(c_probe):
    _check_probe(*c_probe)


def test_frame_shorter_than_its_header_is_a_contract_error():
    for RouteStats, Probe in impls():
        stats = RouteStats("r", "probe")
        p = Probe(stats, want=20)
        short = struct.pack(">IB", 10, 1) + b"x" * 30
        assert p.feed(0, short[:3]) == 3
        assert p.feed(0, short[3:]) == 0
        assert p.error.reason == "bad_header" and "parser contract" in str(p.error)


def test_name_interning_is_bounded():
    """Opcode names (Thrift methods...) share the 256 slots with codes, then "other"."""
    from proxy.framing import RouteStats
    for cls in {RouteStats, framing_py.RouteStats}:
        stats = cls("r", "p")
        first = stats.name_slot(b"getUser")
        assert stats.name_slot("getUser") == first and stats.slot_name(first) == "getUser"
        assert stats.opcode_slot(5) != first
        slots = {stats.name_slot("m%d" % i) for i in range(300)}
        assert 256 in slots and len(slots) == 256 - 2 + 1
        assert stats.name_slot(b"getUser") == first          # known names keep their slot
        assert stats.slot_name(256) == "other"


def test_unknown_codes_cannot_use_up_the_labels():
    """Issue 8, defect 6: unknown codes take at most UNKNOWN_LABELS labels, then share
    "unknown"; the protocol's own opcodes keep theirs."""
    from proxy.framing import RouteStats
    from proxy.framing_common import UNKNOWN_LABELS
    for cls in {RouteStats, framing_py.RouteStats}:
        stats = cls("r", "p", opcode_namer=lambda c: {1: "ONE", 2: "TWO"}.get(c, "unknown_%d" % c))
        stats.set_known([1, 2])
        slots = {stats.opcode_slot(1000 + i) for i in range(1000)}
        assert len(slots) == UNKNOWN_LABELS + 1
        shared = stats.opcode_slot(5000)
        assert stats.slot_name(shared) == "unknown" and shared != 256
        one, two = stats.opcode_slot(1), stats.opcode_slot(2)
        assert stats.slot_name(one) == "ONE" and stats.slot_name(two) == "TWO"
        assert len({one, two, shared}) == 3


def test_codes_at_and_past_the_tables_edges():
    """slot_for()'s inline table hit (proxy/_framing.pxd) and its miss path agree with
    the twin at the table's edges: 0 and 65535 get slots of their own and keep them, a
    negative code or one past the table counts under "other" and takes no slot."""
    from proxy.framing import RouteStats
    from proxy.framing_common import OTHER_SLOT
    for cls in {RouteStats, framing_py.RouteStats}:
        stats = cls("r", "p")
        low, high = stats.opcode_slot(0), stats.opcode_slot(65535)
        assert low != high and OTHER_SLOT not in (low, high)
        assert (stats.opcode_slot(0), stats.opcode_slot(65535)) == (low, high)   # hits
        for code in (-1, -(1 << 40), 65536, 1 << 40):
            assert stats.opcode_slot(code) == OTHER_SLOT
        assert stats.opcode_slot(7) == 2 and stats.opcode_slot(7) == 2   # the next slot


def test_a_flood_of_unknown_stream_keys_leaves_real_opcodes_labelled():
    """The reproduction: 256 eight-byte frames with unknown keys from one client, then a
    real command — which must still be counted under its own name."""
    from proxy.protocols.rabbitmq_stream.conformance import req
    from proxy.protocols.rabbitmq_stream import constants as K
    from tests.parsers import make, parser_impls
    for impl in parser_impls("rabbitmq-stream").values():
        stats, p = make(impl, "rabbitmq-stream")
        flood = b"".join(struct.pack(">IHH", 4, 0x1000 + i, 1) for i in range(256))
        hb = req(K.HEARTBEAT)
        assert p.feed(0, flood + hb) == len(flood) + len(hb)
        frames = stats.snapshot()["frames"]
        assert frames[("c2s", "Heartbeat")] == 1
        assert frames[("c2s", "unknown")] == 256 - 16
        assert "other" not in {name for _, name in frames}
