"""Helpers for the tests that run a real Prometheus: Grafana dashboard JSON and PromQL
text (here), and Prometheus itself with the HTTP helpers (tests/_support/prometheus.py,
re-exported).

Used by tests/test_prometheus_scrape.py and tests/test_grafana_loadtest.py. Without the
binaries those tests skip, or fail when FRAMETAP_CI is set.
"""

import re

from tests._support.prometheus import (MISSING, Prom, http_get, prometheus_binary,  # noqa: F401
                                       promtool_binary, start_prometheus, stop, wait_http,
                                       wait_port)

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
