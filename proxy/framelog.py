"""Frame logs: one row per frame, Parquet (zstd) or JSON Lines (docs/design.md, "Frame log").

The pieces:

* ``SCHEMA`` - the file schema every writer produces (proxy and Locust users alike).
* ``FileSink`` - one process's rotating files: written under a hidden temporary name
  (``.<name>.tmp``, which Spark and pyarrow datasets skip) and renamed when complete, so
  a reader never sees half a file; one Parquet row group per flushed batch.
* ``RowBuffer`` - a bounded buffer of row dicts (the Locust users, the pure-Python
  parsers).  The compiled proxy uses ``proxy._framing.FrameLogBuffer`` instead: fixed-size
  native records, turned into Arrow columns by ``proxy.framelog_native``.
* ``FrameLog`` - the background writer thread: drains its sources every
  ``flush_interval`` seconds (or when a buffer fills), writes, rotates, and counts.  The
  producing side never waits: a full buffer drops rows and counts them; a failing disk
  counts a write error, drops the batch, and is retried with a new file next time.
"""

import datetime
import json
import logging
import os
import socket
import threading
import time
import uuid

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

log = logging.getLogger("frametap.framelog")

FORMATS = ("parquet", "jsonl")
SOURCES = ("proxy", "client")

#: The frame-log file schema (docs/design.md, "Frame log"): names, order and types.
SCHEMA = pa.schema([
    ("ts_ns", pa.int64()),
    ("source", pa.string()),
    ("run_id", pa.string()),
    ("route", pa.string()),
    ("protocol", pa.string()),
    ("conn_id", pa.int64()),
    ("peer", pa.string()),
    ("direction", pa.string()),
    ("opcode", pa.int32()),
    ("opcode_name", pa.string()),
    ("kind", pa.string()),
    ("correlation_id", pa.string()),
    ("status", pa.string()),
    ("outcome", pa.string()),
    ("frame_bytes", pa.int64()),
    ("header_bytes", pa.int64()),
    ("payload_bytes", pa.int64()),
    ("messages", pa.int64()),
    ("latency_ns", pa.int64()),
    ("request_opcode_name", pa.string()),
    ("resource", pa.string()),
    ("attrs", pa.map_(pa.string(), pa.string())),
])
COLUMNS = tuple(SCHEMA.names)

#: Columns with few distinct values per row group: dictionary-encoded in Parquet.  The
#: others (times, ids, latencies) are written plain: a dictionary would only cost time.
#: No column statistics either: they cost ~30% of the writer's time and the analysis
#: scans whole files.  (bench/framelog_bench.py measures the writer.)
DICTIONARY_COLUMNS = ["source", "run_id", "route", "protocol", "peer", "direction", "opcode",
                      "opcode_name", "kind", "status", "outcome", "request_opcode_name",
                      "resource", "conn_id", "frame_bytes", "header_bytes", "payload_bytes",
                      "messages"]

#: Writer settings that cut its cost per row (bench/framelog_bench.py; docs/design.md,
#: "Frame log"): one page per column and row group rather than a page per 20,000 rows
#: and the encoders fed 1,024 values at a time (each page is compressed with a fresh
#: zstd context, and each small batch is a round of per-column bookkeeping).
PARQUET_OPTIONS = {"write_batch_size": 65536, "max_rows_per_page": 1 << 22,
                   "data_page_size": 8 << 20}


def new_run_id():
    """A run id for a process that was not given one: UTC start time + 8 random hex."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:8]


def file_stem(source, start, host=None, pid=None):
    """``<source>-<host>-<pid>-<start UTC %Y%m%dT%H%M%SZ>`` (the sequence number follows)."""
    host = (host or socket.gethostname() or "host").replace("-", "_").replace("/", "_")
    stamp = datetime.datetime.fromtimestamp(start, datetime.timezone.utc)
    return "%s-%s-%d-%s" % (source, host, os.getpid() if pid is None else pid,
                            stamp.strftime("%Y%m%dT%H%M%SZ"))


class FileSink:
    """Rotating frame-log files of one process in one directory.

    ``write(table)`` appends a batch (one Parquet row group) and raises OSError when the
    disk fails; the sink then abandons the file (its rows are lost: ``abandon()``
    returns their per-route counts) and opens a fresh one on the next write.
    ``finished`` callbacks receive ``(path, rows_by_route)`` for each completed file.
    """

    def __init__(self, directory, source="proxy", fmt="parquet", rotate_bytes=256 << 20,
                 rotate_seconds=300.0, on_finished=None, compression="zstd"):
        if fmt not in FORMATS:
            raise ValueError("format must be one of %s, not %r" % (", ".join(FORMATS), fmt))
        self.directory = directory
        self.source = source
        self.fmt = fmt
        self.rotate_bytes = rotate_bytes
        self.rotate_seconds = rotate_seconds
        self.compression = compression
        self.on_finished = on_finished
        self.stem = file_stem(source, time.time())
        self.seq = 0
        self._file = None        # open stream
        self._writer = None      # pq.ParquetWriter (parquet)
        self._tmp = None
        self._final = None
        self._opened = 0.0
        self._rows = {}          # route -> rows in the open file

    @property
    def path(self):
        """The final name of the open file, or None."""
        return self._final

    def _open(self, schema):
        os.makedirs(self.directory, exist_ok=True)
        self.seq += 1
        name = "%s-%06d.%s" % (self.stem, self.seq, self.fmt)
        self._final = os.path.join(self.directory, name)
        self._tmp = os.path.join(self.directory, "." + name + ".tmp")
        self._file = open(self._tmp, "wb")
        if self.fmt == "parquet":
            # store_schema=False: files read back with the plain SCHEMA types, whether
            # the batch was built with dictionary-encoded columns or not
            self._writer = pq.ParquetWriter(self._file, schema, compression=self.compression,
                                            store_schema=False, write_statistics=False,
                                            use_dictionary=DICTIONARY_COLUMNS,
                                            **PARQUET_OPTIONS)
        self._opened = time.monotonic()
        self._rows = {}

    def write(self, table):
        """Append one batch (a pyarrow Table with SCHEMA's columns) as a row group."""
        if table.num_rows == 0:
            return
        if self._file is None:
            self._open(table.schema)
        if self.fmt == "parquet":
            self._writer.write_table(table, row_group_size=max(table.num_rows, 1))
        else:
            out = []
            for row in table.to_pylist():
                if row.get("attrs") is not None:
                    row["attrs"] = dict(row["attrs"])
                out.append(json.dumps(row, separators=(",", ":")))
            self._file.write(("\n".join(out) + "\n").encode())
            self._file.flush()
        for route, n in _route_counts(table).items():
            self._rows[route] = self._rows.get(route, 0) + n
        if self._file.tell() >= self.rotate_bytes:
            self.finish()

    def maybe_rotate(self):
        """Finish the open file when it is older than rotate_seconds."""
        if self._file is not None and time.monotonic() - self._opened >= self.rotate_seconds:
            self.finish()

    def finish(self):
        """Complete the open file: close it and rename it to its final name."""
        if self._file is None:
            return
        try:
            if self._writer is not None:
                self._writer.close()
            self._file.close()
            os.replace(self._tmp, self._final)
        except BaseException:
            self.abandon()
            raise
        rows, path = self._rows, self._final
        self._reset()
        if self.on_finished is not None:
            self.on_finished(path, rows)

    def abandon(self):
        """Drop the open file after a failure; returns {route: rows} that were in it."""
        rows = self._rows
        for closer in (self._writer, self._file):
            try:
                if closer is not None:
                    closer.close()
            except Exception:
                pass
        try:
            if self._tmp is not None:
                os.unlink(self._tmp)
        except OSError:
            pass
        self._reset()
        return rows

    def _reset(self):
        self._file = self._writer = self._tmp = self._final = None
        self._rows = {}

    close = finish


def _route_counts(table):
    """{route: rows} of a batch.  A dictionary column is counted by its indices (a
    dictionary of one route needs no pass at all): casting it to strings first cost
    ~26 ns per row, a seventh of the writer's whole budget."""
    col = table.column("route")
    counts = {}
    if pa.types.is_dictionary(col.type):
        for chunk in col.chunks:
            names = chunk.dictionary.to_pylist()
            if len(names) == 1 and not chunk.null_count:
                pairs = [(names[0], len(chunk))]
            else:
                pairs = [(None if item["values"] is None else names[item["values"]],
                          item["counts"])
                         for item in pc.value_counts(chunk.indices).to_pylist()]
            for name, n in pairs:
                counts[name] = counts.get(name, 0) + n
        return counts
    for item in col.value_counts().to_pylist():
        counts[item["values"]] = counts.get(item["values"], 0) + item["counts"]
    return counts


class RowBuffer:
    """A bounded buffer of row dicts (SCHEMA's keys; missing keys are null).

    ``append`` never blocks: beyond ``limit`` buffered rows it drops and counts the row
    under its route.  The writer thread takes everything with ``drain()``.
    """

    def __init__(self, limit=65536, defaults=None):
        self.limit = limit
        self.defaults = dict(defaults or {})
        self.rows = []
        self.dropped = {}        # route -> rows dropped
        self.full = None         # threading.Event the writer waits on (set by FrameLog)

    def append(self, row):
        rows = self.rows
        if len(rows) >= self.limit:
            route = row.get("route") or self.defaults.get("route")
            self.dropped[route] = self.dropped.get(route, 0) + 1
            return False
        rows.append(row)
        if len(rows) * 2 == self.limit and self.full is not None:
            self.full.set()      # half full: wake the writer early
        return True

    def drain(self):
        """Everything buffered so far, as pyarrow Tables (the buffer starts empty)."""
        rows, self.rows = self.rows, []      # one swap: atomic under the GIL
        if not rows:
            return []
        if self.defaults:
            rows = [dict(self.defaults, **r) for r in rows]
        return [pa.Table.from_pylist(rows, schema=SCHEMA)]

    def dropped_counts(self):
        return dict(self.dropped)


class FrameLog:
    """The frame-log writer thread of one process.

    ``sources`` have ``drain() -> [pa.Table]`` and ``dropped_counts() -> {route: n}``
    (and may have ``drain_full()``: what a wake by a full buffer chunk writes).
    Counters (for the metrics): ``records`` (rows in finished files, by route),
    ``write_drops`` (rows lost to write errors, by route), ``files``, ``write_errors``.
    """

    def __init__(self, directory, source="proxy", fmt="parquet", rotate_bytes=256 << 20,
                 rotate_seconds=300.0, flush_interval=1.0):
        self.sink = FileSink(directory, source, fmt, rotate_bytes, rotate_seconds,
                             on_finished=self._finished)
        self.flush_interval = flush_interval
        self.sources = []
        self.records = {}
        self.write_drops = {}
        self.files = 0
        self.write_errors = 0
        self.wake = threading.Event()
        self._stop = False
        self._thread = None
        self._lock = threading.Lock()          # one drain at a time (thread vs. flush())
        self._last_error_log = 0.0

    # ---- producers ---------------------------------------------------------------

    def add_source(self, source):
        if hasattr(source, "full"):
            source.full = self.wake
        self.sources.append(source)
        return source

    def dropped(self):
        """{route: rows dropped} - buffer overflows plus rows lost to write errors."""
        out = dict(self.write_drops)
        for src in self.sources:
            for route, n in src.dropped_counts().items():
                out[route] = out.get(route, 0) + n
        return out

    # ---- the thread ----------------------------------------------------------------

    def start(self):
        self._thread = threading.Thread(target=self._run, name="frametap-framelog",
                                        daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop:
            woken = self.wake.wait(self.flush_interval)
            self.wake.clear()
            if self._stop:
                break
            # woken by a full buffer chunk: write the full ones only (a part-filled chunk
            # is a small row group, dearer per row); every flush_interval: everything
            self.flush(partial=not woken)

    def flush(self, finish=False, partial=True):
        """Drain every source into the open file (and complete it when ``finish``)."""
        with self._lock:
            for src in list(self.sources):
                try:
                    if partial or finish or not hasattr(src, "drain_full"):
                        tables = src.drain()
                    else:                          # the compiled buffer's full chunks only
                        tables = src.drain_full()
                except Exception as exc:      # a bug, not the disk: say so, keep going
                    self._error("frame log: draining a buffer failed: %s" % exc)
                    continue
                for table in tables:
                    self._write(table)
            try:
                if finish:
                    self.sink.finish()
                else:
                    self.sink.maybe_rotate()
            except OSError as exc:
                self._write_failed(exc, self.sink.abandon())

    def _write(self, table):
        try:
            self.sink.write(table)
        except Exception as exc:          # the disk, or a batch pyarrow refuses: count
            lost = self.sink.abandon()     # and drop it, the thread keeps writing
            for route, n in _route_counts(table).items():
                lost[route] = lost.get(route, 0) + n
            self._write_failed(exc, lost)

    def _write_failed(self, exc, lost):
        self.write_errors += 1
        for route, n in lost.items():
            self.write_drops[route] = self.write_drops.get(route, 0) + n
        self._error("frame log: writing to %s failed (%s); %d rows dropped, retrying with a "
                    "new file" % (self.sink.directory, getattr(exc, "strerror", None) or exc,
                                  sum(lost.values())))

    def _error(self, message):
        now = time.monotonic()
        if now - self._last_error_log >= 10.0:    # one line per 10 s, not per batch
            self._last_error_log = now
            log.warning("%s", message)

    def _finished(self, path, rows):
        self.files += 1
        for route, n in rows.items():
            self.records[route] = self.records.get(route, 0) + n

    def close(self, timeout=30.0):
        """Stop the thread, write what is buffered, complete the open file."""
        self._stop = True
        self.wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self.flush(finish=True)
