"""Grafana for a load run, checked against a real Prometheus under a real distributed Locust run.

Stack (subprocesses on 127.0.0.1, every one on port 0 and naming its ports in its ready
file): the reference FlyMQ server with
``--require-auth``; the proxy with two FlyMQ routes, ``fly`` (to that server) and
``stall`` (to a socket that never answers, ``request_timeout`` 0.5 s); a Locust master
with the exporter (``--frametap-metrics``) and two ``--worker`` processes, one that
authenticates (its requests succeed) and one that does not (the server answers every
request with ERROR: failures on both the client's and the proxy's side); and Prometheus
scraping the proxy and the Locust master every second with grafana/rules.yml loaded.
Before the load, a few faults through the proxy: garbage (a protocol error) and
requests on the ``stall`` route (timeouts).

Checks: Prometheus' sum of ``frametap_locust_requests_total`` equals the master's final
``--json`` request count exactly; every PromQL expression of both dashboards and of
every rule (template variables replaced by the label values Prometheus reports) returns
at least one series, alert expressions with their comparisons turned into ``bool`` ones
(so a quiet alert's expression is checked too); the recording rules' series appear; the
injected faults make their alerts pending and the healthy parts stay quiet; promtool's
config, rules and rule unit tests pass; both dashboards' JSON is well formed
(unique ids, grid, datasource variable, units, links) and names only metrics the proxy or
the exporter serves. The exporter's own parts (unrounded histogram, worker increments,
label bounds) are unit-tested in-process; a ``--processes 2`` run and a plain run are
checked against their endpoint.
"""

import json
import math
import re
import socket
import ssl
import subprocess
import sys
import threading
import time

import pytest
import yaml

from loadgen.flymq.client import FlyMQClient
from loadgen.locustmetrics import (MAX_OPCODES, LocustCollector, LocustMetrics, MetricsServer,
                                   address_arg, linger_arg)
from loadgen.tlscerts import throwaway
from proxy.framing_common import BUCKETS
from tests._support.locust import (LOCUST, json_stats, locust_env, start_locust,
                                   start_locust_master, start_locust_worker)
from tests._support.processes import (FRAMETAP, ROOT, host_port, proxy_process,
                                      server_process, stop_process)
from tests.support import request
from tests.prom_support import (all_panels, dashboard_exprs, exposed_families, family_of,
                                http_get, metric_names, promtool_binary, start_prometheus,
                                substitute, variable_queries)

GRAFANA = ROOT / "grafana"
DASHBOARDS = {"frametap-proxy": GRAFANA / "dashboards" / "frametap.json",
              "frametap-loadtest": GRAFANA / "dashboards" / "frametap-loadtest.json"}
RULES = GRAFANA / "rules.yml"
USER, PASSWORD = "load", "s3cret"
RUN_TIME = 15          # seconds of load (the expressions are checked while it runs)
USERS = 4


def env(extra=None):
    return locust_env("flymq", extra)


def boolify(expr):
    """``expr`` with every comparison outside label matchers and strings made a ``bool``
    one, so it returns its series whether or not the condition holds."""
    out, i, depth, quote = [], 0, 0, None
    while i < len(expr):
        c = expr[i]
        if quote:
            out.append(c)
            if c == "\\":
                out.append(expr[i + 1])
                i += 1
            elif c == quote:
                quote = None
        elif c in "\"'`":
            quote = c
            out.append(c)
        elif c == "{":
            depth += 1
            out.append(c)
        elif c == "}":
            depth -= 1
            out.append(c)
        elif depth == 0 and (m := re.match(r"(==|!=|>=|<=|>|<)(?!\s*bool\b)", expr[i:])):
            out.append(m.group(1) + " bool")
            i += len(m.group(1))
            continue
        else:
            out.append(c)
        i += 1
    return "".join(out)


def load_rules():
    return yaml.safe_load(RULES.read_text())["groups"]


def load_dashboard(uid):
    return json.loads(DASHBOARDS[uid].read_text())


class SilentUpstream:
    """A listening socket whose connections are accepted and read, never answered."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.conns = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)     # kept open, never read: requests go unanswered

    def drop_next(self, before, timeout=5.0):
        """Close the first connection accepted after the first ``before``, once bytes have
        arrived on it (the proxy forwarded a request): its request is cut off."""
        deadline = time.monotonic() + timeout
        while len(self.conns) <= before:
            assert time.monotonic() < deadline, "the proxy did not connect upstream"
            time.sleep(0.01)
        conn = self.conns[before]
        conn.settimeout(timeout)
        assert conn.recv(1, socket.MSG_PEEK), "the upstream connection closed first"
        conn.close()

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


# --------------------------------------------------------------------------- the stack

@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Everything up, faults injected, a distributed Locust run checked while it runs.

    Yields a dict: ``prom``, the evaluation time ``at`` (mid-run), the label values seen,
    the query results, the proxy's and the exporter's ``/metrics`` text, the master's
    final JSON stats."""
    tmp = tmp_path_factory.mktemp("loadtest")
    procs, silent = [], SilentUpstream()
    certs = throwaway(str(tmp / "tls"))            # the TLS panels' route (openssl)
    try:
        procs.append(server := server_process(tmp, "flymq", "--user", f"{USER}:{PASSWORD}",
                                              "--require-auth"))
        procs.append(proxy := proxy_process(tmp, config=f"""
[proxy]
shutdown_timeout = 1.0

[admin]
listen = "127.0.0.1:0"

[[routes]]
name = "fly"
protocol = "flymq"
listen = "127.0.0.1:0"
upstream = "{server.address}"

[[routes.faults]]                  # the fault panel's series: a delay on a fifth of PRODUCE
name = "slow-produce"
match = {{opcode = ["PRODUCE"]}}
action = {{type = "delay", ms = 1}}
trigger = {{probability = 0.2}}

[[routes]]
name = "stall"
protocol = "flymq"
listen = "127.0.0.1:0"
upstream = "127.0.0.1:{silent.port}"
request_timeout = 0.5

[[routes]]                         # the TLS row's series: handshakes that pass and fail
name = "tls"
protocol = "flymq"
listen = "127.0.0.1:0"
upstream = "{server.address}"
[routes.tls]
mode = "terminate"
[routes.tls.listen]
cert = "{certs["cert"]}"
key = "{certs["key"]}"
"""))
        fly, stall, admin = proxy.port("fly"), proxy.port("stall"), proxy.admin_port

        # TLS: one handshake that succeeds, one plain client on the TLS listener
        ctx = ssl.create_default_context(cafile=certs["ca"])
        with socket.create_connection(("127.0.0.1", proxy.port("tls"))) as raw:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1"):
                pass
        with socket.create_connection(("127.0.0.1", proxy.port("tls"))) as s:
            s.sendall(request(1))
            s.settimeout(5)
            try:
                s.recv(100)          # the proxy counts a failed handshake and closes
            except OSError:
                pass

        # the Locust master first (on port 0, its exporter too): it waits for its two
        # workers, so no load yet, and its ready file names the ports Prometheus scrapes
        procs.append(master := start_locust_master(
            tmp, "flymq", f"127.0.0.1:{fly}", ["FlyMQProducer", "FlyMQConsumer"],
            expect_workers=2, users=USERS, duration=f"{RUN_TIME}s",
            args=["--frametap-metrics", "127.0.0.1:0", "--frametap-metrics-linger", "10"]))
        metrics_port = host_port(master.metrics)[1]
        pproc, prom = start_prometheus(
            tmp, {"frametap": [proxy.admin], "locust": [master.metrics]},
            rule_files=[str(RULES)])
        procs.append(pproc)
        prom.wait_value('up{job="frametap"}', lambda v: v == 1, "the proxy scraped")

        # faults: garbage on the fly route, unanswered requests on the stall route
        with socket.create_connection(("127.0.0.1", fly)) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 4)
            s.settimeout(5)
            try:
                s.recv(100)          # the proxy closes a connection it cannot frame
            except OSError:
                pass
        for _ in range(3):
            try:
                with FlyMQClient("127.0.0.1", stall, timeout=0.8) as c:
                    c.produce("stalled", b"x")
            except OSError:
                pass                 # no answer: the client gives up, the proxy times out
        # a request whose upstream connection closes before request_timeout: a cut-off,
        # not a timeout (the silent upstream drops the connection once the request is in)
        before = len(silent.conns)
        with socket.create_connection(("127.0.0.1", stall)) as s:
            s.sendall(request(1))
            silent.drop_next(before)
        prom.wait_value('sum(frametap_request_timeouts_total{route="stall"})',
                        lambda v: v >= 1, "the stall route's timeouts")
        prom.wait_value('sum(frametap_request_cutoffs_total{route="stall"})',
                        lambda v: v >= 1, "the stall route's cut-off")
        prom.wait_value('sum(frametap_protocol_errors_total{route="fly"})',
                        lambda v: v >= 1, "the fly route's protocol error")
        prom.wait_value('count(frametap_tls_handshakes_total{route="tls"} > 0)',
                        lambda v: v >= 2, "the tls route's handshakes, ok and failed")

        # the distributed Locust run: two workers join the master
        for i, extra in enumerate(({"FRAMETAP_FLYMQ_USER": USER,
                                    "FRAMETAP_FLYMQ_PASSWORD": PASSWORD}, {})):
            procs.append(start_locust_worker(master, "flymq", extra,
                                             log=tmp / f"worker{i}.log"))

        # mid-run: every panel and rule must have data
        prom.wait_value('sum(frametap_locust_users{job="locust"})', lambda v: v == USERS,
                        "all users running", timeout=30)
        for expr, what in (
                ('count(frametap_locust_requests_total{outcome="error"} > 0)', "client failures"),
                ('count(frametap_locust_requests_total{outcome="ok"} > 0)', "client successes"),
                ('count(frametap_request_duration_seconds_count{outcome="error"} > 0)',
                 "proxy error answers"),
                ("count(protocol_opcode:frametap_locust_request_duration_seconds:p99_rate1m)",
                 "the Locust p99 recording rule"),
                ("count(route_protocol_opcode:frametap_request_errors:ratio_rate1m)",
                 "the proxy error-ratio recording rule"),
                ('protocol_opcode:frametap_locust_requests:rate1m{opcode="PRODUCE"} > 0',
                 "a Locust PRODUCE rate (two worker reports)"),
                ('sum(rate(frametap_request_duration_seconds_count{route="fly", '
                 'opcode="PRODUCE"}[1m])) > 0', "a proxy PRODUCE rate"),
                ('count(route_protocol_opcode:frametap_request_errors:ratio_rate1m{route="fly"}'
                 ' > 0)', "an opcode with errors"),
                ('count(route_protocol_opcode:frametap_request_errors:ratio_rate1m{route="fly"}'
                 ' < 1)', "an opcode with successes"),
                ('count(count by (alertname) (ALERTS{alertname=~"FrametapLocustErrorRatioHigh|'
                 'FrametapRequestErrorRatioHigh|FrametapProtocolErrors|FrametapRequestTimeouts"}))'
                 ' == 4', "the injected faults' alerts pending")):
            prom.wait_value(expr, lambda v: v > 0, what, timeout=20)
        assert master.poll() is None, "the Locust run ended before the mid-run checks"
        at = time.time()
        proxy_text = http_get(f"http://127.0.0.1:{admin}/metrics", timeout=5)[1]
        status, locust_text = http_get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
        assert status == 200, locust_text
        labels = {name: prom.api(f"label/{name}/values", {"match[]": [
            "frametap_locust_requests_total", "frametap_requests_in_flight"]})["data"]
            for name in ("protocol", "route", "opcode")}
        variables = {"protocol": "(" + "|".join(labels["protocol"]) + ")",
                     "route": "(" + "|".join(labels["route"]) + ")",
                     "opcode": "(" + "|".join(labels["opcode"]) + ")",
                     "__rate_interval": "1m", "__interval": "15s", "__range": "5m"}
        alerts = prom.query("ALERTS", at)["data"]["result"]

        out, err = master.communicate(timeout=RUN_TIME + 90)
        assert master.proc.returncode in (0, 1), err[-3000:]    # 1: there were failures
        stats = json_stats(out)
        for p in procs[-2:]:
            p.wait(30)
        # the load is over: the proxy's counters hold still; Prometheus scrapes them once
        # more (every second), so a query at ``end`` sees what /metrics says now
        time.sleep(1.0)                  # the workers' closed connections counted
        end_text = http_get(f"http://127.0.0.1:{admin}/metrics", timeout=5)[1]
        time.sleep(2.5)
        end = time.time()
        yield {"prom": prom, "at": at, "variables": variables, "labels": labels,
               "proxy_text": proxy_text, "locust_text": locust_text, "stats": stats,
               "alerts": alerts, "master_err": err, "end": end, "end_text": end_text}
    finally:
        silent.close()
        for p in reversed(procs):
            p.stop() if hasattr(p, "stop") else stop_process(p)


# --------------------------------------------------------------------------- under load

@pytest.mark.slow
def test_prometheus_total_equals_locust_json_exactly(run):
    prom, stats = run["prom"], run["stats"]
    expected = sum(e["num_requests"] for e in stats)
    failures = sum(e["num_failures"] for e in stats)
    assert expected > 200 and 0 < failures < expected, (expected, failures)
    # the master is gone now: its last scrape (during the linger) holds the final totals
    total = prom.wait_value(
        'sum(last_over_time(frametap_locust_requests_total{job="locust"}[10m]))',
        lambda v: v == expected, f"{expected} requests", timeout=10)
    assert total == expected
    errors = prom.scalar('sum(last_over_time(frametap_locust_requests_total'
                         '{job="locust", outcome="error"}[10m]))')
    assert errors == failures
    # per opcode too, and every request with a response time is in the histogram
    by_name = {}
    for e in stats:
        by_name[e["name"]] = by_name.get(e["name"], 0) + e["num_requests"]
    r = prom.query('sum by (opcode) (last_over_time(frametap_locust_requests_total'
                   '{job="locust"}[10m]))')["data"]["result"]
    assert {s["metric"]["opcode"]: int(float(s["value"][1])) for s in r} == by_name
    assert prom.scalar('sum(last_over_time(frametap_locust_request_duration_seconds_count'
                       '{job="locust"}[10m]))') == expected


@pytest.mark.slow
def test_client_and_proxy_agree_on_answered_requests(run):
    """Every PRODUCE Locust reported went through the proxy's fly route and was timed
    there (no request fails before reaching it here). The proxy may have seen more: a user
    stopped mid-request never reports it, and a headless master waits only 0.5 s for the
    workers' final reports (Locust's runners.py), so on a busy machine a worker's last
    few seconds can be missing from Locust's totals (and therefore from the exporter's)."""
    prom = run["prom"]
    client = prom.scalar('sum(last_over_time(frametap_locust_requests_total'
                         '{job="locust", opcode="PRODUCE"}[10m]))')
    proxy = prom.wait_value('sum(frametap_request_duration_seconds_count'
                            '{route="fly", opcode="PRODUCE"})', lambda v: v >= client,
                            "proxy PRODUCE count", timeout=10)
    assert 0 < client <= proxy <= 1.5 * client, (client, proxy)


@pytest.mark.slow
@pytest.mark.parametrize("uid", list(DASHBOARDS))
def test_every_dashboard_query_returns_series(run, uid):
    prom, at, variables = run["prom"], run["at"], run["variables"]
    dash = load_dashboard(uid)
    exprs = dashboard_exprs(dash)
    assert len(exprs) >= 20, len(exprs)
    empty, failed = [], []
    for title, ref, expr in exprs:
        q = substitute(expr, variables)
        r = prom.query(q, at)
        if r.get("status") != "success":
            failed.append(f"{title} [{ref}]: {q}\n    -> {r.get('error')}")
        elif not r["data"]["result"]:
            empty.append(f"{title} [{ref}]: {q}")
    assert not failed, "rejected by Prometheus:\n" + "\n".join(failed)
    assert not empty, "no series:\n" + "\n".join(empty)


def _counter_expr(expr):
    """A panel's ``sum by (...) (rate(METRIC{...}[$__rate_interval]))`` as the same sum of
    the counter itself: what /metrics says, grouped and filtered as the panel is."""
    out = re.sub(r"rate\(([a-z_]+\{[^}]*\})\[\$__rate_interval\]\)", r"\1", expr)
    assert out != expr and "rate(" not in out, expr
    return out


@pytest.mark.slow
@pytest.mark.parametrize("title,metric,by", [
    ("Injected faults/s by fault and action", "frametap_faults_injected_total",
     ("fault", "action")),
    ("Cut-off requests/s by opcode", "frametap_request_cutoffs_total", ("opcode",))])
def test_fault_panels_agree_with_the_proxys_metrics(run, title, metric, by):
    """The proxy dashboard's fault panels show the proxy's counters: mid-run the rate is
    positive for what the run caused (the fly route's delay rule, the stall route's
    cut-off); once the load is over, the panel's sum of the counter itself equals the
    proxy's /metrics, series by series."""
    from prometheus_client.parser import text_string_to_metric_families
    prom, variables = run["prom"], run["variables"]
    panels = {p["title"]: p for p in all_panels(load_dashboard("frametap-proxy"))}
    (target,) = panels[title]["targets"]
    expr = substitute(target["expr"], variables)
    rates = {tuple(s["metric"][k] for k in by): float(s["value"][1])
             for s in prom.query(expr, run["at"])["data"]["result"]}
    want = {}
    for fam in text_string_to_metric_families(run["end_text"]):
        for s in fam.samples:
            if s.name == metric and s.value:
                key = tuple(s.labels[k] for k in by)
                want[key] = want.get(key, 0) + s.value
    if metric == "frametap_faults_injected_total":
        assert set(want) == {("slow-produce", "delay")}, want
        assert rates[("slow-produce", "delay")] > 0, rates
    else:
        assert sum(want.values()) >= 1, want        # the stall route's cut-off at least
    got = {tuple(s["metric"][k] for k in by): float(s["value"][1])
           for s in prom.query(substitute(_counter_expr(target["expr"]), variables),
                               run["end"])["data"]["result"]}
    print(f"\n{title}: panel at the end {got}, /metrics {want}, mid-run rate {rates}")
    assert {k: v for k, v in got.items() if v} == want


@pytest.mark.slow
def test_loadtest_dashboard_compares_client_and_proxy(run):
    prom, at, variables = run["prom"], run["at"], run["variables"]
    panels = {p["title"]: p for p in all_panels(load_dashboard("frametap-loadtest"))}
    rps = panels["Requests/s by opcode: client vs proxy"]["targets"]
    client, proxy = (prom.query(substitute(t["expr"], variables), at)["data"]["result"]
                     for t in rps)
    cops = {s["metric"]["opcode"]: float(s["value"][1]) for s in client}
    pops = {s["metric"]["opcode"]: float(s["value"][1]) for s in proxy}
    assert cops["PRODUCE"] > 0 and pops["PRODUCE"] > 0
    # joined on protocol/opcode: the gap panel has a series per opcode both sides have
    gap = panels["Time outside the server: client p99 - proxy p99"]["targets"][0]["expr"]
    r = prom.query(substitute(gap, variables), at)["data"]["result"]
    assert {s["metric"]["opcode"] for s in r} >= {"PRODUCE"}
    assert set(r[0]["metric"]) == {"protocol", "opcode"}
    users = prom.scalar(substitute(panels["Users"]["targets"][0]["expr"], variables), at)
    assert users == USERS
    ratio = panels["Failure ratio by opcode: client vs proxy"]["targets"][0]["expr"]
    r = prom.query(substitute(ratio, variables), at)["data"]["result"]
    values = [float(s["value"][1]) for s in r]
    # NaN: an opcode with no request in the window (0/0), e.g. CREATE_TOPIC after start-up
    assert values and all(0 <= v <= 1 or math.isnan(v) for v in values), r
    assert max(v for v in values if not math.isnan(v)) > 0   # the unauthenticated worker


@pytest.mark.slow
def test_dashboard_variables_resolve(run):
    prom = run["prom"]
    expected = {"protocol": "flymq", "route": "fly", "opcode": "PRODUCE"}
    for uid in DASHBOARDS:
        for name, query in variable_queries(load_dashboard(uid)):
            m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", query)
            assert m, f"{uid} variable {name}: expected label_values(selector, label)"
            selector = substitute(m.group(1), {"protocol": ".*", "route": ".*"})
            r = prom.api(f"label/{m.group(2)}/values", {"match[]": selector})
            assert r.get("status") == "success", (uid, name, r)
            assert expected[name] in r["data"], (uid, name, r["data"])


@pytest.mark.slow
def test_every_rule_expression_returns_series(run):
    prom, at = run["prom"], run["at"]
    empty, failed, n = [], [], 0
    for group in load_rules():
        for rule in group["rules"]:
            name = rule.get("record") or rule.get("alert")
            exprs = [rule["expr"]]
            if "alert" in rule:
                exprs.append(boolify(rule["expr"]))     # the condition, true or false
            for expr in exprs:
                n += 1
                r = prom.query(expr, at)
                if r.get("status") != "success":
                    failed.append(f"{name}: {expr} -> {r.get('error')}")
                elif not r["data"]["result"] and ("record" in rule or expr is not exprs[0]):
                    empty.append(f"{name}: {expr}")
    assert n >= 25
    assert not failed, "\n".join(failed)
    assert not empty, "no series:\n" + "\n".join(empty)


@pytest.mark.slow
def test_recording_rules_series_appear(run):
    prom, at = run["prom"], run["at"]
    records = [r["record"] for g in load_rules() for r in g["rules"] if "record" in r]
    assert len(records) >= 6
    for record in records:
        r = prom.query(record, at)["data"]["result"]
        assert r, f"recording rule {record} has no series"
    rate = prom.query('protocol_opcode:frametap_locust_requests:rate1m{opcode="PRODUCE"}',
                      at)["data"]["result"]
    assert rate and float(rate[0]["value"][1]) > 0
    # one worker's requests fail, the other's succeed (Locust hands the first worker the
    # first user class, so which opcodes fail varies)
    ratios = [float(x["value"][1]) for x in prom.query(
        'route_protocol_opcode:frametap_request_errors:ratio_rate1m{route="fly"}',
        at)["data"]["result"]]
    assert any(v > 0 for v in ratios) and any(v < 1 for v in ratios), ratios


@pytest.mark.slow
def test_injected_faults_make_their_alerts_pending_and_only_those(run):
    alerts = {(a["metric"]["alertname"], a["metric"].get("route")) for a in run["alerts"]}
    names = {a for a, _ in alerts}
    assert ("FrametapProtocolErrors", "fly") in alerts, alerts
    assert ("FrametapRequestTimeouts", "stall") in alerts, alerts
    assert "FrametapLocustErrorRatioHigh" in names, alerts
    assert ("FrametapRequestErrorRatioHigh", "fly") in alerts, alerts
    quiet = {"FrametapProxyDown", "FrametapUpstreamConnectFailures", "FrametapFramelogDrops",
             "FrametapFramelogWriteErrors", "FrametapUnmatchedResponses"}
    assert not names & quiet, alerts


@pytest.mark.slow
@pytest.mark.parametrize("uid", list(DASHBOARDS))
def test_dashboard_metrics_exist_in_proxy_or_exporter_output(run, uid):
    exposed = exposed_families(run["proxy_text"]) | exposed_families(run["locust_text"])
    dash = load_dashboard(uid)
    names = set()
    for _, _, expr in dashboard_exprs(dash):
        names |= metric_names(expr)
    for _, query in variable_queries(dash):
        names |= metric_names(query)
    assert len(names) >= 9, names
    unknown = sorted(n for n in names if not any(f in exposed for f in family_of(n)))
    assert not unknown, f"{uid} uses metrics nobody exposes: {unknown}"


@pytest.mark.slow
def test_exporter_output_is_the_contract(run):
    text = run["locust_text"]
    families = {line.split()[2].removesuffix("_total"): line.split()[3]
                for line in text.splitlines() if line.startswith("# TYPE ")}
    assert families == {"frametap_locust_requests": "counter",
                        "frametap_locust_request_duration_seconds": "histogram",
                        "frametap_locust_users": "gauge"}, families
    les = sorted({float(m) for m in re.findall(
        r'frametap_locust_request_duration_seconds_bucket\{[^}]*le="([^"+]+)"', text)})
    assert les == sorted(BUCKETS)
    # the proxy's histogram uses the very same bucket bounds, written the same way
    proxy_les = set(re.findall(r'frametap_request_duration_seconds_bucket\{[^}]*le="([^"]+)"',
                               run["proxy_text"]))
    locust_les = set(re.findall(r'frametap_locust_request_duration_seconds_bucket\{[^}]*'
                                r'le="([^"]+)"', text))
    assert proxy_les == locust_les
    for line in text.splitlines():
        if line.startswith("frametap_locust_requests_total{"):
            assert set(re.findall(r'(\w+)="', line)) == {"protocol", "opcode", "outcome"}


# --------------------------------------------------------------------------- promtool

def test_promtool_check_config_and_rules():
    promtool = promtool_binary()
    for args in (["check", "config", str(GRAFANA / "prometheus.yml")],
                 ["check", "rules", str(RULES)]):
        r = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr
    text = (GRAFANA / "prometheus.yml").read_text()
    cfg = yaml.safe_load(text)
    assert cfg["rule_files"] == ["rules.yml"]
    assert {j["job_name"] for j in cfg["scrape_configs"]} == {"frametap", "locust"}


def test_promtool_rule_unit_tests_fire_every_alert_and_stay_quiet():
    tests = yaml.safe_load((GRAFANA / "rules_test.yml").read_text())
    alerts = {r["alert"] for g in load_rules() for r in g["rules"] if "alert" in r}
    fired, quiet = set(), set()
    for t in tests["tests"]:
        for case in t.get("alert_rule_test", []):
            (fired if case.get("exp_alerts") else quiet).add(case["alertname"])
    assert fired == alerts and quiet == alerts, (alerts - fired, alerts - quiet)
    r = subprocess.run([promtool_binary(), "test", "rules", str(GRAFANA / "rules_test.yml")],
                       capture_output=True, text=True, timeout=60, cwd=GRAFANA)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_rules_have_annotations_and_for():
    for group in load_rules():
        for rule in group["rules"]:
            if "alert" not in rule:
                assert re.fullmatch(r"[a-z_]+:[a-z_]+:[a-z0-9_]+", rule["record"]), rule
                continue
            assert rule.get("for"), rule["alert"]
            assert rule["annotations"].get("summary") and rule["annotations"].get(
                "description"), rule["alert"]
            assert rule["labels"]["severity"] in ("warning", "critical")


# --------------------------------------------------------------------------- dashboard JSON

@pytest.mark.parametrize("uid", list(DASHBOARDS))
def test_dashboard_json_is_well_formed(uid):
    dash = load_dashboard(uid)
    assert dash["uid"] == uid and dash["id"] is None
    assert 36 <= dash["schemaVersion"] <= 41
    panels = list(all_panels(dash))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    cells = {}
    for p in panels:
        g = p["gridPos"]
        assert g["w"] >= 1 and g["h"] >= 1 and g["x"] >= 0 and g["y"] >= 0, p["title"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["fieldConfig"]["defaults"].get("unit"), f"{p['title']!r} has no unit"
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"]["uid"] == "${datasource}", v["name"]
    # no hard-coded datasource: the only uids are the variable, Grafana's own, the dashboard's
    uids = set(re.findall(r'"uid":\s*"([^"]*)"', json.dumps(dash)))
    assert uids <= {"${datasource}", "-- Grafana --", uid}, uids


def test_loadtest_dashboard_variables_and_links():
    dash = load_dashboard("frametap-loadtest")
    names = [v["name"] for v in dash["templating"]["list"]]
    assert names == ["datasource", "protocol", "route", "opcode"]
    links = {uid: [lk["url"] for lk in load_dashboard(uid)["links"]] for uid in DASHBOARDS}
    assert any(u.startswith("/d/frametap-proxy") for u in links["frametap-loadtest"])
    assert any(u.startswith("/d/frametap-loadtest") for u in links["frametap-proxy"])
    for uid in DASHBOARDS:
        for lk in load_dashboard(uid)["links"]:
            assert lk["keepTime"] and lk["includeVars"]


def test_provisioning_loads_both_dashboards():
    provider = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "frametap.yml")
                              .read_text())
    path = provider["providers"][0]["options"]["path"]
    readme = (GRAFANA / "README.md").read_text()
    # the README copies both JSON files into the provider's folder
    for f in DASHBOARDS.values():
        assert f"grafana/dashboards/{f.name}" in readme
    assert path in readme
    ds = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    assert ds["datasources"][0]["type"] == "prometheus"


# --------------------------------------------------------------------------- the exporter's parts

def test_histogram_takes_unrounded_milliseconds():
    m = LocustMetrics()
    m.observe("flymq", "PRODUCE", "ok", 0.3)       # 0.3 ms: Locust's stats would say 0
    m.observe("flymq", "PRODUCE", "ok", 0.05)      # exactly the first bound: le is inclusive
    m.observe("flymq", "PRODUCE", "ok", 0.0501)
    m.observe("flymq", "PRODUCE", "ok", 20000.0)   # over 10 s: +Inf only
    m.observe("flymq", "PRODUCE", "ok", None)      # counted, not timed (as Locust does)
    from prometheus_client.registry import CollectorRegistry
    reg = CollectorRegistry(auto_describe=False)
    reg.register(LocustCollector(m, lambda: 7))
    lab = {"protocol": "flymq", "opcode": "PRODUCE", "outcome": "ok"}

    def bucket(le):
        return reg.get_sample_value("frametap_locust_request_duration_seconds_bucket",
                                    dict(lab, le=le))
    assert bucket("5e-05") == 1                    # 0.05 ms
    assert bucket("0.0001") == 2                   # + 0.0501 ms
    assert bucket("0.00025") == 2
    assert bucket("0.0005") == 3                   # + 0.3 ms
    assert bucket("10.0") == 3 and bucket("+Inf") == 4
    assert reg.get_sample_value("frametap_locust_requests_total", lab) == 5
    assert reg.get_sample_value("frametap_locust_request_duration_seconds_count", lab) == 4
    total = reg.get_sample_value("frametap_locust_request_duration_seconds_sum", lab)
    assert total == pytest.approx((0.3 + 0.05 + 0.0501 + 20000.0) / 1000.0)
    assert reg.get_sample_value("frametap_locust_users") == 7


def test_odd_response_times_are_counted_not_timed():
    m = LocustMetrics()
    for odd in (float("nan"), float("inf"), "12", -1.0):
        m.observe("flymq", "FETCH", "ok", odd)
    row = m.rows[("flymq", "FETCH", "ok")]
    assert row[0] == 4                  # all counted (Locust counts them too)
    assert row[1] == 1 and row[3] == 1  # only -1 ms is timed: the lowest bucket


def test_worker_increments_add_up_on_the_master():
    master, w1, w2 = LocustMetrics(), LocustMetrics(), LocustMetrics()
    for i in range(100):
        w1.observe("flymq", "PRODUCE", "ok", i * 0.1)
        w2.observe("flymq", "PRODUCE", "error" if i % 4 == 0 else "ok", 2.0)
    master.merge(w1.take())
    assert w1.take() == []                          # taken increments are not sent twice
    w1.observe("flymq", "FETCH", "ok", 1.0)
    master.merge(w1.take())
    master.merge(w2.take())
    assert master.total_requests() == 201
    assert master.rows[("flymq", "PRODUCE", "error")][0] == 25
    ok = master.rows[("flymq", "PRODUCE", "ok")]
    assert ok[0] == 175 and ok[1] == 175 and sum(ok[3:]) == 175
    # garbage from a worker is ignored and counted, never a crash
    master.merge([["flymq", "X", "ok", 1]])
    master.merge("nonsense")
    master.merge([["flymq", "X", "ok"] + ["a"] * 21])
    assert master.malformed == 3 and master.total_requests() == 201


# Run in a child: importing locust monkey-patches this process for gevent, which would
# break the threaded servers other tests here run in-process.
_EARLY_SPAWN = """
import sys
from argparse import Namespace
from locust.env import Environment
from locust.event import Events
from locust.runners import WorkerRunner
from loadgen import locustmetrics
events = Events()
environment = Environment(events=events, parsed_options=Namespace(
    frametap_metrics="127.0.0.1:1", frametap_metrics_linger=0))

class Worker(WorkerRunner):          # only the runner's type is read by the plugin
    def __init__(self):
        pass

    def __del__(self):
        pass
runner = Worker()
environment.runner = runner if sys.argv[1] == "stored" else None
plugin = locustmetrics._Plugin()
for event, method in plugin.LISTENERS.items():
    getattr(events, event).add_listener(getattr(plugin, method))
events.test_start.fire(environment=environment)            # before init
environment.runner = runner
events.init.fire(environment=environment, runner=runner, web_ui=None)
for _ in range(3):
    events.request.fire(request_type="flymq", name="PRODUCE", response_time=1.0,
                        response_length=0, exception=None, context={})
data = {}
events.report_to_master.fire(client_id="w1", data=data)
master = locustmetrics.LocustMetrics()
master.merge(data.get(locustmetrics.REPORT_KEY, []))
print(master.total_requests(), plugin.server is None)
"""


@pytest.mark.parametrize("runner_stored", ["stored", "not-yet"])
def test_worker_counts_when_test_start_comes_before_init(runner_stored):
    """A worker can receive the master's first spawn (test_start) before its own init
    event fires - even before Locust has stored the runner it is still constructing in
    the environment; its requests must still reach the master's totals (this ordering
    lost one or both workers' share of a --processes 2 run on a loaded machine)."""
    res = subprocess.run([sys.executable, "-c", _EARLY_SPAWN, runner_stored], cwd=ROOT,
                         env=env(), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split() == ["3", "True"], res.stderr[-3000:]  # counted; no server


def test_labels_are_bounded():
    m = LocustMetrics()
    for i in range(MAX_OPCODES + 50):
        m.observe("http", f"/item/{i}", "ok", 1.0)
    opcodes = {k[1] for k in m.rows}
    assert len(opcodes) == MAX_OPCODES + 1 and "other" in opcodes
    assert m.rows[("http", "other", "ok")][0] == 50
    assert m.total_requests() == MAX_OPCODES + 50


def test_metrics_server_lingers_until_one_more_scrape():
    m = LocustMetrics()
    m.observe("flymq", "PRODUCE", "ok", 1.5)
    srv = MetricsServer(LocustCollector(m, lambda: 3), "127.0.0.1", 0)
    port = srv.port
    assert port != 0 and srv.address == f"127.0.0.1:{port}"
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        status, text = http_get(url)
        assert status == 200 and "frametap_locust_users 3.0" in text
        assert 'frametap_locust_requests_total{opcode="PRODUCE",outcome="ok",' \
               'protocol="flymq"} 1.0' in text
        # a scrape 0.5 s from now ends the linger; without one it lasts its full time
        got = []
        timer = threading.Timer(0.5, lambda: got.append(http_get(url)))
        timer.start()
        t0 = time.monotonic()
        assert srv.linger(10) is True
        assert 0.4 < time.monotonic() - t0 < 5
        timer.join(5)
        assert got and got[0][0] == 200
        t0 = time.monotonic()
        assert srv.linger(0.3) is False and time.monotonic() - t0 >= 0.3
        assert srv.linger(0) is False
    finally:
        srv.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_frametap_load_help_lists_both_plugins():
    """``frametap load`` installs the plugins before Locust parses its command line, so
    its ``--help`` shows the exporter's options next to the frame log's."""
    r = subprocess.run(FRAMETAP + ["load", "--help"], cwd=ROOT, env=env(),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    for option in ("--frametap-metrics HOST:PORT", "--frametap-metrics-linger SECONDS",
                   "--frametap-framelog DIR"):
        assert option in r.stdout, option


def test_option_values_are_checked():
    import argparse
    assert address_arg("127.0.0.1:9646") == "127.0.0.1:9646"
    assert address_arg("[::1]:9646") == "[::1]:9646"
    assert address_arg("127.0.0.1:0") == "127.0.0.1:0"      # a free port, see the ready file
    for bad in ("9646", "host:", "[::1:9646", "a:70000"):
        with pytest.raises(argparse.ArgumentTypeError):
            address_arg(bad)
    assert linger_arg("2.5") == 2.5
    for bad in ("-1", "x", "99999"):
        with pytest.raises(argparse.ArgumentTypeError):
            linger_arg(bad)


@pytest.mark.slow
def test_bad_option_and_busy_port_exit_2_with_one_line(tmp_path):
    r = subprocess.run(LOCUST + ["--headless", "-t", "1s", "--frametap-metrics", "nohost"],
                       cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--frametap-metrics" in r.stderr and "Traceback" not in r.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        r = subprocess.run(LOCUST + ["--headless", "-t", "1s", "-u", "1", "--host",
                                     "127.0.0.1:1", "--frametap-metrics", f"127.0.0.1:{port}"],
                           cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if "frametap-metrics" in ln]
    assert len(lines) == 1 and "cannot listen" in lines[0], r.stderr[-2000:]
    assert "Traceback" not in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("mode", [["--processes", "2"], []], ids=["processes-2", "plain"])
def test_served_totals_equal_locust_json(mode, tmp_path):
    """``--processes 2`` (the forked children are workers, the parent serves their totals)
    and a plain run (one process counts and serves): the last scrape, taken during the
    linger after the final report, equals Locust's --json count."""
    from loadgen.flymq.server import FlyMQServerThread
    with FlyMQServerThread() as srv:
        run = start_locust(tmp_path, "flymq", f"127.0.0.1:{srv.port}", ["FlyMQProducer"],
                           users=2, duration="3s",
                           args=["--frametap-metrics", "127.0.0.1:0",
                                 "--frametap-metrics-linger", "20"],
                           processes=2 if mode else None)
        port = host_port(run.metrics)[1]
        scrapes = []
        deadline = time.monotonic() + 60
        while run.poll() is None and time.monotonic() < deadline:
            try:
                status, text = http_get(f"http://127.0.0.1:{port}/metrics", timeout=2)
            except OSError:
                status, text = None, ""
            if status == 200:
                scrapes.append(text)
            time.sleep(0.3)
        out, err = run.communicate(timeout=30)
        proc = run.proc
    assert proc.returncode == 0, err[-3000:]
    expected = sum(e["num_requests"] for e in json_stats(out))   # one document: no worker's
    assert expected > 50
    totals = [sum(float(v) for v in re.findall(
        r'^frametap_locust_requests_total\{[^}]*\} (\S+)$', text, re.M)) for text in scrapes]
    assert totals[-1] == expected, (f"{len(totals)} scrapes, last {totals[-4:]}, "
                                    f"expected {expected}", err[-3000:])
    # the middle too: the served totals only ever grew (an exporter that lost or re-sent
    # a worker's report mid-run ends at the same total), and in a plain run a scrape
    # during the load saw part of it (the numbers are live, not filled in at the end;
    # --processes workers report every 3 s, so a 3 s run may show only the end)
    assert all(b >= a for a, b in zip(totals, totals[1:])), totals
    if not mode:
        assert any(0 < t < expected for t in totals), totals
    assert any(re.search(r"^frametap_locust_users 2\.0$", s, re.M) for s in scrapes)
    # the endpoint went away with Locust
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
