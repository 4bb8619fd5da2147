"""Apache Thrift's own Python TLS transports through a ``both`` route: ``TSSLSocket`` +
THeader (binary, with an info header) against ``TSSLServerSocket`` (TThreadedServer,
THeaderProtocolFactory), certificates made by the test. Every call is counted by method
and status exactly as over plain TCP; the frame log's rows carry the TLS version and
cipher beside THeader's own info keys."""

import glob
import ssl
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from proxy.app import ProxyApp
from proxy.config import config_from_dict
from tests.conftest import LoopThread
from tests.support import sample
from tests.thrift_real import ApacheServer, thrift_or_skip
from tests.tls_certs import certs  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow
N = 6


@pytest.fixture(scope="module")
def gen():
    return thrift_or_skip()


@pytest.fixture
def tls_server(gen, certs):
    """Apache's TThreadedServer on a TSSLServerSocket (port 0, read back)."""
    from thrift.transport import TSSLSocket
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certs.cert, certs.key)
    server = ApacheServer(gen, transport=TSSLSocket.TSSLServerSocket(
        host="127.0.0.1", port=0, ssl_context=ctx), client_types=("HEADERS",)).start()
    yield server.port, server.handler
    server.stop()


def test_apache_tssl_theader_through_both_route(gen, tls_server, certs, tmp_path):
    from thrift.protocol.THeaderProtocol import THeaderProtocol
    from thrift.Thrift import TApplicationException
    from thrift.transport import TSSLSocket
    from thrift.transport.THeaderTransport import THeaderClientType, THeaderSubprotocolID
    port, handler = tls_server
    lt = LoopThread()
    app = ProxyApp(config_from_dict({
        "routes": [{"name": "thrift", "protocol": "ttheader", "listen": "127.0.0.1:0",
                    "upstream": f"127.0.0.1:{port}",
                    "tls": {"mode": "both", "listen": {"cert": certs.cert, "key": certs.key},
                            "upstream": {"ca": certs.ca, "server_name": "localhost"}}}],
        "framelog": {"dir": str(tmp_path)}}))
    lt.run(app.start())
    proxy_port = app.routes[0].address[1]

    def value(name, **labels):
        return lt.call(lambda: sample(app, name, route="thrift", **labels)) or 0

    try:
        ctx = ssl.create_default_context(cafile=certs.ca)
        sock = TSSLSocket.TSSLSocket("127.0.0.1", proxy_port, ssl_context=ctx,
                                     server_hostname="localhost")
        sock.setTimeout(10000)
        proto = THeaderProtocol(sock, [THeaderClientType.HEADERS], THeaderSubprotocolID.BINARY)
        client = gen.UserService.Client(proto)
        sock.open()
        proto.set_header(b"client", b"pytest-tls")
        for i in range(N):
            assert client.echo("tls-%d" % i) == "tls-%d" % i
        with pytest.raises(gen.ttypes.NotFound):
            client.getUser(-1)
        with pytest.raises(TApplicationException):
            client.placeOrder(1, [])
        client.log("over tls")
        client.ping()
        sock.close()
        deadline = time.monotonic() + 10
        while lt.call(lambda: len(app.routes[0].connections)) and time.monotonic() < deadline:
            time.sleep(0.02)
        p = {"protocol": "ttheader"}
        assert value("frametap_responses_total", opcode="echo", status="OK", **p) == N
        assert value("frametap_responses_total", opcode="getUser", status="EXCEPTION", **p) == 1
        assert value("frametap_responses_total", opcode="placeOrder", status="INTERNAL_ERROR",
                     **p) == 1
        assert value("frametap_responses_total", opcode="ping", status="OK", **p) == 1
        assert value("frametap_frames_total", direction="c2s", opcode="log", **p) == 1
        assert value("frametap_unmatched_responses_total", **p) == 0
        for side in ("listen", "upstream"):
            assert value("frametap_tls_handshakes_total", side=side, outcome="ok") == 1
        assert handler.logged == ["over tls"]
        assert lt.call(lambda: app.routes[0].stats.snapshot()["errors"]) == {}
    finally:
        lt.run(app.shutdown(2))
        lt.stop()
    rows = pa.concat_tables([pq.read_table(f) for f in
                             glob.glob(str(tmp_path / "*.parquet"))]).to_pylist()
    assert len(rows) == 2 * (N + 4) - 1          # the oneway log has no reply
    for r in rows:
        attrs = dict(r["attrs"])
        assert attrs["tls_version"] == "TLSv1.3" and attrs["tls_cipher"].startswith("TLS_")
        assert attrs.get("tls_sni") == "localhost"
    tagged = [dict(r["attrs"]) for r in rows if "client" in dict(r["attrs"])]
    assert tagged and all(a["client"] == "pytest-tls" for a in tagged)
