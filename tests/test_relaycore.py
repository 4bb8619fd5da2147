"""The relay's per-read path (proxy/_relaycore.pyx, its twin proxy/relaycore_py.py): the
compiled one is what a built proxy runs, it does what relay.py's Python path did (the
same data object written to the peer, everything else to the Python slow paths), and the
fault engine still sees the reads that go through it.  In the twins tier: with
FRAMETAP_NO_EXTENSIONS=1 the same checks run on the pure-Python twin."""

import asyncio
import importlib.machinery
import types

import pytest

from proxy import relay
from proxy.framing import NO_EXTENSIONS
from tests._support.faults import FaultSet, Rule
from tests.parsers import make, parser_impls
from tests.support import frame, read_frame, request, run, sample, wait_for
from tests.test_faults_relay import R, Upstream, connect, num, start

pytestmark = pytest.mark.twins

if NO_EXTENSIONS:
    from proxy import relaycore_py as core
else:
    from proxy import _relaycore as core

IMPLS = parser_impls("flymq")


def test_the_relay_classes_are_built_on_the_selected_core():
    """ClientSide/UpstreamSide read through the core's data_received (none of their own);
    a built tree's core is the compiled module, FRAMETAP_NO_EXTENSIONS=1 the twin."""
    assert relay.ClientSide.__mro__[1] is core.ClientCore
    assert relay.UpstreamSide.__mro__[1] is core.UpstreamCore
    assert issubclass(relay.ClientSide, asyncio.Protocol)
    for cls in (relay.ClientSide, relay.UpstreamSide):
        assert "data_received" not in vars(cls)
    assert "_relay" not in vars(relay.ClientSide)
    assert relay.FULL_READ == core.FULL_READ == 256000
    assert relay.YIELD_FRAMES == core.YIELD_FRAMES == 64
    if NO_EXTENSIONS:
        assert core.__name__ == "proxy.relaycore_py"
    else:
        assert core.__name__ == "proxy._relaycore"
        assert core.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
        assert not isinstance(core.ClientCore.data_received, types.FunctionType)


class Transport:
    def __init__(self):
        self.written = []
        self.paused = 0

    def write(self, data):
        self.written.append(data)

    def pause_reading(self):
        self.paused += 1

    def resume_reading(self):
        self.paused -= 1


class Conn(relay.ClientSide):
    """A ClientSide without a route: the slow paths only record that they were called."""

    def __init__(self, parser, upstream=True):
        super().__init__(route=None)
        self.calls = []
        self.parser = parser
        self.transport = Transport()
        if upstream:
            self.upstream = relay.UpstreamSide(self)
            self.upstream.transport = Transport()

    def _relay_slow(self, d, data, ok):
        self.calls.append(("slow", d, data, ok))

    def parser_crashed(self, d, exc):
        self.calls.append(("crashed", d, type(exc).__name__))

    def _yield(self, d):
        self.calls.append(("yield", d))


@pytest.fixture(params=sorted(IMPLS))
def parser(request):
    return make(IMPLS[request.param], "flymq")[1]


def test_a_plain_read_writes_the_same_object_to_the_peer(parser):
    conn = Conn(parser)
    up = request(1) + request(2)
    down = frame(0x01, b"\0\0\0\1rrrr")
    conn.data_received(up)
    conn.upstream.data_received(down)
    assert conn.upstream.transport.written[0] is up
    assert conn.transport.written[0] is down
    assert conn.calls == []
    assert parser.feed_frames == 1 and parser.bytes_fed == len(up) + len(down)


def test_a_transport_swapped_in_takes_the_next_write(parser):
    """The fault engine puts a Pipe in a side's transport and takes it out again: the
    next read is written to whatever ``transport`` is then."""
    conn = Conn(parser)
    old_up, old_down = conn.upstream.transport, conn.transport
    conn.upstream.transport, conn.transport = Transport(), Transport()
    conn.data_received(request(1))
    conn.upstream.data_received(frame(0x01, b"\0\0\0\1rrrr"))
    assert len(conn.upstream.transport.written) == len(conn.transport.written) == 1
    conn.upstream.transport, conn.transport = old_up, old_down
    conn.data_received(request(2))
    assert old_up.written == [request(2)] and old_down.written == []


def test_everything_but_a_plain_read_goes_to_the_slow_path(parser):
    conn = Conn(parser, upstream=False)          # client bytes before the upstream is up
    data = request(1)
    conn.data_received(data)
    assert conn.calls == [("slow", 0, data, len(data))]
    conn = Conn(parser.__class__(parser.stats))  # a protocol error: the valid prefix
    bad = request(1) + b"GET / HTTP/1.1\r\n\r\n"
    conn.data_received(bad)
    assert conn.calls == [("slow", 0, bad, len(request(1)))]
    assert conn.upstream.transport.written == []
    conn = Conn(parser.__class__(parser.stats))  # held bytes: output is a list
    conn.parser.set_hold(0, True)
    conn.data_received(request(1)[:5])
    assert conn.calls == [("slow", 0, request(1)[:5], 5)]


def test_a_parser_that_raises_costs_its_connection_only(parser):
    class Broken:
        output = None
        feed_frames = 0

        def feed(self, d, data):
            raise RuntimeError("bug")
    conn = Conn(Broken())
    conn.data_received(b"x")
    conn.upstream.data_received(b"y")
    assert conn.calls == [("crashed", 0, "RuntimeError"), ("crashed", 1, "RuntimeError")]


def test_a_full_read_of_many_frames_yields_after_it_is_relayed(parser):
    conn = Conn(parser)
    many = request(1, size=60) * (core.FULL_READ // 68 + 1)
    conn.data_received(many)
    conn.upstream.data_received(frame(0x01, b"\0\0\0\1rrrr") * (core.FULL_READ // 16 + 1))
    assert conn.calls == [("yield", 0), ("yield", 1)]
    few = frame(0x01, b"x" * core.FULL_READ)    # a full read of one frame: no yield
    conn.data_received(few)
    assert conn.calls == [("yield", 0), ("yield", 1)]
    assert conn.upstream.transport.written[-1] is few


def test_relay_hook_takes_both_directions_and_relay_stays_callable_unbound(parser):
    """proxy.faults sets relay_hook while injected replies wait and calls
    ClientSide._relay(conn, d, data) itself."""
    conn = Conn(parser)
    seen = []
    conn.relay_hook = lambda d, data: seen.append((d, data))
    conn.data_received(b"a")
    conn.upstream.data_received(b"b")
    assert seen == [(0, b"a"), (1, b"b")]
    assert conn.upstream.transport.written == [] and conn.transport.written == []
    conn.relay_hook = None
    data = request(3)
    relay.ClientSide._relay(conn, 0, data)
    assert conn.upstream.transport.written == [data]


def test_the_rest_of_a_cut_read_goes_through_relay_hook_too(parser):
    """A read cut at the frame cap (ClientSide._run_slice, from the loop's Backlog) is
    relayed as a read is: through the fault engine's relay_hook while it has one."""
    conn = Conn(parser)
    seen = []
    conn.relay_hook = lambda d, data: seen.append((d, bytes(data)))
    conn.deferred = 2
    conn._run_slice(1, memoryview(b"rest"))
    assert seen == [(1, b"rest")] and conn.deferred == 0
    conn.relay_hook = None
    data = request(5)
    conn._run_slice(0, memoryview(data))
    assert bytes(conn.upstream.transport.written[0]) == data


def _python_relay_spy(monkeypatch):
    """Count calls of the Python attribute ``ClientSide._relay``: the compiled
    data_received never looks it up, the twin's does."""
    calls = []
    orig = relay.ClientSide._relay

    def spy(self, d, data):
        calls.append(d)
        return orig(self, d, data)
    monkeypatch.setattr(relay.ClientSide, "_relay", spy, raising=False)
    return calls


def test_live_reads_take_the_compiled_path_and_fault_rules_see_them(monkeypatch):
    """On a live proxy with a drop rule armed, the reads go through the compiled
    data_received (the Python ``_relay`` is never called: no relay_hook, no Python frame),
    and the rule still acts on the frames the C path feeds the parser."""
    python_relays = _python_relay_spy(monkeypatch)

    async def scenario():
        up = await Upstream().start()
        fs = FaultSet([Rule("lose", "drop", opcodes=["PRODUCE"], trigger="nth", n=2)])
        app = await start(up.address, fs)
        reader, writer = await connect(app)
        conn = next(iter(app.routes[0].connections))
        assert isinstance(conn, core.ClientCore) and conn.relay_hook is None
        for i in (1, 2, 3):
            writer.write(request(i))
            if i != 2:
                assert num((await read_frame(reader))[1]) == i
        assert [n for _, n in up.arrivals] == [1, 3]        # 2 dropped by the rule
        assert sample(app, "frametap_faults_injected_total", opcode="PRODUCE", fault="lose",
                      action="drop", **R) == 1
        assert conn.relay_hook is None
        writer.close()
        await app.shutdown(0)
        up.close()
    run(scenario())
    if NO_EXTENSIONS:
        assert python_relays                  # the twin's data_received calls _relay
    else:
        assert python_relays == []


def test_an_injected_reply_goes_through_relay_hook_then_reads_return_to_the_core(monkeypatch):
    """An error rule's reply waits for its FIFO place: the server's reads go through the
    fault engine's relay_hook (which calls ClientSide._relay unbound) until it is
    injected, then relay_hook is cleared and reads take the core's path again."""
    python_relays = _python_relay_spy(monkeypatch)

    async def scenario():
        up = await Upstream(answer_delay=0.3).start()
        fs = FaultSet([Rule("busy", "error", opcodes=["PRODUCE"], trigger="nth", n=2,
                            message="injected busy")])
        app = await start(up.address, fs)
        reader, writer = await connect(app)
        conn = next(iter(app.routes[0].connections))
        writer.write(request(1) + request(2) + request(3))
        await wait_for(lambda: conn.relay_hook is not None,   # the reply to 2 waits for
                       what="the fault engine's relay_hook")   # the answer to 1
        got = [await read_frame(reader) for _ in range(3)]
        assert [op for op, _ in got] == [0x01, 0xFF, 0x01]
        assert got[1][1] == b"injected busy"
        assert conn.relay_hook is None
        hooked = len(python_relays)
        assert 1 in python_relays              # the server's reads went through the hook
        consume = frame(0x02, bytes(4) + b"c")  # (a 4th PRODUCE would be the rule's again)
        writer.write(consume)
        assert (await read_frame(reader))[0] == 0x02
        if not NO_EXTENSIONS:
            assert len(python_relays) == hooked   # back on the compiled path
        writer.close()
        await app.shutdown(0)
        up.close()
    run(scenario())
