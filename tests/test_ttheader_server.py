"""The reference Thrift service (``frametap serve ttheader``): every dialect and protocol
answered by Apache's library-encoded payloads, declared and application exceptions, the
error rate, per-method service time, bad input, and Apache's own THeader and framed
clients calling it through the proxy."""

import socket
import subprocess
import sys
import time

import pytest

from loadgen.ttheader.client import ThriftClient
from loadgen.ttheader.server import ThriftServerThread
from proxy.protocols.ttheader import codec
from tests.test_ttheader_apache import Proxy
from tests.thrift_real import client as apache_client, thrift_or_skip

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gen():
    return thrift_or_skip()


@pytest.mark.parametrize("transport", ["ttheader", "theader", "framed"])
@pytest.mark.parametrize("protocol", ["binary", "compact"])
def test_every_dialect(gen, transport, protocol):
    from thrift.Thrift import TApplicationException
    with ThriftServerThread() as srv:
        c = ThriftClient("127.0.0.1", srv.port, transport, protocol,
                         zlib=transport == "theader")
        assert c.call("echo", "x") == "x" and c.last_status == "OK"
        user = c.call("getUser", 42)
        assert (user.id, user.name, user.tags) == (42, "user-00042", ["tier-0", "demo"])
        assert [u.id for u in c.call("listUsers", 4, {"region": "eu"})] == [1, 2, 3, 4]
        assert c.call("placeOrder", 7, [100, 200]).items == [100, 200]
        assert c.call("ping") is None and c.call("log", "line") is None
        with pytest.raises(gen.ttypes.NotFound):
            c.call("getUser", 0)
        assert c.last_status == "EXCEPTION"
        with pytest.raises(TApplicationException):
            c.call("retired")
        assert c.last_status == "UNKNOWN_METHOD"
        assert c.call("echo", "still") == "still"
        c.close()
        assert srv.server.handler.logged == 1


def test_kitex_reply_headers_and_seq_ids():
    with ThriftServerThread() as srv:
        s = socket.create_connection(("127.0.0.1", srv.port), 5)
        call = codec.ttheader(codec.binary_message("ping", codec.CALL, 77, b"\x00"), seq=77,
                              flags=1, intinfo={2: "log-9", 9: "ping"}, inner_framed=True)
        s.sendall(call)
        transport, fields, payload = codec.split(codec.read_frame(s))
        s.close()
    assert transport == "ttheader" and fields["seq"] == 77 and fields["flags"] == 1
    assert fields["intinfo"][9] == "ping" and fields["intinfo"][2] == "log-9"
    assert fields["strinfo"] == {"biz-status": "0"} and fields.get("inner_framed")
    assert codec.parse_message_header(payload) == ("ping", codec.REPLY, 77)


def test_error_rate_and_method_time():
    with ThriftServerThread(error_rate=1.0, method_times={"echo": "30ms"}, seed=1) as srv:
        c = ThriftClient("127.0.0.1", srv.port)
        t0 = time.perf_counter()
        c.call("echo", "slow")
        assert time.perf_counter() - t0 >= 0.025
        t0 = time.perf_counter()
        c.call("ping")
        assert time.perf_counter() - t0 < 0.025
        failures = 0
        for i in range(5):
            try:
                c.call("getUser", i + 1)
            except Exception:
                failures += 1
        assert failures == 5 and c.last_status == "EXCEPTION"
        c.close()


@pytest.mark.parametrize("garbage", [b"GET / HTTP/1.1\r\n\r\n", b"\x80\x01\x00\x01junk",
                                     b"\x00\x00\x00\x08\x10\x00\x00\x00\x00\x00\x00\x00"])
def test_garbage_closes_that_connection_only(garbage):
    with ThriftServerThread() as srv:
        good = ThriftClient("127.0.0.1", srv.port)
        bad = socket.create_connection(("127.0.0.1", srv.port), 5)
        bad.sendall(garbage)
        bad.settimeout(5)
        assert bad.recv(10) == b""
        bad.close()
        assert good.call("echo", "ok") == "ok"
        good.close()


@pytest.mark.parametrize("mode", ["header-binary", "header-compact", "framed-binary"])
def test_apache_clients_through_proxy_to_reference_service(gen, tmp_path, mode):
    """Apache's THeader client (and its framed client) against our service via frametap."""
    from thrift.Thrift import TApplicationException
    with ThriftServerThread() as srv:
        proxy = Proxy(srv.port, tmp_path)
        try:
            c, _, trans = apache_client(gen, proxy.port, mode, service="LegacyUserService")
            for i in range(5):
                assert c.getUser(i + 1).id == i + 1
            with pytest.raises(gen.ttypes.NotFound):
                c.getUser(-5)
            with pytest.raises(TApplicationException):
                c.retired()
            c.log("x")
            c.ping()
            trans.close()
            assert proxy.value("frametap_responses_total", opcode="getUser", status="OK") == 5
            assert proxy.value("frametap_responses_total", opcode="getUser",
                               status="EXCEPTION") == 1
            assert proxy.value("frametap_responses_total", opcode="retired",
                               status="UNKNOWN_METHOD") == 1
            assert proxy.value("frametap_frames_total", direction="c2s", opcode="log") == 1
            assert proxy.value("frametap_request_duration_seconds_count", opcode="ping",
                               outcome="ok") == 1
            assert proxy.errors() == {}
        finally:
            proxy.close()


def test_serve_command_help_and_bad_arguments():
    r = subprocess.run([sys.executable, "-m", "proxy", "serve", "ttheader", "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--transport" in r.stdout and "--method-time" in r.stdout
    r = subprocess.run([sys.executable, "-m", "proxy", "serve", "ttheader", "--error-rate",
                        "2"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "expected a fraction" in r.stderr
    assert "Traceback" not in r.stderr
