"""``frametap load``: argument mistakes are one line and exit 2, the protocol is chosen
(or inferred and said), and users back off while reconnections keep failing (issue 20,
"Errors as one line").

Locust runs only in subprocesses (importing it here would gevent-patch pytest)."""

import json
import random
import socket
import subprocess
import sys
import threading
import time

import pytest

from loadgen.userbase import Backoff
from loadgen.flymq.server import FlyMQServerThread
from loadgen.loadargs import LoadArgumentError, choose_protocols
from proxy import protocols
from tests._support.processes import FRAMETAP, ROOT, frametap_env


def frametap_load(*args, env=None, timeout=120):
    full = frametap_env(env)
    if "FRAMETAP_PROTOCOLS" not in (env or {}):
        full.pop("FRAMETAP_PROTOCOLS", None)
    return subprocess.run(FRAMETAP + ["load", *args], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=timeout)


def one_line(r):
    """Exit status 2 and exactly one line on stderr, no traceback; returns the line."""
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith("frametap load: ")
    return lines[0]


# ---- the command line ------------------------------------------------------------------

def test_no_host_is_one_line():
    line = one_line(frametap_load("--headless", "-u", "1", "-t", "1s"))
    assert line == ("frametap load: --host is required: the address of the proxy route (or "
                    "server) to load, e.g. --host 127.0.0.1:19092; FRAMETAP_PROTOCOLS picks "
                    "the users (%s)" % ", ".join(s.name for s in protocols.specs() if s.users))


def test_a_host_the_chosen_users_cannot_take_is_one_line():
    line = one_line(frametap_load("--headless", "-u", "1", "-t", "1s", "--host",
                                  "tcp://127.0.0.1:9092", env={"FRAMETAP_PROTOCOLS": "flymq"}))
    assert line == ("frametap load: --host 'tcp://127.0.0.1:9092': flymq users: host "
                    "'tcp://127.0.0.1:9092': expected scheme flymq:// (or HOST:PORT)")


def test_a_scheme_no_protocol_takes_is_one_line():
    line = one_line(frametap_load("--headless", "-t", "1s", "--host", "bogus://x:1"))
    assert line.startswith("frametap load: --host 'bogus://x:1': no protocol's users take the "
                           "scheme bogus://")


def test_a_host_that_names_no_protocol_is_one_line():
    line = one_line(frametap_load("--headless", "-t", "1s", "--host", "127.0.0.1:19999"))
    assert line.startswith("frametap load: --host 127.0.0.1:19999: which protocol does it "
                           "speak? Set FRAMETAP_PROTOCOLS")


def test_an_unknown_protocol_is_one_line():
    line = one_line(frametap_load("--headless", "-t", "1s", "--host", "127.0.0.1:1",
                                  env={"FRAMETAP_PROTOCOLS": "flymq,kafka"}))
    assert "unknown protocol 'kafka'" in line


def test_help_still_works():
    r = frametap_load("--help", timeout=60)
    assert r.returncode == 0 and "--frametap-framelog" in r.stdout


@pytest.mark.slow
def test_the_protocol_is_inferred_and_said(tmp_path):
    """Without FRAMETAP_PROTOCOLS, a host that names FlyMQ runs the FlyMQ users alone
    (not every protocol's against one server), and one line says so.  (The reference
    server listens on a free port, so the scheme names it here; the usual-port rule is
    test_choose_protocols'.)"""
    with FlyMQServerThread() as srv:
        r = frametap_load("--headless", "-u", "2", "-r", "2", "-t", "2s", "--host",
                          f"flymq://127.0.0.1:{srv.port}", "--only-summary", "--loglevel",
                          "WARNING")
    assert r.returncode == 0, r.stderr[-3000:]
    said = [line for line in r.stderr.splitlines() if line.startswith("frametap load: ")]
    assert said == [f"frametap load: running the flymq users (FlyMQProducer, FlyMQConsumer) "
                    f"against flymq://127.0.0.1:{srv.port}: the host's scheme flymq:// "
                    f"(FRAMETAP_PROTOCOLS chooses)"]
    assert "fleximq" not in r.stdout and "rocketmq" not in r.stdout


@pytest.mark.parametrize("host, named, env, want", [
    ("127.0.0.1:9092", (), {}, (["flymq"], "port 9092 is flymq's usual port")),
    ("127.0.0.1:5552", (), {}, (["rabbitmq-stream"], "port 5552 is rabbitmq-stream's usual port")),
    ("rocketmq://10.0.0.1:19876", (), {}, (["rocketmq"], "the host's scheme rocketmq://")),
    ("tcp://10.0.0.1:7001", (), {}, (["fleximq"], "the host's scheme tcp://")),
    ("127.0.0.1:19092", ("FlyMQProducer",), {}, (["flymq"], "the user classes named")),
    ("127.0.0.1:19092", (), {"FRAMETAP_PROTOCOLS": "flymq,ttheader"},
     (["flymq", "ttheader"], None)),
])
def test_choose_protocols(host, named, env, want):
    # In a child: checking a host imports the protocol's user modules, and so Locust,
    # which monkey-patches with gevent; done in the suite's own process after other tests
    # left threads behind, that import deadlocked on a module lock.
    code = ("import json, sys; from loadgen.loadargs import choose_protocols; "
            "a = json.loads(sys.argv[1]); "
            "print(json.dumps(choose_protocols(a[0], tuple(a[1]), a[2])))")
    r = subprocess.run([sys.executable, "-c", code, json.dumps([host, list(named), env])],
                       capture_output=True, text=True, timeout=120,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert (got[0], got[1]) == want


def test_the_web_ui_may_get_its_host_later():
    assert choose_protocols(None, (), {}, headless=False) == (
        [s.name for s in protocols.specs() if s.users], None)
    with pytest.raises(LoadArgumentError, match="--host is required"):
        choose_protocols(None, (), {}, headless=True)


# ---- reconnection back-off ------------------------------------------------------------

def test_backoff_doubles_up_to_its_cap_and_starts_over_after_a_success():
    waits = []
    b = Backoff(first=0.1, cap=1.0, jitter=0.0, sleep=waits.append)
    for _ in range(7):
        b.before_connect()
    assert waits == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]     # the first attempt does not wait
    b.ok()
    waits.clear()
    b.before_connect()
    b.before_connect()
    assert waits == [0.1]


def test_backoff_jitter_stays_within_its_fraction_and_the_cap():
    b = Backoff(first=1.0, cap=4.0, jitter=0.2, rng=random.Random(7), sleep=lambda s: None)
    b.attempts = 2
    seen = {round(b.delay(), 6) for _ in range(200)}
    assert min(seen) >= 1.6 and max(seen) <= 2.4 and len(seen) > 50
    b.attempts = 40
    assert max(b.delay() for _ in range(200)) <= 4.0


class ClosingServer:
    """Accepts connections and closes them at once: a proxy whose upstream is down
    (the connect succeeds, the first request fails).  Counts the connections."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self):
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


@pytest.mark.slow
def test_users_back_off_from_a_dead_upstream():
    """Two FlyMQ users for 4 s against a peer that drops every connection: with the
    back-off capped at 1 s each reconnects about seven times (0, 0.1, 0.3, 0.7, 1.5,
    2.5, 3.5 s), not thousands of times."""
    server = ClosingServer()
    try:
        started = time.monotonic()
        r = frametap_load("--headless", "-u", "2", "-r", "2", "-t", "4s", "--host",
                          f"127.0.0.1:{server.port}", "--only-summary", "--loglevel", "ERROR",
                          env={"FRAMETAP_PROTOCOLS": "flymq",
                               "FRAMETAP_RECONNECT_MAX_DELAY": "1"})
        took = time.monotonic() - started
        accepted = server.accepted
    finally:
        server.close()
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert 2 * 3 <= accepted <= 2 * 12, (accepted, took, r.stdout[-2000:])
