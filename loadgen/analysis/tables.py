"""The analysis tables (docs/design.md, "Analysis outputs"), as Spark DataFrames.

Everything is DataFrame API (no Python UDFs: executors need no Python) and every result
is an aggregate or a top-N, so only small tables ever reach the driver.  The frames are
scanned twice for all the tables (``counts``: every row, counts only; ``latencies``:
answered rows, percentile sketches), then once for ``slowest`` and, with client logs,
once for ``decomposition`` (docs/analysis.md, "How the job works").

How rows count (``classify``), by the request's opcode:

* ``request`` / ``oneway`` rows are requests, under their own ``opcode_name``;
* a ``response`` row with ``request_opcode_name`` or ``latency_ns`` is an answer to a
  request of ``request_opcode_name``; an ``error`` outcome makes it an error; its latency
  feeds the percentiles;
* a ``response`` row with neither is unmatched, under its own ``opcode_name``;
* an ``event`` row with ``status = "timeout"`` is a timeout of ``request_opcode_name``;
  one with ``status = "closed"`` is a cut-off (its connection closed before the answer:
  a run that stopped, a peer that went away), counted apart from timeouts;
* a ``source = "client"`` ``request`` row is a request and, when it carries a latency,
  its answer too (the client logs one row per completed request); one with
  ``status = "timeout"`` is a timeout instead.

Every row also has a ``leg``: the direction its request was sent (a proxy response
answers a request that went the other way; client rows are ``c2s``).  A fleximq REQ
crosses the proxy twice - requester to broker (``c2s``) and broker to responder
(``s2c``) - so the proxy counts it once per leg, and the client/proxy comparison
compares Locust with the ``c2s`` leg.
"""

import math

from pyspark.sql import functions as F

from loadgen.analysis import ACCURACY, RANK_ERROR

QUANTILES = (0.5, 0.9, 0.99, 0.999)

#: the product design's summary columns, then ``cut_off`` (requests whose connection
#: closed before their answer: counted apart from ``timeouts``)
SUMMARY_COLUMNS = ("source", "route", "protocol", "opcode", "requests", "responses",
                   "errors", "error_ratio", "timeouts", "unmatched", "rate_per_s", "p50_ms",
                   "p90_ms", "p99_ms", "p999_ms", "max_ms", "frame_bytes", "messages",
                   "cut_off")
TIMELINE_COLUMNS = ("second", "source", "route", "opcode", "requests", "errors", "p99_ms")
SLOWEST_COLUMNS = ("ts", "source", "route", "protocol", "opcode", "conn_id", "peer",
                   "correlation_id", "latency_ms", "status")
DECOMPOSITION_COLUMNS = ("route", "protocol", "opcode", "pairs", "client_p50_ms",
                         "client_p99_ms", "server_p50_ms", "server_p99_ms",
                         "outside_p50_ms", "outside_p99_ms")
#: errors.csv: what went wrong, per request opcode: each error answer's status (the
#: protocol's status name; on the client side the exception's class when no answer came)
ERRORS_COLUMNS = ("source", "route", "protocol", "opcode", "status", "errors")
#: legs.csv: per (source, protocol, opcode, leg) - the client/proxy comparison's grain
LEGS_COLUMNS = ("source", "protocol", "opcode", "leg", "requests", "responses", "errors",
                "timeouts", "cut_off", "p50_ms", "p99_ms")

#: faults.csv: the fault view - per (route, protocol, opcode, fault): the frame-log rows a
#: fault rule touched (``attrs.fault``), and per injected status the replies the proxy
#: made itself (``attrs.injected = "1"``), apart from the real answers
FAULTS_COLUMNS = ("route", "protocol", "opcode", "fault", "status", "touched", "injected",
                  "injected_errors")

#: event statuses: a request that got no answer in time / whose connection closed first
TIMEOUT, CLOSED = "timeout", "closed"

NS_PER_S = 1_000_000_000
#: at most about this many points per line in the report's per-opcode chart
OPCODE_POINTS = 400


def ms(col):
    """Nanoseconds to milliseconds (a double, to the nanosecond)."""
    return F.round(col / 1e6, 6)


def _count(flag):
    return F.sum(F.col(flag).cast("long"))


def classify(frames):
    """Each frame-log row with its grouping opcode (``op``), answered latency (``lat``),
    what it counts as (boolean ``is_*``), its request's direction (``leg``), the status
    of an error answer (``err_status``), and its bytes and messages."""
    kind, source, status = F.col("kind"), F.col("source"), F.col("status")
    latency, request_op = F.col("latency_ns"), F.col("request_opcode_name")
    is_req = kind.isin("request", "oneway")
    is_event = kind.eqNullSafe("event")
    client_row = source.eqNullSafe("client") & kind.eqNullSafe("request")
    is_timeout = ((is_event & status.eqNullSafe(TIMEOUT))
                  | (client_row & status.eqNullSafe(TIMEOUT)))
    is_cut = is_event & status.eqNullSafe(CLOSED)
    is_unmatched = kind.eqNullSafe("response") & latency.isNull() & request_op.isNull()
    answered = ((kind.eqNullSafe("response") & ~is_unmatched)
                | (client_row & latency.isNotNull() & ~is_timeout))
    is_err = answered & F.col("outcome").eqNullSafe("error")
    direction = F.coalesce(F.col("direction"), F.lit("c2s"))
    leg = (F.when(source.eqNullSafe("client"), F.lit("c2s"))
           .when(kind.eqNullSafe("response"),
                 F.when(direction == "s2c", F.lit("c2s")).otherwise(F.lit("s2c")))
           .otherwise(direction))
    is_frame = ~is_event
    attrs = F.col("attrs") if "attrs" in frames.columns else F.lit(None).cast("map<string,string>")
    is_inj = answered & source.eqNullSafe("proxy") & attrs["injected"].eqNullSafe("1")
    return frames.select(
        "ts_ns", "source", "run_id", "route", "protocol", "conn_id", "peer",
        "correlation_id", "status", "kind",
        F.when(is_req, F.col("opcode_name"))
         .otherwise(F.coalesce(request_op, F.col("opcode_name"))).alias("op"),
        F.when(answered, latency).alias("lat"),
        is_req.alias("is_req"),
        answered.alias("is_resp"),
        is_err.alias("is_err"),
        is_timeout.alias("is_to"),
        is_cut.alias("is_cut"),
        is_unmatched.alias("is_un"),
        leg.alias("leg"),
        F.when(is_err | is_inj, F.coalesce(status, F.lit("(no status)"))).alias("err_status"),
        attrs["fault"].alias("fault"),
        is_inj.alias("is_inj"),
        F.when(is_frame, F.coalesce(F.col("frame_bytes"), F.lit(0))).otherwise(0).alias("fb"),
        F.when(is_frame, F.coalesce(F.col("messages"), F.lit(0))).otherwise(0).alias("msgs"),
    )


def _grouping_sets(df, sets, columns, *aggs):
    """``df.groupingSets`` over ``sets`` ({name: key columns}), with a ``set`` column
    naming each result row's set (from grouping_id(): one bit per column of
    ``columns``, the first the highest, 1 when the column is not in the row's set)."""
    label = None
    for name, keys in sets.items():
        gid = sum(1 << (len(columns) - 1 - i) for i, col in enumerate(columns)
                  if col not in keys)
        cond = F.col("gid") == gid
        label = F.when(cond, F.lit(name)) if label is None else label.when(cond, F.lit(name))
    g = df.groupingSets([[F.col(c) for c in keys] for keys in sets.values()],
                        *[F.col(c) for c in columns]).agg(F.grouping_id().alias("gid"), *aggs)
    return g.select(label.alias("set"), *[c for c in g.columns if c != "gid"])


def _second(col="ts_ns"):
    return F.expr(f"{col} div {NS_PER_S}")


def _bucket(bucket_s, col="sec"):
    return F.expr(f"({col} div {bucket_s}) * {bucket_s}")


# ---- pass 1: counts ------------------------------------------------------------------------

def counts(rows):
    """Pass 1, every row: counts and sums per (second, source, route, protocol, opcode,
    run, leg, error status): the finest grain any table needs (``err_status`` is null
    on every row but error answers, so it splits few groups), in one code-generated hash
    aggregation
    over the frames (no percentile: that would make Spark interpret the whole
    aggregation).  Summary, timeline, series and runs add these up (``*_counts``), so
    their extra groupings cost nothing like another pass."""
    return (rows.select("*", _second().alias("sec"))
            .groupBy("sec", "source", "route", "protocol", "op", "run_id", "leg",
                     "err_status", "fault")
            .agg(F.count(F.lit(1)).alias("records"),
                 _count("is_req").alias("requests"),
                 _count("is_resp").alias("responses"),
                 _count("is_err").alias("errors"),
                 _count("is_to").alias("timeouts"),
                 _count("is_cut").alias("cut_off"),
                 _count("is_un").alias("unmatched"),
                 _count("is_inj").alias("injected"),
                 F.sum((F.col("is_inj") & F.col("is_err")).cast("long")).alias("injected_errors"),
                 F.min("ts_ns").alias("first_ns"),
                 F.max("ts_ns").alias("last_ns"),
                 F.min(F.when(F.col("is_req"), F.col("ts_ns"))).alias("first_req_ns"),
                 F.max(F.when(F.col("is_req"), F.col("ts_ns"))).alias("last_req_ns"),
                 F.max("lat").alias("max_ns"),
                 F.sum("fb").alias("frame_bytes"),
                 F.sum("msgs").alias("messages")))


_SUMS = ("requests", "responses", "errors", "timeouts", "cut_off", "unmatched", "frame_bytes",
         "messages")


def runs_of(counted):
    """Per (run_id, source): records, first and last ts_ns (the report's metadata, and
    the time span that sizes the report's buckets)."""
    return (counted.groupBy("run_id", "source")
            .agg(F.sum("records").alias("records"), F.min("first_ns").alias("first_ns"),
                 F.max("last_ns").alias("last_ns"))
            .orderBy("first_ns", "run_id", "source"))


# ---- pass 2: latency sketches --------------------------------------------------------------

#: The groups that get percentiles, by the columns that name them.
SUMMARY_KEY = ("source", "route", "protocol", "op")
TIMELINE_KEY = ("source", "route", "op")             # per second
SERIES_KEY = ("source", "route")                     # per report bucket
LEG_KEY = ("source", "protocol", "op", "leg")        # legs; per opcode-series bucket
PROTOCOL_KEY = ("source", "protocol", "leg")         # the report's headline
SOURCE_KEY = ("source", "leg")
_NULL = "\u0000null"                                 # what a null key hashes as


def _hash(cols):
    return F.xxhash64(*[F.coalesce(F.col(c), F.lit(_NULL)) for c in cols])


_HASHES = {"summary": ("ks", SUMMARY_KEY), "timeline": ("kt", TIMELINE_KEY),
           "series": ("kr", SERIES_KEY), "legs": ("kl", LEG_KEY)}
#: the sets keyed by a hash column, and the hash columns each percentile set uses
_HASHED_BY = {"summary": "summary", "timeline": "timeline", "series": "series",
              "legs": "legs", "opseries": "legs"}


def _with_keys(df, hashed, sets=tuple(_HASHES)):
    """``df`` with the hash key columns of ``sets`` (``ks`` summary, ``kt`` timeline,
    ``kr`` series, ``kl`` legs: 64-bit hashes of their string keys) when ``hashed``."""
    if not hashed:
        return df
    sets = [_HASHED_BY.get(s, s) for s in sets]
    sets = [s for i, s in enumerate(sets) if s in _HASHES and s not in sets[:i]]
    return df.select("*", *[_hash(_HASHES[s][1]).alias(_HASHES[s][0]) for s in sets])


def _keys(hashed):
    """{set: its key columns} as ``latencies`` and the joins name them.  The two small
    report sets (per source; per source and protocol) are keyed by their strings."""
    if hashed:
        keys = {"summary": ("ks",), "timeline": ("sec", "kt"), "series": ("bucket_s", "kr"),
                "legs": ("kl",), "opseries": ("bucket_o", "kl")}
    else:
        keys = {"summary": SUMMARY_KEY, "timeline": ("sec",) + TIMELINE_KEY,
                "series": ("bucket_s",) + SERIES_KEY, "legs": LEG_KEY,
                "opseries": ("bucket_o",) + LEG_KEY}
    keys.update(proto=PROTOCOL_KEY, side=SOURCE_KEY)
    return keys


def hashes_are_unique(counted):
    """Whether the 64-bit key hashes name each summary, timeline, series and legs group
    of this data alone.  Pass 2 groups by hashes (a long per row is much cheaper to
    group by than four strings); this check on the few distinct keys makes that
    exact: on a collision the job groups by the strings instead."""
    keys = _with_keys(counted.select(*SUMMARY_KEY, "leg").distinct(), True).collect()
    for cols, key in ((SUMMARY_KEY, "ks"), (TIMELINE_KEY, "kt"), (SERIES_KEY, "kr"),
                      (LEG_KEY, "kl")):
        named = {}
        for r in keys:
            named.setdefault(r[key], set()).add(tuple(r[c] for c in cols))
        if any(len(groups) > 1 for groups in named.values()):
            return False
    return True


def latencies(rows, bucket_s, hashed=True, op_bucket_s=None):
    """Pass 2, answered rows only: one percentile sketch (``q``: the QUANTILES, each a
    logged latency in ns) per summary group, timeline second, report bucket (per route:
    ``bucket_s``; per opcode and leg: ``op_bucket_s``), leg, and per source and protocol,
    from one scan (Spark's grouping sets).  Keyed as ``_keys(hashed)`` says."""
    op_bucket_s = op_bucket_s or bucket_s
    answered = rows.where(F.col("lat").isNotNull()).select(
        *SUMMARY_KEY, "leg", "lat", _second().alias("sec"),
        _bucket(bucket_s, f"(ts_ns div {NS_PER_S})").alias("bucket_s"),
        _bucket(op_bucket_s, f"(ts_ns div {NS_PER_S})").alias("bucket_o"))
    keyed = _with_keys(answered, hashed)
    sets = _keys(hashed)
    columns = []
    for keys in sets.values():
        columns += [c for c in keys if c not in columns]
    return _grouping_sets(keyed, sets, tuple(columns),
                          F.percentile_approx("lat", list(QUANTILES), ACCURACY).alias("q"))


def _attach(counted_groups, latency, set_name, hashed):
    """``counted_groups`` (one table's counts) with its percentiles ``q`` from pass 2
    (null where a group has no answered request)."""
    keys = _keys(hashed)[set_name]
    c = _with_keys(counted_groups, hashed, (set_name,)).alias("c")
    lat = latency.where(F.col("set") == set_name).select(*keys, "q").alias("l")
    cond = None
    for k in keys:                                   # null-safe: a route may be null
        eq = F.col(f"c.{k}").eqNullSafe(F.col(f"l.{k}"))
        cond = eq if cond is None else cond & eq
    small = set_name in ("summary", "legs", "proto", "side")
    return c.join(F.broadcast(lat) if small else lat, cond, "left").select("c.*", "l.q")


def summary_of(counted, latency, hashed=True):
    """One row per (source, route, protocol, opcode): SUMMARY_COLUMNS."""
    groups = counted.groupBy(*SUMMARY_KEY).agg(
        *[F.sum(c).alias(c) for c in _SUMS], F.min("first_req_ns").alias("first_req_ns"),
        F.max("last_req_ns").alias("last_req_ns"), F.max("max_ns").alias("max_ns"))
    g = _attach(groups, latency, "summary", hashed)
    # the rate over the time requests were sent: answers and timeouts (request_timeout
    # later) would stretch the span and understate it
    span_s = F.greatest(F.coalesce((F.col("last_req_ns") - F.col("first_req_ns")) / 1e9,
                                   F.lit(0.0)), F.lit(1.0))
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
        "frame_bytes", "messages", "cut_off",
    )


def timeline_of(counted, latency, hashed=True):
    """One row per (second, source, route, opcode): TIMELINE_COLUMNS (``second`` is a
    UTC timestamp).  Requests count in the second they were sent, answers (errors,
    latency) in the second they came back."""
    groups = counted.groupBy("sec", *TIMELINE_KEY).agg(
        F.sum("requests").alias("requests"), F.sum("errors").alias("errors"))
    g = _attach(groups, latency, "timeline", hashed)
    return g.select(F.timestamp_seconds("sec").alias("second"), "source", "route",
                    F.col("op").alias("opcode"), "requests", "errors",
                    ms(F.col("q")[2]).alias("p99_ms"))


def series_of(counted, latency, bucket_s, hashed=True):
    """Per (bucket, source, route): requests, responses, errors, timeouts, cut-offs, p99 -
    the report's throughput, p99 and error-ratio charts (``bucket_seconds`` keeps them
    small).  Client rows carry no route: their ``protocol`` names them."""
    groups = counted.groupBy(_bucket(bucket_s).alias("bucket_s"), *SERIES_KEY).agg(
        F.first("protocol", ignorenulls=True).alias("protocol"),
        *[F.sum(c).alias(c) for c in _LEG_SUMS])
    g = _attach(groups, latency, "series", hashed)
    return (g.select("bucket_s", "source", "route", "protocol", "requests", "responses",
                     "errors", "timeouts", "cut_off", ms(F.col("q")[2]).alias("p99_ms"))
            .orderBy("source", "route", "bucket_s"))


def legs_of(counted, latency, hashed=True):
    """One row per (source, protocol, opcode, leg): LEGS_COLUMNS - the grain at which
    the report compares what the clients saw with what the proxy saw."""
    groups = counted.groupBy(*LEG_KEY).agg(*[F.sum(c).alias(c) for c in _LEG_SUMS])
    g = _attach(groups, latency, "legs", hashed)
    return g.select("source", "protocol", F.col("op").alias("opcode"), "leg", *_LEG_SUMS,
                    ms(F.col("q")[0]).alias("p50_ms"), ms(F.col("q")[2]).alias("p99_ms"))


_LEG_SUMS = ("requests", "responses", "errors", "timeouts", "cut_off")


def op_series_of(counted, latency, op_bucket_s, hashed=True):
    """Per (bucket, source, protocol, opcode, leg): requests, answers, errors, timeouts,
    cut-offs, p50 and p99 - the report's latency-over-time chart per opcode."""
    groups = counted.groupBy(_bucket(op_bucket_s).alias("bucket_o"), *LEG_KEY).agg(
        *[F.sum(c).alias(c) for c in _LEG_SUMS])
    g = _attach(groups, latency, "opseries", hashed)
    return (g.select(F.col("bucket_o").alias("bucket_s"), "source", "protocol",
                     F.col("op").alias("opcode"), "leg", *_LEG_SUMS,
                     ms(F.col("q")[0]).alias("p50_ms"), ms(F.col("q")[2]).alias("p99_ms"))
            .orderBy("source", "protocol", "opcode", "leg", "bucket_s"))


def totals_of(counted, latency):
    """The run's headline numbers: per (source, leg), and per (source, protocol, leg) -
    requests, answers, errors, timeouts, cut-offs, unmatched, first and last request,
    p50, p90, p99, max.  ``protocol`` is null on the per-source rows.  Per leg, so that
    what clients asked (``c2s``) is not mixed with what servers sent or forwarded."""
    sums = [F.sum(c).alias(c) for c in _SUMS if c not in ("frame_bytes", "messages")]
    extra = [F.min("first_req_ns").alias("first_req_ns"),
             F.max("last_req_ns").alias("last_req_ns"), F.max("max_ns").alias("max_ns")]
    out = []
    for name, key in (("side", SOURCE_KEY), ("proto", PROTOCOL_KEY)):
        g = _attach(counted.groupBy(*key).agg(*sums, *extra), latency, name, False)
        if "protocol" not in key:
            g = g.withColumn("protocol", F.lit(None).cast("string"))
        out.append(g.select(
            "source", "protocol", "leg", *[c for c in _SUMS if c not in ("frame_bytes", "messages")],
            "first_req_ns", "last_req_ns",
            ms(F.col("q")[0]).alias("p50_ms"), ms(F.col("q")[1]).alias("p90_ms"),
            ms(F.col("q")[2]).alias("p99_ms"), ms(F.col("max_ns")).alias("max_ms")))
    return out[0].unionByName(out[1]).orderBy("source", "leg",
                                              F.col("protocol").asc_nulls_first())


def errors_of(counted):
    """One row per (source, route, protocol, opcode, status) of error answers:
    ERRORS_COLUMNS (timeouts and cut-offs are the summary's own columns)."""
    return (counted.where(F.col("err_status").isNotNull())
            .groupBy("source", "route", "protocol", "op", "err_status")
            .agg(F.sum("errors").alias("errors"))
            .where(F.col("errors") > 0)              # an injected answer that is no error
            .select("source", "route", "protocol", F.col("op").alias("opcode"),
                    F.col("err_status").alias("status"), "errors"))


def faults_of(counted):
    """The fault view, FAULTS_COLUMNS: rows a fault rule touched in the traffic per
    (route, protocol, opcode, fault) - ``status`` null; the proxy's own replies are not
    among them - and replies the proxy injected per (route, protocol, opcode, fault,
    status). An injected reply's row names its rule (``attrs.fault``); in frame logs
    written before it did, ``fault`` is null there and ``attribute_faults`` names it
    when one rule touched that opcode."""
    touched = (counted.where(F.col("fault").isNotNull())
               .groupBy("route", "protocol", "op", "fault")
               .agg((F.sum("records") - F.sum("injected")).alias("touched"))
               .where(F.col("touched") > 0)
               .select("route", "protocol", "op", "fault",
                       F.lit(None).cast("string").alias("status"), "touched",
                       F.lit(0).cast("long").alias("injected"),
                       F.lit(0).cast("long").alias("injected_errors")))
    injected = (counted.where(F.col("injected") > 0)
                .groupBy("route", "protocol", "op", "fault", "err_status")
                .agg(F.sum("injected").alias("injected"),
                     F.sum("injected_errors").alias("injected_errors"))
                .select("route", "protocol", "op", "fault",
                        F.col("err_status").alias("status"),
                        F.lit(0).cast("long").alias("touched"), "injected",
                        "injected_errors"))
    return (touched.unionByName(injected)
            .select("route", "protocol", F.col("op").alias("opcode"), "fault", "status",
                    "touched", "injected", "injected_errors"))


def attribute_faults(rows):
    """``faults_of``'s collected rows with each injected reply's ``fault`` named: the rule
    that touched that (route, protocol, opcode), when exactly one did (at most one rule
    acts on a frame, but several may share an opcode: then it stays null)."""
    rules = {}
    for r in rows:
        if r.get("fault") is not None:
            rules.setdefault((r["route"], r["protocol"], r["opcode"]), set()).add(r["fault"])
    out = []
    for r in rows:
        r = dict(r)
        if r.get("fault") is None:
            named = rules.get((r["route"], r["protocol"], r["opcode"])) or set()
            if len(named) == 1:
                r["fault"] = next(iter(named))
        out.append(r)
    return sorted(out, key=lambda r: (r["route"] or "", r["protocol"] or "",
                                      r["opcode"] or "", r["fault"] or "",
                                      r["status"] or ""))


def slowest_threshold(summary, n):
    """A latency (ns) that at least ``n`` answered requests reach, from the summary's
    percentiles, or None.  ``percentile_approx`` guarantees that its q-percentile of a
    group of c answers has at least (1 - q - RANK_ERROR) * c answers at or above it;
    so ``slowest`` may drop everything below the largest such bound and still hold the
    true top ``n`` (its top-N then sorts thousands of rows, not millions)."""
    best = None
    for r in summary:
        answers = r.get("responses") or 0
        for q, col in zip(QUANTILES, ("p50_ms", "p90_ms", "p99_ms", "p999_ms")):
            value = r.get(col)
            if value is None or (1 - q - RANK_ERROR) * answers < n:
                continue
            ns = int(math.floor(value * 1e6)) - 1          # ms were rounded: stay below
            best = ns if best is None else max(best, ns)
    return best


def bucket_seconds(span_s, points=1200):
    """A round bucket width (s) that cuts ``span_s`` into at most about ``points``."""
    need = max(1.0, span_s / points)
    for step in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600,
                 43200, 86400):
        if step >= need:
            return step
    return int(math.ceil(need / 86400)) * 86400


def slowest(rows, n, threshold=None):
    """The ``n`` slowest answered requests (orderBy + limit: a top-N per partition, never
    a full sort on the driver).  ``ts_ns`` is the answer row's own timestamp.
    ``threshold`` (from ``slowest_threshold``) drops rows that cannot be among them."""
    answered = rows.where(F.col("lat").isNotNull())      # never a timeout or a cut-off
    if threshold is not None:
        answered = answered.where(F.col("lat") >= F.lit(threshold))
    return (answered
            .orderBy(F.col("lat").desc(), "ts_ns", "source", "conn_id", "correlation_id")
            .limit(n)
            .select("ts_ns", "source", "route", "protocol", F.col("op").alias("opcode"),
                    "conn_id", "peer", "correlation_id", ms(F.col("lat")).alias("latency_ms"),
                    "status"))


def decomposition(rows, counted=None, hashed=False):
    """One row per (route, protocol, opcode) with both sides logged: DECOMPOSITION_COLUMNS.

    A pair is a client row (``source=client``, ``kind=request``, with a latency) and a
    proxy response (``source=proxy``, with a latency) with equal ``protocol``, ``peer``
    and ``correlation_id``.  Client rows may carry no route (or the protocol's name), so
    route is not a join key: it, protocol and opcode come from the proxy's row.  Ids
    that repeat on one (peer, protocol) - a FIFO connection's 1, 2, 3... on a reused
    client port, a wrapped 32-bit opaque - pair with each other's repeats too
    (docs/analysis.md).

    Only the join keys and latencies are shuffled, in a hash join built on the client
    side (no sort of millions of proxy rows).  With ``hashed`` (keys checked by
    ``hashes_are_unique``) the proxy row's (route, protocol, opcode) travels as its
    summary hash ``ks`` and is named again from ``counted`` after the aggregation."""
    client = (rows.where(F.col("source").eqNullSafe("client") & F.col("kind").eqNullSafe("request")
                         & F.col("lat").isNotNull() & F.col("correlation_id").isNotNull())
              .select("protocol", "peer", "correlation_id", F.col("lat").alias("client_ns")))
    server = rows.where(F.col("source").eqNullSafe("proxy") & F.col("kind").eqNullSafe("response")
                        & F.col("lat").isNotNull() & F.col("correlation_id").isNotNull())
    group = ["ks"] if hashed else ["route", "protocol", "op"]
    server = _with_keys(server, hashed, ("summary",)).select(
        "protocol", "peer", "correlation_id", *group, F.col("lat").alias("server_ns"))
    pairs = server.join(client.hint("shuffle_hash"), ["protocol", "peer", "correlation_id"])
    two = [0.5, 0.99]
    g = pairs.groupBy(*group).agg(
        F.count(F.lit(1)).alias("pairs"),
        F.percentile_approx("client_ns", two, ACCURACY).alias("c"),
        F.percentile_approx("server_ns", two, ACCURACY).alias("s"),
        F.percentile_approx(F.col("client_ns") - F.col("server_ns"), two, ACCURACY).alias("o"),
    )
    if hashed:
        names = _with_keys(counted.where(F.col("source").eqNullSafe("proxy"))
                           .select(*SUMMARY_KEY).distinct(), True, ("summary",))
        g = g.join(F.broadcast(names), "ks")
    return g.select("route", "protocol", F.col("op").alias("opcode"), "pairs",
                    ms(F.col("c")[0]).alias("client_p50_ms"),
                    ms(F.col("c")[1]).alias("client_p99_ms"),
                    ms(F.col("s")[0]).alias("server_p50_ms"),
                    ms(F.col("s")[1]).alias("server_p99_ms"),
                    ms(F.col("o")[0]).alias("outside_p50_ms"),
                    ms(F.col("o")[1]).alias("outside_p99_ms"))
