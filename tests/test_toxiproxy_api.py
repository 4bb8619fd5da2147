"""The fault HTTP API (proxy/api.py) over real HTTP against a running ``frametap proxy``
(port 0, ready file): Toxiproxy 2.x's paths, status codes and bodies, every error path,
frametap's own /api/v1/routes/{route}/faults, and Toxiproxy's own Python client
(PyPI toxiproxy-python) creating a proxy and a latency toxic against frametap."""

import importlib.util
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from proxy import protocols
from tests._support.processes import host_port, proxy_process, read_to_eof

CONFIG = """
[admin]
listen = "127.0.0.1:0"

[toxiproxy]
listen = "127.0.0.1:0"

[[routes]]
name = "fly"
protocol = "flymq"
listen = "127.0.0.1:0"
upstream = "{fly_upstream}"

[[routes]]
name = "mq"
protocol = "rocketmq"
listen = "127.0.0.1:0"
upstream = "127.0.0.1:9"

[[routes.faults]]
name = "busy"
match = {{opcode = ["SEND_MESSAGE_V2"]}}
action = {{type = "error", status = "SYSTEM_BUSY"}}
trigger = {{probability = 0.05}}
"""

ENGINE = importlib.util.find_spec("proxy.faults") is not None


class EchoServer:
    """Echoes every byte back, on 127.0.0.1 port 0, one thread per connection."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.sock.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn):
        with conn:
            try:
                while data := conn.recv(65536):
                    conn.sendall(data)
            except OSError:
                pass

    def close(self):
        self.closed = True
        self.sock.close()


@pytest.fixture(scope="module")
def echo():
    server = EchoServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, echo):
    from loadgen.flymq.server import FlyMQServerThread
    with FlyMQServerThread() as fly:
        tmp = tmp_path_factory.mktemp("api")
        with proxy_process(tmp, config=CONFIG.format(fly_upstream=f"127.0.0.1:{fly.port}"),
                           log_level="warning") as p:
            p.fly = fly
            yield p
        assert "Traceback" not in p.log_text(), p.log_text()[-3000:]


@pytest.fixture(scope="module")
def api(proxy):
    return "http://" + proxy.ready["api"]


def http(method, url, body=None, raw=None, headers=None):
    """(status, parsed JSON body or None for an empty one, content type)."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method,
                                 headers=dict({"User-Agent": "test"}, **(headers or {})))
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            status, payload, ctype = resp.status, resp.read(), resp.headers["Content-Type"]
    except urllib.error.HTTPError as exc:
        status, payload, ctype = exc.code, exc.read(), exc.headers["Content-Type"]
    if not payload.strip():
        return status, None, ctype
    try:
        return status, json.loads(payload), ctype
    except ValueError:
        return status, payload.decode("utf-8", "replace"), ctype


def error(status, message):
    return status, {"error": message, "status": status}


def echo_once(address, payload=b"hello"):
    with socket.create_connection(host_port(address), timeout=5) as s:
        s.sendall(payload)
        got = b""
        while len(got) < len(payload):
            chunk = s.recv(65536)
            assert chunk, "connection closed before the echo"
            got += chunk
    return got


def refused(address):
    try:
        socket.create_connection(host_port(address), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def closed_by_peer(sock, timeout=5):
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


# ---- Toxiproxy: proxies --------------------------------------------------------------

def test_version_and_configured_routes_are_proxies(api, proxy, echo):
    status, body, ctype = http("GET", api + "/version")
    assert status == 200 and ctype.startswith("application/json")
    assert body["version"] == "2.12.0" and body["frametap"]
    status, proxies, _ = http("GET", api + "/proxies")
    assert status == 200
    assert proxies["fly"] == {"name": "fly", "listen": proxy.address("fly"),
                              "upstream": f"127.0.0.1:{proxy.fly.port}", "enabled": True,
                              "toxics": [], "frametap_protocol": "flymq"}
    assert proxies["mq"]["frametap_protocol"] == "rocketmq"
    assert http("GET", api + "/proxies/fly")[:2] == (200, proxies["fly"])


def scrape(proxy, family, route):
    """{(direction, [opcode]): value} of one metric family of ``route`` from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(proxy.admin_url + "/metrics", timeout=10) as resp:
        families = text_string_to_metric_families(resp.read().decode())
    return {tuple(v for k, v in sorted(s.labels.items()) if k not in ("route", "protocol")):
            s.value for f in families if f.name == family for s in f.samples
            if s.labels.get("route") == route}


def test_create_relay_and_delete_an_undecoded_proxy(api, proxy, echo):
    status, made, _ = http("POST", api + "/proxies",
                           {"name": "echo1", "listen": "127.0.0.1:0", "upstream": echo.address})
    assert status == 201, made
    host, port = host_port(made["listen"])
    assert host == "127.0.0.1" and port != 0
    assert made == {"name": "echo1", "listen": made["listen"], "upstream": echo.address,
                    "enabled": True, "toxics": [], "frametap_protocol": "tcp"}
    assert echo_once(made["listen"], b"x" * 100_000) == b"x" * 100_000
    assert http("GET", api + "/proxies/echo1")[:2] == (200, made)
    # undecoded: every byte counted, no frame
    relayed = scrape(proxy, "frametap_bytes", route="echo1")
    assert relayed == {("c2s",): 100_000, ("s2c",): 100_000}, relayed
    assert scrape(proxy, "frametap_frames", route="echo1") == {}
    assert http("POST", api + "/proxies", {"name": "echo1", "upstream": echo.address})[:2] \
        == error(409, "proxy already exists")
    held = socket.create_connection(host_port(made["listen"]), timeout=5)
    try:
        held.sendall(b"ping")
        assert held.recv(4) == b"ping"
        status, body, _ = http("DELETE", api + "/proxies/echo1")
        assert (status, body) == (204, None)
        assert closed_by_peer(held)                 # Toxiproxy closes a deleted proxy's
    finally:
        held.close()
    assert refused(made["listen"])
    assert http("GET", api + "/proxies/echo1")[:2] == error(404, "proxy not found")
    assert http("DELETE", api + "/proxies/echo1")[:2] == error(404, "proxy not found")
    assert "echo1" not in http("GET", api + "/proxies")[1]


@pytest.mark.parametrize("body, raw, expected", [
    (None, b"{nope", (400, "bad request body: Expecting property name enclosed in double "
                          "quotes: line 1 column 2 (char 1)")),
    (None, b"", (400, "bad request body: empty (expected a JSON object)")),
    ([1], None, (400, "bad request body: [1] (expected a JSON object)")),
    ({"upstream": "127.0.0.1:1"}, None, (400, "missing required field: name")),
    ({"name": "n"}, None, (400, "missing required field: upstream")),
    ({"name": "n", "upstream": "nohost"}, None,
     (400, "upstream = 'nohost': expected 'host:port' or '[v6]:port' (e.g. 127.0.0.1:9092)")),
    ({"name": "n", "upstream": "127.0.0.1:1", "listen": "127.0.0.1:99999"}, None,
     (400, "listen = '127.0.0.1:99999': port must be 0..65535")),
    ({"name": "n", "upstream": "127.0.0.1:1", "frametap_protocol": "mqtt"}, None,
     (400, "frametap_protocol = 'mqtt': expected one of " + ", ".join(protocols.accepted()))),
    ({"name": "n", "upstream": "127.0.0.1:1", "enabled": "yes"}, None,
     (400, "bad request body: enabled = 'yes': expected true or false")),
    ({"name": "n", "upstream": 5}, None,
     (400, "bad request body: upstream = 5: expected a string")),
    ({"name": "a/b", "upstream": "127.0.0.1:1"}, None,
     (400, "name = 'a/b': expected at most 200 printable characters and no '/'")),
    ({"name": "n", "upstream": "127.0.0.1:1", "colour": 1}, None,
     (400, "bad request body: unknown key 'colour' (expected one of: name, listen, "
           "upstream, enabled, toxics, frametap_protocol)")),
])
def test_create_proxy_errors(api, body, raw, expected):
    status, answer, _ = http("POST", api + "/proxies", body, raw=raw)
    assert (status, answer) == error(*expected)
    assert "n" not in http("GET", api + "/proxies")[1]


def test_create_on_an_address_in_use_is_409(api, proxy):
    status, answer, _ = http("POST", api + "/proxies", {
        "name": "clash", "listen": proxy.address("fly"), "upstream": "127.0.0.1:1"})
    assert (status, answer) == error(409, f"listen = '{proxy.address('fly')}': address "
                                          "already in use")
    assert "clash" not in http("GET", api + "/proxies")[1]


def test_decoded_proxy_through_the_api(api, proxy):
    from loadgen.flymq.client import FlyMQClient
    status, made, _ = http("POST", api + "/proxies", {
        "name": "fly2", "listen": "127.0.0.1:0", "upstream": f"127.0.0.1:{proxy.fly.port}",
        "frametap_protocol": "flymq"})
    assert status == 201 and made["frametap_protocol"] == "flymq", made
    host, port = host_port(made["listen"])
    with FlyMQClient(host, port) as client:
        client.create_topic("t")
        client.produce("t", b"v")
    frames = scrape(proxy, "frametap_frames", route="fly2")
    assert frames[("c2s", "PRODUCE")] == 1 and frames[("s2c", "PRODUCE")] == 1, frames
    # its rules are checked against the FlyMQ opcode table
    status, rule, _ = http("POST", api + "/api/v1/routes/fly2/faults", {
        "name": "slow", "match": {"opcode": "PRODUCE"}, "action": {"type": "delay", "ms": 5}})
    assert status == 201, rule
    status, answer, _ = http("POST", api + "/api/v1/routes/fly2/faults", {
        "name": "x", "match": {"opcode": "SEND_MESSAGE_V2"}, "action": {"type": "drop"}})
    assert status == 400 and answer["error"].startswith(
        "match.opcode = 'SEND_MESSAGE_V2': not a flymq opcode name"), answer
    assert http("DELETE", api + "/proxies/fly2")[0] == 204


def test_disable_enable_and_update(api, echo):
    other = EchoServer()
    try:
        status, made, _ = http("POST", api + "/proxies", {
            "name": "echo2", "listen": "127.0.0.1:0", "upstream": echo.address})
        assert status == 201
        listen = made["listen"]
        held = socket.create_connection(host_port(listen), timeout=5)
        held.sendall(b"a")
        assert held.recv(1) == b"a"
        status, body, _ = http("POST", api + "/proxies/echo2", {"enabled": False})
        assert status == 200 and body["enabled"] is False and body["listen"] == listen
        assert closed_by_peer(held)
        held.close()
        assert refused(listen)
        assert http("GET", api + "/proxies/echo2")[1]["enabled"] is False
        status, body, _ = http("PATCH", api + "/proxies/echo2", {"enabled": True})
        assert (status, body["enabled"], body["listen"]) == (200, True, listen)
        assert echo_once(listen) == b"hello"             # the same port again
        # a new upstream: the proxy restarts on its address
        status, body, _ = http("PATCH", api + "/proxies/echo2", {"upstream": other.address})
        assert (status, body["upstream"], body["listen"], body["enabled"]) == \
            (200, other.address, listen, True)
        assert echo_once(listen) == b"hello"
        # a new listen address
        status, body, _ = http("PATCH", api + "/proxies/echo2", {"listen": "127.0.0.1:0"})
        assert status == 200 and body["listen"] != listen
        assert refused(listen) and echo_once(body["listen"]) == b"hello"
        assert http("PATCH", api + "/proxies/echo2", {"enabled": 1})[:2] == error(
            400, "bad request body: enabled = 1: expected true or false")
        assert http("PATCH", api + "/proxies/echo2", {"name": "other"})[:2] == error(
            400, "name = 'other': a proxy cannot be renamed (delete it and create the new "
                 "one)")
        assert http("PATCH", api + "/proxies/echo2", {"upstream": "x"})[0] == 400
        assert http("PATCH", api + "/proxies/nope", {"enabled": True})[:2] == error(
            404, "proxy not found")
        assert http("DELETE", api + "/proxies/echo2")[0] == 204
    finally:
        other.close()


# ---- Toxiproxy: toxics ----------------------------------------------------------------

def test_toxics(api):
    base = api + "/proxies/fly/toxics"
    assert http("GET", base)[:2] == (200, [])
    status, toxic, _ = http("POST", base, {"type": "latency", "attributes": {"latency": 100}})
    assert (status, toxic) == (200, {"attributes": {"latency": 100, "jitter": 0},
                                     "name": "latency_downstream", "type": "latency",
                                     "stream": "downstream", "toxicity": 1.0})
    assert http("GET", api + "/proxies/fly")[1]["toxics"] == [toxic]
    assert http("POST", base, {"type": "latency"})[:2] == error(
        409, "toxic already exists: 'latency_downstream'")
    status, up, _ = http("POST", base, {"name": "cut", "type": "limit_data",
                                        "stream": "upstream", "toxicity": 0.5,
                                        "attributes": {"bytes": 10}})
    assert status == 200 and up["stream"] == "upstream"
    assert [t["name"] for t in http("GET", base)[1]] == ["cut", "latency_downstream"]
    assert http("GET", base + "/latency_downstream")[:2] == (200, toxic)
    assert http("GET", base + "/nope")[:2] == error(404, "toxic not found: 'nope'")
    status, changed, _ = http("PATCH", base + "/latency_downstream",
                              {"attributes": {"jitter": 5}})
    assert (status, changed["attributes"], changed["toxicity"]) == \
        (200, {"latency": 100, "jitter": 5}, 1.0)
    status, changed, _ = http("POST", base + "/latency_downstream", {"toxicity": 0.5})
    assert (status, changed["attributes"], changed["toxicity"]) == \
        (200, {"latency": 100, "jitter": 5}, 0.5)
    assert http("PATCH", base + "/nope", {"toxicity": 1})[:2] == error(
        404, "toxic not found: 'nope'")
    assert http("PATCH", base + "/latency_downstream", {"attributes": {"latency": -1}})[:2] \
        == error(400, "attributes.latency = -1: expected an integer 0..3600000")
    for body, message in [
            ({"type": "jam"}, "type = 'jam': invalid toxic type (expected one of: latency, "
                              "bandwidth, slow_close, timeout, reset_peer, slicer, limit_data)"),
            ({"type": "latency", "stream": "up", "name": "x"},
             "stream = 'up': stream was invalid, can be either upstream or downstream"),
            ({"type": "latency", "name": "y", "attributes": {"latecy": 1}},
             "attributes: unknown key 'latecy' for a latency toxic (expected one of: "
             "latency, jitter)"),
            ({"type": "latency", "name": "z", "toxicity": -0.1},
             "toxicity = -0.1: expected a probability 0..1")]:
        assert http("POST", base, body)[:2] == error(400, message)
    assert http("POST", base, raw=b"[")[0] == 400
    assert (http("DELETE", base + "/cut")[0], http("DELETE", base + "/cut")[:2]) == \
        (204, error(404, "toxic not found: 'cut'"))
    assert http("DELETE", base + "/latency_downstream")[0] == 204
    assert http("GET", base)[:2] == (200, [])
    for method in ("GET", "POST"):
        assert http(method, api + "/proxies/nope/toxics", {"type": "latency"})[:2] == \
            error(404, "proxy not found")
    assert http("DELETE", api + "/proxies/nope/toxics/x")[:2] == error(404, "proxy not found")


def test_reset_enables_proxies_and_removes_toxics_only(api, echo):
    http("POST", api + "/proxies", {"name": "echo3", "upstream": echo.address})
    assert http("POST", api + "/proxies/echo3", {"enabled": False})[0] == 200
    assert http("POST", api + "/proxies/fly/toxics", {"type": "timeout"})[0] == 200
    status, body, _ = http("POST", api + "/reset")
    assert (status, body) == (204, None)
    state = http("GET", api + "/proxies")[1]
    assert state["echo3"]["enabled"] is True and state["fly"]["toxics"] == []
    assert echo_once(state["echo3"]["listen"]) == b"hello"
    # frametap's own rules stay: /reset is Toxiproxy's, and Toxiproxy has none
    assert [r["name"] for r in http("GET", api + "/api/v1/routes/mq/faults")[1]] == ["busy"]
    assert http("DELETE", api + "/proxies/echo3")[0] == 204


def test_populate(api, echo):
    other = EchoServer()
    try:
        status, body, _ = http("POST", api + "/populate", [
            {"name": "p1", "listen": "127.0.0.1:0", "upstream": echo.address},
            {"name": "p2", "listen": "127.0.0.1:0", "upstream": echo.address,
             "enabled": False}])
        assert status == 201, body
        p1, p2 = body["proxies"]
        assert (p1["name"], p1["enabled"], p2["name"], p2["enabled"]) == \
            ("p1", True, "p2", False)
        held = socket.create_connection(host_port(p1["listen"]), timeout=5)
        held.sendall(b"k")
        assert held.recv(1) == b"k"
        # the same again: p1 unchanged (its connection lives on); p2 replaced
        status, body, _ = http("POST", api + "/populate", [
            {"name": "p1", "listen": p1["listen"], "upstream": echo.address},
            {"name": "p2", "listen": "127.0.0.1:0", "upstream": other.address}])
        assert status == 201, body
        assert body["proxies"][0] == p1
        assert (body["proxies"][1]["upstream"], body["proxies"][1]["enabled"]) == \
            (other.address, True)
        held.sendall(b"j")
        assert held.recv(1) == b"j"
        held.close()
        assert http("POST", api + "/populate", [{"name": "p3"}])[:2] == error(
            400, "missing required field: upstream at proxy 1")
        assert http("POST", api + "/populate", {"name": "p3"})[:2] == error(
            400, "bad request body: {'name': 'p3'} (expected a JSON array)")
        status, body, _ = http("POST", api + "/populate", [
            {"name": "p4", "listen": "127.0.0.1:0", "upstream": echo.address},
            {"name": "p5", "listen": p1["listen"], "upstream": echo.address}])
        assert status == 409 and body["status"] == 409, body
        assert body["error"] == f"listen = '{p1['listen']}': address already in use"
        assert [p["name"] for p in body["proxies"]] == ["p4"]
        for name in ("p1", "p2", "p4"):
            assert http("DELETE", api + f"/proxies/{name}")[0] == 204
    finally:
        other.close()


# ---- frametap's own: rules ------------------------------------------------------------

def test_rules_api(api, proxy):
    status, routes, _ = http("GET", api + "/api/v1/routes")
    assert status == 200
    mq = next(r for r in routes if r["name"] == "mq")
    assert mq == {"name": "mq", "protocol": "rocketmq", "listen": proxy.address("mq"),
                  "upstream": "127.0.0.1:9", "enabled": True, "toxics": [],
                  "faults": [{"name": "busy", "match": {"direction": "c2s",
                                                        "opcode": ["SEND_MESSAGE_V2"]},
                              "action": {"type": "error", "status": "SYSTEM_BUSY",
                                         "message": "injected by frametap fault busy"},
                              "trigger": {"probability": 0.05}}]}
    assert http("GET", api + "/api/v1/routes/mq")[:2] == (200, mq)
    base = api + "/api/v1/routes/mq/faults"
    rule = {"name": "slow", "match": {"opcode": ["PULL_MESSAGE"], "direction": "c2s"},
            "action": {"type": "delay", "ms": 20, "jitter_ms": 5}, "trigger": {"nth": 3}}
    assert http("POST", base, rule)[:2] == (201, rule)
    assert [r["name"] for r in http("GET", base)[1]] == ["busy", "slow"]
    assert http("GET", base + "/slow")[:2] == (200, rule)
    status, changed, _ = http("PATCH", base + "/slow", {"trigger": {"once": True}})
    assert (status, changed) == (200, dict(rule, trigger={"once": True}))
    assert http("POST", base + "/slow", {"action": {"type": "drop"}})[1]["action"] == \
        {"type": "drop"}
    assert http("POST", base, rule)[:2] == error(409, "rule already exists: 'slow'")
    status, body, _ = http("POST", base, dict(rule, name="x", match={"opcode": ["PULL"]}))
    assert (status, body["status"]) == (400, 400)
    assert body["error"].startswith("match.opcode = 'PULL': not a rocketmq opcode name as "
                                    "the metrics name them (did you mean ")
    assert "PULL_MESSAGE" in body["error"]
    assert http("PATCH", base + "/slow", {"trigger": {"nth": 0}})[:2] == error(
        400, "trigger.nth = 0: expected an integer 1..4611686018427387904")
    assert http("PATCH", base + "/nope", {})[:2] == error(404, "rule not found: 'nope'")
    assert http("GET", base + "/nope")[:2] == error(404, "rule not found: 'nope'")
    assert http("GET", api + "/api/v1/routes/nope/faults")[:2] == error(
        404, "route not found: 'nope'")
    assert http("POST", api + "/api/v1/routes/nope/faults", rule)[:2] == error(
        404, "route not found: 'nope'")
    status, unnamed, _ = http("POST", base, {"action": {"type": "drop"}})
    assert status == 201 and unnamed["name"] == "drop_3"
    assert (http("DELETE", base + "/slow")[0], http("DELETE", base + "/slow")[:2]) == \
        (204, error(404, "rule not found: 'slow'"))
    # DELETE on the collection removes every rule, not the toxics
    http("POST", api + "/proxies/mq/toxics", {"type": "latency"})
    assert http("DELETE", base)[:2] == (204, None)
    assert http("GET", base)[:2] == (200, [])
    assert len(http("GET", api + "/proxies/mq/toxics")[1]) == 1
    assert http("POST", base, mq["faults"][0])[:2] == (201, mq["faults"][0])   # restore
    http("DELETE", api + "/proxies/mq/toxics/latency_downstream")


def test_an_undecoded_route_refuses_rules(api, echo):
    http("POST", api + "/proxies", {"name": "raw", "upstream": echo.address})
    try:
        status, body, _ = http("POST", api + "/api/v1/routes/raw/faults",
                               {"name": "x", "action": {"type": "drop"}})
        assert status == 400 and "not decoded" in body["error"], body
    finally:
        http("DELETE", api + "/proxies/raw")


def test_http_errors(api):
    assert http("GET", api + "/nothing")[:2] == error(404, "not found: GET /nothing")
    assert http("PUT", api + "/proxies", {})[:2] == error(
        405, "method not allowed: PUT /proxies")
    assert http("GET", api + "/proxies", headers={"User-Agent": "Mozilla/5.0"})[:2] == \
        (403, "User agent not allowed\n")
    status, body, _ = http("POST", api + "/proxies", raw=b" " * ((1 << 20) + 1))
    assert (status, body) == error(413, "request body too large (at most 1048576 bytes)")


# ---- Toxiproxy's own Python client -------------------------------------------------

def _toxiproxy_client(api):
    """Toxiproxy's own Python client (PyPI toxiproxy-python), pointed at ``api``."""
    try:
        import toxiproxy
    except ImportError:
        reason = "toxiproxy-python is not installed (pip install toxiproxy-python)"
        if os.environ.get("FRAMETAP_CI"):
            pytest.fail(reason + " (FRAMETAP_CI is set: CI must have it)")
        pytest.skip(reason)
    server = toxiproxy.Toxiproxy()
    host, port = host_port(api[len("http://"):])
    server.update_api_consumer(host, port)
    return server


@pytest.fixture
def client(api):
    from_client = _toxiproxy_client(api)
    yield from_client
    from toxiproxy.api import APIConsumer            # class attributes: put them back
    APIConsumer.host, APIConsumer.port = "127.0.0.1", 8474


def test_toxiproxy_python_client(client, echo):
    from toxiproxy.exceptions import InvalidToxic, ProxyExists
    assert client.running()
    assert json.loads(client.version())["version"] == "2.12.0"
    assert {"fly", "mq"} <= set(client.proxies())
    made = client.create(upstream=echo.address, name="redis_master")
    assert (made.name, made.upstream, made.enabled) == ("redis_master", echo.address, True)
    assert echo_once(made.listen) == b"hello"
    made.add_toxic(type="latency", attributes={"latency": 100})
    toxics = made.toxics()
    assert list(toxics) == ["latency_downstream"]
    assert (toxics["latency_downstream"].type, toxics["latency_downstream"].attributes) == \
        ("latency", {"latency": 100, "jitter": 0})
    with pytest.raises(ProxyExists):                  # its name for any 409
        made.add_toxic(type="latency", attributes={"latency": 100})
    with pytest.raises(InvalidToxic):                 # its name for any 400
        made.add_toxic(type="latency", name="bad", attributes={"latency": -1})
    with pytest.raises(ProxyExists):
        client.create(upstream=echo.address, name="redis_master")
    assert made.destroy_toxic("latency_downstream") is True
    assert made.toxics() == {}
    with made.down():
        assert refused(made.listen)
        assert client.get_proxy("redis_master").enabled is False
    assert echo_once(made.listen) == b"hello"
    assert client.get_proxy("redis_master").enabled is True
    populated = client.populate([{"name": "pop", "upstream": echo.address,
                                  "listen": "127.0.0.1:0"}])
    assert [p.name for p in populated] == ["pop"]
    assert echo_once(populated[0].listen) == b"hello"
    assert client.reset() is True
    assert made.destroy() is True and populated[0].destroy() is True
    assert client.get_proxy("redis_master") is None


@pytest.mark.skipif(not ENGINE, reason="the fault engine (proxy/faults.py) that applies "
                                       "toxics is not in this tree yet")
def test_toxiproxy_client_latency_shows_up(client, echo):
    made = client.create(upstream=echo.address, name="slow_master")
    try:
        plain = min(_round_trip(made.listen) for _ in range(3))
        made.add_toxic(type="latency", attributes={"latency": 100})
        slowed = [_round_trip(made.listen) for _ in range(3)]
        assert all(0.095 <= t <= 0.5 for t in slowed) and min(slowed) - plain >= 0.09, \
            (plain, slowed)
        made.destroy_toxic("latency_downstream")
        assert _round_trip(made.listen) < 0.05
    finally:
        made.destroy()


def _round_trip(address):
    started = time.perf_counter()
    assert echo_once(address, b"ping") == b"ping"
    return time.perf_counter() - started


# ---- in process: the app's hooks and the API on the proxy's own loop -----------------

def test_app_hooks_in_process_with_the_api_on_the_proxys_loop():
    """ProxyApp.add_route / set_route_enabled / remove_route and the API in the proxy's
    own event loop (uvloop): an error the loop reports fails the test (loopcheck); the
    refused requests are counted."""
    import asyncio

    import aiohttp

    from proxy.app import ProxyApp
    from proxy.config import RouteConfig, config_from_dict
    from proxy.faultspec import FaultSet
    from tests.support import run

    async def scenario():
        echo = EchoServer()
        app = ProxyApp(config_from_dict({
            "routes": [{"name": "fly", "protocol": "flymq", "listen": "127.0.0.1:0",
                        "upstream": "127.0.0.1:9"}],
            "toxiproxy": {"listen": "127.0.0.1:0"}, "proxy": {"shutdown_timeout": 1.0}}))
        await app.start()
        loop = asyncio.get_running_loop()
        base = "http://%s:%d" % app.api.address
        try:
            cfg = RouteConfig(name="raw", protocol="tcp", listen=("127.0.0.1", 0),
                              upstream=host_port(echo.address), framelog=False)
            assert isinstance(cfg.faults, FaultSet) and cfg.faults.protocol == "tcp"
            route = await app.add_route(cfg)
            listen = "%s:%d" % route.address
            assert await loop.run_in_executor(None, echo_once, listen) == b"hello"
            with pytest.raises(ValueError, match="exists already"):
                await app.add_route(cfg)
            await app.set_route_enabled("raw", False)
            assert not app.route_enabled(route)
            assert await loop.run_in_executor(None, refused, listen)
            await app.set_route_enabled("raw", True)
            assert await loop.run_in_executor(None, echo_once, listen) == b"hello"
            async with aiohttp.ClientSession() as http_client:
                async with http_client.get(base + "/proxies") as resp:
                    assert set(await resp.json()) == {"fly", "raw"}
                async with http_client.post(base + "/proxies/raw/toxics",
                                            json={"type": "jam"}) as resp:
                    assert resp.status == 400
                async with http_client.delete(base + "/proxies/nope") as resp:
                    assert resp.status == 404
            assert app.api.refused == {400: 1, 404: 1}
            await app.remove_route("raw")
            assert [r.cfg.name for r in app.routes] == ["fly"]
            assert await loop.run_in_executor(None, refused, listen)
            with pytest.raises(KeyError):
                await app.remove_route("raw")
        finally:
            await app.shutdown(0.5)
            echo.close()
        assert app.api.runner is None            # the API closed with the listeners
    run(scenario())


def test_connection_cap_answers_503_and_the_relay_goes_on(proxy, api):
    """A flood of idle API connections: the ones over the cap get one 503 line and are
    closed, the relay goes on serving, and the API serves again once they go."""
    from proxy.api import MAX_CONNECTIONS
    address = proxy.ready["api"]
    held = []
    try:
        for _ in range(MAX_CONNECTIONS):
            held.append(socket.create_connection(host_port(address), timeout=10))
        # the last one in is served (the cap counts from connection_made): prove it
        held[-1].sendall(b"GET /version HTTP/1.1\r\nHost: x\r\nUser-Agent: t\r\n\r\n")
        assert held[-1].recv(65536).startswith(b"HTTP/1.1 200")
        with socket.create_connection(host_port(address), timeout=10) as extra:
            got = read_to_eof(extra)
        assert got.startswith(b"HTTP/1.1 503"), got[:200]
        assert b"too many API connections" in got
        # the proxy's loop is not held up by the flood: its admin endpoint answers
        with urllib.request.urlopen("http://%s/metrics" % proxy.ready["admin"],
                                    timeout=10) as resp:
            assert resp.status == 200 and b"frametap_" in resp.read()
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + 10
    while True:
        try:
            status, body, _ = http("GET", api + "/version")
            break
        except (OSError, urllib.error.URLError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    assert status == 200 and body["version"]
