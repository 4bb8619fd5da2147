"""The proxy's frame log under faults: a directory that cannot be written and a writer
that cannot keep up are counted (frametap_framelog_write_errors_total / _dropped_total)
while relaying goes on unaffected; per-route ``framelog = false`` and ``sample``."""

import glob
import os
import resource
import shutil
import struct

import pyarrow.parquet as pq
import pytest

from loadgen.flymq.client import FlyMQClient
from loadgen.flymq.server import FlyMQServerThread
from proxy.config import config_from_dict
from tests.conftest import LoopThread
from tests.support import sample

pytestmark = pytest.mark.slow


@pytest.fixture
def server():
    srv = FlyMQServerThread().start()
    yield srv
    srv.stop()


def run_proxy(server, log, routes=1, **route):
    lt = LoopThread()
    from proxy.app import ProxyApp
    tables = [dict({"name": "fly%d" % i, "protocol": "flymq", "listen": "127.0.0.1:0",
                    "upstream": server.address}, **route) for i in range(routes)]
    app = ProxyApp(config_from_dict({"routes": tables, "framelog": log}))
    lt.run(app.start())
    return app, lt


def stop(app, lt):
    lt.run(app.shutdown(5))
    lt.stop()


def produce_many(port, n, connections=1, size=32):
    for _ in range(connections):
        c = FlyMQClient("127.0.0.1", port)
        c.create_topic("t", 1)
        # pipelined: n requests written at once, then n answers read (the client's
        # request() is one round trip; this is how a load test hurts a writer)
        payload = struct.pack(">H", 1) + b"t" + struct.pack(">I", 0) + \
            struct.pack(">I", size) + b"v" * size + struct.pack(">i", -1)
        frame = bytes([0xAF, 1, 0x01, 1]) + struct.pack(">I", len(payload)) + payload
        c._sock.sendall(frame * n)
        for _ in range(n):
            answer = c._read_frame()            # the clients' shared read loop
            assert answer.opcode == 0x01, answer    # a PRODUCE answer, not ERROR
        c.close()


def metric(app, lt, name, **labels):
    return lt.call(lambda: sample(app, name, **labels)) or 0


def rows_in(directory):
    return sum(pq.read_metadata(p).num_rows for p in glob.glob(os.path.join(directory,
                                                                            "*.parquet")))


def test_unwritable_directory_is_counted_and_relaying_goes_on(server, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.mkdir()                 # usable at start-up (an unusable one is refused) ...
    app, lt = run_proxy(server, {"dir": str(blocker / "logs")})
    app.framelog.flush_interval = 0.05
    shutil.rmtree(blocker)
    blocker.write_text("x")         # ... then lost: root ignores permissions, a file blocks
    port = app.routes[0].address[1]
    produce_many(port, 500)
    lt.run(_until(lambda: app.framelog.write_errors > 0))
    assert metric(app, lt, "frametap_frames_total", route="fly0", protocol="flymq",
                  direction="s2c", opcode="PRODUCE") == 500      # every answer relayed
    assert metric(app, lt, "frametap_framelog_write_errors_total") >= 1
    assert metric(app, lt, "frametap_framelog_dropped_total", route="fly0") > 0
    assert metric(app, lt, "frametap_framelog_files_total") == 0
    # the disk recovers: later records are written
    blocker.unlink()
    produce_many(port, 50)
    stop(app, lt)
    assert app.framelog.files >= 1 and rows_in(str(blocker / "logs")) >= 100


def test_writer_that_cannot_keep_up_drops_and_counts(server, tmp_path):
    app, lt = run_proxy(server, {"dir": str(tmp_path), "buffer_records": 2048})
    app.framelog.flush_interval = 3600      # the writer never wakes on its own ...
    app.framelog.wake = _NeverSet()         # ... nor when a chunk fills
    for src in app.framelog.sources:
        src.buffer.wake = app.framelog.wake
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    port = app.routes[0].address[1]
    produce_many(port, 20000, size=8)
    relayed = metric(app, lt, "frametap_frames_total", route="fly0", protocol="flymq",
                     direction="s2c", opcode="PRODUCE")
    assert relayed == 20000                 # relaying did not wait for the writer
    dropped = app.framelog.dropped()["fly0"]
    assert dropped > 30000                  # held about the buffer, the rest counted
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    assert grown_mib < 64, grown_mib        # bounded: the buffer, not the traffic
    stop(app, lt)
    total = app.framelog.records["fly0"] + app.framelog.dropped()["fly0"]
    assert total == 2 + 40000               # CREATE_TOPIC pair + 20000 pairs, all accounted
    assert rows_in(str(tmp_path)) == app.framelog.records["fly0"]


def test_route_framelog_false_and_sampling(server, tmp_path):
    app, lt = run_proxy(server, {"dir": str(tmp_path), "sample": 0.5}, routes=1)
    try:
        port = app.routes[0].address[1]
        for _ in range(40):
            produce_many(port, 1)
    finally:
        stop(app, lt)
    rows = [r for p in glob.glob(str(tmp_path / "*.parquet"))
            for r in pq.read_table(p).to_pylist()]
    conns = {r["conn_id"] for r in rows}
    assert 5 <= len(conns) <= 35            # about half of 40 connections (p < 1e-4 outside)
    for conn in conns:                      # a sampled connection is logged whole
        assert len([r for r in rows if r["conn_id"] == conn]) == 4

    off_dir = tmp_path / "off"
    app, lt = run_proxy(server, {"dir": str(off_dir)}, framelog=False)
    try:
        produce_many(app.routes[0].address[1], 10)
    finally:
        stop(app, lt)
    assert rows_in(str(off_dir)) == 0
    assert app.framelog.records == {}


class _NeverSet:
    def set(self):
        pass

    def wait(self, timeout=None):
        return False

    def clear(self):
        pass


async def _until(predicate, timeout=10.0):
    import asyncio
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)
