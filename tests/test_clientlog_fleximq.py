"""End to end for fleximq: ``frametap proxy -c`` with a frame log in front of the
reference broker, the fleximq Locust users through it with the client-side frame log and
the same run id; every client row that waits for an answer (JOIN, REQ, PING) joins the
proxy's response row on (peer, correlation_id), and the proxy's latency never exceeds the
client's (docs/design.md, "Frame log")."""

import uuid

import pytest

from loadgen.fleximq.server import FlexiMQBrokerThread
from tests._support import run_locust
from tests.test_clientlog_locust import check_rows, read_rows, request_count
from tests.test_clientlog_proxy import Proxy, join_responses

pytestmark = pytest.mark.slow


def test_fleximq_client_rows_join_the_proxys_responses(tmp_path):
    run_id = f"e2e-{uuid.uuid4().hex[:8]}"
    with FlexiMQBrokerThread() as b, \
            Proxy(tmp_path, [("fx", "fleximq", ("127.0.0.1", b.port), "")], run_id) as proxy:
        proc = run_locust("fleximq", proxy.address("fx"),
                          ["FlexiMQRequester", "FlexiMQResponder", "FlexiMQPubSub"], users=6,
                          args=["--frametap-framelog", str(tmp_path / "client-log"),
                                "--frametap-run-id", run_id])
        proxy_rows = proxy.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    client_rows = read_rows(tmp_path / "client-log")
    assert len(client_rows) == request_count(proc.stats)
    check_rows(client_rows, "fleximq", run_id=run_id)
    pairs, expected, missing = join_responses(client_rows, proxy_rows)
    assert expected > 100
    assert len(pairs) >= 0.99 * expected, (len(pairs), expected, missing[:3])
    assert {c["opcode_name"] for c, _ in pairs} == {"JOIN", "REQ", "PING"}
    assert not [(c, p) for c, p in pairs if p["latency_ns"] > c["latency_ns"]]
    pubs = [r for r in client_rows if r["opcode_name"] == "PUB"]
    assert pubs and all(r["kind"] == "oneway" and r["resource"] == "frametap.events"
                        for r in pubs)
    # the proxy saw each client REQ on its requester's connection with the same id
    reqs = {(r["peer"], r["correlation_id"]) for r in proxy_rows
            if r["opcode_name"] == "REQ" and r["direction"] == "c2s"}
    assert all((c["peer"], c["correlation_id"]) in reqs for c, _ in pairs
               if c["opcode_name"] == "REQ")
