"""The relay over real sockets: forwarding, half-close, resets, backpressure, limits, faults."""

import asyncio
import socket
import struct

import pytest

from proxy.relay import WRITE_HIGH
from tests.support import (FaultyUpstream, frame, proxy_port, read_frame, request, run,
                           sample, start_proxy, wait_for)

R = {"route": "t", "protocol": "flymq"}


def test_relays_and_counts_every_frame():
    async def scenario():
        up = await FaultyUpstream().start()
        app = await start_proxy(up.address)
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port(app))
        for i in range(10):                               # pipelined
            writer.write(request(i))
        for i in range(10):
            op, payload = await read_frame(reader)
            assert op == 0x01 and payload[:4] == struct.pack(">I", i)
        writer.close()
        await wait_for(lambda: not app.routes[0].connections, what="connection closed")
        assert sample(app, "frametap_frames_total", direction="c2s", opcode="PRODUCE", **R) == 10
        assert sample(app, "frametap_frames_total", direction="s2c", opcode="PRODUCE", **R) == 10
        assert sample(app, "frametap_bytes_total", route="t", direction="c2s") == 10 * 24
        assert sample(app, "frametap_request_duration_seconds_count", opcode="PRODUCE",
                      outcome="ok", **R) == 10
        assert sample(app, "frametap_responses_total", opcode="PRODUCE", status="OK", **R) == 10
        assert sample(app, "frametap_connections_total", route="t") == 1
        assert sample(app, "frametap_connections_active", route="t") == 0
        assert sample(app, "frametap_requests_in_flight", **R) == 0
        assert sample(app, "frametap_upstream_connect_duration_seconds_count", route="t") == 1
        await app.shutdown(0)
        up.close()
    run(scenario())


def test_forwards_bytes_before_the_frame_is_complete():
    async def scenario():
        up = await FaultyUpstream().start()
        app = await start_proxy(up.address)
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port(app))
        data = request(7, size=1000)
        writer.write(data[:500])
        await wait_for(lambda: len(up.received) == 500, what="half a frame at upstream")
        writer.write(data[500:])
        op, payload = await read_frame(reader)
        assert payload[:4] == struct.pack(">I", 7)
        writer.close()
        await app.shutdown(0)
        up.close()
    run(scenario())


def test_half_close_propagates_and_other_direction_keeps_flowing():
    async def scenario():
        up = await FaultyUpstream().start()
        app = await start_proxy(up.address)
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port(app))
        writer.write(request(1) + request(2))
        writer.write_eof()                                 # client done sending
        await asyncio.wait_for(up.eof_seen.wait(), 5)      # upstream saw the FIN
        assert (await read_frame(reader))[1][:4] == struct.pack(">I", 1)
        assert (await read_frame(reader))[1][:4] == struct.pack(">I", 2)
        assert await reader.read() == b""                  # then upstream's FIN reaches us
        await wait_for(lambda: not app.routes[0].connections, what="both sides closed")
        assert sample(app, "frametap_request_timeouts_total", opcode="PRODUCE", **R) is None
        await app.shutdown(0)
        up.close()
    run(scenario())


def test_upstream_down_closes_client_and_counts():
    async def scenario():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            dead = "127.0.0.1:%d" % s.getsockname()[1]    # bound, never listening
            app = await start_proxy(dead)
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port(app))
            writer.write(request(1))
            assert await asyncio.wait_for(reader.read(), 5) == b""
            await wait_for(lambda: not app.routes[0].connections, what="connection dropped")
            assert sample(app, "frametap_upstream_connect_failures_total", route="t") == 1
            assert sample(app, "frametap_connections_active", route="t") == 0
            await app.shutdown(0)
    run(scenario())


def test_upstream_reset_mid_frame_closes_only_that_connection():
    async def scenario():
        up = await FaultyUpstream().start()
        app = await start_proxy(up.address)
        r1, w1 = await asyncio.open_connection("127.0.0.1", proxy_port(app))
        w1.write(request(1))
        assert (await read_frame(r1))[0] == 1              # healthy connection first
        r2, w2 = await asyncio.open_connection("127.0.0.1", proxy_port(app))
        up.reset_after = len(up.received) + 24
        w2.write(request(2))
        try:
            rest = await asyncio.wait_for(r2.read(), 5)    # half a frame then close/reset
            assert len(rest) <= 20
        except ConnectionResetError:
            pass
        up.reset_after = None
        w1.write(request(3))                               # the other one still works
        assert (await read_frame(r1))[1][:4] == struct.pack(">I", 3)
        await wait_for(lambda: len(app.routes[0].connections) == 1, what="reset conn gone")
        assert sample(app, "frametap_protocol_errors_total", direction="s2c",
                      reason="truncated_frame", **R) == 1
        # the half response's header was seen, so request 2 counts as answered
        assert sample(app, "frametap_responses_total", opcode="PRODUCE", status="OK", **R) == 3
        assert sample(app, "frametap_requests_in_flight", **R) == 0
        w1.close()
        await app.shutdown(0)
        up.close()
    run(scenario())


def test_client_sends_half_a_frame_and_closes():
    async def scenario():
        up = await FaultyUpstream().start()
        app = await start_proxy(up.address)
        r1, w1 = await asyncio.open_connection("127.0.0.1", proxy_port(app))
        w1.write(request(1)[:10])
        w1.close()
        await wait_for(lambda: not app.routes[0].connections, what="half-frame conn closed")
        assert sample(app, "frametap_protocol_errors_total", direction="c2s",
                      reason="truncated_frame", **R) == 1
        # its connection closed before any answer: a cut-off, not a timeout
        assert sample(app, "frametap_request_cutoffs_total", opcode="PRODUCE", **R) == 1
        assert sample(app, "frametap_request_timeouts_total", opcode="PRODUCE", **R) is None
        r2, w2 = await asyncio.open_connection("127.0.0.1", proxy_port(app))
        w2.write(request(2))
        assert (await read_frame(r2))[0] == 1
        w2.close()
        await app.shutdown(0)
        up.close()
    run(scenario())


def test_client_reset_aborts_upstream():
    async def scenario():
        up = await FaultyUpstream().start()
        app = await start_proxy(up.address)
        sock = socket.create_connection(("127.0.0.1", proxy_port(app)))
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_sendall(sock, request(1)[:12])
        await wait_for(lambda: len(up.received) >= 12, what="bytes at upstream")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()                                       # RST
        await wait_for(lambda: not app.routes[0].connections, what="conn torn down")
        await asyncio.wait_for(up.eof_seen.wait(), 5)      # upstream side closed too
        await app.shutdown(0)
        up.close()
    run(scenario())


def test_garbage_closes_connection_others_unaffected():
    async def scenario():
        up = await FaultyUpstream().start()
        app = await start_proxy(up.address)
        r1, w1 = await asyncio.open_connection("127.0.0.1", proxy_port(app))
        r2, w2 = await asyncio.open_connection("127.0.0.1", proxy_port(app))
        w2.write(request(9) + b"\x16\x03\x01\x00\xa5\x01\x00\x00garbage")
        await asyncio.wait_for(r2.read(), 5)                           # closed by the proxy
        await wait_for(lambda: bytes(up.received) == request(9), what="valid prefix upstream")
        assert b"garbage" not in bytes(up.received)
        w1.write(request(1))
        assert (await read_frame(r1))[1][:4] == struct.pack(">I", 1)
        assert sample(app, "frametap_protocol_errors_total", direction="c2s",
                      reason="bad_magic", **R) == 1
        w1.close()
        await app.shutdown(0)
        up.close()
    run(scenario())


def test_oversized_length_rejected_before_payload():
    async def scenario():
        up = await FaultyUpstream().start()
        app = await start_proxy(up.address, max_frame_bytes=4096)
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port(app))
        writer.write(bytes([0xAF, 1, 1, 1]) + struct.pack(">I", 1 << 30))   # header only
        assert await asyncio.wait_for(reader.read(), 5) == b""
        assert sample(app, "frametap_protocol_errors_total", direction="c2s",
                      reason="frame_too_large", **R) == 1
        assert len(up.received) == 0                       # nothing of it was forwarded
        await app.shutdown(0)
        up.close()
    run(scenario())


def test_client_that_never_reads_keeps_memory_bounded():
    """Upstream floods 64 MiB; the client never reads: the proxy's buffers stay bounded."""
    async def scenario():
        up = await FaultyUpstream().start()
        up.flood = 64 * 1024 * 1024
        app = await start_proxy(up.address)
        sock = socket.create_connection(("127.0.0.1", proxy_port(app)))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        await wait_for(lambda: app.routes[0].connections, what="connection")
        conn = next(iter(app.routes[0].connections))
        peak = 0
        for _ in range(100):                               # 1 s of flood
            await asyncio.sleep(0.01)
            peak = max(peak, conn.transport.get_write_buffer_size())
        relayed = app.routes[0].stats.snapshot()["bytes"]["s2c"]
        assert relayed < 16 * 1024 * 1024, relayed         # upstream was paused, not drained
        assert peak <= WRITE_HIGH + 256 * 1024, peak       # high-water + at most one read
        sock.close()
        await app.shutdown(0)
        up.close()
    run(scenario())


def test_upstream_that_never_reads_pauses_the_client():
    async def scenario():
        up = await FaultyUpstream().start()
        up.stall = True
        app = await start_proxy(up.address)
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port(app))
        await wait_for(lambda: app.routes[0].connections, what="connection")
        conn = next(iter(app.routes[0].connections))
        await wait_for(lambda: conn.upstream is not None, what="upstream")
        big = request(0, size=1024 * 1024)
        sent = 0
        try:
            for _ in range(64):                            # try to push 64 MiB
                writer.write(big)
                await asyncio.wait_for(writer.drain(), 0.5)
                sent += len(big)
        except asyncio.TimeoutError:
            pass                                           # our own send blocked: good
        assert sent < 32 * 1024 * 1024
        assert conn.upstream.transport.get_write_buffer_size() <= WRITE_HIGH + 1024 * 1024 + 8
        writer.transport.abort()
        await app.shutdown(0)
        up.close()
    run(scenario())


def test_connection_limit():
    async def scenario():
        up = await FaultyUpstream().start()
        app = await start_proxy(up.address, max_connections=2)
        conns = [await asyncio.open_connection("127.0.0.1", proxy_port(app)) for _ in range(2)]
        await wait_for(lambda: len(app.routes[0].connections) == 2, what="two connections")
        r3, w3 = await asyncio.open_connection("127.0.0.1", proxy_port(app))
        try:
            assert await asyncio.wait_for(r3.read(), 5) == b""
        except ConnectionResetError:
            pass
        assert sample(app, "frametap_connections_rejected_total", route="t") == 1
        r, w = conns[0]
        w.write(request(5))
        assert (await read_frame(r))[1][:4] == struct.pack(">I", 5)
        for _, w in conns:
            w.close()
        await app.shutdown(0)
        up.close()
    run(scenario())


def test_request_timeout_counted_by_sweeper():
    async def scenario():
        up = await FaultyUpstream().start()
        up.stall = True
        app = await start_proxy(up.address, request_timeout=0.2)
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port(app))
        writer.write(request(1))
        await wait_for(lambda: sample(app, "frametap_request_timeouts_total", opcode="PRODUCE",
                                      **R) == 1, what="timeout counted")
        assert sample(app, "frametap_requests_in_flight", **R) == 0
        writer.close()
        await app.shutdown(0)
        up.close()
    run(scenario())


def test_several_routes_in_one_process():
    async def scenario():
        from proxy.app import ProxyApp
        from proxy.config import config_from_dict
        up1 = await FaultyUpstream().start()
        up2 = await FaultyUpstream().start()
        app = ProxyApp(config_from_dict({"routes": [
            {"name": "a", "protocol": "flymq", "listen": "127.0.0.1:0", "upstream": up1.address},
            {"name": "b", "protocol": "flymq", "listen": "127.0.0.1:0", "upstream": up2.address},
        ]}))
        await app.start()
        for i, up in ((0, up1), (1, up2)):
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port(app, i))
            writer.write(request(i))
            await read_frame(reader)
            writer.close()
        assert up1.connections == 1 and up2.connections == 1
        assert sample(app, "frametap_frames_total", route="a", protocol="flymq",
                      direction="c2s", opcode="PRODUCE") == 1
        assert sample(app, "frametap_frames_total", route="b", protocol="flymq",
                      direction="c2s", opcode="PRODUCE") == 1
        await app.shutdown(0)
        up1.close()
        up2.close()
    run(scenario())


def test_log_flood_is_bounded(caplog):
    """200 garbage connections: every one counted, at most ~10 warnings a second logged."""
    import logging

    async def scenario():
        up = await FaultyUpstream().start()
        app = await start_proxy(up.address)
        for _ in range(200):
            r, w = await asyncio.open_connection("127.0.0.1", proxy_port(app))
            w.write(b"\x16\x03\x01garbage!")
            await r.read()
            w.close()
        assert sample(app, "frametap_protocol_errors_total", direction="c2s",
                      reason="bad_magic", **R) == 200
        await app.shutdown(0)
        up.close()
    with caplog.at_level(logging.WARNING, logger="frametap.relay"):
        run(scenario())
    closing = [r for r in caplog.records if "closing connection" in r.getMessage()]
    assert 1 <= len(closing) <= 40                      # 200 events over a few seconds


def test_a_parser_that_raises_costs_one_connection(caplog):
    """Any exception out of a parser is contained at the relay (issue 8, defect 1): counted
    under reason parser_error, one line without a traceback, that connection closed, the
    next connection served."""
    from proxy.framing_py import FrameParser, RouteStats

    class Exploding(FrameParser):           # a parser with a bug on magic 0xEE
        header_size = 8
        max_frame_bytes = 1 << 20

        def on_header(self, d, h, avail):
            if h[0] == 0xEE:
                raise OverflowError("int too big to convert")
            n = int.from_bytes(h[4:8], "big") + 8
            self.begin(d, self.stats.slot_for(h[2]), 0, n, 8)
            return n

    async def scenario():
        up = await FaultyUpstream().start()
        app = await start_proxy(up.address)
        route = app.routes[0]
        route.parser_class = Exploding             # a twin-core parser: twin-core counters
        route.stats = RouteStats(route.cfg.name, route.cfg.protocol)
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port(app))
        writer.write(b"\xee" + bytes(7))
        assert await asyncio.wait_for(reader.read(), 5) == b""      # closed by the proxy
        writer.close()
        await wait_for(lambda: not route.connections, what="connection closed")
        assert sample(app, "frametap_protocol_errors_total", direction="c2s",
                      reason="parser_error", **R) == 1
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port(app))
        writer.write(request(7))                                      # the next one works
        op, payload = await read_frame(reader)
        assert op == 0x01 and payload[:4] == struct.pack(">I", 7)
        writer.close()
        await app.shutdown(0)
        up.close()
    with caplog.at_level("WARNING"):
        run(scenario())
    lines = [r for r in caplog.records if "parser raised" in r.getMessage()]
    assert len(lines) == 1 and "OverflowError" in lines[0].getMessage()
    assert not any(r.exc_info for r in caplog.records)


def test_suppressed_warnings_are_flushed_with_the_route_name(caplog):
    from proxy.relay import LogLimiter
    lim = LogLimiter("r9", per_second=2)
    with caplog.at_level("WARNING"):
        for i in range(5):
            lim.warning("w %d", i)
        lim.flush(now=lim.window + 1)         # the sweeper's call, a second later
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs == ["w 0", "w 1", "route r9: 3 similar warnings suppressed"]


def test_half_closed_connection_is_closed_after_half_close_timeout():
    """Issue 8, defect 4: client FIN + an upstream that never closes used to stay in
    CLOSE-WAIT forever with connections_active stuck."""
    async def scenario():
        up = await FaultyUpstream().start()
        up.stall = True                                   # never reads, never closes
        app = await start_proxy(up.address, request_timeout=1.0)
        route = app.routes[0]
        route.half_close_timeout = 0.5
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port(app))
        writer.write(request(1))
        await writer.drain()
        writer.write_eof()
        await wait_for(lambda: not route.connections, timeout=5, what="half-close timeout")
        assert route.closed_counts == {("proxy", "half_close"): 1}
        assert sample(app, "frametap_connections_active", route="t") == 0
        assert sample(app, "frametap_connections_closed_total", route="t", by="proxy",
                      reason="half_close") == 1
        writer.close()
        await app.shutdown(0)
        up.close()
    run(scenario())


@pytest.mark.slow
def test_idle_connection_is_closed_after_idle_timeout_and_busy_one_is_not():
    async def scenario():
        up = await FaultyUpstream().start()
        app = await start_proxy(up.address, request_timeout=1.0)
        route = app.routes[0]
        route.idle_timeout = 0.8
        r1, w1 = await asyncio.open_connection("127.0.0.1", proxy_port(app))   # idle
        r2, w2 = await asyncio.open_connection("127.0.0.1", proxy_port(app))   # busy
        for i in range(12):
            w2.write(request(i))
            await read_frame(r2)
            await asyncio.sleep(0.15)
        assert await asyncio.wait_for(r1.read(), 5) == b""
        assert route.closed_counts.get(("proxy", "idle")) == 1
        assert len(route.connections) == 1                  # the busy one lives on
        w1.close()
        w2.close()
        await wait_for(lambda: not route.connections, what="closed")
        assert route.closed_counts.get(("client", "close"), 0) + \
            route.closed_counts.get(("client", "eof"), 0) + \
            route.closed_counts.get(("upstream", "eof"), 0) == 1
        await app.shutdown(0)
        up.close()
    run(scenario())


def test_requests_to_an_unreachable_upstream_are_not_request_timeouts():
    async def scenario():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            # held, never listening: nothing else can take the port while the test runs
            dead = "127.0.0.1:%d" % s.getsockname()[1]
            app = await start_proxy(dead)
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port(app))
            writer.write(request(1) + request(2))
            assert await asyncio.wait_for(reader.read(), 5) == b""
            route = app.routes[0]
            await wait_for(lambda: not route.connections, what="closed")
            snap = route.stats.snapshot()
            assert snap["timeouts"] == {} and snap["in_flight"] == 0
            assert snap["connect_failures"] == 1
            assert route.closed_counts == {("proxy", "connect_failed"): 1}
            writer.close()
            await app.shutdown(0)
    run(scenario())


def test_fd_limit_is_raised_to_the_hard_limit():
    """Issue 8, defect 2: the proxy ran with the shell's soft limit (1024 -> ~500 clients)."""
    import resource
    import subprocess
    import sys
    code = ("import resource; from proxy.app import raise_fd_limit, connection_capacity; "
            "soft = raise_fd_limit(); h = resource.getrlimit(resource.RLIMIT_NOFILE)[1]; "
            "print(soft, h, connection_capacity(soft))")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(256, hard)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE,
                                                               (low, hard)), check=True)
    got, hard_seen, capacity = (int(x) for x in out.stdout.split())
    assert got >= low
    if hard_seen != resource.RLIM_INFINITY:
        assert got == hard_seen
    assert capacity == (got - 64) // 2


def test_a_big_read_is_parsed_frame_cap_frames_a_turn_and_arrives_whole():
    """A read holding more than FRAME_CAP frames (+ pending requests) is parsed and
    forwarded FRAME_CAP at a time, the rest queued in the loop's Backlog while that
    direction reads nothing more; the Backlog runs TURNS slices a loop iteration, so one
    busy connection cannot hold the loop for milliseconds (docs/design.md, "Fairness").
    A read of FULL_READ bytes still yields before that side's next read.  Both
    directions arrive whole, in order, with the FIN after the last byte."""
    from proxy import relay
    n = 20_000                                  # 20,000 x 72 B = 1.4 MB each way
    sent = b"".join(frame(0x01, struct.pack(">I", i) + b"q" * 60) for i in range(n))
    back = b"".join(frame(0x01, struct.pack(">I", i) + b"r" * 60) for i in range(n))
    got_up = bytearray()

    async def upstream(reader, writer):
        while True:
            chunk = await reader.read(1 << 20)
            if not chunk:
                break
            got_up.extend(chunk)
        writer.write(back)                      # all the answers, then the FIN
        await writer.drain()
        writer.close()

    async def scenario():
        loop = asyncio.get_running_loop()
        ticks = [0]

        def tick():                             # counts loop iterations
            ticks[0] += 1
            if not stop:
                loop.call_soon(tick)
        stop = []
        loop.call_soon(tick)
        server = await asyncio.start_server(upstream, "127.0.0.1", 0)
        app = await start_proxy(f"127.0.0.1:{server.sockets[0].getsockname()[1]}")
        route = app.routes[0]
        fed = []                                # (d, bytes given, parsed, frames, tick, slice)
        base = route.parser_class

        class Recording(base):                  # the route's own parser, feeds recorded
            def feed(self, d, data):
                ok = base.feed(self, d, data)
                fed.append((d, len(data), ok, self.feed_frames, ticks[0],
                            isinstance(data, memoryview)))
                return ok
        route.parser_class = Recording
        slices0 = route.backlog.slices
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port(app))
        writer.write(sent)
        writer.write_eof()
        got = await asyncio.wait_for(reader.read(), 20)      # until the proxy's FIN
        writer.close()
        stop.append(1)
        try:
            assert bytes(got_up) == sent
            assert got == back
            for d, total in ((0, len(sent)), (1, len(back))):
                assert sum(ok for dd, _, ok, *_ in fed if dd == d) == total
            # a request is a frame and a pending request: FRAME_CAP // 2 frames a feed;
            # an answer (FlyMQ's are matched in order) a frame: FRAME_CAP
            assert max(f for d, _, _, f, _, _ in fed if d == 0) == relay.FRAME_CAP // 2
            assert max(f for d, _, _, f, _, _ in fed if d == 1) == relay.FRAME_CAP
            assert route.backlog.slices - slices0 >= n // (relay.FRAME_CAP // 2)
            per_tick = {}
            for d, _, _, frames, t, _ in fed:
                per_tick[t] = per_tick.get(t, 0) + frames
            # a loop iteration: TURNS slices and at most one fresh read a direction
            assert max(per_tick.values()) <= (relay.TURNS + 2) * relay.FRAME_CAP
            big = 0
            for d in (0, 1):
                reads = [(k, t) for dd, k, _, _, t, sl in fed if dd == d and not sl]
                for (k, t), (_, t2) in zip(reads, reads[1:]):
                    if k >= relay.FULL_READ:
                        big += 1
                        assert t2 > t, ("a read of %d bytes was followed by another in "
                                        "the same loop iteration" % k)
            assert big, "no read reached FULL_READ: the test did not exercise the yield"
            snap = route.stats.snapshot()
            assert snap["frames"][("c2s", "PRODUCE")] == n
            assert snap["frames"][("s2c", "PRODUCE")] == n
            assert snap["bytes"] == {"c2s": len(sent), "s2c": len(back)}
        finally:
            await app.shutdown(0)
            server.close()
    run(scenario())


def test_flooding_connections_cannot_hold_another_routes_round_trip():
    """Six connections flood one route with small frames (senders in threads, upstream
    discarding) while a client on another route makes lockstep round trips.  Between
    sending a request and reading its answer, the client waits for a few loop iterations
    of the flooders' parsing, each bounded by the Backlog (TURNS slices plus one cut read
    per connection read): measured, 512 frames a round trip.  Without the frame cap
    (FRAME_CAP = 0) the same test measured 256,000: whole 256 KB reads of every flooder,
    32 reads in a row.  Counted in frames parsed, not time (a shared machine)."""
    import threading
    from proxy import relay
    from proxy.app import ProxyApp
    from proxy.config import config_from_dict
    flooders, cap = 6, relay.FRAME_CAP
    parsed = [0]

    async def scenario():
        async def discard(reader, writer):
            while await reader.read(1 << 20):
                pass
            writer.close()
        sink = await asyncio.start_server(discard, "127.0.0.1", 0)
        echo = await FaultyUpstream().start()
        app = ProxyApp(config_from_dict({"routes": [
            {"name": "flood", "protocol": "flymq", "listen": "127.0.0.1:0",
             "upstream": "127.0.0.1:%d" % sink.sockets[0].getsockname()[1]},
            {"name": "probe", "protocol": "flymq", "listen": "127.0.0.1:0",
             "upstream": echo.address}], "proxy": {"shutdown_timeout": 1.0}}))
        await app.start()
        flood_route = app.routes[0]
        base = flood_route.parser_class

        class Counting(base):
            def feed(self, d, data):
                ok = base.feed(self, d, data)
                parsed[0] += self.feed_frames
                return ok
        flood_route.parser_class = Counting
        stop = threading.Event()
        blob = b"".join(frame(0x01, struct.pack(">I", i) + b"q" * 12) for i in range(20000))

        def flood():
            s = socket.create_connection(("127.0.0.1", proxy_port(app, 0)))
            try:
                while not stop.is_set():
                    s.sendall(blob)
            except OSError:
                pass
            s.close()
        threads = [threading.Thread(target=flood, daemon=True) for _ in range(flooders)]
        for t in threads:
            t.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port(app, 1))
        waits = []
        try:
            while parsed[0] < 200_000:              # the flood is on
                await asyncio.sleep(0.01)
            slices = flood_route.backlog.slices
            for i in range(40):
                before = parsed[0]
                writer.write(request(i))
                await read_frame(reader)
                waits.append(parsed[0] - before)
            assert flood_route.backlog.slices - slices >= 40, "the flood was never cut"
        finally:
            stop.set()
            writer.close()
            await app.shutdown(0)
            for t in threads:
                t.join(5)
            sink.close()
            echo.close()
        waits.sort()
        # a round trip spans a few loop iterations: allow four full ones
        assert waits[len(waits) // 2] <= 4 * (relay.TURNS + flooders) * cap, waits
        assert waits[-1] <= 8 * (relay.TURNS + flooders) * cap, waits
    run(scenario())
