"""``frametap analyze LOGDIR... --out DIR``: frame logs -> tables + report.html.

Also a Spark application of its own::

    spark-submit loadgen/analysis/job.py LOGDIR... --out DIR

(the session is then spark-submit's, so its ``--master`` and ``--conf`` apply).  Outputs
and their columns: docs/analysis.md.
"""

import argparse
import datetime
import os
import re
import sys
import textwrap
import time

if __package__ in (None, ""):          # run as a script (spark-submit): find our packages
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))

from loadgen.analysis import ACCURACY, RANK_ERROR, AnalysisError  # noqa: E402


class JobFailed(Exception):
    """Spark could not finish the job for a reason that is not the input's (out of
    memory, a lost cluster): one line, exit status 1."""


STEPS = ("finding frame logs", "checking Parquet footers", "counting (pass 1: every row)",
         "percentiles (pass 2: answered requests), summary", "timeline",
         "legs, errors, per-opcode series", "slowest requests", "client/proxy decomposition",
         "report")


def add_arguments(parser):
    parser.add_argument("paths", nargs="+", metavar="LOGDIR",
                        help="frame-log directories or files (searched recursively for "
                             "*.parquet and *.jsonl); any Hadoop path: /dir, file://, "
                             "hdfs://, s3a://, globs")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="output directory (created when missing; outputs of an earlier "
                             "run there are replaced)")
    parser.add_argument("--master", metavar="URL", default=None,
                        help="Spark master: local[*] (default), local[N], spark://host:7077, "
                             "yarn, k8s://...")
    parser.add_argument("--slowest", type=_positive, default=100, metavar="N",
                        help="how many of the slowest answered requests slowest.csv lists (100)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting, repeatable (e.g. spark.driver.memory=8g, "
                             "spark.jars.packages=org.apache.hadoop:hadoop-aws:3.4.1)")
    parser.add_argument("--connect-timeout", type=_seconds, default=None, metavar="SECONDS",
                        help="how long a cluster master may take to accept the job, and "
                             "a spark:// master to give it an executor, before the "
                             "command gives up (15)")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress line and no summary table (errors still show)")
    return parser


def _positive(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, got {value}")
    return value


def _seconds(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") \
            from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected more than 0 seconds, got {text}")
    return value


def parse_conf(values):
    pairs = []
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise AnalysisError(f"--conf: expected KEY=VALUE (e.g. spark.driver.memory=8g), "
                                f"got {item!r}")
        pairs.append((key.strip(), value))
    return pairs


class Result:
    """What ``analyze`` produced: the output paths and the small tables it collected."""

    def __init__(self, out_dir, files, summary, meta, paths, tables=None):
        self.out_dir = out_dir
        self.files = files
        self.summary = summary
        self.meta = meta
        self.paths = paths      # output name -> Hadoop path string
        self.tables = tables or {}   # the small tables the report was drawn from


def _rows(df):
    return [r.asDict() for r in df.collect()]


def _spark_failure(exc, spark=None, logs=None):
    """Turn a failed Spark action into AnalysisError (the input's fault) or JobFailed.

    A file Spark could not decode is named: from Spark's message when it names it,
    else (a broken page behind a valid footer can fail deep in the Parquet reader with
    an IndexOutOfBounds and no file name) by reading each Parquet file alone."""
    from loadgen.analysis.inputs import find_undecodable, local_name, task_failure
    from loadgen.analysis.session import first_line
    text = str(exc)
    m = re.search(r"(?:reading file|Could not read footer for file:?)\s+(\S+?)\.?(?:\s|$)", text)
    if m:
        reason = ""
        cause = re.search(r"(?:Caused by|Cause): ([^\n]+)", text)
        if cause:
            reason = ": " + cause.group(1).strip()[:200]
        if "Malformed" in text or "JSON" in text or "malformed" in text:
            reason = ": a line is not a JSON object of the frame-log schema"
        return AnalysisError(f"cannot read {local_name(m.group(1))}{reason}")
    if "Malformed records are detected" in text:
        return AnalysisError("a JSON Lines frame log has a line that is not a JSON object of "
                             "the frame-log schema")
    if (spark is not None and logs is not None and logs.parquet and task_failure(text)
            and not re.search(r"OutOfMemory|ExecutorLost|[Ee]xecutor lost|heartbeat|"
                              r"killed|cancell?ed", text)):
        culprit = find_undecodable(spark, logs.parquet)
        if culprit is not None:
            path, why = culprit
            return AnalysisError(f"cannot read {local_name(path)}: its data does not decode "
                                 f"({why}); a damaged file - move it aside and run again")
    return JobFailed(f"Spark job failed: {first_line(exc)}")


def analyze(spark, paths, out, slowest=100, progress=None, logs=None, warn=None):
    """Run the analysis with ``spark`` and write every output into ``out``; returns a
    Result.  AnalysisError for bad input, JobFailed when Spark gives up.  ``logs``: the
    files, when ``inputs.prepare_local`` found and checked them already.  ``warn``:
    where a line about something skipped goes (a run file that cannot be read)."""
    from pyspark import StorageLevel
    from pyspark.errors import PySparkException
    from py4j.protocol import Py4JError

    from loadgen.analysis import inputs, report, tables
    from loadgen.analysis.outputs import OutputDir, iso_from_ns
    from loadgen.analysis.runs import Runs, client_route_column

    step_no = 0

    def step(label):
        nonlocal step_no
        step_no += 1
        if progress is not None:
            progress.step(label, step_no, len(STEPS))

    cached = []            # small persisted results, released at the end
    try:
        step(STEPS[0])
        if logs is None:
            logs = inputs.prepare_local(paths, out)
        step(STEPS[1])
        if logs is None:                             # hdfs://, s3a://, globs: Hadoop's way
            logs = inputs.find_frame_logs(spark, paths, exclude=out)
            inputs.check_parquet(spark, logs.parquet)
        outdir = OutputDir(spark, out)
        runs = Runs(inputs.read_run_files(spark, logs, warn))

        step(STEPS[2])
        frames = inputs.read_frames(spark, logs)
        frames = frames.withColumn("route", client_route_column(runs.route_by_address()))
        rows = tables.classify(frames)
        counted = tables.counts(rows).persist(StorageLevel.MEMORY_AND_DISK)
        cached.append(counted)
        run_rows = _rows(tables.runs_of(counted))   # pass 1: every row, counts only
        hashed = tables.hashes_are_unique(counted)
        first = min((r["first_ns"] for r in run_rows if r["first_ns"] is not None),
                    default=None)
        last = max((r["last_ns"] for r in run_rows if r["last_ns"] is not None), default=None)
        span_s = (last - first) / 1e9 if first is not None else 0.0
        bucket_s = tables.bucket_seconds(span_s)
        op_bucket_s = tables.bucket_seconds(span_s, points=tables.OPCODE_POINTS)

        step(STEPS[3])
        latency = tables.latencies(rows, bucket_s, hashed, op_bucket_s) \
            .persist(StorageLevel.MEMORY_AND_DISK)
        cached.append(latency)
        written = {}
        summary_df = outdir.parquet(tables.summary_of(counted, latency, hashed), "summary",
                                    sort=("source", "route", "protocol", "opcode"))
        written["summary"] = outdir.path("summary")
        summary = _rows(summary_df)               # (pass 2 ran for this: percentiles)
        written["summary.csv"] = outdir.csv(summary_df, "summary.csv")

        step(STEPS[4])
        timeline_df = outdir.parquet(tables.timeline_of(counted, latency, hashed), "timeline",
                                     sort=("second", "source", "route", "opcode"))
        written["timeline"] = outdir.path("timeline")
        written["timeline.csv"] = outdir.csv(timeline_df, "timeline.csv")
        series = _rows(tables.series_of(counted, latency, bucket_s, hashed))

        step(STEPS[5])
        legs = _rows(tables.legs_of(counted, latency, hashed)
                     .orderBy("protocol", "opcode", "source", "leg"))
        written["legs.csv"] = outdir.csv_rows(legs, tables.LEGS_COLUMNS, "legs.csv")
        errors = _rows(tables.errors_of(counted)
                       .orderBy("source", "route", "protocol", "opcode", _desc("errors")))
        written["errors.csv"] = outdir.csv_rows(errors, tables.ERRORS_COLUMNS, "errors.csv")
        faults = tables.attribute_faults(_rows(tables.faults_of(counted)))
        written["faults.csv"] = outdir.csv_rows(faults, tables.FAULTS_COLUMNS, "faults.csv")
        totals = _rows(tables.totals_of(counted, latency))
        op_series = _rows(tables.op_series_of(counted, latency, op_bucket_s, hashed))

        step(STEPS[6])
        threshold = tables.slowest_threshold(summary, slowest)
        slow_df = tables.slowest(rows, slowest, threshold).persist(StorageLevel.MEMORY_AND_DISK)
        cached.append(slow_df)
        slow = _rows(slow_df)
        written["slowest.csv"] = outdir.csv(
            slow_df.select(iso_from_ns("ts_ns").alias("ts"),
                           *[c for c in tables.SLOWEST_COLUMNS if c != "ts"]),
            "slowest.csv")       # one partition, already in order (orderBy + limit)

        step(STEPS[7])
        decomposition_df = tables.decomposition(rows, counted, hashed)
        if not any(r["source"] == "client" for r in run_rows):
            decomposition_df = decomposition_df.limit(0)      # nothing to pair: no scan
        decomposition_df = outdir.parquet(decomposition_df, "decomposition",
                                          sort=("route", "protocol", "opcode"))
        written["decomposition"] = outdir.path("decomposition")
        decomposition = _rows(decomposition_df)
        written["decomposition.csv"] = outdir.csv(decomposition_df, "decomposition.csv")

        step(STEPS[8])
        meta = {
            "paths": list(paths), "files": len(logs),
            "records": sum(r["records"] for r in run_rows),
            "runs": run_rows, "sources": sorted({r["source"] for r in run_rows
                                                 if r["source"]}),
            "first_ns": first, "last_ns": last, "accuracy": ACCURACY,
            "run_files": len(runs.files),
            "generated": datetime.datetime.now(datetime.timezone.utc)
                                          .strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        data = {"meta": meta, "summary": summary, "series": series, "bucket_s": bucket_s,
                "slowest": slow, "decomposition": decomposition, "legs": legs,
                "errors": errors, "faults": faults, "totals": totals, "op_series": op_series,
                "op_bucket_s": op_bucket_s, "runs": runs}
        page = report.render(data)
        written["report.html"] = outdir.write_text("report.html", page)
        return Result(outdir.root, len(logs), summary, meta, written, data)
    except (PySparkException, Py4JError) as exc:
        if os.environ.get("FRAMETAP_DEBUG"):
            raise
        raise _spark_failure(exc, spark, logs) from None
    finally:
        for df in cached:
            try:
                df.unpersist()
            except Exception:
                pass


def _desc(name):
    from pyspark.sql import functions as F
    return F.col(name).desc()


def _fmt(value, places=3):
    if value is None:
        return "-"
    return f"{value:.{places}f}"


def summary_table(rows):
    """The summary as a fixed-width text table (what the terminal shows)."""
    head = ("source", "route", "opcode", "requests", "answers", "errors", "timeouts",
            "cut off", "unmatched", "req/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms")
    lines = [head]
    for r in sorted(rows, key=lambda r: (r["source"] or "", r["route"] or "",
                                         r["opcode"] or "")):
        lines.append((r["source"] or "-", r["route"] or "-", r["opcode"] or "-",
                      str(r["requests"]), str(r["responses"]), str(r["errors"]),
                      str(r["timeouts"]), str(r.get("cut_off") or 0), str(r["unmatched"]),
                      _fmt(r["rate_per_s"], 1),
                      _fmt(r["p50_ms"]), _fmt(r["p99_ms"]), _fmt(r["p999_ms"]),
                      _fmt(r["max_ms"])))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = []
    for n, line in enumerate(lines):
        cells = [c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in
                 enumerate(zip(line, widths))]
        out.append("  ".join(cells).rstrip())
        if n == 0:
            out.append("-" * len(out[0]))
    return "\n".join(out)


def headline(totals):
    """The report's headline as lines for the terminal: per side, what clients sent."""
    out = []
    for source, label in (("client", "clients"), ("proxy", "proxy")):
        t = next((r for r in totals if r["source"] == source and r.get("protocol") is None
                  and r.get("leg", "c2s") == "c2s"), None)
        if t is None or not t["requests"]:
            continue
        span = max(((t["last_req_ns"] or 0) - (t["first_req_ns"] or 0)) / 1e9, 1.0)
        ratio = t["errors"] / t["responses"] * 100 if t["responses"] else 0.0
        out.append(f"{label}: {t['requests']:,} requests ({t['requests'] / span:,.0f}/s), "
                   f"errors {ratio:.2f} % of answers, {t['timeouts']:,} timeouts, "
                   f"{t['cut_off']:,} cut off, p50 {_fmt(t['p50_ms'])} ms, "
                   f"p99 {_fmt(t['p99_ms'])} ms")
    return out


def fault_lines(faults):
    """The fault view for the terminal: per route, opcode and fault, the rows it touched
    and the replies the proxy injected (faults.csv)."""
    out = {}
    for f in faults:
        key = (f["route"], f["opcode"], f.get("fault") or "(rule not named)")
        entry = out.setdefault(key, [0, {}])
        entry[0] += f.get("touched") or 0
        if f.get("injected"):
            entry[1][f["status"]] = entry[1].get(f["status"], 0) + f["injected"]
    lines = []
    for (route, opcode, fault), (touched, injected) in sorted(out.items()):
        replies = ", ".join(f"{n:,} {status}" for status, n in sorted(injected.items()))
        lines.append(f"fault {fault}: route {route} {opcode}: {touched:,} rows touched"
                     + (f", injected replies: {replies}" if replies else ""))
    return lines


def run(args, stdout=None):
    """The command: a session, the job, the table and where the report is; returns 0.
    Raises AnalysisError (exit 2) or JobFailed (exit 1)."""
    from loadgen.analysis.inputs import local_name, prepare_local
    from loadgen.analysis.session import (CONNECT_TIMEOUT, Console, Progress, start_session,
                                          stop_session)

    stdout = stdout or sys.stdout
    console = Console(quiet=args.quiet)
    conf = parse_conf(args.conf)
    started = time.monotonic()
    if "PYSPARK_GATEWAY_PORT" in os.environ and args.master:
        console.say("analyze: --master is ignored under spark-submit (give it to spark-submit)")
    logs = prepare_local(args.paths, args.out)       # local paths: checked before the JVM
    console.step("analyze: starting Spark (%s)" % (args.master or "local[*]"))
    timeout = getattr(args, "connect_timeout", None) or CONNECT_TIMEOUT
    spark, owned = start_session(args.master, conf, console, connect_timeout=timeout)
    try:
        with Progress(spark, console) as progress:
            result = analyze(spark, args.paths, args.out, args.slowest, progress, logs,
                             warn=console.say)
    except KeyboardInterrupt:
        try:
            spark.sparkContext.cancelAllJobs()
        except Exception:
            pass
        raise
    finally:
        stop_session(spark, owned)
    if not args.quiet:
        meta = result.meta
        stdout.write(summary_table(result.summary) + "\n\n")
        for line in headline(result.tables.get("totals") or []):
            stdout.write(line + "\n")
        for line in fault_lines(result.tables.get("faults") or []):
            stdout.write(line + "\n")
        stdout.write(f"{meta['records']:,} records in {result.files:,} file(s); percentiles "
                     f"by Spark percentile_approx, rank error <= {RANK_ERROR * 100:g} %\n")
        stdout.write(f"tables: {local_name(result.out_dir)}/ (summary, timeline, slowest, "
                     f"decomposition: .csv and Parquet)\n")
        stdout.write(f"report: {local_name(result.paths['report.html'])}\n")
        stdout.write(f"done in {time.monotonic() - started:.1f} s\n")
        stdout.flush()
    return 0


def make_parser(prog="frametap analyze"):
    return add_arguments(argparse.ArgumentParser(
        prog=prog, description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter))


DESCRIPTION = textwrap.fill(
    "Analyse frame logs with PySpark: per-opcode summary, per-second timeline, slowest "
    "requests, client/proxy latency decomposition, and a self-contained report.html. "
    "Needs Java 17+.", 79)
EPILOG = """\
outputs in DIR: summary.csv + summary/, timeline.csv + timeline/, slowest.csv,
decomposition.csv + decomposition/ (Parquet directories), legs.csv, errors.csv,
faults.csv, report.html (docs/analysis.md describes every column).

examples:
  frametap analyze framelogs/ --out analysis/
  frametap analyze hdfs:///logs/run42 --out hdfs:///reports/run42 --master yarn
  spark-submit loadgen/analysis/job.py framelogs/ --out analysis/"""


def main(argv=None):
    """Entry point for ``python -m loadgen.analysis.job`` and ``spark-submit job.py``."""
    args = make_parser("job.py").parse_args(argv)
    return exit_code(args)


def exit_code(args):
    """``run`` with errors as one line on stderr: 2 for the user's, 1 for Spark's."""
    try:
        return run(args)
    except AnalysisError as exc:
        print(f"frametap: error: {exc}", file=sys.stderr)
        return 2
    except JobFailed as exc:
        print(f"frametap: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
