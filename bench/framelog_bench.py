"""Frame-log writer benchmark: records/s from the native buffer into Parquet, one core.

Fills a FrameLogBuffer with the records a FlyMQ parser produces for pipelined
PRODUCE requests and their answers (the small-frame profile), then times the writer
thread's work on them - transpose to columns (columns()), Arrow table (NativeSource),
Parquet (FileSink) - pinned to one cpu.  Target: >= 2 M records/s into Parquet.

    python bench/framelog_bench.py [--records 2000000] [--repeat 5] [--format parquet]
                                   [--batch-chunks 1]
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TARGET = 2_000_000


def fill(n_records, chunk_records):
    from proxy import _framing, protocols
    from proxy.protocols.flymq import samples
    stats = _framing.RouteStats("flymq", "flymq")
    chunks = -(-n_records // chunk_records) + 1
    buf = _framing.FrameLogBuffer(chunks, chunk_records)
    route = buf.add_route(stats)
    parser = protocols.load("flymq").load_parser()(stats)
    parser.conn_id = 1
    parser.attach_log(buf, route)
    _, reqs, resps = samples.bench_frames(1000, 64)
    req, resp = b"".join(reqs), b"".join(resps)
    for _ in range(n_records // 2000):
        parser.feed(0, req)
        parser.feed(1, resp)
    return buf


def one_pass(n_records, chunk_records, fmt, directory, batch_chunks):
    from proxy.framelog import FileSink
    from proxy.framelog_native import NativeSource
    buf = fill(n_records, chunk_records)
    src = NativeSource(buf, "bench")
    src.connection(1, "127.0.0.1:50000")
    sink = FileSink(directory, "proxy", fmt, rotate_bytes=1 << 40, rotate_seconds=1e9)
    t_cols = t_table = t_write = 0.0
    rows = 0
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    while True:
        a = time.perf_counter()
        taken = []
        while len(taken) < batch_chunks and (i := buf.take()) >= 0:
            taken.append(i)
        if not taken:
            break
        cols = buf.columns(taken, src.wall_offset_ns)
        for i in taken:
            buf.release(i)
        b = time.perf_counter()
        table = src.table(cols)
        c = time.perf_counter()
        sink.write(table)
        d = time.perf_counter()
        t_cols += b - a
        t_table += c - b
        t_write += d - c
        rows += table.num_rows
    sink.finish()
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    size = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory))
    return {"rows": rows, "wall": wall, "cpu": cpu, "cols": t_cols, "table": t_table,
            "write": t_write, "bytes": size}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=2_000_000, help="records per pass (2M)")
    ap.add_argument("--chunk-records", type=int, default=32768,
                    help="records per buffer chunk, as the proxy's default (32768)")
    ap.add_argument("--batch-chunks", type=int, default=1,
                    help="chunks per table/row group (1: the proxy's writer keeping up, "
                         "woken by each full chunk; it takes up to 8 when behind)")
    ap.add_argument("--repeat", type=int, default=5, help="passes (5)")
    ap.add_argument("--format", default="parquet", choices=["parquet", "jsonl"])
    ap.add_argument("--cpu", default="0", help="cpu to pin to (0; '' for none)")
    args = ap.parse_args(argv)
    if args.cpu and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(args.cpu)})
    results = []
    for rep in range(args.repeat):
        directory = tempfile.mkdtemp(prefix="frametap-flbench-")
        try:
            r = one_pass(args.records, args.chunk_records, args.format, directory,
                         args.batch_chunks)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        results.append(r)
        print(f"[{rep + 1}/{args.repeat}] {r['rows']:,} records in {r['wall']:.2f} s "
              f"({r['rows'] / r['wall'] / 1e6:.2f} M/s; columns {r['cols']:.2f} s, table "
              f"{r['table']:.2f} s, write {r['write']:.2f} s; cpu {r['cpu']:.2f} s; "
              f"{r['bytes'] / r['rows']:.1f} B/record on disk)", flush=True)
    rates = [r["rows"] / r["wall"] for r in results]
    med = statistics.median(rates)
    # CPU seconds per record: what the writer takes from a core shared with the relay
    # (and, unlike wall time, not inflated by other work on a busy machine)
    per_cpu = [r["cpu"] / r["rows"] * 1e9 for r in results]
    print(f"writer: median {med / 1e6:.2f} M records/s (spread {min(rates) / 1e6:.2f}.."
          f"{max(rates) / 1e6:.2f}) into {args.format} on one cpu; target >= "
          f"{TARGET / 1e6:.0f} M/s: {'PASS' if med >= TARGET else 'FAIL'}; cpu "
          f"{statistics.median(per_cpu):.0f} ns/record ({min(per_cpu):.0f}..{max(per_cpu):.0f}), "
          f"{1e3 / statistics.median(per_cpu):.2f} M records per cpu-second")
    return 0


if __name__ == "__main__":
    sys.exit(main())
