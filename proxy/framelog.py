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
import errno
import json
import logging
import os
import socket
import tempfile
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
DICTIONARY_COLUMNS = ["source", "run_id", "route", "protocol", "peer", "direction",
                      "opcode_name", "kind", "status", "outcome", "request_opcode_name",
                      "resource"]

#: Integer columns with few distinct values or runs (ids, sizes, counts): DELTA_BINARY_PACKED
#: rather than a dictionary.  Parquet's writer takes no Arrow dictionary of integers
#: directly (it decodes one and hashes every value again), and its dictionary encoder
#: hashes each value: ~40 instructions per value and column, where the delta encoder
#: bit-packs the differences (constant or alternating sizes, one connection's run of
#: rows) for ~93 instructions less per row over these six columns, files as small
#: (bench/callgrind_writer.py).  Spark >= 3.3 and pyarrow read it (tests/test_analyze.py).
#: BYTE_STREAM_SPLIT would cost ~65 instructions a row less, files as small, but Spark's
#: vectorised reader takes it for integers only in 4.x: a user's Spark 3.5 cluster could
#: not read the logs.
DELTA_COLUMNS = ["conn_id", "opcode", "frame_bytes", "header_bytes", "payload_bytes",
                 "messages"]

#: Writer settings that cut its cost per row (bench/framelog_bench.py; docs/design.md,
#: "Frame log"): one page per column and row group rather than a page per 20,000 rows
#: and the encoders fed 1,024 values at a time (each page is compressed with a fresh
#: zstd context, and each small batch is a round of per-column bookkeeping); version 2
#: data pages, whose levels are stored as they are, not compressed again (~24
#: instructions per row less; Spark >= 3.x and pyarrow read them).
PARQUET_OPTIONS = {"write_batch_size": 65536, "max_rows_per_page": 1 << 22,
                   "data_page_size": 8 << 20, "data_page_version": "2.0"}


def jsonl_bytes_py(table):
    """A batch as JSON Lines, one Python object per row (the pure-Python twin's writer,
    and the reference output of the compiled one: ``proxy._jsonl``)."""
    out = []
    for row in table.to_pylist():
        if row.get("attrs") is not None:
            row["attrs"] = dict(row["attrs"])
        out.append(json.dumps(row, separators=(",", ":")))
    return ("\n".join(out) + "\n").encode()


def _jsonl_native():
    """The compiled JSON Lines writer (``proxy._jsonl``: lines formatted from the Arrow
    buffers and written without the GIL, no Python object per row), or None when
    FRAMETAP_NO_EXTENSIONS selects the pure-Python twin."""
    global _JSONL
    if _JSONL is None:
        if os.environ.get("FRAMETAP_NO_EXTENSIONS"):
            _JSONL = False
        else:
            try:
                from proxy import _jsonl
            except ImportError as exc:  # pragma: no cover - build problem
                raise ImportError(
                    "frametap's compiled extensions are missing (%s); build them with `pip "
                    "install .` or `python setup.py build_ext --inplace`, or set "
                    "FRAMETAP_NO_EXTENSIONS=1" % exc) from exc
            _JSONL = _jsonl
    return _JSONL or None


_JSONL = None


def jsonl_bytes(table):
    """A batch (a pyarrow Table of SCHEMA's columns) as JSON Lines bytes."""
    native = _jsonl_native()
    if native is not None:
        try:
            return native.format_table(table)
        except TypeError:       # a column type the compiled writer has no code for
            pass
    return jsonl_bytes_py(table)


def write_jsonl(file, table):
    """Append a batch to ``file`` (a binary file object) as JSON Lines: the compiled
    writer formats and writes it in 256 KiB blocks straight to the descriptor."""
    native = _jsonl_native()
    if native is not None:
        file.flush()
        try:
            native.write_table(table, file.fileno())
            return
        except TypeError:       # raised before anything is written
            pass
    file.write(jsonl_bytes_py(table))


def unusable_directory(path):
    """Why frame-log files cannot be written into ``path`` (created when missing), or
    None: the start-up check of ``--framelog DIR`` / ``[framelog] dir`` (a probe file is
    created and removed, which also catches a read-only file system when root)."""
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        return "not a directory"
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:
            return "not a directory (a part of the path is a file)"
        return "cannot create the directory: %s" % (exc.strerror or exc)
    if not os.path.isdir(path):
        return "not a directory"
    try:
        fd, probe = tempfile.mkstemp(prefix=".frametap-probe-", suffix=".tmp", dir=path)
    except OSError as exc:
        return "cannot write files there: %s" % (exc.strerror or exc)
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError as exc:
        return "cannot remove files there: %s" % (exc.strerror or exc)
    return None


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


class SinkError(Exception):
    """A frame-log file could not be written, finished or kept: ``lost`` is {route: rows}
    that were in it (and in the batch being written), none of which reached a finished
    file: the caller counts them as dropped.  ``cause`` is the underlying exception."""

    def __init__(self, cause, lost):
        super().__init__(str(cause))
        self.cause = cause
        self.lost = lost

    @property
    def reason(self):
        return getattr(self.cause, "strerror", None) or str(self.cause) or \
            type(self.cause).__name__


class FileSink:
    """Rotating frame-log files of one process in one directory.

    ``write(table)`` appends a batch (one Parquet row group).  Every failure - writing,
    finishing (close + rename), the open file found deleted (``check()``) - abandons the
    open file and raises :class:`SinkError` whose ``lost`` holds the rows of that file
    and of the batch, so that no row is ever uncounted; the next write opens a fresh
    file.  ``finished`` callbacks receive ``(path, rows_by_route)`` for each completed
    file.  A temporary file that cannot be removed is retried by ``check()`` and
    ``finish()`` (``stale``).
    """

    def __init__(self, directory, source="proxy", fmt="parquet", rotate_bytes=256 << 20,
                 rotate_seconds=300.0, on_finished=None, compression="zstd"):
        if fmt not in FORMATS:
            raise ValueError("format must be one of %s, not %r" % (", ".join(FORMATS), fmt))
        if fmt == "jsonl":
            # the compiled JSON Lines writer is imported now, not at the first write: a
            # process whose code became unreadable since (privileges dropped, a checkout
            # moved) would otherwise count every row as a write error
            _jsonl_native()
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
        self._ident = None       # (st_dev, st_ino) of the open file
        self.stale = set()       # abandoned temporary files not removed yet

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
        st = os.fstat(self._file.fileno())
        self._ident = (st.st_dev, st.st_ino)
        if self.fmt == "parquet":
            # store_schema=False: files read back with the plain SCHEMA types, whether
            # the batch was built with dictionary-encoded columns or not
            self._writer = pq.ParquetWriter(self._file, schema, compression=self.compression,
                                            store_schema=False, write_statistics=False,
                                            use_dictionary=DICTIONARY_COLUMNS,
                                            column_encoding=dict.fromkeys(
                                                DELTA_COLUMNS, "DELTA_BINARY_PACKED"),
                                            **PARQUET_OPTIONS)
        self._opened = time.monotonic()
        self._rows = {}

    def write(self, table):
        """Append one batch (a pyarrow Table with SCHEMA's columns) as a row group;
        raises SinkError (the open file abandoned, its rows and the batch's in ``lost``)."""
        if table.num_rows == 0:
            return
        counts = _route_counts(table)
        try:
            if self._file is None:
                self._open(table.schema)
            if self.fmt == "parquet":
                self._writer.write_table(table, row_group_size=max(table.num_rows, 1))
            else:
                write_jsonl(self._file, table)
                self._file.flush()
            size = self._file.tell()
        except Exception as exc:           # the disk, or a batch the encoder refuses
            lost = self.abandon()
            _add_counts(lost, counts)
            raise SinkError(exc, lost) from exc
        _add_counts(self._rows, counts)
        if size >= self.rotate_bytes:
            self.finish()

    def maybe_rotate(self):
        """Finish the open file when it is older than rotate_seconds."""
        if self._file is not None and time.monotonic() - self._opened >= self.rotate_seconds:
            self.finish()

    def check(self):
        """Notice a lost file within one flush: the open file must still be the one at
        its temporary name (a deleted or replaced directory unlinks or hides it, and
        every row written into it would be lost at rotation); raises SinkError with its
        rows.  Also retries removing abandoned temporary files."""
        if self.stale:
            self.clean_stale()
        if self._file is None:
            return
        try:
            if os.fstat(self._file.fileno()).st_nlink == 0:
                raise FileNotFoundError(errno.ENOENT, "the open file was deleted",
                                        self._tmp)
            st = os.stat(self._tmp)
            if (st.st_dev, st.st_ino) != self._ident:
                raise FileNotFoundError(errno.ENOENT, "the open file was replaced",
                                        self._tmp)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ESTALE):
                return                  # e.g. EACCES on stat: finishing will tell
            raise SinkError(exc, self.abandon()) from exc

    def finish(self):
        """Complete the open file: close it and rename it to its final name; raises
        SinkError (with the file's rows) when it cannot."""
        if self.stale:
            self.clean_stale()
        if self._file is None:
            return
        try:
            if self._writer is not None:
                self._writer.close()
            self._file.close()
            st = os.stat(self._tmp)
            if (st.st_dev, st.st_ino) != self._ident:
                raise FileNotFoundError(errno.ENOENT, "the open file was replaced",
                                        self._tmp)
            os.replace(self._tmp, self._final)
        except Exception as exc:
            raise SinkError(exc, self.abandon()) from exc
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
        if self._writer is not None:
            self._writer.is_open = False    # else its __del__ retries close() and prints
        tmp, ident = self._tmp, self._ident
        self._reset()
        if tmp is not None:
            try:
                st = os.stat(tmp)
                if (st.st_dev, st.st_ino) == ident:     # never another writer's file
                    os.unlink(tmp)
            except FileNotFoundError:
                pass
            except OSError:
                self.stale.add((tmp, ident))            # retried at the next flush
        return rows

    def clean_stale(self):
        """Remove the abandoned temporary files left behind; returns those still there."""
        for item in list(self.stale):
            tmp, ident = item
            try:
                st = os.stat(tmp)
                if (st.st_dev, st.st_ino) == ident:
                    os.unlink(tmp)
            except FileNotFoundError:
                pass
            except OSError:
                continue
            self.stale.discard(item)
        return sorted(t for t, _ in self.stale)

    def _reset(self):
        self._file = self._writer = self._tmp = self._final = self._ident = None
        self._rows = {}

    close = finish


def _add_counts(into, counts):
    for route, n in counts.items():
        into[route] = into.get(route, 0) + n
    return into


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
        """Everything buffered so far, as pyarrow Tables (the buffer starts empty).  Rows
        that cannot be converted (a bad value) are counted as dropped, never lost."""
        rows, self.rows = self.rows, []      # one swap: atomic under the GIL
        if not rows:
            return []
        try:
            if self.defaults:
                rows = [dict(self.defaults, **r) for r in rows]
            return [pa.Table.from_pylist(rows, schema=SCHEMA)]
        except Exception:
            default = self.defaults.get("route")
            for r in rows:
                route = r.get("route", default) if isinstance(r, dict) else default
                self.dropped[route] = self.dropped.get(route, 0) + 1
            raise

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
            try:
                self.flush(partial=not woken)
            except Exception as exc:      # a bug: say so, and the thread keeps writing
                self._error("frame log: the writer failed: %r" % (exc,))

    def flush(self, finish=False, partial=True):
        """Drain every source into the open file (and complete it when ``finish``).
        Every row drained ends in a finished file or in ``write_drops``."""
        with self._lock:
            try:
                self.sink.check()              # a deleted directory: noticed here
            except SinkError as exc:
                self._write_failed(exc)
            for src in list(self.sources):
                try:
                    if partial or finish or not hasattr(src, "drain_full"):
                        tables = src.drain()
                    else:                          # the compiled buffer's full chunks only
                        tables = src.drain_full()
                except Exception as exc:      # a bug, not the disk: say so, keep going
                    self._error("frame log: draining a buffer failed (its rows are counted "
                                "as dropped): %r" % (exc,))
                    continue
                for table in tables:
                    self._write(table)
            try:
                if finish:
                    self.sink.finish()
                else:
                    self.sink.maybe_rotate()
            except SinkError as exc:
                self._write_failed(exc)
            if finish and self.sink.stale:
                for path in self.sink.clean_stale():
                    self._error("frame log: cannot remove the unfinished file %s" % path,
                                force=True)

    def _write(self, table):
        try:
            self.sink.write(table)
        except SinkError as exc:          # the disk, or a batch pyarrow refuses: count
            self._write_failed(exc)       # and drop it, the thread keeps writing

    def _write_failed(self, exc):
        lost = exc.lost
        self.write_errors += 1
        _add_counts(self.write_drops, lost)
        self._error("frame log: writing to %s failed (%s); %d rows dropped, retrying with a "
                    "new file" % (self.sink.directory, exc.reason, sum(lost.values())))

    def _error(self, message, force=False):
        now = time.monotonic()
        if force or now - self._last_error_log >= 10.0:    # one line per 10 s, not per batch
            self._last_error_log = now
            log.warning("%s", message)

    def _finished(self, path, rows):
        self.files += 1
        _add_counts(self.records, rows)

    def close(self, timeout=30.0):
        """Stop the thread, write what is buffered, complete the open file."""
        self._stop = True
        self.wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self.flush(finish=True)
