"""The parser core's fault selection (FrameParser.set_faults), on both twins and every
protocol: an armed direction hands exactly the frames of its armed opcodes, whole, to
the fault hook and forwards every other byte unchanged and in order, however the stream
is split; arming and disarming between any two reads loses and duplicates nothing."""

import random

import pytest

from proxy import protocols
from tests.parsers import make, parser_impls

PROTOCOLS = sorted(protocols.names())


def _samples(protocol, n=40, size=64):
    spec = protocols.load(protocol)
    mod = __import__(spec.samples, fromlist=["bench_frames"])
    _, requests, responses = mod.bench_frames(n, size)
    return requests, responses


def _request_opcode(impl, protocol, requests):
    """(name, numeric code or None) of the sample requests' opcode, from a tracer."""
    stats, parser = make(impl, protocol)
    rows = []
    parser.tracer = rows.append
    parser.feed(0, requests[0])
    row = next(r for r in rows if r["direction"] == "c2s")
    code = row["opcode"]
    return row["opcode_name"], (code if code is not None and code >= 0 else None)


def _slot_of(stats, name, code):
    """The slot a rule naming this opcode arms (as proxy.faults resolves names)."""
    return stats.opcode_slot(code) if code is not None else stats.name_slot(name)


class Hit:
    def __init__(self, frame, info):
        self.frame = frame
        self.info = info


def _run(impl, protocol, stream, arm, chunk, d=0, flips=None, seed=0):
    """Feed ``stream`` in pieces of ``chunk`` bytes (0: random 1..300) into direction d
    armed by ``arm(parser, stats)``; returns (forwarded items, hook calls).  ``flips``:
    disarm/re-arm between reads at random (retrying a set_faults() that must wait)."""
    stats, parser = make(impl, protocol)
    hits = []

    def hook(dd, frame):
        assert dd == d
        h = Hit(frame, parser.fault_info(dd))
        hits.append(h)
        return h
    parser.fault_hook = hook
    armed = state = arm(parser, stats)
    rnd = random.Random(seed)
    out = []
    pos = 0
    pending = None
    while pos < len(stream):
        k = chunk or rnd.randint(1, 300)
        data = stream[pos:pos + k]
        ok = parser.feed(d, data)
        assert parser.error is None, parser.error
        assert ok == len(data)
        out.extend(parser.output if parser.output is not None else [data])
        pos += k
        if flips and rnd.random() < flips:
            state = (0, (), False) if state[0] else armed
            pending = state
        if pending is not None and parser.set_faults(d, *pending):
            pending = None
    return out, hits, parser, stats


def _joined(out):
    return b"".join(x.frame if isinstance(x, Hit) else x for x in out)


@pytest.mark.parametrize("record", [True, False], ids=["recording", "counting"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("chunk", [1, 7, 0, 1 << 20])
def test_armed_opcode_frames_reach_the_hook_whole(protocol, chunk, record):
    for name, impl in parser_impls(protocol).items():
        requests, _ = _samples(protocol)
        stream = b"".join(requests)
        opname, code = _request_opcode(impl, protocol, requests)

        def arm(parser, stats):
            slot = _slot_of(stats, opname, code)
            assert stats.slot_name(slot) == opname
            assert parser.set_faults(0, 1, [slot], record)
            assert parser.recording == record
            return (1, (slot,), record)
        out, hits, parser, stats = _run(impl, protocol, stream, arm, chunk)
        assert [h.frame for h in hits] == requests, name
        assert _joined(out) == stream, name
        if record:
            assert all(h.info[1] in (0, 2) for h in hits)     # requests (or oneway)


@pytest.mark.parametrize("record", [True, False], ids=["recording", "counting"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unarmed_opcodes_pass_without_a_python_call(protocol, record):
    for name, impl in parser_impls(protocol).items():
        requests, responses = _samples(protocol)
        for d, frames in ((0, requests), (1, responses)):
            stream = b"".join(frames)

            def arm(parser, stats):
                slot = stats.name_slot("no_such_opcode")    # armed, never on the wire
                assert parser.set_faults(d, 1, [slot], record)
                return (1, (slot,), record)
            out, hits, parser, _ = _run(impl, protocol, stream, arm, 0, d=d)
            assert hits == [], name
            assert _joined(out) == stream, name
            assert all(isinstance(x, (bytes, bytearray)) for x in out)


@pytest.mark.parametrize("record", [True, False], ids=["recording", "counting"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_frame_mode_and_arming_between_any_reads(protocol, record):
    """Mode 2 (a rule on every opcode) switched on and off at random between reads:
    the bytes come out once each, in order; every hooked frame is a whole frame."""
    for name, impl in parser_impls(protocol).items():
        requests, _ = _samples(protocol, n=120)
        stream = b"".join(requests)
        for seed in range(4):
            def arm(parser, stats):
                assert parser.set_faults(0, 2, (), record)
                return (2, (), record)
            out, hits, parser, _ = _run(impl, protocol, stream, arm, 0, flips=0.3,
                                        seed=seed)
            assert _joined(out) == stream, (name, seed)
            assert all(h.frame in requests for h in hits), (name, seed)
            assert hits, (name, seed)


@pytest.mark.parametrize("record", [True, False], ids=["recording", "counting"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_twins_agree_on_what_they_hand_over(protocol, record):
    impls = parser_impls(protocol)
    if len(impls) < 2:
        pytest.skip("compiled extensions not built (FRAMETAP_NO_EXTENSIONS=1)")
    requests, _ = _samples(protocol, n=60)
    stream = b"".join(requests)
    seen = {}
    for name, impl in impls.items():
        def arm(parser, stats):
            assert parser.set_faults(0, 2, (), record)
            return (2, (), record)
        out, hits, parser, _ = _run(impl, protocol, stream, arm, 0, flips=0.2, seed=7)
        # (kind, resource, FIFO request, and its number; keyed string ids are hashed
        # under a per-connection secret, so only FIFO numbers compare)
        seen[name] = ([(h.frame, h.info[1], h.info[3], h.info[4],
                        h.info[2] if h.info[4] else None) for h in hits],
                      [len(x.frame) if isinstance(x, Hit) else len(x) for x in out])
    a, b = seen.values()
    assert a == b


def test_disarmed_direction_returns_to_the_forwarding_path():
    for name, impl in parser_impls("flymq").items():
        requests, _ = _samples("flymq")
        stats, parser = make(impl, "flymq")
        parser.fault_hook = lambda d, f: f
        assert parser.set_faults(0, 2)
        assert parser.fault_armed(0) == (2, True)
        parser.feed(0, requests[0][:5])                 # half a header held
        assert parser.output == []
        assert not parser.set_faults(0, 0)              # must wait for the frame's end
        parser.feed(0, requests[0][5:])
        assert b"".join(parser.output) == requests[0]
        assert parser.set_faults(0, 0)
        assert parser.fault_armed(0) == (0, False)
        parser.feed(0, requests[1])
        assert parser.output is None                    # today's path: forward as it is
        assert not parser.recording


def test_injected_mark_and_fault_attr_reach_the_rows():
    for name, impl in parser_impls("flymq").items():
        requests, responses = _samples("flymq")
        stats, parser = make(impl, "flymq")
        rows = []
        parser.tracer = rows.append

        def hook(d, frame):
            parser.fault_attr(d, b"fault", b"busy")
            return frame
        parser.fault_hook = hook
        assert parser.set_faults(0, 2)
        parser.feed(0, requests[0])
        parser.fault_mark(1, True)
        parser.feed(1, responses[0])
        parser.fault_mark(1, False)
        parser.feed(1, responses[1])
        parser.feed(0, requests[0])
        parser.fault_mark(1, True, b"busy")         # the engine names the rule
        parser.feed(1, responses[0])
        parser.fault_mark(1, False)
        c2s = [r for r in rows if r["direction"] == "c2s"]
        s2c = [r for r in rows if r["direction"] == "s2c"]
        assert c2s[0]["attrs"] == {"fault": "busy"}, name
        assert s2c[0]["attrs"] == {"injected": "1"}, name
        assert not s2c[1]["attrs"], name
        assert s2c[2]["attrs"] == {"injected": "1", "fault": "busy"}, name


def test_fifo_forget_counts_a_timeout_and_keeps_the_pairing():
    for name, impl in parser_impls("flymq").items():
        requests, responses = _samples("flymq")
        stats, parser = make(impl, "flymq")
        dropped = []

        def hook(d, frame):
            if not dropped:
                dropped.append(parser.fault_forget())
            return frame
        parser.fault_hook = hook
        assert parser.set_faults(0, 2)
        parser.feed(0, requests[0] + requests[1])
        assert dropped == [True]
        assert parser.fifo_first() == 2                 # request 1 is gone
        snap = stats.snapshot()
        assert sum(snap["timeouts"].values()) == 1, name
        parser.feed(1, responses[0])
        assert parser.fifo_first() == -1
        assert parser.expire(now=1 << 62) == 0          # nothing left to time out
        parser.feed(0, requests[2])
        assert parser.expire(now=1 << 62) == 1, name
