"""What a connection costs the proxy after it closed, and while it is being set up.

Issue 8's proxy fuzz grew the proxy's RSS by 22-32 MB after its warm-up. Measured
(bench/soak.py proxyfuzz and tracemalloc/mallinfo2 inside the proxy): no live object
grew; the proxy had accepted every client at once while their upstream connects were
still pending (3,400-3,700 connections open at the peak, ~3,000 of them waiting for the
upstream, ~11,000 asyncio tasks), about 20 KB each, and after they closed glibc's heap
(~30 MB free) and pymalloc's pools (~32 MB of empty pools in arenas it cannot return)
kept the high-water mark. A route now sets up at most relay.SETUP_LIMIT connections at
once and lets the rest wait in the kernel's listen backlog (docs/design.md, "File
descriptors"). These tests hold the two properties that bound the proxy's memory:
closed connections leave no object behind (not even for the cyclic GC), and the number
of connections in set-up never passes the limit, while every client is still served.
"""

import asyncio
import gc
import socket

import pytest

from proxy import relay
from proxy.framing import FrameParser
from tests.support import (FaultyUpstream, frame, proxy_port, read_frame, request, run,
                           sample, start_proxy, wait_for)


def _alive(kind):
    return sum(1 for o in gc.get_objects() if isinstance(o, kind))


def test_closed_connections_leave_no_object_behind():
    """Connections closed every way the fuzz closes them (answered and closed, a
    protocol error from the client, a reset, a close before the upstream answered):
    once connections_active is back to 0, no ClientSide, UpstreamSide or parser is left,
    with the cyclic GC switched off, so reference counting alone freed them."""
    async def scenario():
        up = await FaultyUpstream().start()
        app = await start_proxy(up.address)
        port = proxy_port(app)
        route = app.routes[0]

        async def client(i):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            kind = i % 4
            if kind == 0:                                  # answered, then closed
                writer.write(request(i))
                await read_frame(reader)
                writer.close()
            elif kind == 1:                                # garbage: protocol error
                writer.write(b"GET / HTTP/1.1\r\n\r\n")
                await reader.read()
                writer.close()
            elif kind == 2:                                # a reset mid-frame
                writer.write(request(i)[:5])
                await asyncio.sleep(0)
                writer.transport.abort()
            else:                                          # closed before the answer
                writer.write(request(i) + frame(0x01, b"x" * 3)[:6])
                writer.close()
            await writer.wait_closed()

        gc.collect()
        before = (_alive(relay.ClientSide), _alive(relay.UpstreamSide), _alive(FrameParser))
        gc.disable()
        try:
            for batch in range(8):
                await asyncio.gather(*(client(batch * 50 + i) for i in range(50)))
            await wait_for(lambda: not route.connections and route.setting_up == 0,
                           timeout=20, what="every connection closed and set up")
            assert sample(app, "frametap_connections_active", route="t") == 0
            assert sample(app, "frametap_connections_total", route="t") == 400
            await asyncio.sleep(0.1)                       # the transports' last callbacks
            left = (_alive(relay.ClientSide), _alive(relay.UpstreamSide),
                    _alive(FrameParser))
        finally:
            gc.enable()
        assert left == before == (0, 0, 0), (
            f"(ClientSide, UpstreamSide, parsers) alive after 400 closed connections: "
            f"{left}, before: {before}")
        await app.shutdown(0)
        up.close()
    run(scenario())


@pytest.mark.slow
def test_connections_in_setup_are_bounded_and_the_rest_wait_in_the_backlog(monkeypatch):
    """An upstream whose accept queue is full (it listens and never accepts: the kernel
    drops further SYNs) holds every upstream connect until connect_timeout. The route
    takes at most SETUP_LIMIT clients off its listen backlog meanwhile, instead of all of
    them, and still serves (here: counts as connect_failed) every client in the end."""
    limit, clients = 8, 40
    monkeypatch.setattr(relay, "SETUP_LIMIT", limit)

    async def scenario():
        stuck = socket.socket()
        stuck.bind(("127.0.0.1", 0))
        stuck.listen(0)                   # accept queue of one; never accepted
        fill = []
        for _ in range(4):                # fill the queue; the later ones hang in SYN
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(stuck.getsockname())
            fill.append(s)
        await asyncio.sleep(0.1)
        app = await start_proxy("127.0.0.1:%d" % stuck.getsockname()[1],
                                connect_timeout=1.0)
        route = app.routes[0]
        port = proxy_port(app)
        writers = []
        for _ in range(clients):          # the kernel completes these from the backlog
            _r, w = await asyncio.open_connection("127.0.0.1", port)
            writers.append(w)
        await wait_for(lambda: route.setting_up >= limit, what="the route at its limit")
        peak = 0
        for _ in range(50):               # the whole first connect_timeout
            peak = max(peak, route.setting_up, len(route.connections))
            assert all(a.held for a in route.acceptors) or route.setting_up < limit
            await asyncio.sleep(0.01)
        assert peak <= limit, f"{peak} connections in set-up (limit {limit})"
        assert sample(app, "frametap_connections_total", route="t") <= limit
        await wait_for(lambda: route.closed_counts.get(("proxy", "connect_failed"), 0)
                       == clients, timeout=60, what="every client served")
        assert sample(app, "frametap_connections_total", route="t") == clients
        assert sample(app, "frametap_upstream_connect_failures_total", route="t") == clients
        assert route.setting_up == 0 and not any(a.held for a in route.acceptors)
        for w in writers:
            w.close()
        await app.shutdown(0)
        for s in fill:
            s.close()
        stuck.close()
    run(scenario(), timeout=120)
