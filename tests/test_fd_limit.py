"""File-descriptor exhaustion (issue 8, defect 2; docs/design.md, "File descriptors").

A real proxy process started with a low hard RLIMIT_NOFILE (so it cannot raise it) and
more clients than descriptors: on today's main uvloop's listener accepts-and-closes the
clients it has no descriptor for (nothing counts them) and /metrics cannot be reached.
Now every client is either served at once or waits in the listen backlog and is served
when descriptors free up, the accepts that ran out are counted in
``frametap_accept_errors_total``, and /metrics answers throughout.
"""

import os
import resource
import select
import socket
import struct
import subprocess
import sys
import time
import urllib.request

import pytest

from loadgen.flymq.server import FlyMQServerThread

FRAMETAP = [sys.executable, "-m", "proxy"]
FD_LIMIT = 160          # the proxy's soft and hard limit: about 60 proxied connections
CLIENTS = 150
LIST_TOPICS = bytes([0xAF, 1, 0x08, 1]) + struct.pack(">I", 0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port, timeout=5.0):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
        assert r.status == 200
        return r.read().decode()


def metric(text, name, **labels):
    total = None
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total = (total or 0) + float(value)
    return total


def _limit():
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


@pytest.fixture
def proxy(tmp_path):
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < CLIENTS + 200:
        pytest.skip("this test process itself needs more descriptors than the proxy gets")
    with FlyMQServerThread() as upstream:
        listen, admin = free_port(), free_port()
        proc = subprocess.Popen(
            FRAMETAP + ["proxy", "--protocol", "flymq", "--name", "fly",
                        "--listen", f"127.0.0.1:{listen}",
                        "--upstream", f"127.0.0.1:{upstream.port}",
                        "--admin", f"127.0.0.1:{admin}", "--log-level", "warning"],
            stderr=subprocess.PIPE, text=True, preexec_fn=_limit)
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    scrape(admin, 1)
                    break
                except OSError:
                    assert proc.poll() is None, proc.stderr.read()
                    assert time.monotonic() < deadline, "proxy did not start"
                    time.sleep(0.1)
            yield proc, listen, admin
        finally:
            proc.terminate()
            try:
                _out, err = proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                _out, err = proc.communicate()
            assert "Traceback" not in err, err


def _answered(socks, timeout):
    """Sockets (of ``socks``) that received a whole 8-byte header within ``timeout``;
    raises when any saw EOF or a reset instead (a dropped client)."""
    done = set()
    bufs = {s: b"" for s in socks}
    deadline = time.monotonic() + timeout
    while len(done) < len(socks):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select([s for s in socks if s not in done], [], [], left)
        for s in ready:
            try:
                data = s.recv(4096)
            except ConnectionResetError:
                data = b""
            assert data, "a client was dropped (EOF/reset) instead of served or waiting"
            bufs[s] += data
            if len(bufs[s]) >= 8:
                done.add(s)
    return done


def test_more_clients_than_descriptors_are_all_served_and_metrics_answer(proxy):
    proc, listen, admin = proxy
    clients = []
    try:
        for _ in range(CLIENTS):
            s = socket.create_connection(("127.0.0.1", listen), timeout=5)
            s.sendall(LIST_TOPICS)
            clients.append(s)
        served = _answered(clients, 3.0)
        assert 0 < len(served) < CLIENTS, len(served)
        text = scrape(admin)             # at the fd limit, the scrape is still answered
        assert metric(text, "frametap_accept_errors_total", route="fly") > 0
        assert metric(text, "frametap_connections_active", route="fly") >= len(served)
        waiting = [s for s in clients if s not in served]
        for s in list(served):           # free descriptors: the waiting ones get in
            s.close()
            clients.remove(s)
        served_late = set()
        deadline = time.monotonic() + 30
        while len(served_late) < len(waiting) and time.monotonic() < deadline:
            got = _answered([s for s in waiting if s not in served_late], 1.0)
            for s in got:                # served: done with it, its descriptors free up
                s.close()
                clients.remove(s)
            served_late |= got
            scrape(admin)                # and /metrics answers throughout
        assert len(served_late) == len(waiting)
        text = scrape(admin)
        assert metric(text, "frametap_connections_total", route="fly") == CLIENTS
        assert metric(text, "frametap_connections_rejected_total", route="fly") == 0
        assert metric(text, "frametap_upstream_connect_failures_total", route="fly") == 0
        assert proc.poll() is None
    finally:
        for s in clients:
            s.close()
