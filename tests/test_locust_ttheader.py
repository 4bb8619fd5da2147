"""Headless Locust runs of the Thrift RPC users (packaged locustfile) through
``frametap proxy`` to the reference Thrift service, in every transport: requests are
reported per method under ``request_type="ttheader"``, failures are exactly the
declared ``NotFound`` and the unknown method, and every client frame-log row (seq id as
``correlation_id``) joins the proxy's response row for the same call."""

import uuid

import pytest

from loadgen.ttheader.server import ThriftServerThread
from tests._support.framelogs import flushes
from tests._support.locust import run_locust
from tests._support.processes import proxy_process
from tests.test_clientlog_locust import check_rows, read_rows, request_count
from tests.test_clientlog_proxy import join_responses

pytestmark = pytest.mark.slow
METHODS = {"getUser", "echo", "placeOrder", "listUsers", "ping", "log", "retired"}


@pytest.mark.parametrize("transport, protocol", [("ttheader", "binary"),
                                                 ("theader", "compact"),
                                                 ("framed", "binary")])
def test_locust_users_through_proxy(tmp_path, transport, protocol):
    run_id = f"tt-{uuid.uuid4().hex[:8]}"
    with ThriftServerThread(service_time="200us") as srv, proxy_process(tmp_path, config=f"""
[framelog]
dir = "{tmp_path / 'proxy-log'}"
run_id = "{run_id}"
rotate_seconds = 3600

[[routes]]
name = "thrift"
protocol = "ttheader"
listen = "127.0.0.1:0"
upstream = "127.0.0.1:{srv.port}"
""", log_level="warning") as proxy:
        run = run_locust("ttheader", f"ttheader://{proxy.address('thrift')}", ["ThriftUser"],
                         users=4, duration="4s",
                         args=["--frametap-framelog", str(tmp_path / "client-log"),
                               "--frametap-run-id", run_id],
                         env={"FRAMETAP_TTHEADER_TRANSPORT": transport,
                              "FRAMETAP_TTHEADER_PROTOCOL": protocol,
                              "FRAMETAP_TTHEADER_ZLIB": "1" if transport == "theader" else "0"})
        # SIGTERM: the proxy drains, then writes and closes its frame log
        assert proxy.stop(60) == 0, proxy.log_text()[-3000:]
    proxy_rows = read_rows(tmp_path / "proxy-log")
    proc = run
    stats = run.stats
    assert set(stats) >= {"getUser", "echo", "placeOrder"}, stats.keys()
    assert set(stats) <= METHODS
    # failures: the unknown method always, NotFound for the ~1% unknown user ids
    assert stats.get("retired", {}).get("num_failures", 0) == \
        stats.get("retired", {}).get("num_requests", 0)
    for name in ("echo", "listUsers", "ping", "log"):
        if name in stats:
            assert stats[name]["num_failures"] == 0, (name, proc.stderr[-2000:])
    client_rows = read_rows(tmp_path / "client-log")
    assert len(client_rows) == request_count(stats)
    # both writers flushed while the 4 s run went on (1 s interval), not only at close:
    # a writer that died at its first wake-up leaves the same rows in one final flush
    for directory, source in ((tmp_path / "client-log", "client"),
                              (tmp_path / "proxy-log", "proxy")):
        files, groups = flushes(directory, source)
        assert files >= 1 and groups > files, (source, files, groups)
    check_rows(client_rows, "ttheader", run_id=run_id)
    assert {r["kind"] for r in client_rows if r["opcode_name"] == "log"} <= {"oneway"}
    pairs, expected, missing = join_responses(client_rows, proxy_rows)
    assert expected > 100 and len(pairs) >= 0.99 * expected, (len(pairs), expected,
                                                              missing[:3])
    for c, p in pairs:
        assert c["status"] == p["status"], (c, p)
        assert p["latency_ns"] <= c["latency_ns"]
    # the proxy saw every call under its method, and nothing it could not read
    proxy_reqs = [r for r in proxy_rows if r["direction"] == "c2s" and
                  r["kind"] in ("request", "oneway")]
    assert {r["opcode_name"] for r in proxy_reqs} <= METHODS
    # (a call cut short when Locust stops its users is sent but never reported)
    assert len(client_rows) <= len(proxy_reqs) <= len(client_rows) + 4
