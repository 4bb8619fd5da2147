"""A real Prometheus scrapes a real proxy process; the Grafana dashboard's queries run on it.

Stack (all subprocesses on 127.0.0.1, port 0: each names its ports in its ready file): the reference FlyMQ server, the proxy
(``python -m proxy proxy --protocol flymq ... --admin ...``) and ``prometheus`` (Debian
package ``prometheus``) scraping the proxy's admin port every second. PRODUCE requests go
through the proxy with the sync FlyMQClient, and Prometheus' HTTP API must then report
exactly those frames. Every PromQL expression of grafana/dashboards/frametap.json is run
against that Prometheus (a syntax error or unknown function fails), and every frametap_*
metric the dashboard names must be one the proxy exposes (docs/design.md, "Prometheus metrics").

Without the prometheus binary the Prometheus tests skip, or fail when FRAMETAP_CI is set.
"""

import json
import math
import re
import subprocess

import pytest

from loadgen.flymq.client import FlyMQClient
from tests._support.processes import ROOT, proxy_process, server_process
from tests.prom_support import (all_panels, dashboard_exprs, exposed_families, family_of,
                                http_get, metric_names, promtool_binary, start_prometheus,
                                stop, variable_queries)
from tests.prom_support import substitute as substitute_vars

GRAFANA = ROOT / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "frametap.json"
ROUTE = "fly"                  # --name of the proxy's route
JOB = "frametap"
TOPIC = "scrape-test"
N_REQUESTS = 50

# Every metric family the dashboard may use: the contract of docs/design.md, "Prometheus
# metrics" (including the framelog families designed there but not exported yet). (The
# test also checks the proxy exposes the ones the dashboard uses.)
CONTRACT = {
    "frametap_frames_total", "frametap_frame_bytes_total", "frametap_messages_total",
    "frametap_bytes_total", "frametap_request_duration_seconds", "frametap_responses_total",
    "frametap_requests_in_flight", "frametap_request_timeouts_total",
    "frametap_unmatched_responses_total", "frametap_protocol_errors_total",
    "frametap_connections_active", "frametap_connections_total",
    "frametap_upstream_connect_failures_total", "frametap_upstream_connect_duration_seconds",
    "frametap_framelog_records_total", "frametap_framelog_dropped_total",
    "frametap_connections_rejected_total",
    # the shared design's "Faults" section
    "frametap_faults_injected_total",
    # docs/design.md's own: requests whose connection closed before their answer (kept
    # apart from frametap_request_timeouts_total, which counts only real timeouts)
    "frametap_request_cutoffs_total",
    # the shared design's "Transports" section
    "frametap_tls_handshakes_total", "frametap_tls_handshake_duration_seconds",
}
CONTRACT_LABELS = {"route", "protocol", "direction", "opcode", "outcome", "status", "reason",
                   "le", "job", "instance", "fault", "action", "side"}

# Grafana variables -> what they expand to for a single route/protocol.
VARIABLES = {
    "route": ROUTE,
    "protocol": "flymq",
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "5m",
    "__range_s": "300",
    "__range_ms": "300000",
    "__interval_ms": "15000",
}


# --------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def proxy_stack(tmp_path_factory):
    """Reference FlyMQ server + proxy process with an admin listener (all on port 0)."""
    tmp = tmp_path_factory.mktemp("proxy")
    with server_process(tmp, "flymq") as server, \
            proxy_process(tmp, ["--protocol", "flymq", "--name", ROUTE,
                                "--listen", "127.0.0.1:0", "--upstream", server.address,
                                "--admin", "127.0.0.1:0"]) as proxy:
        yield {"port": proxy.port(ROUTE), "admin": proxy.admin_port, "upstream": server.port}


@pytest.fixture(scope="module")
def prometheus(proxy_stack, tmp_path_factory):
    """A real Prometheus scraping the proxy's admin port every second."""
    proc, prom = start_prometheus(tmp_path_factory.mktemp("prom"),
                                  {JOB: [f"127.0.0.1:{proxy_stack['admin']}"]})
    try:
        # the target must be scraped once before traffic, so rates have a baseline
        prom.wait_value(f'up{{job="{JOB}"}}', lambda v: v == 1, "up == 1")
        yield prom
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def traffic(proxy_stack, prometheus):
    """N_REQUESTS PRODUCE requests through the proxy, in two halves seen by Prometheus."""
    sel = f'frametap_frames_total{{route="{ROUTE}",direction="c2s",opcode="PRODUCE"}}'
    with FlyMQClient("127.0.0.1", proxy_stack["port"]) as client:
        half = N_REQUESTS // 2
        for i in range(half):
            client.produce(TOPIC, b"value-%d" % i)
        # a scrape between the halves gives rate() two distinct points
        prometheus.wait_value(sel, lambda v: v == half, f"{half} PRODUCE frames")
        for i in range(half, N_REQUESTS):
            client.produce(TOPIC, b"value-%d" % i)
    prometheus.wait_value(sel, lambda v: v == N_REQUESTS, f"{N_REQUESTS} PRODUCE frames")
    return N_REQUESTS


# --------------------------------------------------------------------------- dashboard

def load_dashboard():
    return json.loads(DASHBOARD.read_text())


def substitute(expr):
    return substitute_vars(expr, VARIABLES)


# --------------------------------------------------------------------------- tests

def test_prometheus_scrapes_proxy(proxy_stack, prometheus, traffic):
    assert prometheus.scalar(
        f'frametap_frames_total{{direction="c2s",opcode="PRODUCE"}}') == traffic
    assert prometheus.scalar(f'up{{job="{JOB}"}}') == 1
    # every request was answered: as many s2c PRODUCE frames and histogram observations
    assert prometheus.scalar(
        f'frametap_frames_total{{direction="s2c",opcode="PRODUCE"}}') == traffic
    assert prometheus.scalar(
        'sum(frametap_request_duration_seconds_count{opcode="PRODUCE"})') == traffic
    assert prometheus.scalar('frametap_connections_total') >= 1
    q = prometheus.scalar(
        "histogram_quantile(0.99, sum by (le) (frametap_request_duration_seconds_bucket))")
    assert q is not None and math.isfinite(q) and 0 < q <= 10, q


def test_dashboard_queries_run_on_prometheus(prometheus, traffic):
    dash = load_dashboard()
    exprs = dashboard_exprs(dash)
    assert len(exprs) >= 20
    failures, results = [], {}
    for title, ref, expr in exprs:
        q = substitute(expr)
        r = prometheus.query(q)
        if r.get("status") != "success":
            failures.append(f"{title} [{ref}]: {q}\n    -> {r.get('errorType')}: {r.get('error')}")
        else:
            results[(title, ref)] = r["data"]["result"]
    assert not failures, "dashboard queries rejected by Prometheus:\n" + "\n".join(failures)

    # the core panels show the traffic that just went through
    rps = {s["metric"].get("opcode"): float(s["value"][1])
           for s in results[("Requests/s by opcode", "A")]}
    assert rps.get("PRODUCE", 0) > 0, rps
    frames = {s["metric"].get("direction") for s in results[("Frames/s by direction", "A")]}
    assert frames == {"c2s", "s2c"}, frames
    active = results[("Active connections", "A")]
    assert active and active[0]["metric"].get("route") == ROUTE, active


def test_dashboard_variables_resolve(prometheus, traffic):
    dash = load_dashboard()
    expected = {"route": ROUTE, "protocol": "flymq"}
    found = {}
    for name, query in variable_queries(dash):
        m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", query)
        assert m, f"variable {name}: expected label_values(selector, label), got {query!r}"
        selector, label = substitute(m.group(1)), m.group(2)
        r = prometheus.api(f"label/{label}/values", {"match[]": selector})
        assert r.get("status") == "success", (name, selector, r)
        found[name] = r["data"]
    for name, value in expected.items():
        assert value in found.get(name, []), (name, found)


def test_dashboard_uses_only_exposed_contract_metrics(proxy_stack):
    status, text = http_get(f"http://127.0.0.1:{proxy_stack['admin']}/metrics", timeout=5)
    assert status == 200
    exposed = exposed_families(text)
    dash = load_dashboard()
    names = set()
    for _, _, expr in dashboard_exprs(dash):
        names |= metric_names(expr)
    for _, query in variable_queries(dash):
        names |= metric_names(query)
    assert len(names) >= 14, names
    unknown = sorted(n for n in names if not any(f in exposed for f in family_of(n)))
    assert not unknown, f"dashboard uses metrics the proxy does not expose: {unknown}"
    # ...and each is a contract family, in the form Prometheus stores it
    off_contract = sorted(n for n in names
                          if n not in CONTRACT and not any(f in CONTRACT for f in family_of(n)))
    assert not off_contract, f"dashboard metrics outside docs/design.md's contract: {off_contract}"
    for n in names:
        if n.startswith(("frametap_request_duration_seconds", "frametap_upstream_connect_duration",
                         "frametap_tls_handshake_duration")):
            assert n.endswith(("_bucket", "_count", "_sum")), f"histogram used bare: {n}"


def test_dashboard_labels_and_datasource():
    dash = load_dashboard()
    assert 36 <= dash["schemaVersion"] <= 41
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    assert {"route", "protocol"} <= set(variables)
    for name in ("route", "protocol"):
        assert "label_values" in json.dumps(variables[name]["query"])
    for p in all_panels(dash):
        if p.get("type") == "row":
            continue
        assert p["datasource"]["uid"] in ("${datasource}", "$datasource"), p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] in ("${datasource}", "$datasource"), p["title"]
    # only contract labels in selectors and grouping clauses
    for title, _, expr in dashboard_exprs(dash):
        labels = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)\s*\"", expr))
        for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
            labels |= {x.strip() for x in group.split(",") if x.strip()}
        assert labels <= CONTRACT_LABELS, (title, labels - CONTRACT_LABELS)
    ids = [p["id"] for p in all_panels(dash)]
    assert len(ids) == len(set(ids)), "duplicate panel ids"


def test_example_prometheus_config_is_valid():
    text = (GRAFANA / "prometheus.yml").read_text()
    assert "job_name: frametap" in text and "127.0.0.1:9400" in text
    assert re.search(r"scrape_interval:\s*5s", text)
    r = subprocess.run([promtool_binary(), "check", "config", str(GRAFANA / "prometheus.yml")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr


def test_grafana_provisioning_files():
    ds = (GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text()
    assert "apiVersion: 1" in ds and "type: prometheus" in ds
    dp = (GRAFANA / "provisioning" / "dashboards" / "frametap.yml").read_text()
    assert "apiVersion: 1" in dp and "type: file" in dp and "path:" in dp
