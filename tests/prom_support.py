"""Helpers for the tests that run a real Prometheus (Debian package ``prometheus``, which
brings ``promtool``): finding the binaries, starting a private Prometheus on loopback with
temporary storage, querying its HTTP API, and reading Grafana dashboard JSON.

Used by tests/test_prometheus_scrape.py and tests/test_grafana_loadtest.py. Without the
binaries those tests skip, or fail when FRAMETAP_CI is set.
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

from tests.conftest import free_port

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


def start_prometheus(tmp, jobs, rule_files=(), interval="1s"):
    """A private Prometheus on a free loopback port with storage in ``tmp``, scraping
    ``jobs`` ({job name: [host:port, ...]}) every ``interval`` and evaluating
    ``rule_files`` as often. Returns (process, Prom) once it is ready; the caller
    stops the process (:func:`stop`)."""
    binary = prometheus_binary()
    tmp = Path(tmp)
    web = free_port()
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
    proc = subprocess.Popen(
        [binary, f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{web}", "--log.level=warn"],
        stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=tmp)
    base = f"http://127.0.0.1:{web}"
    try:
        wait_http(base + "/-/ready", proc, "prometheus", log)
    except BaseException:
        stop(proc)
        raise
    return proc, Prom(base)


# --------------------------------------------------------------------------- dashboards

VAR_RE = re.compile(r"\$\{(\w+)(?::[\w]+)?\}|\$(\w+)|\[\[(\w+)\]\]")


def all_panels(dash):
    for p in dash["panels"]:
        yield p
        yield from p.get("panels", [])       # collapsed rows hold their panels


def dashboard_exprs(dash):
    """[(panel title, refId, expr)] for every query target of every panel."""
    out = []
    for p in all_panels(dash):
        for t in p.get("targets", []):
            if t.get("expr"):
                out.append((p.get("title", ""), t.get("refId", ""), t["expr"]))
    return out


def variable_queries(dash):
    """[(name, query string)] of the query-type template variables."""
    out = []
    for v in dash["templating"]["list"]:
        if v.get("type") == "query":
            q = v.get("query")
            out.append((v["name"], q["query"] if isinstance(q, dict) else q))
    return out


def substitute(expr, variables):
    """``expr`` with Grafana's ``$var`` / ``${var}`` / ``[[var]]`` replaced from
    ``variables``; an unknown variable fails the test."""
    def repl(m):
        name = m.group(1) or m.group(2) or m.group(3)
        if name not in variables:
            raise AssertionError(f"unknown dashboard variable ${name} in {expr!r}")
        return variables[name]
    return VAR_RE.sub(repl, expr)


def metric_names(expr):
    """frametap_* identifiers in an expression (metric names; labels never start so)."""
    return set(re.findall(r"\b(frametap_[a-zA-Z0-9_:]+)", expr))


def exposed_families(text):
    """Metric family names (with their sample-name forms) in Prometheus exposition text."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE ") or line.startswith("# HELP "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0))
    return names


def family_of(name):
    for suffix in ("_bucket", "_count", "_sum", "_total", "_created"):
        if name.endswith(suffix):
            yield name[: -len(suffix)]
    yield name
