"""Pending-request state (issue 8, defect 3; docs/design.md, "Pending requests"), both
twins: a per-process memory budget ([proxy] max_pending_bytes) that the tables cannot
grow past (overflow counted), expiry in request order that walks only what expires, a
full map that makes room by evicting its oldest expired entry, and tables that shrink
once a burst is over.
"""

import gc

import pytest

from proxy import framing_py
from proxy.framing_common import MAP_ENTRY_BYTES, PENDING_BYTES
from proxy.protocols.flymq.conformance import frame as fly_frame
from proxy.protocols.rabbitmq_stream.samples import publish, publish_confirm
from tests.parsers import checked_tracer, make, parser_impls

STREAM = parser_impls("rabbitmq-stream")
FLYMQ = parser_impls("flymq")
SECOND = 1_000_000_000


def core(impl):
    """The framing module (budget functions) of a parser implementation."""
    if impl[0] is framing_py.RouteStats:
        return framing_py
    from proxy import _framing
    return _framing


@pytest.fixture
def budget():
    """Set both twins' budgets for one test, then restore them."""
    mods = {core(i) for i in list(STREAM.values()) + list(FLYMQ.values())}
    saved = {m: m.pending_budget() for m in mods}

    def set_budget(impl, n):
        m = core(impl)
        m.set_pending_budget(m.pending_bytes() + n)   # n more bytes than held now
        return m
    yield set_budget
    for m, b in saved.items():
        m.set_pending_budget(b)


def _overflow(stats):
    return stats.snapshot()["errors"].get(("c2s", "in_flight_overflow"), 0)


def _stream_publishes(parser, first, n, t_ns=None):
    """n Publish frames (10 ids each) from publishing id ``first``."""
    for i in range(n):
        parser.feed(0, publish(first + 10 * i))


@pytest.mark.parametrize("name", sorted(STREAM))
def test_the_budget_caps_the_tables_and_overflow_is_counted(budget, name):
    impl = STREAM[name]
    stats, parser = make(impl, "rabbitmq-stream")
    gc.collect()                             # parsers of earlier tests freed now, not
    mod = budget(impl, 64 * 1024)            # in the middle: 64 KiB for this map
    before = mod.pending_bytes()
    _stream_publishes(parser, 0, 500)          # 5000 unconfirmed ids: ~400 KiB unbounded
    held = mod.pending_bytes() - before
    assert 0 < held <= 64 * 1024
    tracked = parser.pending
    assert tracked == held // MAP_ENTRY_BYTES // 2     # a table is kept at most half full
    assert _overflow(stats) == 5000 - tracked
    assert stats.snapshot()["in_flight"] == tracked
    parser.close()
    assert mod.pending_bytes() <= before       # a closed connection gives its tables back


def test_both_twins_decide_alike_under_the_budget(budget):
    got = []
    for name in sorted(STREAM):
        impl = STREAM[name]
        stats, parser = make(impl, "rabbitmq-stream")
        budget(impl, 20_000)
        _stream_publishes(parser, 0, 300)
        parser.feed(1, publish_confirm(0, 10))
        got.append((parser.pending, _overflow(stats), stats.snapshot()["in_flight"],
                    parser.pending_capacity))
        parser.close()
    assert len(set(got)) == 1, got


@pytest.mark.parametrize("name", sorted(FLYMQ))
def test_fifo_growth_stops_at_the_budget(budget, name):
    impl = FLYMQ[name]
    stats, parser = make(impl, "flymq")
    budget(impl, 100 * PENDING_BYTES)
    for i in range(1000):
        parser.feed(0, fly_frame(0x08))
    assert parser.pending_capacity[1] == 64    # 8 -> 16 -> 32 -> 64, not 128
    assert parser.pending == 64
    assert _overflow(stats) == 1000 - 64
    parser.close()


@pytest.mark.parametrize("name", sorted(STREAM))
def test_a_full_map_evicts_its_oldest_expired_entry(name):
    """An upstream that stopped answering: after request_timeout the old requests are
    timeouts, and new ones take their places instead of overflowing."""
    stats, parser = make(STREAM[name], "rabbitmq-stream", request_timeout=1.0)
    parser.map_limit = 100
    _stream_publishes(parser, 0, 10)           # ids 0..99: the map is full
    _stream_publishes(parser, 100, 1)          # 10 more: overflow, nothing has expired
    assert _overflow(stats) == 10
    assert parser.expire(parser_now(parser) + 2 * SECOND) == 100
    _stream_publishes(parser, 200, 5)          # 50 new: they replace expired ones
    assert _overflow(stats) == 10 and parser.pending == 100
    parser.feed(1, publish_confirm(200, 10))   # the new ones are tracked and answered
    snap = stats.snapshot()
    assert snap["hist"][("Publish", "ok")][0] and sum(snap["hist"][("Publish", "ok")][0]) == 10
    assert snap["timeouts"] == {"Publish": 100}
    parser.close()


@pytest.mark.parametrize("name", sorted(STREAM))
def test_a_map_holding_expired_requests_drops_them_instead_of_growing(name):
    """Behind an upstream that stopped answering the table stays sized by the requests
    still within request_timeout: new requests take the expired ones' places (oldest
    first) rather than doubling the table - a whole-table rehash, one stall of the loop."""
    stats, parser = make(STREAM[name], "rabbitmq-stream", request_timeout=1.0)
    _stream_publishes(parser, 0, 3)            # ids 0..29 in a 64-slot table
    cap = parser.pending_capacity[0]
    assert cap == 64
    assert parser.expire(parser_now(parser) + 2 * SECOND) == 30
    _stream_publishes(parser, 1000, 2)         # 20 new ids: 50 would need 128 slots;
    assert parser.pending_capacity[0] == cap   # ids 0..17 make room instead
    assert parser.pending == 32
    assert _overflow(stats) == 0
    parser.feed(1, publish_confirm(0, 10))     # ids 0..9: dropped first, now unmatched
    parser.feed(1, publish_confirm(20, 10))    # ids 20..29: kept, matched late
    parser.feed(1, publish_confirm(1000, 10))  # new ids: matched and observed
    snap = stats.snapshot()
    assert snap["timeouts"] == {"Publish": 30}
    assert sum(snap["hist"][("Publish", "ok")][0]) == 10
    assert snap["unmatched"] == 10
    _stream_publishes(parser, 5000, 10)        # no expired ones left: the table grows
    assert parser.pending_capacity[0] > cap and _overflow(stats) == 0
    parser.close()


def parser_now(parser):
    """A time after every request fed so far (the parsers read the monotonic clock)."""
    from proxy.framing import now_ns
    return now_ns()


@pytest.mark.parametrize("name", sorted(STREAM))
def test_map_expiry_is_in_request_order_and_walks_only_what_expires(name):
    stats, parser = make(STREAM[name], "rabbitmq-stream", request_timeout=1.0)
    events = []
    parser.tracer = checked_tracer(lambda r: events.append(r) if r["kind"] == "event" else None)
    _stream_publishes(parser, 1000, 3)         # ids 1000..1029, in this order
    t0 = parser_now(parser)
    _stream_publishes(parser, 5, 2)            # ids 5..24: read later
    # the second batch is younger: a sweep just past the first batch's deadline
    # expires the first batch only, in the order the requests were read
    n = parser.expire(t0 + SECOND)
    assert n == 30
    assert [e["correlation_id"] for e in events] == [f"1:{i}" for i in range(1000, 1030)]
    assert parser.expire(t0 + SECOND) == 0     # nothing new: nothing walked or counted
    assert parser.expire(t0 + 10 * SECOND) == 20
    parser.close()


@pytest.mark.parametrize("name", sorted(STREAM))
def test_tables_shrink_after_a_burst(name):
    stats, parser = make(STREAM[name], "rabbitmq-stream")
    _stream_publishes(parser, 0, 2000)         # 20,000 pending ids
    grown = parser.pending_capacity[0]
    assert grown >= 40_000
    for i in range(2000):                      # all confirmed
        parser.feed(1, publish_confirm(10 * i))
    assert parser.pending == 0
    parser.expire()
    assert parser.pending_capacity[0] == 64
    parser.close()


@pytest.mark.parametrize("name", sorted(FLYMQ))
def test_fifo_shrinks_after_a_burst(name):
    stats, parser = make(FLYMQ[name], "flymq")
    for _ in range(5000):
        parser.feed(0, fly_frame(0x08))
    assert parser.pending_capacity[1] == 8192
    for _ in range(4990):
        parser.feed(1, fly_frame(0x08, b"\0\0\0\0"))
    parser.expire()
    assert parser.pending_capacity[1] == 32 and parser.pending == 10
    parser.close()


def test_the_proxy_enforces_max_pending_bytes_against_a_black_hole_upstream():
    """[proxy] max_pending_bytes reaches the core: a client pipelining requests to an
    upstream that reads and never answers cannot grow the tables past it."""
    import asyncio

    from proxy.app import ProxyApp
    from proxy.config import config_from_dict
    from proxy.framing import pending_budget, pending_bytes, set_pending_budget
    from tests.support import run, sample, wait_for
    saved = pending_budget()

    async def scenario():
        async def swallow(reader, writer):
            while await reader.read(65536):
                pass
            writer.close()
        hole = await asyncio.start_server(swallow, "127.0.0.1", 0)
        up = hole.sockets[0].getsockname()[1]
        app = ProxyApp(config_from_dict({
            "proxy": {"shutdown_timeout": 1.0, "max_pending_bytes": 1 << 20},
            "routes": [{"name": "hole", "protocol": "flymq", "listen": "127.0.0.1:0",
                        "upstream": f"127.0.0.1:{up}"}]}))
        await app.start()
        try:
            assert pending_budget() == 1 << 20
            _, writer = await asyncio.open_connection("127.0.0.1", app.routes[0].address[1])
            n = 60_000                                # 60k x 24 B would be 1.4 MB of FIFO
            writer.write(fly_frame(0x08) * n)
            await writer.drain()
            await wait_for(lambda: app.routes[0].stats.snapshot()["frames"].get(
                ("c2s", "LIST_TOPICS"), 0) == n, timeout=20, what="all frames parsed")
            assert pending_bytes() <= 1 << 20
            assert sample(app, "frametap_pending_bytes") == pending_bytes()
            over = sample(app, "frametap_protocol_errors_total", route="hole",
                          protocol="flymq", direction="c2s", reason="in_flight_overflow")
            assert over == n - 32768             # the FIFO stopped at 32768 slots (768 KiB)
            writer.close()
        finally:
            await app.shutdown(0)
            hole.close()
            set_pending_budget(saved)
    run(scenario())


def _confirm(ids):
    """A PublishConfirm for ``ids`` in the order given (answers out of request order)."""
    import struct
    from proxy.protocols.rabbitmq_stream import samples
    return samples.stream_frame(samples.PUBLISH_CONFIRM, struct.pack(">BI", 1, len(ids)) +
                                b"".join(struct.pack(">Q", i) for i in ids))


def test_twins_agree_when_answers_overtake_requests_and_the_order_ring_wraps():
    """Confirms out of request order leave holes in the compiled core's request ring; it
    fills, drops them, grows and shrinks, and expiry, eviction and close() still go in
    request order, as in the pure-Python twin."""
    got = []
    for name in sorted(STREAM):
        stats, parser = make(STREAM[name], "rabbitmq-stream", request_timeout=1.0)
        events = []
        parser.tracer = checked_tracer(lambda r: events.append(r["correlation_id"])
                                       if r["kind"] == "event" else None)
        seen = []
        _stream_publishes(parser, 0, 20)                      # ids 0..199
        parser.feed(1, _confirm(list(range(199, 0, -2))))     # the odd ones, newest first
        for k in range(40):                # 4000 more, most answered, some late or never:
            first = 200 + 100 * k              # the ring fills and is squeezed, many times
            _stream_publishes(parser, first, 10)
            parser.feed(1, _confirm([first + j for j in (97, 3, 50, 1, 99, 0, 42)]))
            parser.feed(1, _confirm(list(range(first + 4, first + 95))))
            seen.append((parser.pending, parser.pending_capacity))
        t = parser_now(parser)
        seen.append(parser.expire(t + 2 * SECOND))
        parser.feed(1, _confirm([0, 2, 4, 1000]))            # late answers are still matched
        parser.map_limit = parser.pending                     # full: new ones evict the oldest
        _stream_publishes(parser, 10_000, 3)
        seen.append((parser.pending, _overflow(stats)))
        parser.close()
        snap = stats.snapshot()
        seen.append((snap["timeouts"], snap["cutoffs"], snap["in_flight"], parser.pending))
        got.append((seen, events))
    assert len(got) == len(STREAM)     # one twin under FRAMETAP_NO_EXTENSIONS=1
    assert all(g == got[0] for g in got), [g[0] for g in got]
    seen, events = got[0]
    # expire() counted seen[40] timeouts; the 30 left when the connection closed are cut off
    assert seen[-1][0] == {"Publish": seen[40]} and seen[-1][1] == {"Publish": 30}
    assert seen[-1][2] == 0
    ids = [int(e.split(":")[1]) for e in events[:seen[40]]]
    assert ids == sorted(ids) and ids[0] == 0          # expiry in request order


def test_expire_with_a_limit_counts_at_most_that_many_and_the_rest_later():
    """expire(now, limit) counts at most ``limit`` timeouts a call, oldest first (the
    FIFO's, then the map's), and the next calls go on where it stopped: the relay's
    sweep slices an upstream's worth of due requests instead of stalling the loop.
    The twins agree call by call (counts, timeout rows, tables)."""
    got = []
    for name in sorted(STREAM):
        stats, parser = make(STREAM[name], "rabbitmq-stream", request_timeout=1.0)
        events = []
        parser.tracer = checked_tracer(
            lambda r: events.append(int(r["correlation_id"].split(":")[1]))
            if r["kind"] == "event" else None)
        _stream_publishes(parser, 0, 100)              # ids 0..999
        parser.feed(1, _confirm(list(range(0, 1000, 7))))   # holes in request order
        t = parser_now(parser) + 2 * SECOND
        calls = []
        while True:
            n = parser.expire(t, 100)
            calls.append((n, parser.pending_capacity))
            if n < 100:
                break
        calls.append(parser.expire(t, 100))            # nothing left: nothing counted
        snap = stats.snapshot()
        got.append((calls, events, snap["timeouts"], snap["in_flight"]))
        parser.close()
    assert len(got) == len(STREAM) and all(g == got[0] for g in got), [g[0] for g in got]
    calls, events, timeouts, in_flight = got[0]
    due = 1000 - len(range(0, 1000, 7))                # 857 unanswered
    assert [c[0] for c in calls[:-1]] == [100] * 8 + [57] and calls[-1] == 0
    assert events == [i for i in range(1000) if i % 7]   # request order, each once
    assert timeouts == {"Publish": due} and in_flight == 0


@pytest.mark.parametrize("name", sorted(FLYMQ))
def test_fifo_expiry_with_a_limit_resumes_where_it_stopped(name):
    stats, parser = make(FLYMQ[name], "flymq", request_timeout=1.0)
    for _ in range(250):
        parser.feed(0, fly_frame(0x08))
    t = parser_now(parser) + 2 * SECOND
    assert [parser.expire(t, 100) for _ in range(4)] == [100, 100, 50, 0]
    assert stats.snapshot()["timeouts"] == {"LIST_TOPICS": 250}
    parser.close()
    assert stats.snapshot()["timeouts"] == {"LIST_TOPICS": 250}   # none counted twice


def test_the_sweep_over_200k_due_requests_lets_the_loop_run_between_slices():
    """200,000 unconfirmed publishing ids behind a black-hole upstream fall due at once:
    the route's sweep counts them in slices of at most SWEEP_SLICE with the loop running
    other callbacks in between (a probe callback sees the timeout counter move by at most
    one slice per loop iteration), not in one callback."""
    import asyncio

    from proxy import relay
    from proxy.app import ProxyApp
    from proxy.config import config_from_dict
    from tests.support import run, wait_for

    async def scenario():
        async def swallow(reader, writer):
            while await reader.read(1 << 20):
                pass
            writer.close()
        hole = await asyncio.start_server(swallow, "127.0.0.1", 0)
        up = hole.sockets[0].getsockname()[1]
        app = ProxyApp(config_from_dict({
            "proxy": {"shutdown_timeout": 1.0},
            "routes": [{"name": "hole", "protocol": "rabbitmq-stream",
                        "listen": "127.0.0.1:0", "upstream": f"127.0.0.1:{up}",
                        "request_timeout": 3600}]}))
        await app.start()
        route = app.routes[0]
        route._sweeper.cancel()                # this test runs the sweep itself
        try:
            n, per = 200_000, 50_000           # four connections (map_limit is 64 Ki)
            writers = []
            for _ in range(n // per):
                _, writer = await asyncio.open_connection("127.0.0.1", route.address[1])
                writer.write(b"".join(publish(10 * i) for i in range(per // 10)))
                await writer.drain()
                writers.append(writer)
            await wait_for(lambda: route.stats.snapshot()["in_flight"] == n, timeout=30,
                           what="every id pending")
            for conn in route.connections:
                conn.parser.timeout_ns = 1     # all of them are due now
            steps = []
            stop = False

            async def probe():                 # one sample per loop iteration
                while not stop:
                    steps.append(route.stats.snapshot()["timeouts"].get("Publish", 0))
                    await asyncio.sleep(0)
            task = asyncio.ensure_future(probe())
            await asyncio.sleep(0)
            await route.sweep_once()
            stop = True
            await task
            steps.append(route.stats.snapshot()["timeouts"].get("Publish", 0))
            moves = [b - a for a, b in zip(steps, steps[1:])]
            assert steps[-1] == n
            assert max(moves) <= relay.SWEEP_SLICE
            assert sum(1 for m in moves if m) >= n // relay.SWEEP_SLICE
            for writer in writers:
                writer.close()
        finally:
            await app.shutdown(0)
            hole.close()
    run(scenario())
