"""Finding, checking and reading frame-log files (docs/design.md, "Frame log").

Paths are Hadoop paths (``/local/dir``, ``file://``, ``hdfs://``, ``s3a://``, globs).  A
directory is searched recursively for ``*.parquet`` and ``*.jsonl``; names starting with
``.`` (unfinished files: the writers' temporary names) or ``_`` (Spark's markers) are
skipped, as is everything under the job's own output directory.  Every Parquet file's
footer is checked against SCHEMA, so a foreign or broken file is named before any work.

Two implementations of the same rules and messages: ``prepare_local`` for local paths,
in Python before Spark starts (a wrong path fails in a blink, not after the JVM's
start-up), and ``find_frame_logs`` + ``check_parquet`` through Hadoop's FileSystem API on
the driver for everything else, so whatever Spark can read works here.
"""

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor

from proxy.framelog import SCHEMA
from proxy.runinfo import is_run_file

from loadgen.analysis import AnalysisError
from loadgen.analysis.session import first_line

SUFFIXES = (".parquet", ".jsonl")

#: The columns the analysis reads (Parquet reads only these, and ``attrs``: see
#: FRAME_COLUMNS; the byte split is never needed).
READ_COLUMNS = ("ts_ns", "source", "run_id", "route", "protocol", "conn_id", "peer",
                "direction", "opcode_name", "kind", "correlation_id", "status", "outcome",
                "frame_bytes", "messages", "latency_ns", "request_opcode_name")
#: What ``read_frames`` reads: READ_COLUMNS and ``attrs``, for the fault view (a row a
#: fault rule touched has ``attrs.fault``, a reply the proxy made ``attrs.injected``).
FRAME_COLUMNS = READ_COLUMNS + ("attrs",)

#: Parquet physical type of each SCHEMA column ("MAP": a group).
_PARQUET_TYPES = {"int64": "INT64", "int32": "INT32", "string": "BINARY"}


class FrameLogs:
    """The frame-log files found: ``parquet`` and ``jsonl`` (Hadoop path strings), and
    the run files beside them (``run_files``: ``run-*.json``, proxy.runinfo)."""

    def __init__(self):
        self.parquet = []
        self.jsonl = []
        self.run_files = []
        self._seen = set()

    def add(self, path):
        if path in self._seen:
            return False
        self._seen.add(path)
        (self.parquet if path.endswith(".parquet") else self.jsonl).append(path)
        return True

    def add_run_file(self, path):
        if path not in self._seen:
            self._seen.add(path)
            self.run_files.append(path)

    def __len__(self):
        return len(self.parquet) + len(self.jsonl)


def spark_schema(columns=None):
    """SCHEMA (proxy/framelog.py) as a Spark StructType, optionally only ``columns``."""
    from pyspark.sql import types as T
    simple = {"int64": T.LongType(), "int32": T.IntegerType(), "string": T.StringType()}
    fields = []
    for field in SCHEMA:
        if columns is not None and field.name not in columns:
            continue
        kind = str(field.type)
        dtype = simple.get(kind) or T.MapType(T.StringType(), T.StringType(), True)
        fields.append(T.StructField(field.name, dtype, True))
    return T.StructType(fields)


def local_name(path):
    """``file:/x/y`` (how Hadoop names local files) as ``/x/y`` in messages; other URIs
    unchanged."""
    if path.startswith("file:"):
        rest = path[5:]
        while rest.startswith("//"):
            rest = rest[1:]
        return rest
    return path


def _hidden(rel):
    return any(part.startswith((".", "_")) for part in rel.split("/") if part)


NO_LOGS = ("no frame logs there (files named *.parquet or *.jsonl; names starting with "
           "'.' are unfinished and skipped)")
SAME_AS_OUT = "is also --out: give the outputs a directory of their own (inside this one is fine)"
GLOB = re.compile(r"[*?\[{]")


def local_path(given):
    """The local file-system path of ``given`` (a plain path or ``file:`` URI without a
    glob), or None for anything Hadoop must resolve (hdfs://, s3a://, globs)."""
    if GLOB.search(given):
        return None
    if given.startswith("file:"):
        return local_name(given)
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", given):
        return None
    return os.path.abspath(given)


def find_local(paths, exclude=None):
    """``find_frame_logs`` for local paths, in Python (no JVM: errors come before Spark
    starts); None when some path is not local.  Same rules and messages."""
    local = [local_path(p) for p in paths]
    if any(p is None for p in local):
        return None
    skip = None
    if exclude and local_path(exclude):
        out = local_path(exclude)
        if os.path.exists(out) and not os.path.isdir(out):
            raise AnalysisError(f"--out {exclude}: exists and is not a directory")
        skip = out.rstrip("/") + "/"
    logs = FrameLogs()
    for given, path in zip(paths, local):
        if not os.path.exists(path):
            raise AnalysisError(f"{given}: no such file or directory")
        if skip and path.rstrip("/") + "/" == skip:
            raise AnalysisError(f"{given} {SAME_AS_OUT}")
        found = 0
        if os.path.isdir(path):
            def failed(exc, given=given):
                raise AnalysisError(f"{given}: cannot list: {exc}")
            for top, dirs, files in os.walk(path, onerror=failed):
                dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
                for name in sorted(files):
                    full = os.path.join(top, name)
                    if skip and full.startswith(skip):
                        continue
                    if name.endswith(SUFFIXES) and not name.startswith((".", "_")):
                        logs.add("file://" + full)
                        found += 1
                    elif is_run_file(name):
                        logs.add_run_file("file://" + full)
        elif path.endswith(SUFFIXES) and not os.path.basename(path).startswith((".", "_")):
            logs.add("file://" + path)
            found += 1
        if not found:
            raise AnalysisError(f"{given}: {NO_LOGS}")
    return logs


def prepare_local(paths, exclude=None):
    """The frame logs under ``paths``, found and checked without Spark, or None when a
    path needs Hadoop (then ``find_frame_logs`` and ``check_parquet`` do it)."""
    logs = find_local(paths, exclude)
    if logs is not None:
        check_local_parquet(logs.parquet)
    return logs


def check_local_parquet(files):
    """``check_parquet`` for local files, with pyarrow (footers only, no JVM)."""
    for f in files:
        problem = local_parquet_problem(local_name(f))
        if problem:
            raise AnalysisError(problem)


def local_parquet_problem(path):
    """``parquet_problem`` for a local file, read with pyarrow."""
    import pyarrow.parquet as pq
    try:
        meta = pq.ParquetFile(path).schema
    except Exception as exc:
        text = getattr(exc, "strerror", None) or str(exc).splitlines()[0]
        return f"{path}: unreadable: {text}"
    top = {}
    arrow = meta.to_arrow_schema()
    for i in range(len(meta)):
        column = meta.column(i)
        name = column.path.split(".")[0]
        if column.path == name:                          # a top-level primitive column
            top[name] = {"BYTE_ARRAY": "BINARY"}.get(column.physical_type,
                                                      column.physical_type)
    return _schema_problem(path, set(arrow.names),
                           lambda name: top.get(name, "a group"))


def _schema_problem(path, names, type_of):
    """The foreign-schema message for a file with columns ``names`` whose Parquet
    physical types ``type_of(name)`` gives ("a group" for nested), or None."""
    missing, wrong = [], []
    for field in SCHEMA:
        if field.name not in names:
            missing.append(field.name)
            continue
        want = _PARQUET_TYPES.get(str(field.type), "a group")
        have = type_of(field.name)
        if have != want:
            wrong.append(f"{field.name} is {have}, expected {want}")
    if not (missing or wrong):
        return None
    what = []
    if missing:
        shown = ", ".join(missing[:5]) + (", ..." if len(missing) > 5 else "")
        what.append(f"lacks column{'s' if len(missing) > 1 else ''} {shown}")
    what.extend(wrong[:3])
    return f"{path}: not a frame log (foreign Parquet schema: {'; '.join(what)})"


def find_frame_logs(spark, paths, exclude=None):
    """Every frame-log file under ``paths``; AnalysisError naming a path that does not
    exist or holds no frame logs.  ``exclude``: a directory to leave out (the output)."""
    jvm = spark._jvm
    hconf = spark._jsc.hadoopConfiguration()
    Path = jvm.org.apache.hadoop.fs.Path
    skip = None
    if exclude:
        out = Path(exclude)
        try:
            skip = out.getFileSystem(hconf).makeQualified(out).toString().rstrip("/") + "/"
        except Exception:
            skip = None                     # reported when the output is created
    logs = FrameLogs()
    for given in paths:
        path = Path(given)
        try:
            fs = path.getFileSystem(hconf)
            matches = fs.globStatus(path)
        except Exception as exc:
            hint = ""
            if "No FileSystem for scheme" in str(exc):
                hint = (" (its Hadoop connector is not on Spark's classpath: e.g. for s3a "
                        "add --conf spark.jars.packages=org.apache.hadoop:hadoop-aws:<version>)")
            raise AnalysisError(f"{given}: {first_line(exc)}{hint}") from None
        if not matches:
            raise AnalysisError(f"{given}: no such file or directory")
        if skip and any(fs.makeQualified(m.getPath()).toString().rstrip("/") + "/" == skip
                        for m in matches):
            raise AnalysisError(f"{given} {SAME_AS_OUT}")
        found = 0
        for status in matches:
            root = status.getPath()
            if status.isDirectory():
                prefix = root.toUri().getPath().rstrip("/") + "/"
                try:
                    files = fs.listFiles(root, True)
                    while files.hasNext():
                        f = files.next().getPath()
                        name = f.toString()
                        rel = f.toUri().getPath()[len(prefix):]
                        if _hidden(rel) or (skip and name.startswith(skip)):
                            continue
                        if name.endswith(SUFFIXES):
                            logs.add(name)
                            found += 1
                        elif is_run_file(f.getName()):
                            logs.add_run_file(name)
                except Exception as exc:
                    raise AnalysisError(f"{given}: cannot list: {first_line(exc)}") from None
            else:
                name = root.toString()
                if name.endswith(SUFFIXES) and not root.getName().startswith((".", "_")):
                    logs.add(name)
                    found += 1
        if not found:
            raise AnalysisError(f"{given}: {NO_LOGS}")
    return logs


def _type_name(ptype):
    if not ptype.isPrimitive():
        return "a group"
    return ptype.asPrimitiveType().getPrimitiveTypeName().name()


def parquet_problem(spark, path):
    """Why the Parquet file ``path`` is not a readable frame log (one line), or None.
    Reads only the footer.  Columns beyond SCHEMA's are allowed (a newer writer)."""
    jvm = spark._jvm
    try:
        hpath = jvm.org.apache.hadoop.fs.Path(path)
        source = jvm.org.apache.parquet.hadoop.util.HadoopInputFile.fromPath(
            hpath, spark._jsc.hadoopConfiguration())
        reader = jvm.org.apache.parquet.hadoop.ParquetFileReader.open(source)
        try:
            schema = reader.getFooter().getFileMetaData().getSchema()
        finally:
            reader.close()
    except Exception as exc:
        return f"{local_name(path)}: unreadable: {java_message(exc)}"
    names = {schema.getType(i).getName() for i in range(schema.getFieldCount())}
    return _schema_problem(local_name(path), names,
                           lambda name: _type_name(schema.getType(name)))


def java_message(exc):
    """The first line of a JVM exception's message (what a user can act on)."""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            msg = java.getMessage()
            if msg:
                # "File file:/x does not exist", "... is not a Parquet file. Expected ..."
                return msg.splitlines()[0][:300]
            return java.getClass().getSimpleName()
        except Exception:
            pass
    return first_line(exc)


def check_parquet(spark, files):
    """AnalysisError for the first foreign or unreadable Parquet file in ``files``.

    Fast path: Spark merges all footers in one job (parallel on a cluster); a merged
    schema equal to SCHEMA means every file is fine.  Anything else (a merge failure,
    an unreadable file, extra columns) is examined file by file, which names the
    culprit."""
    if not files:
        return
    expected = spark_schema()
    sc = spark.sparkContext
    sc.setLogLevel("OFF")        # failures here are expected and reported by us
    try:
        merged = spark.read.option("mergeSchema", "true").parquet(*files).schema
        fine = _same_columns(merged, expected)
    except Exception:
        fine = False
    finally:
        sc.setLogLevel("ERROR")
    if fine:
        return
    with ThreadPoolExecutor(max_workers=8) as pool:
        for problem in pool.map(lambda f: parquet_problem(spark, f), files):
            if problem:
                raise AnalysisError(problem)


def _same_columns(actual, expected):
    have = {f.name: f.dataType.simpleString() for f in actual.fields}
    want = {f.name: f.dataType.simpleString() for f in expected.fields}
    return have == want


def read_frames(spark, logs):
    """One DataFrame of FRAME_COLUMNS over every file (Parquet and JSON Lines)."""
    schema = spark_schema(FRAME_COLUMNS)
    parts = []
    if logs.parquet:
        parts.append(spark.read.schema(schema).parquet(*logs.parquet))
    if logs.jsonl:
        parts.append(spark.read.schema(schema).option("mode", "FAILFAST").json(list(logs.jsonl)))
    frames = parts[0]
    for part in parts[1:]:
        frames = frames.unionByName(part)
    return frames


def read_run_files(spark, logs, warn=None):
    """The run files' JSON objects (proxy.runinfo), read on the driver (they are small);
    one that cannot be read or parsed is skipped with a ``warn(line)``."""
    out = []
    for path in logs.run_files:
        try:
            local = local_path(path)
            if local is not None:
                with open(local, encoding="utf-8") as f:
                    text = f.read(1 << 22)
            else:
                text = _hadoop_read(spark, path)
            data = json.loads(text)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
        except Exception as exc:       # a run file only adds to the report: go on without
            if warn is not None:
                warn(f"analyze: run file {local_name(path)} ignored: "
                     f"{getattr(exc, 'strerror', None) or first_line(exc)}")
            continue
        data["_path"] = local_name(path)
        out.append(data)
    return out


def _hadoop_read(spark, path, limit=1 << 22):
    jvm = spark._jvm
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    fs = hpath.getFileSystem(spark._jsc.hadoopConfiguration())
    stream = fs.open(hpath)
    try:
        reader = jvm.java.io.BufferedReader(jvm.java.io.InputStreamReader(stream, "UTF-8"))
        lines, size = [], 0
        while size < limit:
            line = reader.readLine()
            if line is None:
                break
            lines.append(line)
            size += len(line) + 1
        return "\n".join(lines)
    finally:
        stream.close()


def task_failure(text):
    """The exception a failed Spark task ended with, from a job failure's text
    (``java.lang.ArrayIndexOutOfBoundsException: Index 4024 out of bounds ...``)."""
    m = re.search(r"\(TID \d+\) \([^)]*\): ([^\n]+)", text)
    if m:
        return m.group(1).strip()[:200]
    m = re.search(r"Caused by: ([^\n]+)", text)
    return m.group(1).strip()[:200] if m else None


def find_undecodable(spark, files):
    """(path, reason) of the first Parquet file in ``files`` whose data (the columns the
    analysis reads) does not decode, or None.  Only called after a job failed: local
    files are read with pyarrow first, then each file alone with Spark (the reader
    that failed), so the file that broke the job is the one named."""
    import pyarrow.parquet as pq
    for f in files:
        local = local_path(f)
        if local is None:
            continue
        try:
            pq.read_table(local, columns=list(READ_COLUMNS)).validate(full=True)
        except Exception as exc:
            text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return f, text[:200]
    from pyspark.sql import functions as F
    schema = spark_schema(READ_COLUMNS)
    sc = spark.sparkContext
    sc.setLogLevel("OFF")          # each failure here is expected, and reported by us
    try:
        for f in files:
            try:
                (spark.read.schema(schema).parquet(f)
                 .agg(F.max(F.xxhash64(*READ_COLUMNS)), F.count(F.lit(1))).collect())
            except Exception as exc:
                return f, task_failure(str(exc)) or first_line(exc)
    finally:
        sc.setLogLevel("ERROR")
    return None
