"""The load generator's TLS options: the reference servers' --tls-cert/--tls-key and the
Locust users' --tls* options (loadgen/tlsopts.py). Mistakes are one line and exit 2;
a FRAMETAP_TLS* environment turns TLS on for every sync client."""

import ssl
import subprocess
import sys

import pytest

from loadgen import tlsopts
from loadgen.flymq.client import FlyMQClient
from loadgen.flymq.server import FlyMQServerThread
from tests.tls_certs import certs, server_context  # noqa: F401  (fixture)
from tests._support.processes import ROOT


def run(*args, timeout=120):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def test_serve_tls_options_are_checked(certs):
    r = run("-m", "proxy", "serve", "flymq", "--listen", "127.0.0.1:0",
            "--tls-cert", certs.cert)
    assert r.returncode == 2 and r.stderr.strip().endswith("--tls-cert and --tls-key go together")
    r = run("-m", "proxy", "serve", "flymq", "--listen", "127.0.0.1:0",
            "--tls-cert", certs.cert, "--tls-key", certs.other_key)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "cannot load them" in lines[0], r.stderr
    r = run("-m", "proxy", "serve", "flymq", "--help")
    assert r.returncode == 0 and "--tls-cert" in r.stdout


@pytest.mark.slow
def test_locust_tls_options(certs):
    r = run("-m", "loadgen.plugins", "--help")
    assert r.returncode == 0
    for opt in ("--tls ", "--tls-ca", "--tls-insecure", "--tls-server-name",
                "--tls-client-cert", "--tls-client-key"):
        assert opt in r.stdout, opt
    r = run("-m", "loadgen.plugins", "--headless", "-u", "1", "-t", "1s", "--host",
            "flymq://127.0.0.1:9", "--tls-ca", "/nonexistent/ca.pem", "FlyMQProducer")
    assert r.returncode == 2, r.stderr[-2000:]
    assert "locust: TLS: cannot load /nonexistent/ca.pem" in r.stderr
    assert "Traceback" not in r.stderr


def test_environment_turns_tls_on(certs, monkeypatch):
    assert tlsopts.from_env({}) is None
    with pytest.raises(ValueError, match="cannot load /nonexistent.pem"):
        tlsopts.from_env({"FRAMETAP_TLS_CA": "/nonexistent.pem"})
    tls = tlsopts.from_env({"FRAMETAP_TLS": "1", "FRAMETAP_TLS_CA": certs.ca})
    monkeypatch.setattr(tlsopts, "_default", tlsopts._UNSET)
    monkeypatch.setenv("FRAMETAP_TLS_CA", certs.ca)
    srv = FlyMQServerThread()
    srv.server.ssl_context = server_context(certs.cert, certs.key)
    with srv:
        with FlyMQClient("127.0.0.1", srv.port, timeout=5) as c:
            assert isinstance(c._sock, ssl.SSLSocket)
            assert c._sock.version() == "TLSv1.3"
            c.create_topic("t", 1)
            c.produce("t", b"over tls")
    assert tls.context.verify_mode == ssl.CERT_REQUIRED
    assert tlsopts.ClientTLS(insecure=True).context.verify_mode == ssl.CERT_NONE
