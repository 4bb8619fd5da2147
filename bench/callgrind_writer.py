"""Instructions per record of the frame-log writer, counted by valgrind's callgrind.

The writer's CPU time on this shared machine moves ±25% from one minute to the next;
its instruction count does not.  ``bench/framelog_bench.py``'s small-frame records
(pipelined FlyMQ PRODUCE and answers) are written to Parquet exactly as the proxy's
writer thread does it (``columns()`` -> ``NativeSource.table()`` -> ``FileSink``), under
callgrind, for N and 3N records; the same is done with the buffer filled but not written.
The writer's cost per record is ((all, 3N) - (all, N) - ((fill, 3N) - (fill, N))) / 2N:
free of start-up, imports and the parser that produced the records.  Needs ``valgrind``.

    python bench/callgrind_writer.py [--records 131072] [--batch-chunks 4]

Run it on the build before and after a change to the writer (a second checkout built in
place: ``--checkout DIR``).  Note: callgrind counts each iteration of a ``rep movs``/
``rep stos`` (memcpy/memset of large blocks) as an instruction, so copies weigh more
here than in time.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from callgrind_parsers import callgrind_total  # noqa: E402  (one valgrind runner for both)


def _child(mode: str, records: int, batch_chunks: int, fmt: str = "parquet") -> None:
    """Under callgrind: fill (and, for mode "all", write) ``records`` records."""
    sys.path.insert(0, str(Path.cwd()))
    sys.path.insert(0, str(Path.cwd() / "bench"))
    import framelog_bench
    import pyarrow.parquet  # noqa: F401  (imports cost the same in both modes)
    from proxy.framelog import FileSink  # noqa: F401
    if mode == "fill":
        framelog_bench.fill(records, 32768)
        return
    directory = tempfile.mkdtemp(prefix="frametap-cgwriter-")
    try:
        framelog_bench.one_pass(records, 32768, fmt, directory, batch_chunks)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _count(checkout: Path, mode: str, records: int, batch_chunks: int,
           fmt: str = "parquet") -> int:
    try:
        return callgrind_total(str(Path(__file__).resolve()),
                               ["--child", mode, "--records", str(records),
                                "--batch-chunks", str(batch_chunks), "--format", fmt],
                               cwd=checkout)
    except RuntimeError as exc:
        raise SystemExit(f"callgrind_writer: {mode} {records:,} records: "
                         + (str(exc).strip().splitlines() or ["failed"])[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=131072,
                    help="N: records of the smaller run (default 131072; the larger is 3N)")
    ap.add_argument("--batch-chunks", type=int, default=4,
                    help="32768-record chunks per row group (default 4)")
    ap.add_argument("--checkout", default=str(ROOT),
                    help="frametap checkout to measure, built in place (default this one)")
    ap.add_argument("--format", choices=["parquet", "jsonl"], default="parquet",
                    help="frame-log format written (default parquet)")
    ap.add_argument("--child", choices=["fill", "all"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child, args.records, args.batch_chunks, args.format)
        return 0
    if shutil.which("valgrind") is None:
        print("callgrind_writer: valgrind is not installed (apt-get install valgrind)",
              file=sys.stderr)
        return 2
    checkout = Path(args.checkout).resolve()
    n = args.records
    counts = {}
    steps = [("all", n), ("all", 3 * n), ("fill", n), ("fill", 3 * n)]
    for i, (mode, records) in enumerate(steps, 1):
        print(f"[{i}/{len(steps)}] callgrind: {mode} {records:,} records ...", flush=True)
        counts[mode, records] = _count(checkout, mode, records, args.batch_chunks, args.format)
    writer = ((counts["all", 3 * n] - counts["all", n])
              - (counts["fill", 3 * n] - counts["fill", n])) / (2 * n)
    fill = (counts["fill", 3 * n] - counts["fill", n]) / (2 * n)
    print(f"{checkout}: writer {writer:,.1f} instructions per record "
          f"into {args.format} ({args.batch_chunks} chunk(s) of 32768 per row group); "
          f"filling the buffer (FlyMQ parser + append) {fill:,.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
