"""What the run files (proxy/runinfo.py) say about the runs being analysed.

The frame logs hold what crossed the wire; the run files beside them hold what ran: the
proxy's routes (name, protocol, listen and upstream address, timeouts), the Locust
settings (host, users, spawn rate, run time, user classes) and Locust's own totals, and
the demo's settings.  ``Runs`` gathers them for the report's headline, and names the
proxy route of each client row from the address the client sent it to.

Plain Python on the driver: nothing here touches Spark except ``client_route_column``,
which builds a column expression.
"""

import re

WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]", "", "*")


def _split(address):
    """``host:port`` / ``[v6]:port`` -> (host, port text); ``unix:/p`` -> (address, None)."""
    if not address or address.startswith("unix:"):
        return address, None
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return address, None
    return host, port


class Runs:
    """The run files' contents, by kind.  ``files``: the parsed JSON objects."""

    def __init__(self, files=()):
        self.files = [f for f in files if isinstance(f, dict)]
        self.proxies = [f for f in self.files if f.get("source") == "proxy"]
        self.clients = [f for f in self.files if f.get("source") == "client"]
        self.demos = [f for f in self.files if f.get("source") == "demo"]

    def __bool__(self):
        return bool(self.files)

    # ---- the proxy -------------------------------------------------------------------

    def routes(self):
        """Every proxy route of the run files (dicts: name, protocol, listen, upstream,
        request_timeout...), each name once (the first file's)."""
        seen, out = set(), []
        for f in self.proxies:
            for r in (f.get("proxy") or {}).get("routes") or []:
                if isinstance(r, dict) and r.get("name") and r["name"] not in seen:
                    seen.add(r["name"])
                    out.append(r)
        return out

    def route_by_address(self):
        """[(address or None, port or None, route name)]: how a client's target names
        a proxy route - the exact listen address first, then the port of a route that
        listens on every interface."""
        exact, wildcard = [], []
        for r in self.routes():
            listen = r.get("listen") or ""
            host, port = _split(listen)
            if port is not None and host in WILDCARD_HOSTS:
                wildcard.append((None, port, r["name"]))
            elif listen:
                exact.append((listen, None, r["name"]))
        return exact + wildcard

    # ---- Locust --------------------------------------------------------------------------

    def locust(self):
        """The ``locust`` sections (one per Locust run file)."""
        return [f.get("locust") or {} for f in self.clients]

    def locust_stats(self):
        """{(type, name): {"requests", "failures", "p50_ms", "p99_ms"}} summed over the
        Locust run files (percentiles only when one file has the pair)."""
        out = {}
        for section in self.locust():
            for e in section.get("stats") or []:
                key = (e.get("type"), e.get("name"))
                if key in out:
                    have = out[key]
                    have["requests"] += e.get("requests") or 0
                    have["failures"] += e.get("failures") or 0
                    have["p50_ms"] = have["p99_ms"] = None
                else:
                    out[key] = {"requests": e.get("requests") or 0,
                                "failures": e.get("failures") or 0,
                                "p50_ms": e.get("p50_ms"), "p99_ms": e.get("p99_ms")}
        return out

    def locust_errors(self):
        """Locust's error list: [{"type", "name", "error", "occurrences"}], largest first;
        messages that differ only in their numbers of three digits or more (``no user
        10029``, ``no user 10074``) are one row, those numbers shown as ``N``."""
        grouped = {}
        for section in self.locust():
            for e in section.get("errors") or []:
                if not isinstance(e, dict):
                    continue
                text = re.sub(r"\d{3,}", "N", str(e.get("error", "")))
                key = (e.get("type"), e.get("name"), text)
                grouped[key] = grouped.get(key, 0) + (e.get("occurrences") or 0)
        rows = [{"type": t, "name": n, "error": text, "occurrences": count}
                for (t, n, text), count in grouped.items()]
        return sorted(rows, key=lambda e: (-e["occurrences"], e["type"] or "", e["name"] or ""))

    def demo(self):
        return (self.demos[0].get("demo") or {}) if self.demos else {}

    # ---- the headline ----------------------------------------------------------------

    def settings(self, routes=True):
        """[(label, text)] of what ran, for the report's headline (empty without run
        files); ``routes``: with a line per proxy route."""
        out = []
        demo = self.demo()
        if demo:
            out.append(("demo", f"frametap demo: {demo.get('users')} users per protocol for "
                                f"{demo.get('seconds')} s, reference servers' service time "
                                f"{demo.get('service_time')}"))
        for section in self.locust():
            classes = ", ".join(section.get("user_classes") or []) or "?"
            parts = [f"{section.get('users')} users" if section.get("users") else None,
                     f"spawn rate {section.get('spawn_rate'):g}/s"
                     if isinstance(section.get("spawn_rate"), (int, float)) else None,
                     f"run time {section.get('run_time_s')} s"
                     if section.get("run_time_s") else None,
                     f"{section.get('expect_workers')} workers"
                     if section.get("expect_workers") else None,
                     f"host {section.get('host')}" if section.get("host") else None]
            text = ", ".join(p for p in parts if p)
            out.append((f"Locust ({', '.join(section.get('protocols') or []) or '?'})",
                        f"{text}; users {classes}"))
        for r in self.routes() if routes else ():
            out.append((f"route {r.get('name')}",
                        f"{r.get('protocol')}: {r.get('listen')} → {r.get('upstream')}, "
                        f"request timeout {r.get('request_timeout')} s"))
        return out


def client_route_column(routes):
    """A column: the row's ``route``, with a client row's target address replaced by the
    name of the proxy route that listens there (``routes``: Runs.route_by_address())."""
    from pyspark.sql import functions as F
    route = F.col("route")
    if not routes:
        return route
    client = F.col("source").eqNullSafe("client")
    expr = None
    for address, port, name in routes:
        if address is not None:
            cond = client & route.eqNullSafe(address)
        else:
            cond = client & route.endswith(":" + port)
        expr = F.when(cond, F.lit(name)) if expr is None else expr.when(cond, F.lit(name))
    return expr.otherwise(route)
