"""Command line and config: one clear line and exit 2 for user errors; --help everywhere;
admin endpoints; graceful shutdown of a real proxy process on SIGTERM."""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from proxy import protocols
from proxy.config import config_from_dict
from proxy.errors import ConfigError
from tests.conftest import free_port
from tests.support import frame

FRAMETAP = [sys.executable, "-m", "proxy"]


def frametap(*args, **kw):
    return subprocess.run(FRAMETAP + list(args), capture_output=True, text=True, timeout=60, **kw)


def write(tmp_path, text):
    p = tmp_path / "frametap.toml"
    p.write_text(text)
    return str(p)


GOOD_ROUTE = """
[[routes]]
name = "fly"
protocol = "flymq"
listen = "127.0.0.1:0"
upstream = "127.0.0.1:9092"
"""


@pytest.mark.parametrize("text, needle", [
    (GOOD_ROUTE.replace('"flymq"', '"mqtt"'), "routes[0].protocol = 'mqtt': expected one of"),
    (GOOD_ROUTE.replace('"127.0.0.1:9092"', '"nohost"'), "routes[0].upstream = 'nohost'"),
    (GOOD_ROUTE.replace('"127.0.0.1:9092"', '"h:99999"'), "port must be 1..65535"),
    (GOOD_ROUTE + "colour = 1\n", "routes[0]: unknown key 'colour'"),
    (GOOD_ROUTE + "request_timeout = -1\n", "routes[0].request_timeout = -1"),
    (GOOD_ROUTE + "max_frame_bytes = \"big\"\n", "routes[0].max_frame_bytes = 'big'"),
    ("[admin]\nlisten = \"x\"\n" + GOOD_ROUTE, "admin.listen = 'x'"),
    ("[admin]\nport = 1\n" + GOOD_ROUTE, "admin: unknown key 'port'"),
    ("", "routes: expected at least one"),
    ("[[routes]]\nprotocol = \"flymq\"\n", "missing required key 'listen'"),
    (GOOD_ROUTE + GOOD_ROUTE, "duplicate route name"),
    ("[framelog]\nformat = \"csv\"\n" + GOOD_ROUTE, "framelog.format = 'csv'"),
    (GOOD_ROUTE.replace('"flymq"', '"ttheader"'), "not implemented in this build"),
    ("not toml ===", "invalid TOML"),
])
def test_bad_config_exits_2_with_one_line(tmp_path, text, needle):
    r = frametap("proxy", "-c", write(tmp_path, text))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_missing_config_file(tmp_path):
    r = frametap("proxy", "-c", str(tmp_path / "nope.toml"))
    assert r.returncode == 2 and "not found" in r.stderr


def test_port_in_use_exits_2():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = frametap("proxy", "--protocol", "flymq", "--listen", f"127.0.0.1:{port}",
                     "--upstream", "127.0.0.1:9")
    assert r.returncode == 2
    assert f"routes[0].listen = '127.0.0.1:{port}': address already in use" in r.stderr
    assert "Traceback" not in r.stderr


def test_single_route_flags_need_all_three():
    r = frametap("proxy", "--protocol", "flymq")
    assert r.returncode == 2 and "missing --listen, --upstream" in r.stderr


def test_config_values_parsed():
    cfg = config_from_dict({"admin": {"listen": "[::1]:9400"}, "proxy": {"shutdown_timeout": 3},
                            "routes": [{"protocol": "flymq", "listen": "0.0.0.0:5553",
                                        "upstream": "mq.staging:9092", "max_frame_bytes": 1024,
                                        "request_timeout": 2.5, "max_connections": 7}]})
    r = cfg.routes[0]
    assert cfg.admin_listen == ("::1", 9400) and cfg.shutdown_timeout == 3.0
    assert r.name == "flymq-0" and r.upstream == ("mq.staging", 9092)
    assert (r.max_frame_bytes, r.request_timeout, r.max_connections) == (1024, 2.5, 7)
    with pytest.raises(ConfigError, match="expected an integer >= 1"):
        config_from_dict({"routes": [{"protocol": "flymq", "listen": "a:1", "upstream": "b:2",
                                      "max_connections": 0}]})


@pytest.mark.parametrize("args", [["--help"], ["proxy", "--help"], ["serve", "--help"],
                                  ["demo", "--help"], ["load", "--help"]] +
                         [["serve", spec.name, "--help"] for spec in protocols.specs()
                          if spec.server])
def test_every_command_has_help(args):
    r = frametap(*args)
    assert r.returncode == 0, r.stderr
    assert "usage" in r.stdout.lower() or "Usage" in r.stdout


@pytest.mark.parametrize("name, needle", [
    ("ttheader", "serve: protocol 'ttheader' is not implemented in this build (available: "),
    ("kafka", "serve: protocol 'kafka' is not a protocol (expected one of: "),
])
def test_serve_unavailable_protocol_one_line(name, needle):
    r = frametap("serve", name)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr


def start_proxy_process(tmp_path, upstream_port, extra=""):
    port, admin = free_port(), free_port()
    cfg = write(tmp_path, f"""
[admin]
listen = "127.0.0.1:{admin}"
[proxy]
shutdown_timeout = {extra or 5}
[[routes]]
name = "fly"
protocol = "flymq"
listen = "127.0.0.1:{port}"
upstream = "127.0.0.1:{upstream_port}"
""")
    proc = subprocess.Popen(FRAMETAP + ["proxy", "-c", cfg], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 20
    while True:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=1).status == 200:
                break
        except (urllib.error.URLError, ConnectionError):
            pass
        if time.time() > deadline or proc.poll() is not None:
            proc.kill()
            raise AssertionError("proxy did not become ready: " + proc.stdout.read())
        time.sleep(0.1)
    return proc, port, admin


class SlowUpstream:
    """Blocking upstream that answers each 8-byte-header frame after ``delay`` seconds."""

    def __init__(self, delay):
        import threading
        self.delay = delay
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        import threading
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._conn, args=(c,), daemon=True).start()

    def _conn(self, c):
        with c:
            while True:
                head = c.recv(8, socket.MSG_WAITALL)
                if len(head) < 8:
                    return
                n = int.from_bytes(head[4:], "big")
                if n:
                    c.recv(n, socket.MSG_WAITALL)
                time.sleep(self.delay)
                c.sendall(frame(head[2], b"done"))


def test_admin_endpoints_and_graceful_shutdown(tmp_path):
    up = SlowUpstream(delay=1.0)
    proc, port, admin = start_proxy_process(tmp_path, up.port)
    try:
        assert urllib.request.urlopen(f"http://127.0.0.1:{admin}/healthz").read() == b"ok\n"
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{admin}/nope")
        assert e.value.code == 404
        c = socket.create_connection(("127.0.0.1", port))
        c.sendall(frame(0x08))                            # answered after 1 s
        time.sleep(0.3)
        body = urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics").read().decode()
        assert 'frametap_requests_in_flight{protocol="flymq",route="fly"} 1.0' in body
        assert 'frametap_connections_active{route="fly"} 1.0' in body
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        with pytest.raises(OSError):                      # no longer accepting
            socket.create_connection(("127.0.0.1", port), timeout=1).recv(1)
            raise OSError("accepted")
        c.settimeout(5)
        reply = c.recv(64)                                # the in-flight answer still arrives
        assert reply == frame(0x08, b"done")
        c.close()
        assert proc.wait(timeout=10) == 0                 # drained, then exited
    finally:
        proc.kill()


def test_drain_timeout_closes_idle_connections(tmp_path):
    up = SlowUpstream(delay=0)
    proc, port, admin = start_proxy_process(tmp_path, up.port, extra="1.0")
    try:
        c = socket.create_connection(("127.0.0.1", port))
        c.sendall(frame(0x08))
        c.recv(64)
        t0 = time.time()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
        assert 0.8 < time.time() - t0 < 5                 # waited the drain timeout, no more
        c.settimeout(5)
        assert c.recv(64) == b""                          # then closed the idle connection
    finally:
        proc.kill()


def test_second_signal_skips_the_drain(tmp_path):
    up = SlowUpstream(delay=30)
    proc, port, admin = start_proxy_process(tmp_path, up.port, extra="60")
    try:
        c = socket.create_connection(("127.0.0.1", port))
        c.sendall(frame(0x08))                            # would be answered in 30 s
        time.sleep(0.3)
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert proc.poll() is None                        # draining (up to 60 s)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert time.time() - t0 < 5
        out = proc.stdout.read()
        assert "second stop signal" in out
    finally:
        proc.kill()
