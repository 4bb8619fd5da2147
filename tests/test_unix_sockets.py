"""``unix:/path`` addresses (docs/design.md, "Command line"): a route listens on and
forwards to Unix stream sockets as well as TCP, in every combination, with the same
relay semantics; a unix listener creates its missing parent directory (one level only)
and removes its socket file on shutdown.  Real sockets, a real in-process proxy, and a
small fleximq upstream that answers every REQ."""

import asyncio
import os
import socket
import stat

import pytest

from proxy.addresses import UnixAddress, parse_address
from proxy.app import ProxyApp
from proxy.config import config_from_dict
from proxy.errors import ConfigError
from proxy.protocols.fleximq import codec
from tests.support import run, sample, wait_for


class Upstream:
    """Answers each REQ with a REP (status 200) and echoes whether it saw EOF."""

    def __init__(self):
        self.server = None
        self.eofs = 0

    async def handle(self, reader, writer):
        fr = codec.FrameReader()
        while True:
            data = await reader.read(65536)
            if not data:
                self.eofs += 1
                writer.write(codec.bcast(1, {"eof": True}))   # after the client's FIN
                await writer.drain()
                writer.close()
                return
            for f in fr.feed(data):
                if f.type == codec.REQ:
                    writer.write(codec.rep(1001, f.client_id, f.rid, status=200))
            await writer.drain()

    async def start(self, where, tmp):
        if where == "unix":
            path = str(tmp / "up" / "server.sock")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self.server = await asyncio.start_unix_server(self.handle, path)
            return "unix:" + path
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return "127.0.0.1:%d" % self.server.sockets[0].getsockname()[1]


async def start_proxy(listen, upstream):
    app = ProxyApp(config_from_dict({"routes": [{
        "name": "fx", "protocol": "fleximq", "listen": listen, "upstream": upstream}],
        "proxy": {"shutdown_timeout": 1.0}}))
    await app.start()
    return app


async def open_client(app):
    addr = app.routes[0].address
    if isinstance(addr, UnixAddress):
        return await asyncio.open_unix_connection(addr)
    return await asyncio.open_connection(*addr)


async def read_frames(reader, n):
    fr, out = codec.FrameReader(), []
    while len(out) < n:
        data = await asyncio.wait_for(reader.read(65536), 5)
        assert data, "connection closed early"
        out.extend(fr.feed(data))
    return out


@pytest.mark.parametrize("listen_kind,up_kind", [("unix", "tcp"), ("tcp", "unix"),
                                                 ("unix", "unix"), ("tcp", "tcp")])
def test_every_combination_relays_and_counts(tmp_path, listen_kind, up_kind):
    async def main():
        up = Upstream()
        upstream = await up.start(up_kind, tmp_path)
        sock_path = str(tmp_path / "px" / "proxy.sock")           # px/ does not exist yet
        app = await start_proxy("unix:" + sock_path if listen_kind == "unix"
                                else "127.0.0.1:0", upstream)
        try:
            if listen_kind == "unix":
                assert stat.S_ISSOCK(os.lstat(sock_path).st_mode)
            reader, writer = await open_client(app)
            for i in range(3):
                writer.write(codec.req(1000, 1001, "id-%d" % i, "/p", {"i": i}))
            reps = await read_frames(reader, 3)
            assert sorted(f.rid for f in reps) == ["id-0", "id-1", "id-2"]
            conn = next(iter(app.routes[0].connections))
            if listen_kind == "unix":
                assert conn.peer == "unix:" + sock_path
            else:
                assert conn.peer.startswith("127.0.0.1:")
            # half-close: the client's FIN reaches the upstream, whose last frame still
            # comes back
            writer.write_eof()
            last = await read_frames(reader, 1)
            assert last[0].type == codec.BCAST
            assert await asyncio.wait_for(reader.read(10), 5) == b""
            writer.close()
            await wait_for(lambda: not app.routes[0].connections, what="connection closed")
            assert up.eofs == 1
            R = {"route": "fx", "protocol": "fleximq"}
            assert sample(app, "frametap_frames_total", direction="c2s", opcode="REQ", **R) == 3
            assert sample(app, "frametap_responses_total", opcode="REQ", status="200", **R) == 3
            assert sample(app, "frametap_request_duration_seconds_count", opcode="REQ",
                          outcome="ok", **R) == 3
        finally:
            await app.shutdown(0)
            up.server.close()
        if listen_kind == "unix":
            assert not os.path.exists(sock_path), "socket file removed on shutdown"
            assert os.path.isdir(os.path.dirname(sock_path))
    run(main())


def test_dead_unix_upstream_is_counted(tmp_path):
    async def main():
        app = await start_proxy("127.0.0.1:0", "unix:" + str(tmp_path / "nobody.sock"))
        try:
            reader, writer = await open_client(app)
            writer.write(codec.req(1000, 1001, "x"))
            assert await asyncio.wait_for(reader.read(10), 5) == b""
            writer.close()
            assert sample(app, "frametap_upstream_connect_failures_total", route="fx") == 1
        finally:
            await app.shutdown(0)
    run(main())


def test_only_one_missing_directory_level_is_created(tmp_path):
    async def main():
        path = tmp_path / "a" / "b" / "proxy.sock"
        app = ProxyApp(config_from_dict({"routes": [{
            "name": "fx", "protocol": "fleximq", "listen": "unix:%s" % path,
            "upstream": "127.0.0.1:9"}]}))
        with pytest.raises(ConfigError) as e:
            await app.start()
        msg = str(e.value)
        assert "routes[0].listen" in msg and "unix:%s" % path in msg
        assert "does not exist" in msg and str(tmp_path / "a") in msg
        assert not (tmp_path / "a").exists()
    run(main())


def test_stale_socket_is_replaced_and_a_live_one_refused(tmp_path):
    path = str(tmp_path / "s.sock")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)
    stale.close()                                   # the file stays, no one listens

    async def main():
        app = await start_proxy("unix:" + path, "127.0.0.1:9")
        try:
            second = ProxyApp(config_from_dict({"routes": [{
                "name": "fx", "protocol": "fleximq", "listen": "unix:" + path,
                "upstream": "127.0.0.1:9"}]}))
            with pytest.raises(ConfigError, match="address already in use"):
                await second.start()
            assert os.path.exists(path)              # the live listener keeps its file
        finally:
            await app.shutdown(0)
        assert not os.path.exists(path)
    run(main())


def test_parse_unix_addresses():
    assert parse_address("unix:/run/x.sock", "k", allow_unix=True) == "/run/x.sock"
    assert isinstance(parse_address("unix:/run/x.sock", "k", allow_unix=True), UnixAddress)
    assert parse_address("unix:app.sock", "k", allow_unix=True) == "/tmp/app.sock"   # §6.3.1
    for bad, why in [("unix:", "expected 'unix:/path/to.sock'"),
                     ("unix:/" + "x" * 200, "at most 107 bytes"),
                     ("unix:/tmp/dir/", "not a directory")]:
        with pytest.raises(ConfigError, match=why):
            parse_address(bad, "routes[0].listen", allow_unix=True)
    with pytest.raises(ConfigError, match="not allowed here"):
        parse_address("unix:/x.sock", "admin.listen")


def test_cli_accepts_unix_and_says_so(tmp_path):
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "proxy", "proxy", "--help"],
                         capture_output=True, text=True)
    assert "unix:/path/to.sock" in out.stdout
    out = subprocess.run([sys.executable, "-m", "proxy", "proxy", "--protocol", "fleximq",
                          "--listen", "unix:", "--upstream", "127.0.0.1:1"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "--listen" in out.stderr and "unix:/path/to.sock" in out.stderr


def test_backpressure_over_unix_both_sides(tmp_path):
    """An upstream Unix socket that never reads pauses the Unix client: the proxy's
    buffer stays at the high-water mark plus one read (the relay's rule over TCP too)."""
    from proxy.relay import WRITE_HIGH

    async def main():
        accepted = []

        async def stall(reader, writer):              # accepts, never reads
            accepted.append(writer)
            await asyncio.sleep(30)
        up_path = str(tmp_path / "stall.sock")
        up = await asyncio.start_unix_server(stall, up_path)
        app = await start_proxy("unix:%s" % (tmp_path / "px.sock"), "unix:" + up_path)
        try:
            reader, writer = await open_client(app)
            await wait_for(lambda: app.routes[0].connections, what="connection")
            conn = next(iter(app.routes[0].connections))
            await wait_for(lambda: conn.upstream is not None, what="upstream")
            big = codec.encode(codec.BCAST, 1000, raw_payload=b"x" * (1 << 20))
            sent = 0
            try:
                for _ in range(64):                   # try to push 64 MiB
                    writer.write(big)
                    await asyncio.wait_for(writer.drain(), 0.5)
                    sent += len(big)
            except asyncio.TimeoutError:
                pass                                  # our own send blocked: good
            assert sent < 32 * 1024 * 1024
            assert conn.upstream.transport.get_write_buffer_size() <= \
                WRITE_HIGH + 1024 * 1024 + 64
            writer.transport.abort()
        finally:
            await app.shutdown(0)
            up.close()
    run(main())
