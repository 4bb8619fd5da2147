"""The analysis tables (docs/design.md, "Analysis outputs"), as Spark DataFrames.

Everything is DataFrame API (no Python UDFs: executors need no Python) and every result
is an aggregate or a top-N, so only small tables ever reach the driver.

How rows count (``classify``), by the request's opcode:

* ``request`` / ``oneway`` rows are requests, under their own ``opcode_name``;
* a ``response`` row with ``request_opcode_name`` or ``latency_ns`` is an answer to a
  request of ``request_opcode_name``; an ``error`` outcome makes it an error; its latency
  feeds the percentiles;
* a ``response`` row with neither is unmatched, under its own ``opcode_name``;
* an ``event`` row with ``status = "timeout"`` is a timeout of ``request_opcode_name``;
* a ``source = "client"`` ``request`` row is a request and, when it carries a latency,
  its answer too (the client logs one row per completed request); one with
  ``status = "timeout"`` is a timeout instead.
"""

import math

from pyspark.sql import functions as F

from loadgen.analysis import ACCURACY

QUANTILES = (0.5, 0.9, 0.99, 0.999)

SUMMARY_COLUMNS = ("source", "route", "protocol", "opcode", "requests", "responses",
                   "errors", "error_ratio", "timeouts", "unmatched", "rate_per_s", "p50_ms",
                   "p90_ms", "p99_ms", "p999_ms", "max_ms", "frame_bytes", "messages")
TIMELINE_COLUMNS = ("second", "source", "route", "opcode", "requests", "errors", "p99_ms")
SLOWEST_COLUMNS = ("ts", "source", "route", "protocol", "opcode", "conn_id", "peer",
                   "correlation_id", "latency_ms", "status")
DECOMPOSITION_COLUMNS = ("route", "protocol", "opcode", "pairs", "client_p50_ms",
                         "client_p99_ms", "server_p50_ms", "server_p99_ms",
                         "outside_p50_ms", "outside_p99_ms")

NS_PER_S = 1_000_000_000


def ms(col):
    """Nanoseconds to milliseconds (a double, to the nanosecond)."""
    return F.round(col / 1e6, 6)


def _count(flag):
    return F.sum(F.col(flag).cast("long"))


def classify(frames):
    """Each frame-log row with its grouping opcode (``op``), answered latency (``lat``),
    what it counts as (boolean ``is_*``), and its bytes and messages."""
    kind, source, status = F.col("kind"), F.col("source"), F.col("status")
    latency, request_op = F.col("latency_ns"), F.col("request_opcode_name")
    is_req = kind.isin("request", "oneway")
    client_row = source.eqNullSafe("client") & kind.eqNullSafe("request")
    is_timeout = ((kind.eqNullSafe("event") & status.eqNullSafe("timeout"))
                  | (client_row & status.eqNullSafe("timeout")))
    is_unmatched = kind.eqNullSafe("response") & latency.isNull() & request_op.isNull()
    answered = ((kind.eqNullSafe("response") & ~is_unmatched)
                | (client_row & latency.isNotNull() & ~is_timeout))
    is_frame = ~kind.eqNullSafe("event")
    return frames.select(
        "ts_ns", "source", "run_id", "route", "protocol", "conn_id", "peer",
        "correlation_id", "status", "kind",
        F.when(is_req, F.col("opcode_name"))
         .otherwise(F.coalesce(request_op, F.col("opcode_name"))).alias("op"),
        F.when(answered, latency).alias("lat"),
        is_req.alias("is_req"),
        answered.alias("is_resp"),
        (answered & F.col("outcome").eqNullSafe("error")).alias("is_err"),
        is_timeout.alias("is_to"),
        is_unmatched.alias("is_un"),
        F.when(is_frame, F.coalesce(F.col("frame_bytes"), F.lit(0))).otherwise(0).alias("fb"),
        F.when(is_frame, F.coalesce(F.col("messages"), F.lit(0))).otherwise(0).alias("msgs"),
    )


def runs(frames):
    """Per (run_id, source): records, first and last ts_ns.  A cheap first pass (three
    columns): the report's metadata, and the time span that sizes the report's buckets."""
    return (frames.groupBy("run_id", "source")
            .agg(F.count(F.lit(1)).alias("records"), F.min("ts_ns").alias("first_ns"),
                 F.max("ts_ns").alias("last_ns"))
            .orderBy("first_ns", "run_id", "source"))


#: The grouping sets of ``aggregates``: summary, timeline and the report's route series
#: come out of one scan of the frames (Spark expands each row once per set).
SETS = {
    "summary": ("source", "route", "protocol", "op"),
    "timeline": ("sec", "source", "route", "op"),
    "series": ("bucket_s", "source", "route"),
}
_SET_COLUMNS = ("source", "route", "protocol", "op", "sec", "bucket_s")


def aggregates(rows, bucket_s):
    """Summary, timeline and route-series groups in one pass; ``set`` names the table a
    row belongs to (select them with ``summary_of``, ``timeline_of``, ``series_of``).

    ``sec`` is the UTC second; ``bucket_s`` the start of the report's ``bucket_s``-wide
    bucket.  Requests count in the second they were sent, answers (errors, latency) in
    the second they came back."""
    keyed = rows.select(
        "*", F.expr(f"ts_ns div {NS_PER_S}").alias("sec"),
        F.expr(f"(ts_ns div {bucket_s * NS_PER_S}) * {bucket_s}").alias("bucket_s"))
    # grouping_id(): one bit per column of _SET_COLUMNS, first column highest, set = 1
    # when the column is not part of the row's grouping set
    set_of = None
    for name, keys in SETS.items():
        gid = sum(1 << (len(_SET_COLUMNS) - 1 - i)
                  for i, col in enumerate(_SET_COLUMNS) if col not in keys)
        cond = F.col("gid") == gid
        set_of = F.when(cond, F.lit(name)) if set_of is None else set_of.when(cond, F.lit(name))
    g = keyed.groupingSets([[F.col(c) for c in keys] for keys in SETS.values()],
                           *[F.col(c) for c in _SET_COLUMNS]).agg(
        F.grouping_id().alias("gid"),
        _count("is_req").alias("requests"),
        _count("is_resp").alias("responses"),
        _count("is_err").alias("errors"),
        _count("is_to").alias("timeouts"),
        _count("is_un").alias("unmatched"),
        F.min("ts_ns").alias("first_ns"),
        F.max("ts_ns").alias("last_ns"),
        F.percentile_approx("lat", list(QUANTILES), ACCURACY).alias("q"),
        F.max("lat").alias("max_ns"),
        F.sum("fb").alias("frame_bytes"),
        F.sum("msgs").alias("messages"),
    )
    return g.select(set_of.alias("set"), *[c for c in g.columns if c != "gid"])


def summary_of(agg):
    """One row per (source, route, protocol, opcode): SUMMARY_COLUMNS."""
    g = agg.where(F.col("set") == "summary")
    span_s = F.greatest((F.col("last_ns") - F.col("first_ns")) / 1e9, F.lit(1.0))
    return g.select(
        "source", "route", "protocol", F.col("op").alias("opcode"),
        "requests", "responses", "errors",
        F.when(F.col("responses") > 0, F.round(F.col("errors") / F.col("responses"), 6))
         .otherwise(F.lit(0.0)).alias("error_ratio"),
        "timeouts", "unmatched",
        F.round(F.col("requests") / span_s, 3).alias("rate_per_s"),
        ms(F.col("q")[0]).alias("p50_ms"), ms(F.col("q")[1]).alias("p90_ms"),
        ms(F.col("q")[2]).alias("p99_ms"), ms(F.col("q")[3]).alias("p999_ms"),
        ms(F.col("max_ns")).alias("max_ms"),
        "frame_bytes", "messages",
    )


def timeline_of(agg):
    """One row per (second, source, route, opcode): TIMELINE_COLUMNS (``second`` is a
    UTC timestamp)."""
    return (agg.where(F.col("set") == "timeline")
            .select(F.timestamp_seconds("sec").alias("second"), "source", "route",
                    F.col("op").alias("opcode"), "requests", "errors",
                    ms(F.col("q")[2]).alias("p99_ms")))


def series_of(agg):
    """Per (bucket, source, route): requests, responses, errors, p99 - the report's
    throughput, p99 and error-ratio charts (``bucket_seconds`` keeps them small)."""
    return (agg.where(F.col("set") == "series")
            .select("bucket_s", "source", "route", "requests", "responses", "errors",
                    ms(F.col("q")[2]).alias("p99_ms"))
            .orderBy("source", "route", "bucket_s"))


def bucket_seconds(span_s, points=1200):
    """A round bucket width (s) that cuts ``span_s`` into at most about ``points``."""
    need = max(1.0, span_s / points)
    for step in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600,
                 43200, 86400):
        if step >= need:
            return step
    return int(math.ceil(need / 86400)) * 86400


def slowest(rows, n):
    """The ``n`` slowest answered requests (orderBy + limit: a top-N per partition, never
    a full sort on the driver).  ``ts_ns`` is the answer row's own timestamp."""
    return (rows.where(F.col("lat").isNotNull())
            .orderBy(F.col("lat").desc(), "ts_ns", "source", "conn_id", "correlation_id")
            .limit(n)
            .select("ts_ns", "source", "route", "protocol", F.col("op").alias("opcode"),
                    "conn_id", "peer", "correlation_id", ms(F.col("lat")).alias("latency_ms"),
                    "status"))


def decomposition(rows):
    """One row per (route, protocol, opcode) with both sides logged: DECOMPOSITION_COLUMNS.

    A pair is a client row (``source=client``, ``kind=request``, with a latency) and a
    proxy response (``source=proxy``, with a latency) with equal ``protocol``, ``peer``
    and ``correlation_id``.  Client rows may carry no route (or the protocol's name), so
    route is not a join key: it, protocol and opcode come from the proxy's row.  Ids
    that repeat on one (peer, protocol) - a FIFO connection's 1, 2, 3... on a reused
    client port, a wrapped 32-bit opaque - pair with each other's repeats too
    (docs/analysis.md)."""
    client = (rows.where(F.col("source").eqNullSafe("client") & F.col("kind").eqNullSafe("request")
                         & F.col("lat").isNotNull() & F.col("correlation_id").isNotNull())
              .select("protocol", "peer", "correlation_id", F.col("lat").alias("client_ns")))
    server = (rows.where(F.col("source").eqNullSafe("proxy") & F.col("kind").eqNullSafe("response")
                         & F.col("lat").isNotNull() & F.col("correlation_id").isNotNull())
              .select("route", "protocol", "peer", "correlation_id", "op",
                      F.col("lat").alias("server_ns")))
    pairs = server.join(client, ["protocol", "peer", "correlation_id"])
    two = [0.5, 0.99]
    g = pairs.groupBy("route", "protocol", "op").agg(
        F.count(F.lit(1)).alias("pairs"),
        F.percentile_approx("client_ns", two, ACCURACY).alias("c"),
        F.percentile_approx("server_ns", two, ACCURACY).alias("s"),
        F.percentile_approx(F.col("client_ns") - F.col("server_ns"), two, ACCURACY).alias("o"),
    )
    return g.select("route", "protocol", F.col("op").alias("opcode"), "pairs",
                    ms(F.col("c")[0]).alias("client_p50_ms"), ms(F.col("c")[1]).alias("client_p99_ms"),
                    ms(F.col("s")[0]).alias("server_p50_ms"), ms(F.col("s")[1]).alias("server_p99_ms"),
                    ms(F.col("o")[0]).alias("outside_p50_ms"),
                    ms(F.col("o")[1]).alias("outside_p99_ms"))
