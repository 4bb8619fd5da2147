"""fleximq over WebSocket through the proxy, with real peers on real sockets: the
reference broker listening on ws://, frametap's own client (the ``websockets`` library's
protocol), a client from another library (websocket-client) that packs and splits
frames, a Locust run, all counted exactly by the proxy; and the config's one-line
errors for routes that mix WebSocket and TCP."""

import glob
import os
import re
import subprocess
import sys

import pyarrow.parquet as pq

import pytest
import websocket as wsclient          # websocket-client (not proxy.websocket)

from loadgen.fleximq.client import FlexiMQClient
from loadgen.fleximq.server import FlexiMQBrokerThread
from proxy.app import ProxyApp
from proxy.config import config_from_dict
from proxy.protocols.fleximq import codec
from tests._support import ROOT, read_to_eof, run_locust
from tests.conftest import LoopThread
from tests.support import sample
from tests.tls_certs import certs  # noqa: F401  (fixture)

N = 40


@pytest.fixture
def stack(tmp_path):
    broker = FlexiMQBrokerThread(listen=["ws://127.0.0.1:0/mq"], ping_interval=0).start()
    lt = LoopThread()
    app = ProxyApp(config_from_dict({"routes": [
        {"name": "fxws", "protocol": "fleximq", "listen": "ws://127.0.0.1:0/fx",
         "upstream": broker.addresses[0]}],
        "framelog": {"dir": str(tmp_path / "logs"), "rotate_seconds": 60}}))
    app.logdir = tmp_path / "logs"
    lt.run(app.start())
    url = "ws://127.0.0.1:%d/fx" % app.routes[0].address[1]
    done = []

    def shutdown(timeout=5):           # once: the test's, or the teardown's
        if not done:
            done.append(1)
            lt.run(app.shutdown(timeout))
    app.shutdown_once = shutdown
    yield app, lt, broker, url
    shutdown()
    lt.stop()
    broker.stop()


def counts(app, lt):
    """{(direction, opcode): frames} and {(direction, reason): errors} of the route."""
    def read():
        s = app.routes[0].stats.snapshot()
        return s["frames"], s["errors"]
    return lt.call(read)


def test_broker_and_clients_over_ws_counted_exactly(stack):
    app, lt, broker, url = stack
    assert broker.addresses[0].startswith("ws://127.0.0.1:")
    req, rsp = FlexiMQClient(url), FlexiMQClient(url)
    a_id, b_id = req.join(), rsp.join()
    rids = [req.send_request(b_id, "/api", {"i": i}) for i in range(N)]     # pipelined
    for _ in range(N):
        rsp.reply(rsp.next_request(), {"ok": True})
    for rid in rids:
        assert req.wait_reply(rid).status is None
    assert req.ping() > 0
    req.close()
    rsp.close()
    app.shutdown_once()
    frames, errors = counts(app, lt)
    assert frames == {("c2s", "JOIN"): 2, ("c2s", "REQ"): N, ("c2s", "REP"): N,
                      ("c2s", "PING"): 1, ("s2c", "REP"): N + 2, ("s2c", "REQ"): N,
                      ("s2c", "PONG"): 1}
    assert errors == {}
    R = {"route": "fxws", "protocol": "fleximq"}
    ok = lt.call(lambda: sample(app, "frametap_request_duration_seconds_count",
                                opcode="REQ", outcome="ok", **R))
    assert ok == 2 * N                      # each request: requester leg + responder leg
    assert lt.call(lambda: sample(app, "frametap_responses_total", opcode="JOIN",
                                  status="200", **R)) == 2
    assert a_id != b_id
    # the frame log: one row per frame, as the counters say, with the REQs' ids
    rows = [r for p in glob.glob(os.path.join(app.logdir, "*.parquet"))
            for r in pq.read_table(p).to_pylist() if r["kind"] != "event"]
    got = {}
    for r in rows:
        got[(r["direction"], r["opcode_name"])] = got.get((r["direction"], r["opcode_name"]),
                                                          0) + 1
    assert got == frames
    assert {r["correlation_id"] for r in rows if r["opcode_name"] == "REQ"} == set(rids)


def test_another_librarys_client_packs_and_splits_frames(stack):
    """websocket-client: several fleximq frames in one message, one frame across three
    fragments with a ping in between, one across two messages."""
    app, lt, broker, url = stack
    ws = wsclient.create_connection(url, timeout=10)
    try:
        ws.send_binary(codec.join(None, "j1"))
        rep = codec.FrameReader(1 << 20)
        joined = [f for f in rep.feed(ws.recv())]
        cid = joined[0].client_id
        pings = [codec.ping(cid, 1000 + i) for i in range(3)]
        ws.send_binary(b"".join(pings))                         # three in one message
        p4 = codec.ping(cid, 2000)
        ws.send_frame(wsclient.ABNF.create_frame(p4[:5], wsclient.ABNF.OPCODE_BINARY, 0))
        ws.ping(b"hi")                                          # a control frame inside
        ws.send_frame(wsclient.ABNF.create_frame(p4[5:20], wsclient.ABNF.OPCODE_CONT, 0))
        ws.send_frame(wsclient.ABNF.create_frame(p4[20:], wsclient.ABNF.OPCODE_CONT, 1))
        p5 = codec.ping(cid, 3000)
        ws.send_binary(p5[:30])                                 # across two messages
        ws.send_binary(p5[30:])
        pongs = []
        while len(pongs) < 5:
            op, data = ws.recv_data(control_frame=False)
            if op == wsclient.ABNF.OPCODE_BINARY:
                pongs += [f.header["keepalive"]["timestamp"] for f in rep.feed(data)]
        assert sorted(pongs) == [1000, 1001, 1002, 2000, 3000]
    finally:
        ws.close()
    app.shutdown_once()
    frames, errors = counts(app, lt)
    assert frames == {("c2s", "JOIN"): 1, ("c2s", "PING"): 5, ("s2c", "REP"): 1,
                      ("s2c", "PONG"): 5}
    assert errors == {}


def test_a_plain_http_request_gets_a_clear_answer(stack):
    app, lt, broker, url = stack
    import socket
    host, port = url[5:].split("/")[0].split(":")
    s = socket.create_connection((host, int(port)), 5)
    s.sendall(b"GET /fx HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = read_to_eof(s)
    s.close()
    assert answer.startswith(b"HTTP/1.1 426 ") and b"Upgrade: websocket" in answer
    frames, errors = counts(app, lt)
    assert errors == {("c2s", "ws_bad_upgrade"): 1}


@pytest.mark.slow
def test_locust_users_over_ws_through_the_proxy(stack, tmp_path):
    app, lt, broker, url = stack
    run = run_locust("fleximq", url, users=6, duration="4s")
    assert run.returncode == 0, run.stderr[-3000:]
    stats = {name: e["num_requests"] for name, e in run.stats.items()}
    app.shutdown_once()
    frames, errors = counts(app, lt)
    assert errors == {}
    assert frames[("c2s", "JOIN")] == stats["JOIN"] == 6
    for op in ("REQ", "PING", "PUB"):
        # the proxy sees every request sent; Locust reports those answered before it
        # stopped its users (at most one in flight per user)
        assert 0 < stats[op] <= frames[("c2s", op)] <= stats[op] + 6, (op, frames, stats)


@pytest.mark.parametrize("listen,upstream,why", [
    ("ws://127.0.0.1:0/fx", "127.0.0.1:7890", "--upstream: expected a ws:// URL"),
    ("127.0.0.1:0", "ws://127.0.0.1:7890/", "--listen: expected a ws:// URL"),
    ("ws://127.0.0.1:0/fx", "wss://127.0.0.1:7890/",
     "wss:// needs [routes[0].tls] mode = originate or both (got no [tls] table)"),
    ("ws://127.0.0.1:0/fx?x", "ws://127.0.0.1:7890/", "a query or fragment"),
])
def test_mixed_or_unsupported_sides_are_one_line_errors(listen, upstream, why):
    proc = subprocess.run([sys.executable, "-m", "proxy", "proxy", "--protocol", "fleximq",
                           "--listen", listen, "--upstream", upstream], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and why in lines[0], proc.stderr


def test_websocket_is_a_fleximq_transport_only():
    from proxy.errors import ConfigError
    with pytest.raises(ConfigError, match="WebSocket is a fleximq transport"):
        config_from_dict({"routes": [{"protocol": "flymq", "listen": "ws://127.0.0.1:0/",
                                      "upstream": "ws://127.0.0.1:1/"}]})


def test_the_users_and_the_broker_take_ws_urls():
    # in a child: importing the users imports Locust, which gevent-patches its process
    code = ("from loadgen.fleximq.users import parse_host\n"
            "print(parse_host('ws://127.0.0.1:8080/mq'))\n"
            "try:\n    parse_host('ws://127.0.0.1:8080/mq?x=1')\n"
            "except ValueError as e:\n    print(e)\n")
    child = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
    out = child.stdout.splitlines()
    assert out[0] == "ws://127.0.0.1:8080/mq" and "query or fragment" in out[1], child.stderr
    proc = subprocess.run([sys.executable, "-m", "proxy", "serve", "fleximq", "--listen",
                           "wss://127.0.0.1:0/mq"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "wss:// needs --tls-cert and --tls-key" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_served_over_ws_from_the_command_line(tmp_path):
    """``frametap serve fleximq --listen ws://...`` answers a JOIN over WebSocket."""
    import json
    import time
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "fleximq", "--listen",
                             "ws://127.0.0.1:0/mq", "--ready-file", str(ready)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.1)
        addr = json.loads(ready.read_text())["listen"][0]
        c = FlexiMQClient("ws://%s/mq" % addr)
        assert c.join() >= 1000
        assert c.ping() > 0
        c.close()
    finally:
        proc.terminate()
        proc.wait(30)


def test_wss_both_ways_through_two_routes(certs, tmp_path):
    """wss:// = the WebSocket layer over the route's TLS (proxy/tls.py): a client speaks
    ws:// to route "edge", which originates TLS (wss://, verified against the test's CA)
    to route "inner", which terminates it and speaks ws:// to the broker; both routes
    count every frame, and a websocket-client wss:// client reaches "inner" directly."""
    import ssl
    broker = FlexiMQBrokerThread(listen=["ws://127.0.0.1:0/mq"], ping_interval=0).start()
    lt = LoopThread()
    inner = ProxyApp(config_from_dict({"routes": [
        {"name": "inner", "protocol": "fleximq", "listen": "wss://127.0.0.1:0/fx",
         "upstream": broker.addresses[0],
         "tls": {"mode": "terminate", "listen": {"cert": certs.cert, "key": certs.key}}}]}))
    lt.run(inner.start())
    port = inner.routes[0].address[1]
    edge = ProxyApp(config_from_dict({"routes": [
        {"name": "edge", "protocol": "fleximq", "listen": "ws://127.0.0.1:0/fx",
         "upstream": "wss://127.0.0.1:%d/fx" % port,
         "tls": {"mode": "originate", "upstream": {"ca": certs.ca}}}]}))
    lt.run(edge.start())
    try:
        url = "ws://127.0.0.1:%d/fx" % edge.routes[0].address[1]
        req, rsp = FlexiMQClient(url), FlexiMQClient(url)
        req.join(), rsp.join()
        rids = [req.send_request(rsp.client_id, "/tls", {"i": i}) for i in range(N)]
        for _ in range(N):
            rsp.reply(rsp.next_request())
        for rid in rids:
            req.wait_reply(rid)
        req.close()
        rsp.close()
        ws = wsclient.create_connection("wss://127.0.0.1:%d/fx" % port, timeout=10,
                                        sslopt={"ca_certs": certs.ca,
                                                "cert_reqs": ssl.CERT_REQUIRED})
        ws.send_binary(codec.join(None, "direct"))
        assert codec.FrameReader(1 << 20).feed(ws.recv())[0].client_id >= 1000
        ws.close()
    finally:
        lt.run(edge.shutdown(5))
        lt.run(inner.shutdown(5))
        lt.stop()
        broker.stop()
    want = {("c2s", "JOIN"): 2, ("c2s", "REQ"): N, ("c2s", "REP"): N,
            ("s2c", "REP"): N + 2, ("s2c", "REQ"): N}
    e = edge.routes[0].stats.snapshot()
    i = inner.routes[0].stats.snapshot()
    assert e["frames"] == want and e["errors"] == {}
    assert i["frames"] == {**want, ("c2s", "JOIN"): 3, ("s2c", "REP"): N + 3}
    assert i["errors"] == {}
    ok = lambda app, side: sample(app, "frametap_tls_handshakes_total",  # noqa: E731
                                  route=app.routes[0].cfg.name, side=side, outcome="ok")
    assert ok(edge, "upstream") == 2 and ok(inner, "listen") == 3


@pytest.mark.parametrize("listen,upstream,tls,why", [
    ("wss://127.0.0.1:0/fx", "ws://127.0.0.1:1/", None,
     "wss:// needs [routes[0].tls] mode = terminate, both or permissive"),
    ("ws://127.0.0.1:0/fx", "ws://127.0.0.1:1/", {"mode": "originate"},
     "speaks TLS on this side: write wss://"),
    ("ws://127.0.0.1:0/fx", "ws://127.0.0.1:1/", {"mode": "passthrough"},
     "passthrough never decodes"),
])
def test_wss_and_the_tls_mode_must_agree(listen, upstream, tls, why):
    from proxy.errors import ConfigError
    route = {"protocol": "fleximq", "listen": listen, "upstream": upstream}
    if tls is not None:
        route["tls"] = tls
    with pytest.raises(ConfigError, match=re.escape(why)):
        config_from_dict({"routes": [route]})


@pytest.mark.slow
def test_broker_clients_and_locust_over_wss(certs):
    """wss:// end to end: the reference broker serving wss:// (--tls-cert/--tls-key),
    a "both" route in front of it, frametap's client and a Locust run (FRAMETAP_TLS_CA)
    speaking wss:// to the route; the proxy counts the client's frames exactly."""
    from loadgen.tlsopts import ClientTLS, configure, server_context
    bt = FlexiMQBrokerThread(listen=["wss://127.0.0.1:0/mq"], ping_interval=0)
    bt.server.ssl_context = server_context(certs.cert, certs.key)
    broker = bt.start()
    lt = LoopThread()
    app = ProxyApp(config_from_dict({"routes": [
        {"name": "both", "protocol": "fleximq", "listen": "wss://127.0.0.1:0/fx",
         "upstream": broker.addresses[0],
         "tls": {"mode": "both", "listen": {"cert": certs.cert, "key": certs.key},
                 "upstream": {"ca": certs.ca}}}]}))
    lt.run(app.start())
    url = "wss://127.0.0.1:%d/fx" % app.routes[0].address[1]
    configure(ClientTLS(ca=certs.ca))
    try:
        req, rsp = FlexiMQClient(url), FlexiMQClient(url)
        req.join(), rsp.join()
        rids = [req.send_request(rsp.client_id, "/wss", {"i": i}) for i in range(N)]
        for _ in range(N):
            rsp.reply(rsp.next_request())
        for rid in rids:
            req.wait_reply(rid)
        assert req.ping() > 0
        req.close()
        rsp.close()
        before = lt.call(lambda: dict(app.routes[0].stats.snapshot()["frames"]))
        run = run_locust("fleximq", url, users=6, duration="4s",
                         env={"FRAMETAP_TLS_CA": certs.ca})
        assert run.returncode == 0, run.stderr[-3000:]
    finally:
        configure(None)
        lt.run(app.shutdown(5))
        lt.stop()
        broker.stop()
    assert before == {("c2s", "JOIN"): 2, ("c2s", "REQ"): N, ("c2s", "REP"): N,
                      ("c2s", "PING"): 1, ("s2c", "REP"): N + 2, ("s2c", "REQ"): N,
                      ("s2c", "PONG"): 1}
    s = app.routes[0].stats.snapshot()
    assert s["errors"] == {}
    stats = {name: e["num_requests"] for name, e in run.stats.items()}
    assert s["frames"][("c2s", "JOIN")] - 2 == stats["JOIN"] == 6
    for op in ("REQ", "PING"):
        locust = stats[op] + (N if op == "REQ" else 1)
        assert 0 < locust <= s["frames"][("c2s", op)] <= locust + 6, (op, s["frames"], stats)


@pytest.mark.slow
def test_ready_file_names_a_websocket_route_by_its_url(stack):
    """--ready-file writes addresses as the config takes them: a ws:// route's URL, with
    its path and the port as bound (not a bare host:port a client could not use)."""
    app, lt, broker, url = stack
    routes = lt.call(app.bound_addresses)["routes"]
    assert routes == {"fxws": url}
    assert url.startswith("ws://127.0.0.1:") and url.endswith("/fx") and ":0/" not in url
