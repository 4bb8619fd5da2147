"""fleximq clients through the proxy to the reference broker: two real client
connections (on two routes, one of them a Unix socket on each side) exchange REQ/REP
with the latency recorded exactly once per request on each leg, a PING/PONG round trip,
header-rule violations counted without breaking the stream, and the frame-log rows of
the run equal the counters."""

import glob
import os

import pyarrow.parquet as pq
import pytest

from loadgen.fleximq.client import FlexiMQClient
from loadgen.fleximq.server import FlexiMQBrokerThread
from proxy.app import ProxyApp
from proxy.config import config_from_dict
from proxy.protocols.fleximq import codec
from tests.conftest import LoopThread
from tests.support import sample

N = 25


@pytest.fixture
def stack(tmp_path):
    broker = FlexiMQBrokerThread(listen=["127.0.0.1:0", "unix:%s" % (tmp_path / "b" /
                                                                      "broker.sock")],
                                 ping_interval=0).start()
    lt = LoopThread()
    logdir = tmp_path / "logs"
    app = ProxyApp(config_from_dict({
        "routes": [
            # the requester: unix client side, TCP to the broker
            {"name": "fx-a", "protocol": "fleximq",
             "listen": "unix:%s" % (tmp_path / "p" / "a.sock"), "upstream": broker.addresses[0]},
            # the responder: TCP client side, unix to the broker
            {"name": "fx-b", "protocol": "fleximq", "listen": "127.0.0.1:0",
             "upstream": broker.addresses[1]}],
        "framelog": {"dir": str(logdir), "rotate_seconds": 60}}))
    lt.run(app.start())
    a_addr = "unix:%s" % app.routes[0].address
    b_addr = "127.0.0.1:%d" % app.routes[1].address[1]
    yield app, lt, broker, a_addr, b_addr, logdir
    lt.stop()
    broker.stop()


def value(app, lt, name, **labels):
    return lt.call(lambda: sample(app, name, **labels)) or 0


def test_req_rep_ping_and_violations_through_the_proxy(stack):
    app, lt, broker, a_addr, b_addr, logdir = stack
    req = FlexiMQClient(a_addr)
    rsp = FlexiMQClient(b_addr)
    a_id, b_id = req.join(), rsp.join()
    rids = [req.send_request(b_id, "/api/users", {"i": i}) for i in range(N)]  # pipelined
    for _ in range(N):
        r = rsp.next_request()
        rsp.reply(r, {"ok": True}, status=404 if r.body()["i"] == 0 else None)
    for rid in rids:
        req.wait_reply(rid, check=False)
    rtt = req.ping()
    assert rtt > 0
    req.send(codec.encode(codec.SUB, a_id, {"topic": "t", "status": 1}))   # §2.2.3
    assert req.recv().status == 400                       # the broker's answer
    rid = req.send_request(b_id, "/after")                # the stream goes on
    rsp.reply(rsp.next_request())
    assert req.wait_reply(rid).status is None
    req.close()
    rsp.close()
    lt.run(app.shutdown(5))

    A = {"route": "fx-a", "protocol": "fleximq"}
    B = {"route": "fx-b", "protocol": "fleximq"}
    for R, d_req, d_rep in ((A, "c2s", "s2c"), (B, "s2c", "c2s")):
        assert value(app, lt, "frametap_frames_total", direction=d_req, opcode="REQ", **R) == N + 1
        assert value(app, lt, "frametap_frames_total", direction=d_rep, opcode="REP", **R) >= N + 1
        # latency exactly once per request on each leg
        ok = value(app, lt, "frametap_request_duration_seconds_count", opcode="REQ",
                   outcome="ok", **R)
        err = value(app, lt, "frametap_request_duration_seconds_count", opcode="REQ",
                    outcome="error", **R)
        assert (ok, err) == (N, 1)
        assert value(app, lt, "frametap_responses_total", opcode="REQ", status="404", **R) == 1
        assert value(app, lt, "frametap_responses_total", opcode="REQ", status="200", **R) == N
        assert value(app, lt, "frametap_responses_total", opcode="JOIN", status="200", **R) == 1
        assert value(app, lt, "frametap_request_timeouts_total", opcode="REQ", **R) == 0
    assert value(app, lt, "frametap_request_duration_seconds_count", opcode="PING",
                 outcome="ok", **A) == 1
    # the SUB with a status: counted on the requester's route, c2s; the broker's 400
    # (a REP without reqrep: SUB had none) is unmatched and breaks REP's rule too
    assert value(app, lt, "frametap_protocol_errors_total", direction="c2s",
                 reason="header_rule", **A) == 1
    assert value(app, lt, "frametap_protocol_errors_total", direction="c2s",
                 reason="bad_header", **A) == 0
    assert value(app, lt, "frametap_unmatched_responses_total", **A) == 1
    assert value(app, lt, "frametap_protocol_errors_total", direction="c2s",
                 reason="header_rule", **B) == 0

    # the frame log: one row per frame, equal to the counters
    rows = [r for p in glob.glob(os.path.join(logdir, "*.parquet"))
            for r in pq.read_table(p).to_pylist()]
    for R in (A, B):
        mine = [r for r in rows if r["route"] == R["route"] and r["kind"] != "event"]
        for d in ("c2s", "s2c"):
            for op in ("JOIN", "REQ", "REP", "PING", "PONG", "SUB"):
                n = value(app, lt, "frametap_frames_total", direction=d, opcode=op, **R)
                got = sum(1 for r in mine if r["direction"] == d and r["opcode_name"] == op)
                assert got == n, (R["route"], d, op)
        answered = [r for r in mine if r["kind"] == "response" and r["latency_ns"] is not None
                    and r["request_opcode_name"] == "REQ"]
        assert len(answered) == N + 1
        # the reqrep.id itself (matching uses its hash; the row shows the text)
        assert {r["correlation_id"] for r in answered} == set(rids + [rid])
        assert {codec.log_correlation_id(x) for x in rids} == set(rids)
        reqs = [r for r in mine if r["opcode_name"] == "REQ"]
        assert all(r["resource"] in ("/api/users", "/after") for r in reqs)
    a_reqs = [r for r in rows if r["route"] == "fx-a" and r["opcode_name"] == "REQ"]
    assert all(r["peer"] == a_addr for r in a_reqs)
    assert all(dict(r["attrs"])["client_id"] == str(a_id) and
               dict(r["attrs"])["targets"] == str(b_id) for r in a_reqs)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_auth_secrets_never_reach_the_frame_log(tmp_path, fmt):
    token, password, api_key = "tok-S3cret-a1", "pw-S3cret-b2", "key-S3cret-c3"
    with FlexiMQBrokerThread(ping_interval=0, tokens=[token], users={"alice": password},
                             api_keys=[api_key]) as broker:
        lt = LoopThread()
        logdir = tmp_path / "logs"
        app = ProxyApp(config_from_dict({
            "routes": [{"name": "fx", "protocol": "fleximq", "listen": "127.0.0.1:0",
                        "upstream": broker.address}],
            "framelog": {"dir": str(logdir), "format": fmt}}))
        lt.run(app.start())
        addr = "127.0.0.1:%d" % app.routes[0].address[1]
        try:
            for auth in ({"type": "token", "token": token},
                         {"type": "basic", "username": "alice", "password": password},
                         {"type": "api_key", "api_key": api_key}):
                c = FlexiMQClient(addr)
                c.join(auth=auth)
                c.publish("secret-free-topic", {"x": 1})
                c.ping()
                c.close()
            bad = FlexiMQClient(addr)
            with pytest.raises(Exception):
                bad.join(auth={"type": "token", "token": token + "-wrong"})
            bad.close()
        finally:
            lt.run(app.shutdown(5))
            lt.stop()
    everything = glob.glob(os.path.join(logdir, "*"))
    files = [f for f in everything if f.endswith("." + fmt)]   # the run files are JSON
    assert files
    # the run files (what ran, the proxy's routes) must not hold a secret either
    others = b"".join(open(f, "rb").read() for f in everything if f not in files)
    if fmt == "jsonl":
        blob = b"".join(open(f, "rb").read() for f in files)
        assert b"secret-free-topic" in blob                 # the log has content
        text = blob.decode()
    else:
        rows = [r for f in files for r in pq.read_table(f).to_pylist()]
        assert any(r["resource"] == "secret-free-topic" for r in rows)
        text = repr(rows)
    for secret in (token, password, api_key, "alice"):
        assert secret not in text
        assert secret.encode() not in others
