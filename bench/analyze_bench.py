"""End-to-end timing of ``frametap analyze`` in local mode (not a test: numbers).

Generates proxy frame logs with bench/gen_framelogs.py (10 M records by default; kept
in --logs DIR for the next run), runs the command as a user would (a fresh process:
Python start, Spark's JVM start-up, both passes, every output, report.html, shutdown),
and reports wall seconds, records/s and the peak memory of the whole process tree (the
Python driver plus Spark's JVM: the sum of their proportional set sizes, sampled every
50 ms from /proc).  The
machine's load average is printed too: on a shared machine it explains slow runs.

    python bench/analyze_bench.py                       # 10 M records, 1 run
    python bench/analyze_bench.py --records 2000000 --runs 3 --json out.json
    python bench/analyze_bench.py --client-share 0.3      # + client rows: the join too

Target (docs/benchmarks.md, "Analysis"): 10 M records in <= 60 s on a 2-core machine.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(BENCH_DIR))

import gen_framelogs  # noqa: E402  (bench/ is on sys.path as the script's directory)


def _children():
    """{pid: ppid} of every process."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[int(name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            pass
    return out


def _pss(pid):
    """Proportional set size of ``pid`` in bytes: its resident pages, shared ones
    divided among their sharers - so a child the JVM forks for a moment (Hadoop runs
    shell helpers) does not count the JVM's heap twice, as summed RSS would."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


def tree_memory(root):
    """Memory of ``root`` and all its descendants (sum of PSS)."""
    parents = _children()
    pids, frontier = {root}, [root]
    while frontier:
        p = frontier.pop()
        for child, parent in parents.items():
            if parent == p and child not in pids:
                pids.add(child)
                frontier.append(child)
    return sum(_pss(pid) for pid in pids)


def run_once(logs, out, master, extra):
    cmd = [sys.executable, "-m", "proxy", "analyze", logs, "--out", out, "--quiet",
           "--master", master, *extra]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=os.path.dirname(BENCH_DIR), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_memory(proc.pid))
        time.sleep(0.05)
    seconds = time.monotonic() - started
    stdout, stderr = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"frametap analyze failed ({proc.returncode}):\n{stderr}")
    return seconds, peak


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=10_000_000, help="records to analyse (10 M)")
    p.add_argument("--logs", default=None,
                   help="frame-log directory (generated there when it holds no .parquet; "
                        "default: a directory under /tmp named after --records)")
    p.add_argument("--client-share", type=float, default=0.0,
                   help="when generating: fraction of answered requests also logged by the "
                        "client side, which adds the decomposition join (0)")
    p.add_argument("--runs", type=int, default=1, help="repeat the timed run (1)")
    p.add_argument("--master", default="local[*]", help="Spark master (local[*])")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="passed to frametap analyze --conf")
    p.add_argument("--json", metavar="FILE", help="also write the results here")
    args = p.parse_args(argv)

    logs = args.logs or os.path.join(
        tempfile.gettempdir(), f"frametap-bench-logs-{args.records}-{args.client_share:g}")
    if not (os.path.isdir(logs) and any(n.endswith(".parquet") for n in os.listdir(logs))):
        t = time.monotonic()
        rows, files = gen_framelogs.generate(logs, args.records, quiet=True,
                                             client_share=args.client_share)
        print(f"generated {rows:,} records in {files} files in {time.monotonic() - t:.1f} s "
              f"({logs})")
    import pyarrow.parquet as pq
    files = [os.path.join(logs, n) for n in os.listdir(logs) if n.endswith(".parquet")]
    size = sum(os.path.getsize(f) for f in files)
    records = sum(pq.ParquetFile(f).metadata.num_rows for f in files)   # client rows too
    extra = [a for kv in args.conf for a in ("--conf", kv)]
    results = []
    with tempfile.TemporaryDirectory(prefix="frametap-bench-out-") as out:
        for i in range(args.runs):
            load = os.getloadavg()[0]
            seconds, peak = run_once(logs, out, args.master, extra)
            result = dict(records=records, input_mib=round(size / 2**20, 1),
                          seconds=round(seconds, 2),
                          records_per_s=round(records / seconds),
                          peak_memory_mib=round(peak / 2**20), load_before=round(load, 2),
                          cpus=os.cpu_count(), master=args.master)
            results.append(result)
            print(f"run {i + 1}: {seconds:.1f} s end to end, {records / seconds:,.0f} "
                  f"records/s, peak memory {peak / 2**20:,.0f} MiB (PSS of driver + JVM), load "
                  f"average before {load:.2f} on {os.cpu_count()} CPUs")
    best = min(results, key=lambda r: r["seconds"])
    print(f"best: {best['seconds']} s for {records:,} records ({best['input_mib']} MiB "
          f"Parquet): {best['records_per_s']:,} records/s; target <= 60 s for 10 M")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": results, "best": best}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
