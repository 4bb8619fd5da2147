"""Prometheus export: a custom Collector that reads the native counters at scrape time.

Metric names and labels are a contract (docs/design.md, "Prometheus metrics"); nothing
on the per-frame path touches prometheus_client.

Every family is described once, in :data:`FAMILIES` (name, type, help, labels, and a
function yielding its rows from the routes' snapshots). Two things read that table:

* :meth:`FrametapCollector.collect`, the ``prometheus_client`` Collector interface
  (private registries in tests, ``get_sample_value``);
* :meth:`FrametapCollector.render`, what the admin endpoint serves: the same text
  ``generate_latest`` writes, byte for byte, produced in small pieces so that the event
  loop, which also relays, is never held for long. With 5 routes and full opcode
  tables (256 opcodes, both outcomes, 3 statuses) ``generate_latest`` takes 0.7-1.3 s
  of CPU and builds ~63,000 sample objects; ``render`` writes the same 7.3 MB in ~75 ms,
  straight from the snapshots, in steps of at most 100 lines (~0.1 ms) or one route's
  snapshot (~0.7 ms).
"""

from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily)
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import (UNDERSCORES, escape_label_name,
                                                       escape_metric_name)
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from proxy.framing_common import BUCKETS
from proxy.tls import (metric_rows_client_hellos, metric_rows_durations,
                       metric_rows_handshakes)

#: lines per piece of :meth:`FrametapCollector.render` (~1 µs a line: a piece is ~0.1 ms)
LINES_PER_PIECE = 100


def _buckets(counts):
    """Per-bucket counts (last = +Inf) -> cumulative [(le, count)] for Prometheus."""
    out, acc = [], 0
    for bound, n in zip(BUCKETS, counts):
        acc += n
        out.append((repr(float(bound)), acc))
    acc += counts[-1]
    out.append(("+Inf", acc))
    return out, acc


# ---- rows of each family, from a Scrape (one snapshot per route) -------------------------

def _frames(sc):
    for s in sc.snaps:
        for (d, op), v in s["frames"].items():
            yield (s["route"], s["protocol"], d, op), v


def _frame_bytes(sc):
    for s in sc.snaps:
        fb = s["frame_bytes"]
        for key in s["frames"]:
            yield (s["route"], s["protocol"]) + key, fb[key]


def _messages(sc):
    for s in sc.snaps:
        for (d, op), v in s["messages"].items():
            yield (s["route"], s["protocol"], d, op), v


def _raw_bytes(sc):
    for s in sc.snaps:
        for d, v in s["bytes"].items():
            yield (s["route"], d), v


def _durations(sc):
    for s in sc.snaps:
        for (op, outcome), (counts, total_s) in s["hist"].items():
            yield (s["route"], s["protocol"], op, outcome), (counts, total_s)


def _responses(sc):
    for s in sc.snaps:
        for (op, status), v in s["responses"].items():
            yield (s["route"], s["protocol"], op, status), v


def _per_route_protocol(key):
    def rows(sc):
        for s in sc.snaps:
            yield (s["route"], s["protocol"]), s[key]
    return rows


def _per_opcode(key):
    def rows(sc):
        for s in sc.snaps:
            for op, v in s[key].items():
                yield (s["route"], s["protocol"], op), v
    return rows


def _faults_injected(sc):
    for s in sc.snaps:
        for (op, fault, action), v in s.get("faults", {}).items():
            yield (s["route"], s["protocol"], op, fault, action), v


def _protocol_errors(sc):
    for s in sc.snaps:
        for (d, reason), v in s["errors"].items():
            yield (s["route"], s["protocol"], d, reason), v


def _per_route(key):
    def rows(sc):
        for s in sc.snaps:
            yield (s["route"],), s[key]
    return rows


def _closed(sc):
    for s in sc.snaps:
        for (by, reason), v in s["closed"].items():
            yield (s["route"], by, reason), v


def _accept_errors(sc):
    for s in sc.snaps:
        for reason, v in s["accept_errors"].items():
            yield (s["route"], reason), v


def _connect_durations(sc):
    for s in sc.snaps:
        yield (s["route"],), s["connect_hist"]


def _pending_bytes(sc):
    yield (), sc.pending_bytes


def _framelog_per_route(attr):
    def rows(sc):
        counts = getattr(sc, attr)
        for s in sc.snaps:
            yield (s["route"],), counts.get(s["route"], 0)
    return rows


def _scalar(attr):
    def rows(sc):
        yield (), getattr(sc, attr)
    return rows


RP = ("route", "protocol")

#: (name, type, help, label names, rows(scrape) -> ((label values), value)), in output
#: order; a histogram's value is (per-bucket counts with +Inf last, sum).
FAMILIES = (
    ("frametap_frames", "counter", "Frames seen, by direction and opcode",
     RP + ("direction", "opcode"), _frames),
    ("frametap_frame_bytes", "counter", "Bytes of whole frames (header included), by "
     "direction and opcode", RP + ("direction", "opcode"), _frame_bytes),
    ("frametap_messages", "counter", "Messages carried by frames (batches, fetches and "
     "deliveries count each message)", RP + ("direction", "opcode"), _messages),
    ("frametap_bytes", "counter", "Raw bytes relayed", ("route", "direction"), _raw_bytes),
    ("frametap_request_duration_seconds", "histogram", "Request to response time seen at "
     "the proxy", RP + ("opcode", "outcome"), _durations),
    ("frametap_responses", "counter", "Responses by request opcode and status",
     RP + ("opcode", "status"), _responses),
    ("frametap_requests_in_flight", "gauge", "Requests sent and not yet answered", RP,
     _per_route_protocol("in_flight")),
    ("frametap_request_timeouts", "counter", "Requests with no answer within "
     "request_timeout", RP + ("opcode",), _per_opcode("timeouts")),
    ("frametap_request_cutoffs", "counter", "Requests whose connection closed before their "
     "answer (a run's end, a reset, an upstream that went away)", RP + ("opcode",),
     _per_opcode("cutoffs")),
    ("frametap_unmatched_responses", "counter", "Responses that matched no pending request",
     RP, _per_route_protocol("unmatched")),
    ("frametap_protocol_errors", "counter", "Protocol violations seen",
     RP + ("direction", "reason"), _protocol_errors),
    ("frametap_faults_injected", "counter", "Faults the proxy injected: rules (by opcode) "
     "and toxics (opcode \"\", action = the toxic's type)",
     RP + ("opcode", "fault", "action"), _faults_injected),
    ("frametap_connections_active", "gauge", "Open client connections", ("route",),
     _per_route("conn_active")),
    ("frametap_connections", "counter", "Client connections accepted", ("route",),
     _per_route("conn_total")),
    ("frametap_connections_rejected", "counter", "Client connections refused because the "
     "route's max_connections was reached", ("route",), _per_route("conn_rejected")),
    ("frametap_connections_closed", "counter", "Client connections closed, by who closed "
     "them (client, upstream, proxy) and why", ("route", "by", "reason"), _closed),
    ("frametap_accept_errors", "counter", "Accepts that failed because the process or "
     "system ran out of file descriptors (the listener pauses briefly; clients wait in the "
     "backlog)", ("route", "reason"), _accept_errors),
    ("frametap_upstream_connect_failures", "counter", "Upstream connects that failed or "
     "timed out", ("route",), _per_route("connect_failures")),
    ("frametap_upstream_connect_duration_seconds", "histogram", "Time to connect to the "
     "upstream", ("route",), _connect_durations),
    ("frametap_pending_bytes", "gauge", "Memory of every connection's pending-request "
     "tables (against [proxy] max_pending_bytes)", (), _pending_bytes),
    ("frametap_framelog_records", "counter", "Frame-log rows written to finished files",
     ("route",), _framelog_per_route("framelog_records")),
    ("frametap_framelog_dropped", "counter", "Frame-log rows discarded (writer behind, or "
     "lost to a write error)", ("route",), _framelog_per_route("framelog_dropped")),
    ("frametap_framelog_files", "counter", "Frame-log files completed", (),
     _scalar("framelog_files")),
    ("frametap_framelog_write_errors", "counter", "Frame-log writes that failed (disk "
     "full, unwritable directory)", (), _scalar("framelog_write_errors")),
    # [routes.tls] (proxy.tls): side "listen" (the clients') or "upstream"
    ("frametap_tls_handshakes", "counter", "TLS handshakes by side and outcome (ok, timeout, "
     "verify_failed, protocol_error)", ("route", "side", "outcome"), metric_rows_handshakes),
    ("frametap_tls_handshake_duration_seconds", "histogram", "TLS handshake time, failed "
     "ones included", ("route", "side"), metric_rows_durations),
    ("frametap_tls_client_hellos", "counter", "passthrough routes: first client records "
     "read, by what they held (sni, no_sni, not_tls, bad)", ("route", "outcome"),
     metric_rows_client_hellos),
)

_METRIC_TYPES = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily,
                 "histogram": HistogramMetricFamily}


class Scrape:
    """What one scrape reads: a snapshot per route, the pending-table memory, the frame
    log's counts. Every family's rows come from here, so they agree with each other."""

    def __init__(self):
        self.snaps = []
        self.pending_bytes = 0
        self.framelog_records = {}
        self.framelog_dropped = {}
        self.framelog_files = 0
        self.framelog_write_errors = 0


# ---- the text format, as prometheus_client.exposition.generate_latest writes it -----------

def _value(v):
    """floatToGoString(v), without its cost for the usual numbers."""
    s = repr(float(v))
    if s.find(".") > 6 or s[-1] in "fn":     # >= 1e6 (Go's exponent form), inf, nan
        return floatToGoString(v)
    return s


def _label_value(v):
    if "\\" in v or "\n" in v or '"' in v:
        return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')
    return v


class _Format:
    """One family's text: the HELP and TYPE lines, and its sample lines (labels sorted by
    name, as generate_latest sorts them)."""

    def __init__(self, name, kind, doc, labelnames):
        self.kind = kind
        base = name + "_total" if kind == "counter" else name
        shown = escape_metric_name(base, UNDERSCORES)
        self.head = "# HELP {} {}\n# TYPE {} {}\n".format(
            shown, doc.replace("\\", r"\\").replace("\n", r"\n"), shown, kind)
        self.sample = shown if kind != "histogram" else escape_metric_name(name, UNDERSCORES)
        self.names = [escape_label_name(n, UNDERSCORES) for n in labelnames]
        self.order = sorted(range(len(labelnames)), key=lambda i: labelnames[i])
        if kind == "histogram":
            # where "le" falls among the sorted label names
            self.le_at = sum(1 for n in labelnames if n < "le")

    def labels(self, values):
        """The sorted label pairs of one row, escaped."""
        return [f'{self.names[i]}="{_label_value(values[i])}"' for i in self.order]

    def lines(self, values, value, out):
        pairs = self.labels(values)
        if self.kind != "histogram":
            if pairs:
                out.append(f"{self.sample}{{{','.join(pairs)}}} {_value(value)}\n")
            else:
                out.append(f"{self.sample} {_value(value)}\n")
            return
        counts, total_s = value
        buckets, count = _buckets(counts)
        before = "".join(p + "," for p in pairs[:self.le_at])
        after = "".join("," + p for p in pairs[self.le_at:])
        name = self.sample
        for le, n in buckets:
            out.append(f'{name}_bucket{{{before}le="{le}"{after}}} {_value(n)}\n')
        labels = "{" + ",".join(pairs) + "}" if pairs else ""
        out.append(f"{name}_count{labels} {_value(count)}\n")
        out.append(f"{name}_sum{labels} {_value(total_s)}\n")


_FORMATS = [(_Format(name, kind, doc, labels), rows)
            for name, kind, doc, labels, rows in FAMILIES]


class FrametapCollector(Collector):
    """Yields every frametap_* family from the routes' RouteStats snapshots."""

    def __init__(self, routes, framelog=None):
        self._routes = routes          # callable -> iterable of Route (or RouteStats)
        self._framelog = framelog      # callable -> proxy.framelog.FrameLog or None

    @staticmethod
    def snapshot(route):
        """One route's counters (RouteStats.snapshot() plus the relay's own counts)."""
        stats = getattr(route, "stats", route)
        snap = dict(stats.snapshot())
        # Tuples of numbers, not lists: a render keeps its snapshots over many loop
        # iterations, and a list is tracked by the garbage collector for as long as it
        # lives (5,000 of them at 5 full routes, enough to make every render trigger a
        # full collection of the whole process); tuples of numbers are untracked.
        snap["hist"] = {key: (tuple(counts), total)
                        for key, (counts, total) in snap["hist"].items()}
        counts, total = snap["connect_hist"]
        snap["connect_hist"] = (tuple(counts), total)
        snap["closed"] = dict(getattr(route, "closed_counts", {}))
        snap["accept_errors"] = dict(getattr(route, "accept_errors", {}))
        faults = getattr(route, "faults", None)
        snap["faults"] = dict(faults.injected) if faults is not None else {}
        tls = getattr(route, "tls", None)
        snap["tls"] = tls.snapshot() if tls is not None else None
        return snap

    def _scrape_rest(self, sc):
        from proxy.framing import pending_bytes
        sc.pending_bytes = pending_bytes()
        fl = self._framelog() if self._framelog is not None else None
        if fl is not None:
            sc.framelog_records = dict(fl.records)
            sc.framelog_dropped = dict(fl.dropped())
            sc.framelog_files = fl.files
            sc.framelog_write_errors = fl.write_errors

    def scrape(self):
        sc = Scrape()
        sc.snaps = [self.snapshot(r) for r in self._routes()]
        self._scrape_rest(sc)
        return sc

    def collect(self):
        sc = self.scrape()
        for name, kind, doc, labels, rows in FAMILIES:
            family = _METRIC_TYPES[kind](name, doc, labels=labels)
            for values, value in rows(sc):
                if kind == "histogram":
                    family.add_metric(values, _buckets(value[0])[0], value[1])
                else:
                    family.add_metric(values, value)
            yield family

    def render(self, lines_per_piece=LINES_PER_PIECE):
        """The text exposition of every family, as UTF-8 pieces, in bounded steps: at
        most ``lines_per_piece`` lines (a histogram row's buckets are never split), or
        one route's snapshot, the biggest step (~0.7 ms for a route with 256 opcodes),
        which comes between two ``None`` so that a caller can give it a slice of its
        own. Routes are read one per step, so two routes' counters may be read a few
        steps apart; each route's counters are read at one instant."""
        sc = Scrape()
        for route in list(self._routes()):
            yield None
            sc.snaps.append(self.snapshot(route))
        yield None
        self._scrape_rest(sc)
        out = []
        for fmt, rows in _FORMATS:
            out.append(fmt.head)
            for values, value in rows(sc):
                fmt.lines(values, value, out)
                if len(out) >= lines_per_piece:
                    yield "".join(out).encode()
                    out = []
        if out:
            yield "".join(out).encode()


def make_registry(routes, framelog=None):
    """A private registry holding only frametap's collector (plus process metrics)."""
    from prometheus_client import ProcessCollector
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FrametapCollector(routes, framelog))
    ProcessCollector(registry=registry)
    return registry


class Exposition:
    """What the admin endpoint's /metrics serves, the text of
    ``generate_latest(make_registry(routes, framelog))``: frametap's families, made on
    the event loop in bounded steps (:meth:`pieces`), then the process metrics
    (:meth:`process_text`, to be called off the loop)."""

    def __init__(self, routes, framelog=None):
        from prometheus_client import ProcessCollector
        self.collector = FrametapCollector(routes, framelog)
        self.process = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.process)

    def pieces(self):
        """UTF-8 pieces of frametap's families, and ``None`` (see
        :meth:`FrametapCollector.render`)."""
        return self.collector.render()

    def process_text(self):
        """The process_* metrics as UTF-8. Blocking: it lists /proc/self/fd, ~40 ms at
        18,000 open descriptors (a proxy with 9,000 connections), so the admin endpoint
        runs it in a thread (``os.listdir`` lets go of the GIL for every entry)."""
        return generate_latest(self.process)
