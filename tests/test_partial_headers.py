"""Partial headers are pending memory (issue 19): a header split across reads is held in
a per-connection buffer of up to header_limit bytes (64 KiB).  Before, those buffers sat
outside every budget (+149 KB a connection, ~1.5 GB at 10,000 connections); now they
count against [proxy] max_pending_bytes, a buffer the budget refuses closes its
connection with reason ``pending_budget``, and a big buffer is given back once its
header is done.  Both twins."""

import pytest

from proxy import framing_py
from proxy.protocols.fleximq import codec
from tests.parsers import impl_fixture, make as make_parser

impl, IMPLS = impl_fixture("fleximq")


def core(impl):
    if impl[0] is framing_py.RouteStats:
        return framing_py
    from proxy import _framing
    return _framing


@pytest.fixture
def mod(impl):
    m = core(impl)
    saved = m.pending_budget()
    yield m
    m.set_pending_budget(saved)


def big_header_frame():
    """One fleximq SUB whose MessagePack header is ~60 KB (a long topic)."""
    return codec.encode(codec.SUB, 1000, {"topic": "t" * 60_000})


def test_a_split_header_counts_against_the_budget_and_is_refused_past_it(impl, mod):
    frame = big_header_frame()
    part = frame[:40_000]                      # the header is still incomplete
    stats_a, a = make_parser(impl, "fleximq", "fx")
    stats_b, b = make_parser(impl, "fleximq", "fx")
    before = mod.pending_bytes()
    mod.set_pending_budget(before + 100_000)   # room for one 64 KiB buffer, not two
    assert a.feed(0, part) == len(part)
    held = mod.pending_bytes() - before
    assert 60_000 <= held <= 65_536 + 1024, held
    assert b.feed(0, part) < len(part)          # refused: the connection is closed
    assert b.error is not None and b.error.reason == "pending_budget"
    assert stats_b.snapshot()["errors"] == {("c2s", "pending_budget"): 1}
    assert mod.pending_bytes() - before == held, "the refused buffer was not accounted"
    # the first connection completes its header: its big buffer is given back
    assert a.feed(0, frame[40_000:]) == len(frame) - 40_000
    assert a.error is None
    assert mod.pending_bytes() - before <= 4096, mod.pending_bytes() - before
    assert stats_a.snapshot()["frames"][("c2s", "SUB")] == 1


def test_a_closed_connection_gives_its_header_buffer_back(impl, mod):
    frame = big_header_frame()
    before = mod.pending_bytes()
    stats, p = make_parser(impl, "fleximq", "fx")
    p.feed(0, frame[:30_000])
    assert mod.pending_bytes() - before >= 30_000
    p.close()
    del p
    import gc
    gc.collect()
    assert mod.pending_bytes() <= before + 256, mod.pending_bytes() - before
