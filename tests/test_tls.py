"""TLS on a route (proxy/tls.py; docs/design.md, "Transports"), with real sockets, real
certificates made by the test (tests/tls_certs.py) and the reference servers and clients:

* config: every bad key, file, key pair or date is one line (ConfigError / exit 2);
* ``both``: FlyMQ through TLS on both sides, counted exactly, the handshakes counted and
  timed, TLS version and cipher in the frame log's ``attrs``; ``[proxy] tls_keylog``;
* handshake failures counted per outcome (wrong CA, plain client, a client that never
  speaks, an expired upstream certificate) while another connection carries on;
* ``passthrough``: never decoded, bytes counted, the ClientHello's SNI read;
* ``permissive``: a TLS and a plain RocketMQ client on one listener.
"""

import glob
import logging
import socket
import ssl
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loadgen import tlsopts
from loadgen.flymq.client import FlyMQClient
from loadgen.flymq.server import FlyMQServerThread
from loadgen.tlsopts import ClientTLS
from proxy.app import ProxyApp
from proxy.config import config_from_dict
from proxy.errors import ConfigError
from proxy.tls import classify, client_hello_sni
from tests._support import read_to_eof
from tests.conftest import LoopThread
from tests.support import sample
from tests.tls_certs import certs, server_context  # noqa: F401  (fixture)

N = 25


class Proxy:
    """A ProxyApp with the given route tables on its own loop thread."""

    def __init__(self, routes, logdir=None, proxy=None):
        data = {"routes": routes}
        if logdir is not None:
            data["framelog"] = {"dir": str(logdir)}
        if proxy is not None:
            data["proxy"] = proxy
        self.lt = LoopThread()
        self.app = ProxyApp(config_from_dict(data))
        self.lt.run(self.app.start())

    def port(self, i=0):
        return self.app.routes[i].address[1]

    def value(self, name, **labels):
        return self.lt.call(lambda: sample(self.app, name, **labels)) or 0

    def wait(self, name, want, timeout=10, **labels):
        deadline = time.monotonic() + timeout
        while self.value(name, **labels) != want and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.value(name, **labels) == want, (name, labels)

    def close(self):
        self.lt.run(self.app.shutdown(2))
        self.lt.stop()


def fly_server(cert=None, key=None):
    srv = FlyMQServerThread()
    if cert:
        srv.server.ssl_context = server_context(cert, key)
    return srv


def fly_route(name, upstream, tls):
    return {"name": name, "protocol": "flymq", "listen": "127.0.0.1:0",
            "upstream": upstream, "tls": tls}


def produce(port, tls, n=N, topic="t"):
    with FlyMQClient("127.0.0.1", port, timeout=10) as c:
        if tls is not None:           # (the client takes the process's TLS setting)
            assert isinstance(c._sock, ssl.SSLSocket)
        c.create_topic(topic, 1)
        for i in range(n):
            c.produce(topic, b"v%d" % i)


@pytest.fixture
def client_tls(monkeypatch):
    """Sets the process's client TLS (what --tls / FRAMETAP_TLS set) for the test."""
    def use(tls):
        monkeypatch.setattr(tlsopts, "_default", tls)
        return tls
    yield use


# ---- config ---------------------------------------------------------------------------------

def test_config_problems_are_one_line(certs, tmp_path):
    c = certs
    ok = {"cert": c.cert, "key": c.key}
    cases = [
        ({"mode": "tunnel"}, "routes[0].tls.mode = 'tunnel': expected one of terminate"),
        ({"mode": "terminate"}, "needs a [routes[0].tls.listen] table"),
        ({"mode": "terminate", "listen": {"cert": "/nonexistent.pem", "key": c.key}},
         "routes[0].tls.listen.cert = '/nonexistent.pem': no such file"),
        ({"mode": "terminate", "listen": {"cert": c.cert, "key": c.other_key}},
         "the key does not belong to the certificate"),
        ({"mode": "terminate", "listen": {"cert": c.ca_key, "key": c.key}}, "cannot load them"),
        ({"mode": "terminate", "listen": {"cert": c.expired_cert, "key": c.expired_key}},
         "the certificate expired on"),
        ({"mode": "originate", "listen": ok}, "routes[0].tls.listen: not used with mode"),
        ({"mode": "passthrough", "upstream": {}}, "nothing is decoded"),
        ({"mode": "both", "listen": ok, "upstream": {"ca": "/nonexistent.pem"}},
         "routes[0].tls.upstream.ca = '/nonexistent.pem': no such file"),
        ({"mode": "originate", "upstream": {"ca": c.key}}, "not a PEM CA bundle"),
        ({"mode": "terminate", "listen": dict(ok, require_client_cert=True)},
         "require_client_cert = true: needs client_ca"),
        ({"mode": "terminate", "listen": dict(ok, handshake_timeout=0)},
         "handshake_timeout = 0: expected a number 0.001..600 seconds"),
        ({"mode": "terminate", "listen": dict(ok, min_version="SSLv3")},
         "min_version = 'SSLv3': expected one of 'TLSv1.2', 'TLSv1.3'"),
        ({"mode": "terminate", "listen": dict(ok, colour=1)}, "unknown key 'colour'"),
        ({"mode": "originate", "upstream": {"cert": c.client_cert}},
         "a client certificate needs both cert and key"),
        ({"mode": "originate", "upstream": {"verify": "yes"}},
         "routes[0].tls.upstream.verify = 'yes': expected true or false"),
        ({"mode": "originate", "upstream": {"server_name": "bad name!"}},
         "expected a host name"),
        ("both", "routes[0].tls = 'both': expected a table"),
    ]
    for table, expected in cases:
        with pytest.raises(ConfigError) as e:
            config_from_dict({"routes": [fly_route("r", "127.0.0.1:9", table)]})
        assert expected in str(e.value), (table, str(e.value))
        assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="TLS to a unix: upstream is not supported"):
        config_from_dict({"routes": [fly_route("r", "unix:/tmp/x.sock", {"mode": "originate"})]})
    with pytest.raises(ConfigError, match="proxy.tls_keylog = 3: expected a file name"):
        config_from_dict({"routes": [fly_route("r", "127.0.0.1:9", {"mode": "originate"})],
                          "proxy": {"tls_keylog": 3}})
    good = config_from_dict({"routes": [fly_route("r", "127.0.0.1:9", {
        "mode": "both", "listen": dict(ok, alpn=["flymq"], min_version="TLSv1.3"),
        "upstream": {"ca": c.ca, "server_name": "localhost"}})]})
    tls = good.routes[0].tls
    assert tls.server_name("127.0.0.1") == "localhost"
    assert tls.server_context().minimum_version == ssl.TLSVersion.TLSv1_3


def test_cli_expired_certificate_exits_2(certs, tmp_path):
    cfg = tmp_path / "f.toml"
    cfg.write_text(f"""
[[routes]]
protocol = "flymq"
listen = "127.0.0.1:0"
upstream = "127.0.0.1:9"
[routes.tls]
mode = "terminate"
[routes.tls.listen]
cert = "{certs.expired_cert}"
key = "{certs.expired_key}"
""")
    r = subprocess.run([sys.executable, "-m", "proxy", "proxy", "-c", str(cfg)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("frametap: error: routes[0].tls.listen.cert = ")
    assert "expired" in lines[0]


def test_classify():
    import asyncio
    assert classify(asyncio.TimeoutError()) == "timeout"
    assert classify(ConnectionAbortedError(
        "SSL handshake is taking longer than 1.0 seconds: aborting the connection")) == "timeout"
    assert classify(ConnectionResetError()) == "protocol_error"
    err = ssl.SSLError(1, "[SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca")
    err.reason = "TLSV1_ALERT_UNKNOWN_CA"
    assert classify(err) == "verify_failed"
    err = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")
    err.reason = "WRONG_VERSION_NUMBER"
    assert classify(err) == "protocol_error"


# ---- both: counted exactly, attrs, key log --------------------------------------------------

@pytest.mark.twins
def test_both_counts_and_frame_log_attrs(certs, tmp_path, client_tls, caplog):
    client_tls(ClientTLS(ca=certs.ca))
    keylog = tmp_path / "keys.log"
    with fly_server(certs.cert, certs.key) as srv:
        with caplog.at_level(logging.WARNING, logger="frametap.tls"):
            proxy = Proxy([fly_route("fly", srv.address, {
                "mode": "both", "listen": {"cert": certs.cert, "key": certs.key},
                "upstream": {"ca": certs.ca}})], logdir=tmp_path / "logs",
                proxy={"tls_keylog": str(keylog)})
        assert any("tls_keylog" in r.getMessage() for r in caplog.records)
        try:
            produce(proxy.port(), True)
            produce(proxy.port(), True, n=3)          # a second connection
            proxy.wait("frametap_connections_active", 0, route="fly")
            assert proxy.value("frametap_frames_total", route="fly", protocol="flymq",
                               direction="c2s", opcode="PRODUCE") == N + 3
            assert proxy.value("frametap_responses_total", route="fly", protocol="flymq",
                               opcode="PRODUCE", status="OK") == N + 3
            for side in ("listen", "upstream"):
                assert proxy.value("frametap_tls_handshakes_total", route="fly", side=side,
                                   outcome="ok") == 2, side
                assert proxy.value("frametap_tls_handshake_duration_seconds_count",
                                   route="fly", side=side) == 2
                for outcome in ("timeout", "verify_failed", "protocol_error"):
                    assert proxy.value("frametap_tls_handshakes_total", route="fly",
                                       side=side, outcome=outcome) == 0
            assert proxy.value("frametap_connections_total", route="fly") == 2
            assert srv.server.connections_total == 2
        finally:
            proxy.close()
    rows = pa.concat_tables([pq.read_table(f) for f in
                             glob.glob(str(tmp_path / "logs" / "*.parquet"))]).to_pylist()
    assert len([r for r in rows if r["opcode_name"] == "PRODUCE"]) == 2 * (N + 3)
    for r in rows:
        attrs = dict(r["attrs"])
        assert attrs["tls_version"] == "TLSv1.3" and attrs["tls_cipher"].startswith("TLS_")
        assert attrs["upstream_tls_version"] == "TLSv1.3"
        assert "upstream_tls_sni" not in attrs     # an IP literal: verified, no SNI sent
    text = keylog.read_text()
    assert "CLIENT_HANDSHAKE_TRAFFIC_SECRET" in text     # both sides' sessions


def test_half_close_waits_for_the_answers_on_a_tls_upstream(certs):
    """A plain client writes its requests, then its FIN (shutdown SHUT_WR), then reads.
    A TLS upstream cannot half-close, so the proxy closes it once the requests already
    sent are answered: every answer reaches the client, then the EOF."""
    from proxy.protocols.flymq.codec import ProduceRequest, decode_frame
    n = 50
    with fly_server(certs.cert, certs.key) as srv:
        proxy = Proxy([fly_route("fly", srv.address, {"mode": "originate",
                                                      "upstream": {"ca": certs.ca}})])
        try:
            with FlyMQClient("127.0.0.1", proxy.port(), timeout=10) as c:
                c.create_topic("half", 1)
            with socket.create_connection(("127.0.0.1", proxy.port()), timeout=10) as s:
                s.sendall(b"".join(ProduceRequest("half", b"v%d" % i).to_frame()
                                   for i in range(n)))
                s.shutdown(socket.SHUT_WR)
                got = read_to_eof(s)
            answers = 0
            buf = memoryview(got)
            while buf:
                frame = decode_frame(buf)
                assert frame is not None, "a truncated answer"
                answers += 1
                buf = buf[frame.size:]
            assert answers == n
            assert proxy.value("frametap_responses_total", route="fly", protocol="flymq",
                               opcode="PRODUCE", status="OK") == n
        finally:
            proxy.close()


# ---- handshake failures: counted by outcome, other connections unaffected -------------------

def test_handshake_failures_counted(certs, client_tls):
    good_tls = client_tls(ClientTLS(ca=certs.ca))
    listen = {"cert": certs.cert, "key": certs.key, "handshake_timeout": 0.5}
    with fly_server(certs.cert, certs.key) as good, \
            fly_server(certs.expired_cert, certs.expired_key) as expired:
        proxy = Proxy([fly_route("good", good.address, {"mode": "both", "listen": listen,
                                                        "upstream": {"ca": certs.ca}}),
                       fly_route("expired", expired.address, {
                           "mode": "both", "listen": listen, "upstream": {"ca": certs.ca}}),
                       fly_route("mismatch", good.address, {
                           "mode": "both", "listen": listen,
                           "upstream": {"ca": certs.ca, "server_name": "other.example"}})])
        try:
            keep = FlyMQClient("127.0.0.1", proxy.port(0), timeout=10)
            keep.create_topic("t", 1)
            keep.produce("t", b"before")

            def count(outcome, route="good", side="listen"):
                return proxy.value("frametap_tls_handshakes_total", route=route, side=side,
                                   outcome=outcome)

            # a client that trusts another CA refuses the proxy's certificate
            client_tls(ClientTLS(ca=certs.other_ca))
            with pytest.raises(ssl.SSLCertVerificationError):
                FlyMQClient("127.0.0.1", proxy.port(0), timeout=5)
            proxy.wait("frametap_tls_handshakes_total", 1, route="good", side="listen",
                       outcome="verify_failed")
            # a plain client on the TLS listener
            with socket.create_connection(("127.0.0.1", proxy.port(0)), 5) as s:
                s.sendall(b"\xaf\x01\x01\x00\x00\x00\x00\x05hello")
                s.settimeout(5)
                try:
                    s.recv(100)               # closed (or reset) by the proxy
                except ConnectionResetError:
                    pass
            proxy.wait("frametap_tls_handshakes_total", 1, route="good", side="listen",
                       outcome="protocol_error")
            # a client that connects and never speaks: the handshake times out (0.5 s)
            with socket.create_connection(("127.0.0.1", proxy.port(0)), 5) as s:
                s.settimeout(5)
                t0 = time.monotonic()
                try:
                    assert s.recv(100) == b""
                except ConnectionResetError:
                    pass
                assert 0.3 < time.monotonic() - t0 < 4
            proxy.wait("frametap_tls_handshakes_total", 1, route="good", side="listen",
                       outcome="timeout")
            # an upstream whose certificate expired: the proxy refuses it, the client's
            # connection is closed, the upstream side counts verify_failed
            client_tls(good_tls)
            with pytest.raises((ConnectionError, OSError)):
                with FlyMQClient("127.0.0.1", proxy.port(1), timeout=5) as c:
                    c.create_topic("t", 1)
            proxy.wait("frametap_tls_handshakes_total", 1, route="expired", side="upstream",
                       outcome="verify_failed")
            assert count("ok", "expired", "listen") == 1
            assert proxy.value("frametap_upstream_connect_failures_total", route="expired") == 1
            # an upstream certificate for other names than server_name
            with pytest.raises((ConnectionError, OSError)):
                with FlyMQClient("127.0.0.1", proxy.port(2), timeout=5) as c:
                    c.create_topic("t", 1)
            proxy.wait("frametap_tls_handshakes_total", 1, route="mismatch", side="upstream",
                       outcome="verify_failed")
            # the first connection carried on through all of it
            keep.produce("t", b"after")
            keep.close()
            assert count("ok") == 1 and count("ok", side="upstream") == 1
            assert proxy.value("frametap_frames_total", route="good", protocol="flymq",
                               direction="c2s", opcode="PRODUCE") == 2
        finally:
            proxy.close()


# ---- passthrough ----------------------------------------------------------------------------

def _client_hello(name):
    ctx = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname=name)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


def test_client_hello_sni_parser():
    hello = _client_hello("broker-7.staging.example")
    assert client_hello_sni(hello) == ("sni", "broker-7.staging.example")
    for cut in range(len(hello)):                 # any prefix: wait for more
        assert client_hello_sni(hello[:cut])[0] == "more"
    assert client_hello_sni(_client_hello("127.0.0.1")) == ("no_sni", None)
    assert client_hello_sni(b"GET / HTTP/1.1\r\n") == ("not_tls", None)
    assert client_hello_sni(b"\x16\x03\x01\x00\x05\x01\x00\x00\x01\x03")[0] == "bad"
    assert client_hello_sni(b"\x16\x03\x01\xff\xff")[0] == "not_tls"   # over a record's size


def test_passthrough_relays_undecoded_and_reads_sni(certs, client_tls, caplog):
    client_tls(ClientTLS(ca=certs.ca, server_name="localhost"))
    with fly_server(certs.cert, certs.key) as srv:
        proxy = Proxy([fly_route("pass", srv.address, {"mode": "passthrough"})])
        try:
            with caplog.at_level(logging.INFO, logger="frametap.tls"):
                produce(proxy.port(), True, n=5)
                with socket.create_connection(("127.0.0.1", proxy.port()), 5) as s:
                    s.sendall(b"\xaf\x01 not a ClientHello")
                # the proxy may not have accepted that connection yet (active reads 0
                # before it does): wait until it has seen its first bytes, then until
                # it is gone
                proxy.wait("frametap_tls_client_hellos_total", 1, route="pass",
                           outcome="not_tls")
                proxy.wait("frametap_connections_active", 0, route="pass")
            assert proxy.value("frametap_tls_client_hellos_total", route="pass",
                               outcome="sni") == 1
            assert proxy.value("frametap_tls_client_hellos_total", route="pass",
                               outcome="not_tls") == 1
            assert proxy.value("frametap_bytes_total", route="pass", direction="c2s") > 5 * 20
            assert proxy.value("frametap_bytes_total", route="pass", direction="s2c") > 0
            assert proxy.value("frametap_frames_total", route="pass", protocol="flymq",
                               direction="c2s", opcode="PRODUCE") == 0    # never decoded
            assert any("SNI 'localhost'" in r.getMessage() for r in caplog.records)
        finally:
            proxy.close()


# ---- permissive: TLS and plain RocketMQ clients on one listener -----------------------------

def test_rocketmq_permissive_tls_and_plain_on_one_listener(certs):
    from loadgen.rocketmq.client import RocketMQClient
    from loadgen.rocketmq.server import RocketMQServerThread
    with RocketMQServerThread() as srv:
        proxy = Proxy([{"name": "broker", "protocol": "rocketmq", "listen": "127.0.0.1:0",
                        "upstream": srv.broker_address,
                        "tls": {"mode": "permissive",
                                "listen": {"cert": certs.cert, "key": certs.key}}}])
        try:
            secure = RocketMQClient("127.0.0.1", proxy.port(), timeout=10,
                                    tls=ClientTLS(ca=certs.ca))
            plain = RocketMQClient("127.0.0.1", proxy.port(), timeout=10, tls=None)
            assert isinstance(secure._sock, ssl.SSLSocket)
            assert not isinstance(plain._sock, ssl.SSLSocket)
            for client in (secure, plain, secure):
                client.send("TopicTest", b"hello", queue_id=0)
            secure.close()
            plain.close()
            proxy.wait("frametap_connections_active", 0, route="broker")
            assert proxy.value("frametap_connections_total", route="broker") == 2
            assert proxy.value("frametap_tls_handshakes_total", route="broker",
                               side="listen", outcome="ok") == 1
            sent = proxy.value("frametap_responses_total", route="broker", protocol="rocketmq",
                               opcode="SEND_MESSAGE_V2", status="SUCCESS")
            assert sent == 3
            assert proxy.value("frametap_protocol_errors_total", route="broker",
                               protocol="rocketmq", direction="c2s", reason="bad_header") == 0
        finally:
            proxy.close()


def test_connection_attrs_merge_with_frame_attrs():
    """The compiled frame log's merge (Arrow compute): a row keeps its frame's own attrs
    first, then gets its connection's; rows of connections without any are untouched."""
    from proxy.framelog_native import NativeSource
    src = NativeSource.__new__(NativeSource)
    src.conn_attrs = {7: {"tls_version": "TLSv1.3"},
                      9: {"tls_version": "TLSv1.2", "tls_cipher": "X"}}
    mtype = pa.map_(pa.string(), pa.string())
    frames = pa.array([None, [("client", "a")], None, [("k", "v"), ("k2", "v2")], None], mtype)
    rows = pa.array([0, 0, 1, 2, 1], pa.int32())          # each row's index in conn_keys
    out = src._with_conn_attrs(frames, [7, 8, 9], rows, 5).to_pylist()
    assert out == [[("tls_version", "TLSv1.3")],
                   [("client", "a"), ("tls_version", "TLSv1.3")],
                   None,
                   [("k", "v"), ("k2", "v2"), ("tls_version", "TLSv1.2"), ("tls_cipher", "X")],
                   None]
    assert src._with_conn_attrs(frames, [8], pa.array([0] * 5, pa.int32()), 5) is frames
