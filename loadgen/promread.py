"""Read frametap's /metrics text back into per-opcode numbers (demo and bench reports)."""

import urllib.request
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families


def fetch(url, timeout=5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def histogram_quantile(q, buckets):
    """Prometheus' histogram_quantile: ``buckets`` = sorted [(le, cumulative count)]."""
    if not buckets or buckets[-1][1] == 0:
        return float("nan")
    total = buckets[-1][1]
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return prev_le                 # as Prometheus: the highest finite bound
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return prev_le


def per_opcode(text, route=None):
    """{opcode: {"requests", "errors", "timeouts", "cutoffs", "p50", "p99", "c2s_frames",
    "s2c_frames"}} of a scrape (``cutoffs``: requests whose connection closed before the
    answer, counted apart from timeouts)."""
    buckets = defaultdict(lambda: defaultdict(float))    # opcode -> le -> cumulative
    out = defaultdict(lambda: {"requests": 0.0, "errors": 0.0, "timeouts": 0.0,
                               "cutoffs": 0.0, "c2s_frames": 0.0, "s2c_frames": 0.0})
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if route is not None and s.labels.get("route") not in (None, route):
                continue
            op = s.labels.get("opcode")
            if s.name == "frametap_request_duration_seconds_bucket":
                buckets[op][float(s.labels["le"])] += s.value
            elif s.name == "frametap_request_duration_seconds_count":
                out[op]["requests"] += s.value
                if s.labels.get("outcome") == "error":
                    out[op]["errors"] += s.value
            elif s.name == "frametap_request_timeouts_total":
                out[op]["timeouts"] += s.value
            elif s.name == "frametap_request_cutoffs_total":
                out[op]["cutoffs"] += s.value
            elif s.name == "frametap_frames_total" and s.labels.get("direction") in (
                    "c2s", "s2c"):
                out[op][s.labels["direction"] + "_frames"] += s.value
    for op, b in buckets.items():
        series = sorted(b.items())
        out[op]["p50"] = histogram_quantile(0.5, series)
        out[op]["p99"] = histogram_quantile(0.99, series)
    return dict(out)


def sample_sum(text, name, **labels):
    """Sum of every sample called ``name`` whose labels include ``labels``."""
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total
