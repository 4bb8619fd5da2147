"""Prometheus export: a custom Collector that reads the native counters at scrape time.

Metric names and labels are a contract (docs/design.md, "Prometheus metrics"); nothing
on the per-frame path touches prometheus_client.
"""

from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily)
from prometheus_client.registry import Collector, CollectorRegistry

from proxy.framing_common import BUCKETS


def _buckets(counts):
    """Per-bucket counts (last = +Inf) -> cumulative [(le, count)] for Prometheus."""
    out, acc = [], 0
    for bound, n in zip(BUCKETS, counts):
        acc += n
        out.append((repr(float(bound)), acc))
    acc += counts[-1]
    out.append(("+Inf", acc))
    return out, acc


class FrametapCollector(Collector):
    """Yields every frametap_* family from the routes' RouteStats snapshots."""

    def __init__(self, routes, framelog=None):
        self._routes = routes          # callable -> iterable of Route (or RouteStats)
        self._framelog = framelog      # callable -> proxy.framelog.FrameLog or None

    def collect(self):
        snaps = []
        closes = []
        accept_errors = []
        for r in self._routes():
            stats = getattr(r, "stats", r)
            snaps.append(stats.snapshot())
            closes.append(dict(getattr(r, "closed_counts", {})))
            accept_errors.append(dict(getattr(r, "accept_errors", {})))
        rp = ["route", "protocol"]
        frames = CounterMetricFamily("frametap_frames", "Frames seen, by direction and opcode",
                                     labels=rp + ["direction", "opcode"])
        fbytes = CounterMetricFamily("frametap_frame_bytes", "Bytes of whole frames (header "
                                     "included), by direction and opcode",
                                     labels=rp + ["direction", "opcode"])
        msgs = CounterMetricFamily("frametap_messages", "Messages carried by frames (batches, "
                                   "fetches and deliveries count each message)",
                                   labels=rp + ["direction", "opcode"])
        raw = CounterMetricFamily("frametap_bytes", "Raw bytes relayed",
                                  labels=["route", "direction"])
        dur = HistogramMetricFamily("frametap_request_duration_seconds",
                                    "Request to response time seen at the proxy",
                                    labels=rp + ["opcode", "outcome"])
        resp = CounterMetricFamily("frametap_responses", "Responses by request opcode and status",
                                   labels=rp + ["opcode", "status"])
        inflight = GaugeMetricFamily("frametap_requests_in_flight",
                                     "Requests sent and not yet answered", labels=rp)
        timeouts = CounterMetricFamily("frametap_request_timeouts", "Requests with no answer "
                                       "within request_timeout, or whose connection closed first",
                                       labels=rp + ["opcode"])
        unmatched = CounterMetricFamily("frametap_unmatched_responses",
                                        "Responses that matched no pending request", labels=rp)
        perr = CounterMetricFamily("frametap_protocol_errors", "Protocol violations seen",
                                   labels=rp + ["direction", "reason"])
        active = GaugeMetricFamily("frametap_connections_active", "Open client connections",
                                   labels=["route"])
        total = CounterMetricFamily("frametap_connections", "Client connections accepted",
                                    labels=["route"])
        rejected = CounterMetricFamily("frametap_connections_rejected", "Client connections "
                                       "refused because the route's max_connections was reached",
                                       labels=["route"])
        closed = CounterMetricFamily("frametap_connections_closed", "Client connections "
                                     "closed, by who closed them (client, upstream, proxy) "
                                     "and why", labels=["route", "by", "reason"])
        aerr = CounterMetricFamily("frametap_accept_errors", "Accepts that failed because "
                                   "the process or system ran out of file descriptors "
                                   "(the listener pauses briefly; clients wait in the "
                                   "backlog)", labels=["route", "reason"])
        cfail = CounterMetricFamily("frametap_upstream_connect_failures",
                                    "Upstream connects that failed or timed out", labels=["route"])
        cdur = HistogramMetricFamily("frametap_upstream_connect_duration_seconds",
                                     "Time to connect to the upstream", labels=["route"])
        for s in snaps:
            route, proto = s["route"], s["protocol"]
            for (d, op), v in s["frames"].items():
                frames.add_metric([route, proto, d, op], v)
                fbytes.add_metric([route, proto, d, op], s["frame_bytes"][(d, op)])
            for (d, op), v in s["messages"].items():
                msgs.add_metric([route, proto, d, op], v)
            for d, v in s["bytes"].items():
                raw.add_metric([route, d], v)
            for (op, outcome), (counts, total_s) in s["hist"].items():
                b, _ = _buckets(counts)
                dur.add_metric([route, proto, op, outcome], b, total_s)
            for (op, status), v in s["responses"].items():
                resp.add_metric([route, proto, op, status], v)
            inflight.add_metric([route, proto], s["in_flight"])
            for op, v in s["timeouts"].items():
                timeouts.add_metric([route, proto, op], v)
            unmatched.add_metric([route, proto], s["unmatched"])
            for (d, reason), v in s["errors"].items():
                perr.add_metric([route, proto, d, reason], v)
            active.add_metric([route], s["conn_active"])
            total.add_metric([route], s["conn_total"])
            rejected.add_metric([route], s["conn_rejected"])
            cfail.add_metric([route], s["connect_failures"])
            counts, total_s = s["connect_hist"]
            b, _ = _buckets(counts)
            cdur.add_metric([route], b, total_s)
        for s, counts in zip(snaps, closes):
            for (by, reason), v in counts.items():
                closed.add_metric([s["route"], by, reason], v)
        for s, counts in zip(snaps, accept_errors):
            for reason, v in counts.items():
                aerr.add_metric([s["route"], reason], v)
        yield from (frames, fbytes, msgs, raw, dur, resp, inflight, timeouts, unmatched, perr,
                    active, total, rejected, closed, aerr, cfail, cdur)
        from proxy.framing import pending_bytes
        yield GaugeMetricFamily("frametap_pending_bytes", "Memory of every connection's "
                                "pending-request tables (against [proxy] max_pending_bytes)",
                                value=pending_bytes())
        yield from self._framelog_metrics([s["route"] for s in snaps])

    def _framelog_metrics(self, routes):
        fl = self._framelog() if self._framelog is not None else None
        records = CounterMetricFamily("frametap_framelog_records", "Frame-log rows written "
                                      "to finished files", labels=["route"])
        dropped = CounterMetricFamily("frametap_framelog_dropped", "Frame-log rows discarded "
                                      "(writer behind, or lost to a write error)",
                                      labels=["route"])
        written = fl.records if fl is not None else {}
        lost = fl.dropped() if fl is not None else {}
        for route in routes:
            records.add_metric([route], written.get(route, 0))
            dropped.add_metric([route], lost.get(route, 0))
        yield records
        yield dropped
        yield CounterMetricFamily("frametap_framelog_files", "Frame-log files completed",
                                  value=fl.files if fl is not None else 0)
        yield CounterMetricFamily("frametap_framelog_write_errors", "Frame-log writes that "
                                  "failed (disk full, unwritable directory)",
                                  value=fl.write_errors if fl is not None else 0)


def make_registry(routes, framelog=None):
    """A private registry holding only frametap's collector (plus process metrics)."""
    from prometheus_client import ProcessCollector
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FrametapCollector(routes, framelog))
    ProcessCollector(registry=registry)
    return registry
