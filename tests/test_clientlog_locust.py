"""The client-side frame log in real headless Locust runs (loadgen/clientlog.py).

Locust runs in subprocesses (importing it here would gevent-patch pytest) against the
reference servers. For the join tests the users talk through :class:`TracingRelay`, a
tiny relay in this process that feeds both directions of every connection into the
protocol's compiled parser with a tracer: the records it collects are what the proxy
logs for the same frames (its correlation ids, opcode names and peers), so the client
rows must join them on (peer, correlation_id).
"""

import asyncio
import glob
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import uvloop

from loadgen.flymq.server import FlyMQServerThread
from loadgen.rabbitmq_stream.server import StreamBrokerThread
from loadgen.rocketmq.server import RocketMQServerThread
from proxy import _framing, protocols
from proxy.framelog import SCHEMA
from tests._support import (ROOT, json_stats, locust_cmd, locust_env, run_locust,
                            start_locust, start_locust_master, start_locust_worker)

pytestmark = pytest.mark.slow

USERS = {"flymq": ["FlyMQProducer", "FlyMQConsumer"],
         "rabbitmq-stream": ["StreamPublisher", "StreamConsumer"],
         "rocketmq": ["RocketMQProducer", "RocketMQConsumer"]}


# ---------------------------------------------------------------------- helpers

def clientlog_run(protocol, host, framelog, args=(), env=None, users=4, duration="4s"):
    """One headless Locust run of ``protocol``'s users with the client frame log on
    (tests/_support/locust.py: ``--json`` read strictly)."""
    return run_locust(protocol, host, USERS[protocol], users, duration,
                      args=["--frametap-framelog", str(framelog), *args], env=env)


def read_rows(directory):
    """Every row of every finished frame-log file in ``directory`` (either format)."""
    tables = [pq.read_table(f) for f in sorted(glob.glob(os.path.join(directory, "*.parquet")))]
    rows = [r for t in tables for r in t.to_pylist()]
    for path in sorted(glob.glob(os.path.join(directory, "*.jsonl"))):
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    for t in tables:
        assert t.schema.names == SCHEMA.names
    return rows


def request_count(stats, without=()):
    return sum(e["num_requests"] for name, e in stats.items() if name not in without)


class TracingRelay:
    """A relay on 127.0.0.1 in front of ``upstream`` that traces every frame with the
    protocol's compiled parser, as the proxy does: ``records`` are the parser's frame-log
    records with ``peer`` added (the client's address as the relay saw it)."""

    def __init__(self, protocol, upstream=None):
        self.spec = protocols.load(protocol)
        self.parser_class = self.spec.load_parser()
        self.stats = _framing.RouteStats("relay", protocol)
        self.options = (self.spec.validate_options({}, "options")
                        if self.spec.validate_options else {})
        self.upstream = upstream
        self.records = []
        self.open = 0
        self._conn_ids = iter(range(1, 1 << 30))
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self.loop).result(10)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    async def _handle(self, reader, writer):
        host, port = writer.get_extra_info("peername")[:2]
        peer = f"{host}:{port}"
        parser = self.parser_class(self.stats, None, 30.0, self.options)
        parser.conn_id = next(self._conn_ids)
        records = self.records
        parser.tracer = lambda rec: records.append(dict(rec, peer=peer))
        self.open += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            self.open -= 1
            writer.close()
            return

        async def pump(src, dst, d):
            try:
                while True:
                    data = await src.read(65536)
                    if not data:
                        break
                    parser.feed(d, data)
                    if parser.output is not None:
                        dst.writelines(parser.output)
                    else:
                        dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pump(reader, up_writer, 0), pump(up_reader, writer, 1))
        parser.close()
        self.open -= 1

    def settle(self, timeout=10.0):
        """Wait until every relayed connection has closed (all records are in)."""
        deadline = time.monotonic() + timeout
        while self.open and time.monotonic() < deadline:
            time.sleep(0.05)

    def __exit__(self, *exc):
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def join_report(client_rows, proxy_records):
    """(joined, candidates, mismatches): client rows with a correlation id that find a
    proxy request row with the same (peer, correlation_id) and opcode name."""
    requests = {(r["peer"], r["correlation_id"]): r for r in proxy_records
                if r["direction"] == "c2s" and r["kind"] in ("request", "oneway")
                and r["correlation_id"] is not None}
    joined, candidates, mismatches = 0, 0, []
    for row in client_rows:
        if row["correlation_id"] is None:
            continue
        candidates += 1
        match = requests.get((row["peer"], row["correlation_id"]))
        if match is not None and match["opcode_name"] == row["opcode_name"] \
                and match["kind"] == row["kind"]:
            joined += 1
        elif len(mismatches) < 5:
            mismatches.append((row, match))
    return joined, candidates, mismatches


def check_rows(rows, protocol, run_id=None):
    """What every client row must look like."""
    assert rows
    peer = re.compile(r"^(\d+\.\d+\.\d+\.\d+|\[[0-9a-fA-F:.%\w]+\]):\d+$")
    for r in rows:
        assert r["source"] == "client" and r["protocol"] == protocol
        # the route is where the request went: an address (the proxy's listener, named
        # by the analysis from the proxy's run file)
        assert r["direction"] == "c2s", r
        assert peer.match(r["route"] or "") or (r["route"] or "").startswith("unix:"), r
        assert r["kind"] in ("request", "oneway")
        assert peer.match(r["peer"]), r
        assert r["conn_id"] >= 1 and r["latency_ns"] >= 0 and r["ts_ns"] > 1.6e18
        assert r["outcome"] in ("ok", "error")
        assert r["opcode_name"] and r["opcode"] is not None
        if run_id is not None:
            assert r["run_id"] == run_id
    assert len({r["run_id"] for r in rows}) >= 1


# ---------------------------------------------------------------------- join tests

def _assert_joins(rows, relay, protocol, stats, without=()):
    check_rows(rows, protocol)
    assert not [r for r in rows if r["outcome"] == "error"], [
        r for r in rows if r["outcome"] == "error"][:3]
    joined, candidates, mismatches = join_report(rows, relay.records)
    assert candidates > 100, (candidates, len(rows))
    assert joined >= 0.99 * candidates, (joined, candidates, mismatches)
    # and the row count is Locust's count of the requests that have rows
    return joined, candidates


def test_flymq_client_rows_join_the_parsers_fifo_sequence(tmp_path):
    with FlyMQServerThread() as srv, TracingRelay("flymq", ("127.0.0.1", srv.port)) as relay:
        proc = clientlog_run("flymq", relay.address, tmp_path / "log")
        relay.settle()
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_rows(tmp_path / "log")
    stats = proc.stats
    assert len(rows) == request_count(stats)
    _assert_joins(rows, relay, "flymq", stats)
    # the FIFO sequence: per connection 1, 2, 3, ... (every request is reported here)
    by_conn = {}
    for r in rows:
        by_conn.setdefault(r["conn_id"], []).append(int(r["correlation_id"]))
    for seqs in by_conn.values():
        assert sorted(seqs) == list(range(1, len(seqs) + 1))
    names = Counter(r["opcode_name"] for r in rows)
    assert names["PRODUCE"] == stats["PRODUCE"]["num_requests"] > 0
    assert names["FETCH"] == stats["FETCH"]["num_requests"] > 0
    assert {r["messages"] for r in rows if r["opcode_name"] == "PRODUCE"} == {1}
    assert {r["status"] for r in rows} == {"OK"}


def test_rabbitmq_stream_client_rows_join_per_publishing_id(tmp_path):
    stream = f"clientlog-{uuid.uuid4().hex[:8]}"
    with StreamBrokerThread() as srv, \
            TracingRelay("rabbitmq-stream", ("127.0.0.1", srv.port)) as relay:
        proc = clientlog_run("rabbitmq-stream", relay.address, tmp_path / "log", env={
            "FRAMETAP_STREAM_NAME": stream, "FRAMETAP_STREAM_BATCH": "5",
            "FRAMETAP_STREAM_OFFSET": "first", "FRAMETAP_STREAM_STORE_EVERY": "2",
            "FRAMETAP_STREAM_METADATA_EVERY": "5"})
        relay.settle()
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_rows(tmp_path / "log")
    stats = proc.stats
    publish = [r for r in rows if r["opcode_name"] == "Publish"]
    # one row per publishing id: 5 per Publish event
    assert len(publish) == 5 * stats["Publish"]["num_requests"] > 0
    assert len(rows) - len(publish) == request_count(stats, without=("Publish", "Deliver"))
    assert all(re.fullmatch(r"0:\d+", r["correlation_id"]) and r["messages"] == 1
               and r["status"] == "OK" for r in publish)
    # StoreOffset has no correlation id on the wire: a oneway row that cannot join
    store = [r for r in rows if r["correlation_id"] is None]
    assert {(r["opcode_name"], r["kind"]) for r in store} == {("StoreOffset", "oneway")}
    assert {r["opcode_name"] for r in rows} >= {"Create", "DeclarePublisher", "Publish",
                                                "Subscribe", "Metadata", "StoreOffset"}
    _assert_joins(rows, relay, "rabbitmq-stream", stats)
    # the client's time for each publishing id covers the relay's (publish to confirm)
    confirms = {(r["peer"], r["correlation_id"]): r["latency_ns"] for r in relay.records
                if r["opcode_name"] == "PublishConfirm"}
    pairs = [(confirms[(r["peer"], r["correlation_id"])], r["latency_ns"]) for r in publish
             if (r["peer"], r["correlation_id"]) in confirms]
    assert len(pairs) >= 0.99 * len(publish)
    assert all(server <= client for server, client in pairs)


def test_rocketmq_client_rows_join_on_name_server_and_broker(tmp_path):
    topic = f"clientlog-{uuid.uuid4().hex[:8]}"
    with RocketMQServerThread(queues=4) as srv, \
            TracingRelay("rocketmq", ("127.0.0.1", srv.namesrv_port)) as ns_relay, \
            TracingRelay("rocketmq", ("127.0.0.1", srv.broker_port)) as broker_relay:
        srv.server.advertised_broker = ("127.0.0.1", broker_relay.port)
        proc = clientlog_run("rocketmq", ns_relay.address, tmp_path / "log", env={
            "FRAMETAP_ROCKETMQ_TOPIC": topic, "FRAMETAP_ROCKETMQ_START": "first",
            "FRAMETAP_ROCKETMQ_CONSUMER_GROUP": f"cg-{topic}",
            "FRAMETAP_ROCKETMQ_COMMIT_EVERY": "1"})
        ns_relay.settle()
        broker_relay.settle()
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_rows(tmp_path / "log")
    stats = proc.stats
    assert len(rows) == request_count(stats)

    class Both:
        records = ns_relay.records + broker_relay.records
    _assert_joins(rows, Both, "rocketmq", stats)
    names = Counter(r["opcode_name"] for r in rows)
    for name in ("GET_ROUTEINFO_BY_TOPIC", "HEART_BEAT", "SEND_MESSAGE_V2", "PULL_MESSAGE",
                 "UPDATE_CONSUMER_OFFSET", "UNREGISTER_CLIENT"):
        assert names[name] == stats[name]["num_requests"] > 0, name
    assert {r["kind"] for r in rows if r["opcode_name"] == "UPDATE_CONSUMER_OFFSET"} == {
        "oneway"}
    # opaque, as the proxy writes it: a signed decimal
    assert all(re.fullmatch(r"-?\d+", r["correlation_id"]) for r in rows)
    assert sum(r["messages"] for r in rows if r["opcode_name"] == "PULL_MESSAGE") > 0


# ---------------------------------------------------------------------- processes

FILE_NAME = re.compile(r"^client-(?P<host>[^-]+)-(?P<pid>\d+)-\d{8}T\d{6}Z-\d{6}\.(parquet|jsonl)$")
RUN_FILE = re.compile(r"^run-client-(?P<host>[^-]+)-(?P<pid>\d+)-\d{8}T\d{6}Z\.json$")


def file_pids(directory):
    names = os.listdir(directory)
    assert not [n for n in names if n.startswith(".")], names   # no unfinished file left
    pids = Counter()
    for name in names:
        if RUN_FILE.match(name):         # what ran (proxy/runinfo.py): not a frame log
            continue
        m = FILE_NAME.match(name)
        assert m, name
        pids[int(m["pid"])] += 1
    return pids


def test_processes_each_child_writes_its_own_files_and_no_secret(tmp_path):
    password = "pw-" + uuid.uuid4().hex      # must not reach any file
    log = tmp_path / "log"
    with FlyMQServerThread(users={"loaduser": password}, require_auth=True) as srv:
        # --processes 2 on a free master port, started again on another if it was taken
        locust = start_locust(tmp_path, "flymq", f"127.0.0.1:{srv.port}", users=4,
                              duration="5s", args=["--frametap-framelog", str(log)],
                              env={"FRAMETAP_FLYMQ_USER": "loaduser",
                                   "FRAMETAP_FLYMQ_PASSWORD": password}, processes=2)
        try:
            out, err = locust.communicate(timeout=120)
        finally:
            locust.stop()
        proc = locust.proc
    assert proc.returncode == 0, err[-3000:]
    pids = file_pids(log)
    assert len(pids) == 2 and proc.pid not in pids, (pids, proc.pid)   # children only
    rows = read_rows(log)
    check_rows(rows, "flymq")
    stats = {e["name"]: e for e in json_stats(out)}
    assert len(rows) == request_count(stats)
    # one run id for the run when none is given (the master's, handed to its children),
    # which the master's run file names too; one conn_id numbering per process
    by_run = Counter(r["run_id"] for r in rows)
    run_files = [n for n in os.listdir(log) if RUN_FILE.match(n)]
    assert len(by_run) == 1 and len(run_files) == 1, (by_run, run_files)
    assert int(RUN_FILE.match(run_files[0])["pid"]) == proc.pid      # the parent: the master
    with open(log / run_files[0]) as f:
        run = json.load(f)
    assert run["run_id"] == next(iter(by_run)) and run["ended"]
    assert run["locust"]["processes"] == 2 and run["locust"]["users"] == 4
    assert sum(e["requests"] for e in run["locust"]["stats"]) == request_count(stats)
    assert {r["opcode_name"] for r in rows} >= {"AUTH", "PRODUCE", "FETCH"}
    assert all(r["status"] == "OK" for r in rows if r["opcode_name"] == "AUTH")
    for r in rows:
        assert password not in json.dumps(r)
    for path in glob.glob(str(log / "*")):
        with open(path, "rb") as f:
            assert password.encode() not in f.read()


def test_jsonl_format_and_run_id_from_the_environment(tmp_path):
    password = "pw-" + uuid.uuid4().hex
    log = tmp_path / "log"
    with FlyMQServerThread(users={"u": password}, require_auth=True) as srv:
        proc = clientlog_run("flymq", f"127.0.0.1:{srv.port}", log,
                             ["--frametap-framelog-format", "jsonl"], duration="3s",
                             env={"FRAMETAP_RUN_ID": "demo-run-7",
                                  "FRAMETAP_FLYMQ_USER": "u",
                                  "FRAMETAP_FLYMQ_PASSWORD": password})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert set(file_pids(log)) and all(n.endswith(".jsonl") for n in os.listdir(log)
                                       if not RUN_FILE.match(n))
    rows = read_rows(log)
    check_rows(rows, "flymq", run_id="demo-run-7")
    assert len(rows) == request_count(proc.stats)
    for path in glob.glob(str(log / "*")):
        with open(path, "rb") as f:
            data = f.read()
        assert password.encode() not in data
        assert b'"opcode_name":"AUTH"' in data or RUN_FILE.match(os.path.basename(path))
    # the same table through pyarrow's JSON reader, with the schema's types
    from pyarrow import json as pajson
    table = pajson.read_json(glob.glob(str(log / "*.jsonl"))[0], parse_options=pajson.ParseOptions(
        explicit_schema=pa.schema([f for f in SCHEMA if f.name != "attrs"])))
    assert table.num_rows > 0


def test_distributed_workers_write_master_writes_nothing(tmp_path):
    """A master and two workers: worker 1 has its own --frametap-framelog and run id
    (they win), worker 2 has none and takes the master's (sent with the spawn message).
    The master binds port 0 and tells its workers the port through its ready file."""
    master_dir, own_dir = tmp_path / "master-dir", tmp_path / "worker1-dir"
    with FlyMQServerThread() as srv:
        master = start_locust_master(
            tmp_path, "flymq", f"127.0.0.1:{srv.port}", expect_workers=2, users=4,
            duration="4s", args=["--frametap-framelog", str(master_dir),
                                 "--frametap-run-id", "master-run"])
        w1 = start_locust_worker(master, "flymq", env={"FRAMETAP_RUN_ID": "worker1-run"},
                                 log=tmp_path / "w1.log",
                                 args=["--frametap-framelog", str(own_dir)])
        w2 = start_locust_worker(master, "flymq", log=tmp_path / "w2.log")
        try:
            out, err = master.communicate(timeout=120)
            for w in (w1, w2):
                w.wait(timeout=30)
        finally:
            for w in (w1, w2):
                if w.poll() is None:
                    w.kill()
                    w.wait()
            master.stop()
    assert master.proc.returncode == 0, err[-3000:]
    assert w1.returncode == 0 and w2.returncode == 0, (
        (tmp_path / "w1.log").read_text()[-2000:] + (tmp_path / "w2.log").read_text()[-2000:])
    assert set(file_pids(own_dir)) == {w1.pid}
    assert set(file_pids(master_dir)) == {w2.pid}      # the master itself wrote nothing
    own, given = read_rows(own_dir), read_rows(master_dir)
    check_rows(own, "flymq", run_id="worker1-run")
    check_rows(given, "flymq", run_id="master-run")
    stats = {e["name"]: e for e in json_stats(out)}
    assert len(own) + len(given) == request_count(stats)


# ---------------------------------------------------------------------- command line

def test_help_lists_the_options():
    # Locust prints --help before importing the locustfile (locustio/locust#2917), so
    # the plugin's options show when Locust is started through the plugin module.
    proc = subprocess.run([sys.executable, "-m", "loadgen.clientlog", "--help"], cwd=ROOT,
                          env=locust_env("flymq"), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for option in ("--frametap-framelog DIR", "--frametap-run-id ID",
                   "--frametap-framelog-format {parquet,jsonl}", "FRAMETAP_RUN_ID"):
        assert option in proc.stdout


@pytest.mark.parametrize("args, expected", [
    (["--frametap-framelog-format", "csv"], "invalid choice: 'csv'"),
    (["--frametap-framelog", "{file}/sub"], "--frametap-framelog"),
])
def test_bad_options_exit_2_with_one_line(tmp_path, args, expected):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    args = [a.replace("{file}", str(blocker)) for a in args]
    proc = subprocess.run(
        locust_cmd("127.0.0.1:1", ["FlyMQProducer"], users=1, duration="1s", args=args),
        cwd=ROOT, env=locust_env("flymq"), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert expected in proc.stderr and "Traceback" not in proc.stderr
