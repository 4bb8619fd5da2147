"""A private Prometheus for tests (Debian package ``prometheus``, which brings
``promtool``): finding the binaries, starting it on loopback port 0 with temporary
storage, querying its HTTP API; also the small HTTP helpers the process tests share.

Without the binaries the callers skip, or fail when FRAMETAP_CI is set.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

__all__ = ["MISSING", "prometheus_binary", "promtool_binary", "http_get", "wait_port",
           "wait_http", "stop", "Prom", "start_prometheus"]

MISSING = "prometheus not installed: .ci/run installs it with apt-get"


def _binary(name):
    path = shutil.which(name) or (
        f"/usr/bin/{name}" if os.access(f"/usr/bin/{name}", os.X_OK) else None)
    if path is None:
        if os.environ.get("FRAMETAP_CI"):
            pytest.fail(MISSING)
        pytest.skip(MISSING)
    return path


def prometheus_binary():
    """Path of the prometheus binary; skip (or fail under FRAMETAP_CI) without it."""
    return _binary("prometheus")


def promtool_binary():
    """Path of promtool (same package); skip (or fail under FRAMETAP_CI) without it."""
    return _binary("promtool")


def http_get(url, timeout=2.0):
    """(status, body) of a GET; HTTP errors return their status and body too."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_port(port, proc, what, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{what} did not start listening on {port}")
        time.sleep(0.05)


def wait_http(url, proc, what, logfile, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            if http_get(url, timeout=1)[0] == 200:
                return
        except (urllib.error.URLError, OSError):
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            log = Path(logfile).read_text(errors="replace")[-3000:] if logfile else ""
            raise AssertionError(f"{what} not ready at {url}:\n{log}")
        time.sleep(0.1)


def stop(proc):
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


class Prom:
    """Tiny client for Prometheus' HTTP API."""

    def __init__(self, base):
        self.base = base

    def api(self, path, params):
        url = f"{self.base}/api/v1/{path}?" + urllib.parse.urlencode(params, doseq=True)
        status, body = http_get(url, timeout=5)
        try:
            return json.loads(body)
        except ValueError:
            return {"status": "error", "error": f"HTTP {status}: {body[:500]}"}

    def query(self, expr, at=None):
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self.api("query", params)

    def scalar(self, expr, at=None):
        """The single value of an instant query, or None when there is no single series."""
        r = self.query(expr, at)
        assert r["status"] == "success", (expr, r)
        res = r["data"]["result"]
        if r["data"]["resultType"] == "scalar":
            return float(res[1])
        if len(res) != 1:
            return None
        return float(res[0]["value"][1])

    def wait_value(self, expr, ok, what, timeout=15.0):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = self.scalar(expr)
            if last is not None and ok(last):
                return last
            time.sleep(0.2)
        raise AssertionError(f"Prometheus: timed out waiting for {what}: {expr} = {last}")


#: Prometheus (exporter-toolkit) logs the address it bound, port 0 resolved:
#: ``... msg="Listening on" address=127.0.0.1:38747``
LISTENING_RE = re.compile(r'msg="Listening on" address=(\S+)')


def start_prometheus(tmp, jobs, rule_files=(), interval="1s", timeout=30.0):
    """A private Prometheus on loopback port 0 with storage in ``tmp``, scraping
    ``jobs`` ({job name: [host:port, ...]}) every ``interval`` and evaluating
    ``rule_files`` as often. Returns (process, Prom) once it is ready; the caller
    stops the process (:func:`stop`). The port is the one Prometheus reports in its
    "Listening on" log line (it binds port 0 itself: nothing to collide with)."""
    binary = prometheus_binary()
    tmp = Path(tmp)
    lines = ["global:", f"  scrape_interval: {interval}", f"  scrape_timeout: {interval}",
             f"  evaluation_interval: {interval}"]
    if rule_files:
        lines.append("rule_files:")
        lines += [f"  - '{f}'" for f in rule_files]
    lines.append("scrape_configs:")
    for job, targets in jobs.items():
        lines += [f"  - job_name: {job}", f"    scrape_interval: {interval}",
                  f"    scrape_timeout: {interval}", "    metrics_path: /metrics",
                  "    static_configs:",
                  "      - targets: [" + ", ".join(f"'{t}'" for t in targets) + "]"]
    cfg = tmp / "prom.yml"
    cfg.write_text("\n".join(lines) + "\n")
    log = tmp / "prometheus.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [binary, f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'data'}",
             "--web.listen-address=127.0.0.1:0", "--log.level=info"],
            stdout=out, stderr=subprocess.STDOUT, cwd=tmp)
    try:
        deadline = time.monotonic() + timeout
        while not (m := LISTENING_RE.search(log.read_text(errors="replace"))):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("prometheus did not say where it listens:\n"
                                     + log.read_text(errors="replace")[-3000:])
            time.sleep(0.05)
        base = f"http://{m.group(1)}"
        wait_http(base + "/-/ready", proc, "prometheus", log, timeout=timeout)
    except BaseException:
        stop(proc)
        raise
    return proc, Prom(base)
