"""The client-side frame log's parts without Locust (loadgen/clientlog.py, loadgen/clientbase.py,
loadgen/userbase.py).

Locust is never imported here (it would gevent-patch the pytest process): request events
are fed to ``ClientLog.on_request`` directly, users are RequestReporter subclasses with a
recording event, and the sync clients talk to the reference servers. Real Locust runs are
in tests/test_clientlog_locust.py.
"""

import glob
import json
import os
import subprocess
import sys
import textwrap

import pyarrow.parquet as pq
import pytest

from loadgen.clientlog import ClientLog, GeventFrameLog
from loadgen.clientbase import SocketClient
from loadgen.userbase import RequestReporter
from loadgen.flymq.client import FlyMQClient, FlyMQServerError
from loadgen.flymq.server import FlyMQServerThread
from loadgen.rabbitmq_stream.client import StreamClient
from loadgen.rabbitmq_stream.server import StreamBrokerThread
from loadgen.rocketmq.client import RocketMQClient
from loadgen.rocketmq.server import RocketMQServerThread
from proxy.framelog import SCHEMA
from tests._support.processes import ROOT


def read(directory):
    rows = []
    for path in sorted(glob.glob(os.path.join(directory, "*.parquet"))):
        table = pq.read_table(path)
        assert table.schema.names == SCHEMA.names
        rows += table.to_pylist()
    return rows


# ---------------------------------------------------------------------- rows

def _event(**kw):
    event = {"request_type": "flymq", "name": "PRODUCE", "response_time": 1.5,
             "response_length": 10, "exception": None, "start_time": 1_800_000_000.25,
             "context": {"frametap": {"conn_id": 3, "peer": "127.0.0.1:5000",
                                      "correlation_id": "7", "opcode": 1,
                                      "opcode_name": "PRODUCE", "kind": "request",
                                      "status": "OK", "messages": 1, "resource": "t"}}}
    event.update(kw)
    return event


def test_one_row_per_request_event_with_the_schema_and_defaults(tmp_path):
    log = ClientLog(str(tmp_path), run_id="r1").start()
    log.on_request(**_event())
    log.on_request(**_event(context={}))                       # no frame-log context
    log.on_request(**_event(context={"frametap": None}))
    log.on_request(**_event(context=None))
    log.close()
    (row,) = read(tmp_path)
    # the event's start_time (float seconds) when the context has no ts_ns
    assert abs(row.pop("ts_ns") - 1_800_000_000_250_000_000) < 1000
    assert row == {
        "source": "client", "run_id": "r1",
        "route": None, "protocol": "flymq", "conn_id": 3, "peer": "127.0.0.1:5000",
        "direction": "c2s", "opcode": 1, "opcode_name": "PRODUCE", "kind": "request",
        "correlation_id": "7", "status": "OK", "outcome": "ok", "frame_bytes": None,
        "header_bytes": None, "payload_bytes": None, "messages": 1,
        "latency_ns": 1_500_000, "request_opcode_name": None, "resource": "t",
        "attrs": None}
    assert os.listdir(tmp_path)[0].startswith("client-")
    assert f"-{os.getpid()}-" in os.listdir(tmp_path)[0]


def test_failures_timeouts_names_and_oneway(tmp_path):
    log = ClientLog(str(tmp_path), run_id="r").start()
    base = _event()["context"]["frametap"]
    # an answer that is an error: the answer's status
    log.on_request(**_event(exception=FlyMQServerError("no"), context={
        "frametap": dict(base, correlation_id="1", status="ERROR")}))
    # no answer: timeout, or the connection's failure
    log.on_request(**_event(exception=TimeoutError("slow"), context={
        "frametap": dict(base, correlation_id="2", status=None)}))
    log.on_request(**_event(exception=ConnectionResetError("gone"), context={
        "frametap": dict(base, correlation_id="3", status=None)}))
    # Locust's name differs from the proxy's opcode name: the proxy's, Locust's in attrs
    log.on_request(**_event(name="SEND", context={
        "frametap": dict(base, correlation_id="4", opcode_name="SEND_MESSAGE_V2")}))
    # a oneway request without correlation id, and no start_time: now - response_time
    log.on_request(**_event(name="StoreOffset", start_time=None, context={
        "frametap": {"conn_id": 1, "peer": "[::1]:9", "correlation_id": None,
                     "opcode_name": "StoreOffset", "kind": "oneway", "status": None}}))
    log.close()
    rows = {r["correlation_id"]: r for r in read(tmp_path)}
    assert (rows["1"]["status"], rows["1"]["outcome"]) == ("ERROR", "error")
    assert (rows["2"]["status"], rows["2"]["outcome"]) == ("timeout", "error")
    assert (rows["3"]["status"], rows["3"]["outcome"]) == ("ConnectionResetError", "error")
    assert rows["4"]["opcode_name"] == "SEND_MESSAGE_V2"
    assert rows["4"]["attrs"] == [("locust_name", "SEND")]
    oneway = rows[None]
    assert (oneway["kind"], oneway["status"], oneway["outcome"], oneway["messages"]) == (
        "oneway", None, "ok", 0)
    assert oneway["peer"] == "[::1]:9" and abs(oneway["ts_ns"] / 1e9 - rows["1"]["ts_ns"] / 1e9) > 1


def test_items_become_one_row_each(tmp_path):
    log = ClientLog(str(tmp_path), run_id="r").start()
    log.on_request(**_event(
        request_type="rabbitmq-stream", name="Publish", response_time=9.0,
        exception=TimeoutError("1 not confirmed"),
        context={"frametap": {"conn_id": 2, "peer": "127.0.0.1:6000", "opcode": 2,
                              "ts_ns": 123, "resource": "s",
                              "items": [("0:1", 2.0, "OK", "ok"),
                                        ("0:2", 3.0, "PUBLISHER_DOES_NOT_EXIST", "error"),
                                        ("0:3", 9.0, None, "error")]}}))
    log.close()
    rows = read(tmp_path)
    assert [(r["correlation_id"], r["status"], r["outcome"], r["latency_ns"], r["messages"])
            for r in rows] == [("0:1", "OK", "ok", 2_000_000, 1),
                               ("0:2", "PUBLISHER_DOES_NOT_EXIST", "error", 3_000_000, 1),
                               ("0:3", "timeout", "error", 9_000_000, 1)]
    assert {(r["ts_ns"], r["opcode_name"], r["opcode"], r["resource"]) for r in rows} == {
        (123, "Publish", 2, "s")}


def test_a_full_buffer_drops_and_counts_and_writes_the_rest(tmp_path):
    log = ClientLog(str(tmp_path), run_id="r", limit=10, flush_interval=3600).start()
    for i in range(25):
        log.on_request(**_event())
    assert log.framelog.dropped() == {None: 15}
    log.close()
    assert len(read(tmp_path)) == 10


def test_without_gevent_the_writer_is_a_plain_framelog(tmp_path):
    fl = GeventFrameLog(str(tmp_path), source="client")
    assert fl._pool is None


def test_under_gevent_flushes_run_on_a_native_thread(tmp_path):
    """Under Locust's monkey-patching the writer loop is a greenlet; its flushes must run
    on another OS thread, and the event loop keeps serving while one is in progress."""
    script = textwrap.dedent(f"""
        from gevent import monkey; monkey.patch_all()
        import threading, time, gevent
        from proxy import framelog
        from loadgen.clientlog import ClientLog
        main = threading.get_native_id()
        seen = []
        drain = framelog.RowBuffer.drain
        def slow_drain(self):
            seen.append(threading.get_native_id())
            monkey.get_original("time", "sleep")(0.3)     # a long write
            return drain(self)
        framelog.RowBuffer.drain = slow_drain
        log = ClientLog({str(tmp_path)!r}, run_id="g", flush_interval=0.05).start()
        assert log.framelog._pool is not None
        log.on_request(request_type="p", name="X", response_time=1.0,
                       context={{"frametap": {{"conn_id": 1, "peer": "127.0.0.1:1",
                                             "correlation_id": "1"}}}})
        ticks = []
        t0 = time.perf_counter()
        for _ in range(20):
            gevent.sleep(0.02)
            ticks.append(time.perf_counter() - t0)
        gaps = [b - a for a, b in zip([0] + ticks, ticks)]
        log.close()
        print(max(gaps), len(seen), main not in seen)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    max_gap, flushes, off_main = proc.stdout.split()
    assert flushes != "0" and off_main == "True"
    assert float(max_gap) < 0.2        # a 0.3 s flush never stalled the loop
    assert len(read(tmp_path)) == 1


# ---------------------------------------------------------------------- users

class _Request:
    def __init__(self):
        self.fired = []

    def fire(self, **kwargs):
        self.fired.append(kwargs)


class _Env:
    def __init__(self):
        self.events = type("Events", (), {})()
        self.events.request = _Request()


class User(RequestReporter):
    request_type = "toy"

    def __init__(self, frame_log=True):
        self.environment = _Env()
        self.frame_log = frame_log

    @property
    def fired(self):
        return self.environment.events.request.fired


class FakeClient(SocketClient):
    """A client without a socket: requests are numbered, answered with ``status``."""

    def __init__(self, address="127.0.0.1:4000"):
        self._sock = None
        self.local_address = address
        self.conn_id = 42
        from collections import deque
        self.recent = deque(maxlen=16)

    def call(self, name="OP", status="OK", fail=None):
        sent = self._sent(str(100 + self.requests_sent), 9, name)
        if fail is not None:
            raise fail
        sent.status = status


def test_on_wire_logs_the_first_request_after_it_whatever_the_outcome():
    user, client = User(), FakeClient()
    client.call()                                     # before: not this request's
    with user.timed("A") as req:
        user.on_wire(req, client, resource="t")
        client.call("A", "OK")
        client.call("FOLLOW_UP")                      # a second request in the block
        user.frame_fields(req, messages=3)
    with user.timed("B") as req:
        user.on_wire(req, client)
        client.call("B", fail=TimeoutError("late"))
    a, b = user.fired
    assert a["context"]["frametap"] == {
        "ts_ns": a["context"]["frametap"]["ts_ns"], "conn_id": 42, "peer": "127.0.0.1:4000",
        "target": None, "correlation_id": "101", "opcode": 9, "opcode_name": "A",
        "kind": "request", "status": "OK", "resource": "t", "messages": 3}
    assert abs(a["context"]["frametap"]["ts_ns"] / 1e9 - a["start_time"]) < 1e-6
    assert b["context"]["frametap"]["correlation_id"] == "103"
    assert b["context"]["frametap"]["status"] is None and b["exception"] is not None


def test_nothing_sent_no_frame_context_and_off_means_off():
    user, client = User(), FakeClient()
    with user.timed("A") as req:
        user.on_wire(req, client)
        raise ConnectionRefusedError("no")            # failed before sending
    assert "frametap" not in user.fired[0]["context"]
    off = User(frame_log=False)
    with off.timed("A") as req:
        off.on_wire(req, client)
        client.call()
    assert off.fired[0]["context"] == {}


def test_sent_after_finds_the_first_even_after_many():
    client = FakeClient()
    for _ in range(3):
        client.call()
    mark = client.requests_sent
    for _ in range(5):
        client.call()
    assert client.sent_after(mark).seq == mark + 1
    assert client.sent_after(client.requests_sent) is None
    for _ in range(40):                               # fell out of the recent ones
        client.call()
    assert client.sent_after(mark) is None


# ---------------------------------------------------------------------- clients

def test_flymq_client_numbers_every_request_on_its_connection():
    with FlyMQServerThread() as srv:
        with FlyMQClient("127.0.0.1", srv.port) as a, FlyMQClient("127.0.0.1", srv.port) as b:
            assert a.conn_id != b.conn_id and a.local_address != b.local_address
            host, port = a.local_address.rsplit(":", 1)
            assert (host, int(port)) == a._sock.getsockname()[:2]
            a.create_topic("t")
            a.produce("t", b"v")
            with pytest.raises(FlyMQServerError):
                a.consume("t", 0, 99)
            b.list_topics()
            assert [(s.seq, s.correlation_id, s.opcode_name, s.status) for s in a.recent] == [
                (1, "1", "CREATE_TOPIC", "OK"), (2, "2", "PRODUCE", "OK"),
                (3, "3", "CONSUME", "ERROR")]
            assert [s.correlation_id for s in b.recent] == ["1"]
        assert a.local_address and a.conn_id          # still readable after close


def test_rabbitmq_stream_client_records_correlation_ids_and_codes():
    with StreamBrokerThread() as srv:
        with StreamClient("127.0.0.1", srv.port) as c:
            handshake = [(s.correlation_id, s.opcode_name) for s in c.recent]
            assert handshake == [("1", "PeerProperties"), ("2", "SaslHandshake"),
                                 ("3", "SaslAuthenticate"), ("4", "Open")]
            c.create("s")
            c.create("s", exist_ok=True)
            c.metadata("s")
            c.store_offset("ref", "s", 0)
            assert [(s.correlation_id, s.opcode_name, s.kind, s.status)
                    for s in list(c.recent)[4:]] == [
                ("5", "Create", "request", "OK"),
                ("6", "Create", "request", "STREAM_ALREADY_EXISTS"),
                ("7", "Metadata", "request", "OK"),
                (None, "StoreOffset", "oneway", None)]


def test_rocketmq_client_records_opaque_and_response_names():
    with RocketMQServerThread() as srv:
        with RocketMQClient("127.0.0.1", srv.broker_port) as c:
            c.query_offset("g", "t", 0)
            c.update_offset("g", "t", 0, 5, oneway=True)
            c.get_max_offset("t", 0)
            assert [(s.correlation_id, s.opcode_name, s.kind, s.status) for s in c.recent] == [
                ("1", "QUERY_CONSUMER_OFFSET", "request", "QUERY_NOT_FOUND"),
                ("2", "UPDATE_CONSUMER_OFFSET", "oneway", None),
                ("3", "GET_MAX_OFFSET", "request", "SUCCESS")]
            assert json.dumps(c.local_address).count(":") == 1
