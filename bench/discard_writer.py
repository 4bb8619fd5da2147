"""The proxy with a frame-log writer that discards every row: run_bench.py's ``framelog0``.

usage: python bench/discard_writer.py proxy -c frametap.toml   # as ``python -m proxy ...``

The event loop records every frame into the native buffer exactly as with a real frame
log (``[framelog]`` configured, every connection sampled); only the writer thread differs:
it gives each chunk back unread (``take`` + ``release``): no transpose, no Parquet. Against
plain ``frametap`` that is the event loop's own cost of recording; against ``framelog`` it
is what the writer's work costs the loop when both share a core (its CPU aside: the
caches it takes from the loop). A measuring tool only: rows are lost on purpose, so the
proxy prints ``frame log discarded N rows`` on stderr when it stops; run_bench and
guard.py read it back (``discarded()``) and refuse a run whose loop did not record.
"""

import atexit
import os
import re
import runpy
import sys

#: the line printed at exit, and its pattern for the tools that read it (run_bench, guard)
REPORT = "frame log discarded {} rows"
DISCARDED = re.compile(rb"frame log discarded (\d+) rows")

_buffers = []


def discarded(log_bytes: bytes) -> int | None:
    """The rows a proxy run through this script recorded, read from its output (None:
    it printed no count, e.g. it did not stop cleanly)."""
    m = DISCARDED.search(log_bytes)
    return int(m.group(1)) if m else None


def _discard(self, finish=False, partial=True):
    """FrameLog.flush() that drops the buffered rows instead of writing them (no work
    per row, and the GIL held only for take and release)."""
    with self._lock:
        for src in self.sources:
            buf = src.buffer
            if buf not in _buffers:
                _buffers.append(buf)
            while (i := buf.take(partial or finish)) >= 0:
                buf.release(i)


def _report():
    rows = sum(n for buf in _buffers for n in buf.appended_counts().values())
    print(REPORT.format(rows), file=sys.stderr, flush=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0)
    sys.path.insert(0, os.getcwd())        # frametap from the working directory, as -m does
    from proxy import framelog
    framelog.FrameLog.flush = _discard
    atexit.register(_report)
    sys.argv = ["frametap", *sys.argv[1:]]
    runpy.run_module("proxy", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
