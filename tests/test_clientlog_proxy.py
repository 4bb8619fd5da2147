"""End to end: the real proxy's frame log and the Locust users' client frame log join.

For each protocol, ``frametap proxy -c`` (with a ``[framelog]`` table) sits in front of the
reference server, a headless Locust run of the protocol's users goes through it with
``--frametap-framelog`` and the same run id, and the proxy is stopped with SIGTERM (which
flushes its log). Then every client row that expects an answer must find the proxy's
response row for the same request on (peer, correlation_id), whose
``request_opcode_name`` is the client row's opcode name, and the proxy's upstream
latency can never exceed what the client measured around it.
"""

import signal
import socket
import uuid

import pytest

from loadgen.flymq.server import FlyMQServerThread
from loadgen.rabbitmq_stream.server import StreamBrokerThread
from loadgen.rocketmq.server import RocketMQServerThread
from tests._support import (PortCollision, collided, free_port, host_port, proxy_process,
                            retry_on_collision)
from tests.test_clientlog_locust import check_rows, clientlog_run, read_rows, request_count

pytestmark = pytest.mark.slow

def _ipv6_free():
    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", 0))


def toml_address(host, port):
    return f'"[{host}]:{port}"' if ":" in host else f'"{host}:{port}"'


class Proxy:
    """``frametap proxy -c FILE --ready-file`` in a subprocess. ``routes``: (name,
    protocol, upstream (host, port), options) where options is TOML text, or a function of
    this Proxy (its ``address(name)`` of every route is known by then) returning it.

    Routes listen on port 0 and the addresses come from the ready file, unless an
    option names a route's address before the start (RocketMQ's advertise): then the
    ports are picked first, and a start that lost one to another process is retried on
    fresh ones (tests/_support/ports.py)."""

    def __init__(self, tmp_path, routes, run_id, listen_host="127.0.0.1"):
        self.tmp = tmp_path
        self.log = tmp_path / "proxy-log"
        self.routes = routes
        self.run_id = run_id
        self.host = listen_host
        self.prepicked = any(callable(o) for *_, o in routes)
        self.listen = {}
        self.proc = None

    def _config(self):
        lines = ['[admin]\nlisten = "127.0.0.1:0"\n',
                 f'[framelog]\ndir = "{self.log}"\nrun_id = "{self.run_id}"\n'
                 f"rotate_seconds = 3600\n"]
        for name, protocol, upstream, options in self.routes:
            if callable(options):
                options = options(self)
            lines.append(f'[[routes]]\nname = "{name}"\nprotocol = "{protocol}"\n'
                         f"listen = {toml_address(*self.listen[name])}\n"
                         f'upstream = "{upstream[0]}:{upstream[1]}"\n{options}\n')
        return "\n".join(lines)

    def address(self, name):
        host, port = self.listen[name]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def _start(self, port):
        self.listen = {name: (self.host, port if i == 0 else free_port(self.host))
                       for i, (name, *_) in enumerate(self.routes)}
        try:
            self.proc = proxy_process(self.tmp, config=self._config(), log_level="warning")
        except AssertionError as exc:          # exited before it was ready
            if collided(str(exc)):
                raise PortCollision(str(exc)) from None
            raise
        return self

    def __enter__(self):
        if self.prepicked:
            return retry_on_collision(self._start)
        self.listen = {name: (self.host, 0) for name, *_ in self.routes}
        self.proc = proxy_process(self.tmp, config=self._config(), log_level="warning")
        self.listen = {name: host_port(self.proc.address(name)) for name, *_ in self.routes}
        return self

    def stop(self):
        """SIGTERM: the proxy drains, then writes and closes its frame log."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=60)
        assert rc == 0, self.proc.log_text()[-3000:]
        return read_rows(self.log)

    def __exit__(self, *exc):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def join_responses(client_rows, proxy_rows):
    """(pairs, expected, missing): ``pairs`` = (client row, proxy response row) joined on
    (peer, correlation_id) with the response answering the client's opcode; ``expected``
    counts the client rows that should join (they wait for an answer and carry an id)."""
    responses = {}
    for r in proxy_rows:
        if r["direction"] == "s2c" and r["kind"] == "response" and r["latency_ns"] is not None:
            responses[(r["peer"], r["correlation_id"])] = r
    pairs, missing, expected = [], [], 0
    for row in client_rows:
        if row["kind"] != "request" or row["correlation_id"] is None:
            continue
        expected += 1
        match = responses.get((row["peer"], row["correlation_id"]))
        if match is not None and match["request_opcode_name"] == row["opcode_name"]:
            pairs.append((row, match))
        else:
            missing.append((row, match))
    return pairs, expected, missing


def _check_join(client_rows, proxy_rows, protocol, run_id):
    check_rows(client_rows, protocol, run_id=run_id)
    assert proxy_rows and {r["source"] for r in proxy_rows} == {"proxy"}
    assert {r["run_id"] for r in proxy_rows} == {run_id}
    pairs, expected, missing = join_responses(client_rows, proxy_rows)
    assert expected > 100
    print(f"{protocol}: {len(pairs)} of {expected} client rows joined")
    assert len(pairs) >= 0.99 * expected, (len(pairs), expected, missing[:3])
    slower = [(c["latency_ns"], p["latency_ns"], c["opcode_name"]) for c, p in pairs
              if p["latency_ns"] > c["latency_ns"]]
    assert not slower, slower[:5]
    return pairs


def test_flymq_client_rows_join_the_proxys_responses(tmp_path):
    run_id = f"e2e-{uuid.uuid4().hex[:8]}"
    with FlyMQServerThread(service_time="1ms") as srv, \
            Proxy(tmp_path, [("fly", "flymq", ("127.0.0.1", srv.port), "")], run_id) as proxy:
        proc = clientlog_run("flymq", proxy.address("fly"), tmp_path / "client-log",
                          ["--frametap-run-id", run_id])
        proxy_rows = proxy.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    client_rows = read_rows(tmp_path / "client-log")
    assert len(client_rows) == request_count(proc.stats)
    pairs = _check_join(client_rows, proxy_rows, "flymq", run_id)
    assert {c["opcode_name"] for c, _ in pairs} >= {"PRODUCE", "FETCH", "CREATE_TOPIC"}
    # the same route name on every proxy row; the client knows none
    assert {p["route"] for _, p in pairs} == {"fly"}


def test_rabbitmq_stream_client_rows_join_the_proxys_confirms(tmp_path):
    run_id = f"e2e-{uuid.uuid4().hex[:8]}"
    with StreamBrokerThread() as srv, \
            Proxy(tmp_path, [("stream", "rabbitmq-stream", ("127.0.0.1", srv.port), "")],
                  run_id) as proxy:
        proc = clientlog_run("rabbitmq-stream", proxy.address("stream"), tmp_path / "client-log",
                          ["--frametap-run-id", run_id], env={
                              "FRAMETAP_STREAM_NAME": f"e2e-{uuid.uuid4().hex[:8]}",
                              "FRAMETAP_STREAM_BATCH": "5", "FRAMETAP_STREAM_OFFSET": "first",
                              "FRAMETAP_STREAM_METADATA_EVERY": "5"})
        proxy_rows = proxy.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    client_rows = read_rows(tmp_path / "client-log")
    pairs = _check_join(client_rows, proxy_rows, "rabbitmq-stream", run_id)
    published = [p for c, p in pairs if c["opcode_name"] == "Publish"]
    assert published and {p["opcode_name"] for p in published} == {"PublishConfirm"}
    assert len(published) == 5 * proc.stats["Publish"]["num_requests"]


def test_rocketmq_client_rows_join_the_proxys_responses_on_both_routes(tmp_path):
    run_id = f"e2e-{uuid.uuid4().hex[:8]}"
    topic = f"e2e-{uuid.uuid4().hex[:8]}"
    with RocketMQServerThread(queues=4) as srv:
        broker = ("127.0.0.1", srv.broker_port)
        # the name server's route data names the broker's route, as in the demo
        advertise = (lambda proxy: f'[routes.options]\nadvertise = {{ "{broker[0]}:'
                     f'{broker[1]}" = "{proxy.address("rmq-broker")}" }}\n')
        routes = [("rmq-namesrv", "rocketmq", ("127.0.0.1", srv.namesrv_port), advertise),
                  ("rmq-broker", "rocketmq", broker, "")]
        with Proxy(tmp_path, routes, run_id) as proxy:
            proc = clientlog_run("rocketmq", proxy.address("rmq-namesrv"),
                              tmp_path / "client-log", ["--frametap-run-id", run_id],
                              env={"FRAMETAP_ROCKETMQ_TOPIC": topic,
                                         "FRAMETAP_ROCKETMQ_CONSUMER_GROUP": f"cg-{topic}",
                                         "FRAMETAP_ROCKETMQ_START": "first",
                                         "FRAMETAP_ROCKETMQ_COMMIT_EVERY": "1"})
            proxy_rows = proxy.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    client_rows = read_rows(tmp_path / "client-log")
    assert len(client_rows) == request_count(proc.stats)
    pairs = _check_join(client_rows, proxy_rows, "rocketmq", run_id)
    routes_seen = {p["route"] for _, p in pairs}
    assert routes_seen == {"rmq-namesrv", "rmq-broker"}     # both routes crossed the proxy
    assert {c["opcode_name"] for c, _ in pairs} >= {"GET_ROUTEINFO_BY_TOPIC", "HEART_BEAT",
                                                    "SEND_MESSAGE_V2", "PULL_MESSAGE"}


def _ipv6_loopback():
    try:
        _ipv6_free()
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback")
def test_ipv6_peers_join(tmp_path):
    run_id = f"e2e-{uuid.uuid4().hex[:8]}"
    with FlyMQServerThread() as srv, \
            Proxy(tmp_path, [("fly6", "flymq", ("127.0.0.1", srv.port), "")], run_id,
                  listen_host="::1") as proxy:
        proc = clientlog_run("flymq", proxy.address("fly6"), tmp_path / "client-log",
                          ["--frametap-run-id", run_id], duration="2s", users=2)
        proxy_rows = proxy.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    client_rows = read_rows(tmp_path / "client-log")
    assert all(r["peer"].startswith("[::1]:") for r in client_rows)
    pairs, expected, _missing = join_responses(client_rows, proxy_rows)
    assert expected > 0 and len(pairs) >= 0.99 * expected, (
        client_rows[0]["peer"], proxy_rows[0]["peer"])
