"""Command line and config: one clear line and exit 2 for user errors; --help everywhere;
admin endpoints; graceful shutdown of a real proxy process on SIGTERM."""

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from proxy import protocols
from proxy.addresses import parse_address
from proxy.config import RANGES, config_from_dict
from proxy.errors import ConfigError
from tests._support.processes import FRAMETAP, proxy_process
from tests.support import frame


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
    ("not toml ===", "invalid TOML"),
    # issue 8: values that used to pass validation, or end in a traceback
    (GOOD_ROUTE + "request_timeout = inf\n", "routes[0].request_timeout = inf: expected a "
                                             "number 0.001..3600 seconds"),
    (GOOD_ROUTE + "request_timeout = nan\n", "routes[0].request_timeout = nan"),
    (GOOD_ROUTE + "request_timeout = 1e10\n", "routes[0].request_timeout = 10000000000.0"),
    ("[proxy]\nshutdown_timeout = inf\n" + GOOD_ROUTE,
     "proxy.shutdown_timeout = inf: expected a number 0..3600 seconds"),
    ("proxy = 5\n" + GOOD_ROUTE, "proxy = 5: expected a table"),
    ("framelog = 5\n" + GOOD_ROUTE, "framelog = 5: expected a table"),
    ("framelog = \"x\"\n" + GOOD_ROUTE, "framelog = 'x': expected a table"),
    ("admin = [1]\n" + GOOD_ROUTE, "admin = [1]: expected a table"),
    ("routes = 5\n", "routes = 5: expected an array of tables"),
    ("routes = [5]\n", "routes[0] = 5: expected a table"),
    (GOOD_ROUTE + "options = 5\n", "routes[0].options = 5: expected a table"),
    (GOOD_ROUTE.replace('"127.0.0.1:9092"', '"[::1:9092"'),
     "routes[0].upstream = '[::1:9092': unclosed '['"),
    (GOOD_ROUTE.replace('"127.0.0.1:9092"', '"::1:9092"'), "IPv6 address needs brackets"),
    (GOOD_ROUTE + "max_connections = 1000001\n", "expected an integer 1..1000000"),
    (GOOD_ROUTE + "max_frame_bytes = 2147483649\n", "expected an integer 1..2147483648 bytes"),
    (GOOD_ROUTE + "connect_timeout = 601\n", "expected a number 0.001..600 seconds"),
    (GOOD_ROUTE + "request_timeout = true\n", "routes[0].request_timeout = True"),
    (GOOD_ROUTE + "half_close_timeout = 0\n", "routes[0].half_close_timeout = 0: expected a "
                                              "number 0.001..86400 seconds"),
    (GOOD_ROUTE + "idle_timeout = 604801\n", "expected a number 0..604800 seconds, 0 = never"),
    ("[proxy]\nmax_pending_bytes = 1000\n" + GOOD_ROUTE,
     "proxy.max_pending_bytes = 1000: expected an integer 1048576..68719476736 bytes "
     "(1 MiB..64 GiB)"),
    (GOOD_ROUTE.replace('name = "fly"', "name = 5"), "routes[0].name = 5"),
    ("[framelog]\ndir = 7\n" + GOOD_ROUTE, "framelog.dir = 7"),
    ("x = " + "1" * 5000 + "\n", "invalid TOML"),
    ("x = " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
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


def one_error_line(r):
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_config_is_a_directory(tmp_path):
    line = one_error_line(frametap("proxy", "-c", str(tmp_path)))
    assert line == f"frametap: error: config file {str(tmp_path)!r}: is a directory " \
                   "(expected a TOML file)"


def test_config_not_utf8(tmp_path):
    p = tmp_path / "latin1.toml"
    p.write_bytes(GOOD_ROUTE.replace("fly", "fl\xfc").encode("latin-1"))
    line = one_error_line(frametap("proxy", "-c", str(p)))
    assert "not UTF-8 text (byte 0xfc at offset" in line


@pytest.mark.parametrize("flags, expected", [
    (["--listen", "127.0.0.1:x"], "--listen: port 'x' is not a number (got '127.0.0.1:x')"),
    (["--upstream", "[::1:9092"], "--upstream: unclosed '['"),
    (["--protocol", "mqtt"], "--protocol: expected one of rocketmq, "),
    (["--request-timeout", "inf"], "--request-timeout: expected a number 0.001..3600 seconds "
                                   "(got inf)"),
    (["--request-timeout", "nan"], "--request-timeout: expected a number"),
    (["--drain-timeout", "-1"], "--drain-timeout: expected a number 0..3600 seconds (got -1.0)"),
    (["--max-frame-bytes", "0"], "--max-frame-bytes: expected an integer 1..2147483648"),
    (["--admin", "localhost"], "--admin: expected 'host:port'"),
    (["--name", ""], "--name: expected a non-empty string"),
])
def test_flag_errors_name_the_flag(flags, expected):
    args = {"--protocol": "flymq", "--listen": "127.0.0.1:0", "--upstream": "127.0.0.1:9"}
    args.update(dict(zip(flags[::2], flags[1::2])))
    line = one_error_line(frametap("proxy", *[x for kv in args.items() for x in kv]))
    assert line.startswith("frametap: error: " + expected), line
    assert "routes[0]" not in line


@pytest.mark.parametrize("flags, expected", [
    (["--admin", "[::1"], "--admin: unclosed '['"),
    (["--drain-timeout", "inf"], "--drain-timeout: expected a number 0..3600 seconds (got inf)"),
])
def test_flag_errors_with_config_file(tmp_path, flags, expected):
    line = one_error_line(frametap("proxy", "-c", write(tmp_path, GOOD_ROUTE), *flags))
    assert line.startswith("frametap: error: " + expected), line


def test_port_in_use_exits_2():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = frametap("proxy", "--protocol", "flymq", "--listen", f"127.0.0.1:{port}",
                     "--upstream", "127.0.0.1:9")
    assert r.returncode == 2
    assert f"--listen '127.0.0.1:{port}': address already in use" in r.stderr
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
    with pytest.raises(ConfigError, match=r"expected an integer 1\.\.1000000$"):
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
    if args[0] == "load":                  # Locust's help, with frametap's options in it
        assert "--frametap-framelog" in r.stdout and "--frametap-run-id" in r.stdout
    if args[0] == "proxy":
        assert "--framelog" in r.stdout and "--run-id" in r.stdout


@pytest.mark.parametrize("name, needle", [
    ("kafka", "serve: protocol 'kafka' is not a protocol (expected one of: "),
])
def test_serve_unavailable_protocol_one_line(name, needle):
    r = frametap("serve", name)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr


def start_proxy_process(tmp_path, upstream_port, extra=""):
    """A proxy process on port 0 (route ``fly`` and the admin endpoint): (the
    :class:`~tests._support.processes.ProxyProcess`, route port, admin port)."""
    proc = proxy_process(tmp_path, config=f"""
[admin]
listen = "127.0.0.1:0"
[proxy]
shutdown_timeout = {extra or 5}
[[routes]]
name = "fly"
protocol = "flymq"
listen = "127.0.0.1:0"
upstream = "127.0.0.1:{upstream_port}"
""")
    return proc, proc.port("fly"), proc.admin_port


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
        assert "second stop signal" in proc.log_text()
    finally:
        proc.kill()


def route(**extra):
    return {"routes": [dict({"protocol": "flymq", "listen": "127.0.0.1:0",
                             "upstream": "127.0.0.1:9"}, **extra)]}


def test_new_settings_defaults_and_values():
    cfg = config_from_dict(route())
    r = cfg.routes[0]
    assert (r.half_close_timeout, r.idle_timeout) == (60.0, 3600.0)
    assert cfg.max_pending_bytes == 256 * 1024 * 1024
    cfg = config_from_dict(dict(route(half_close_timeout=2, idle_timeout=0),
                                proxy={"max_pending_bytes": 1 << 20}))
    r = cfg.routes[0]
    assert (r.half_close_timeout, r.idle_timeout) == (2.0, 0.0)
    assert type(r.half_close_timeout) is float and cfg.max_pending_bytes == 1 << 20


def _where(path):
    """(config dict with ``value`` at ``path``, name in the error) for a RANGES key."""
    table, key = path.split(".")
    if table == "routes":
        return (lambda v: route(**{key: v})), f"routes[0].{key}"
    base = route()
    return (lambda v: dict(base, **{table: {key: v}})), path


@pytest.mark.parametrize("path", sorted(RANGES))
def test_every_number_has_a_finite_range(path):
    rng = RANGES[path]
    make, name = _where(path)
    getter = {"routes": lambda c, k: getattr(c.routes[0], k),
              "proxy": lambda c, k: getattr(c, k),
              "admin": lambda c, k: getattr(c, f"admin_{k}"),
              "framelog": lambda c, k: getattr(c.framelog, k)}[path.split(".")[0]]
    key = path.split(".")[1]
    for ok in (rng.low, rng.high):
        value = getter(config_from_dict(make(rng.kind(ok))), key)
        assert value == ok and type(value) is rng.kind
    step = 1 if rng.kind is int else rng.low / 2 or 0.5
    for bad in (rng.low - step, rng.high + step, float("inf"), float("-inf"), float("nan"),
                True, "10", [1], {"a": 1}) + ((rng.low + 0.5,) if rng.kind is int else ()):
        with pytest.raises(ConfigError) as info:
            config_from_dict(make(bad))
        assert str(info.value).startswith(f"{name} = "), str(info.value)
        assert str(info.value).endswith(f": expected {rng.describe()}")


def test_ranges_are_stated():
    assert RANGES["routes.request_timeout"].describe() == "a number 0.001..3600 seconds"
    assert RANGES["routes.idle_timeout"].describe() == "a number 0..604800 seconds, 0 = never"
    assert RANGES["routes.max_connections"].describe() == "an integer 1..1000000"
    assert RANGES["proxy.max_pending_bytes"].describe() == \
        "an integer 1048576..68719476736 bytes (1 MiB..64 GiB)"


@pytest.mark.parametrize("text, expected", [
    ("[::1]:9092", ("::1", 9092)),
    ("mq.staging:9092", ("mq.staging", 9092)),
    ("rabbit_1:5552", ("rabbit_1", 5552)),
    ("0.0.0.0:65535", ("0.0.0.0", 65535)),
])
def test_good_addresses(text, expected):
    assert parse_address(text, "k") == expected


@pytest.mark.parametrize("text, problem", [
    ("[::1:9092", "unclosed '['"),
    ("[::1]", "expected ':port' after ']'"),
    ("[::1]x:1", "expected ':port' after ']'"),
    ("::1]:9092", "misplaced bracket"),
    ("::1:9092", "an IPv6 address needs brackets"),
    ("[1.2.3.4]:5", "'1.2.3.4' is not an IPv6 address"),
    ("999.1.1.1:5", "'999.1.1.1' is not an IPv4 address"),
    ("a b:5", "'a b' is not a host name or address"),
    ("h:+80", "port '+80' is not a number"),
    ("h:\u0668\u0660", "is not a number"),                 # Arabic-Indic digits: int() takes them
    ("h:0", "port must be 1..65535"),
    (":80", "expected 'host:port'"),
])
def test_bad_addresses(text, problem):
    with pytest.raises(ConfigError) as info:
        parse_address(text, "routes[0].upstream")
    assert str(info.value).startswith(f"routes[0].upstream = {text!r}: ")
    assert problem in str(info.value)
