"""File-descriptor exhaustion (issue 8, defect 2; docs/design.md, "File descriptors").

A real proxy process started with a low hard RLIMIT_NOFILE (so it cannot raise it) and
more clients than descriptors: on today's main uvloop's listener accepts-and-closes the
clients it has no descriptor for (nothing counts them) and /metrics cannot be reached.
Now every client is either served at once or waits in the listen backlog and is served
when descriptors free up, the accepts that ran out are counted in
``frametap_accept_errors_total``, and /metrics answers throughout.
"""

import resource
import select
import socket
import struct
import time
import urllib.request

import pytest

from loadgen.flymq.server import FlyMQServerThread
from tests._support.processes import proxy_process

FD_LIMIT = 160          # the proxy's soft and hard limit: about 60 proxied connections
CLIENTS = 150
LIST_TOPICS = bytes([0xAF, 1, 0x08, 1]) + struct.pack(">I", 0)


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
        proc = proxy_process(tmp_path, ["--protocol", "flymq", "--name", "fly",
                                        "--listen", "127.0.0.1:0",
                                        "--upstream", f"127.0.0.1:{upstream.port}",
                                        "--admin", "127.0.0.1:0"],
                             log_level="warning", preexec_fn=_limit)
        try:
            scrape(proc.admin_port, 5)
            yield proc, proc.port("fly"), proc.admin_port
        finally:
            status = proc.stop(20)
            assert "Traceback" not in proc.log_text(), proc.log_text()[-3000:]
            assert status == 0, proc.log_text()[-3000:]


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


@pytest.mark.slow
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
