"""Finding, checking and reading frame-log files (docs/design.md, "Frame log").

Paths are Hadoop paths (``/local/dir``, ``file://``, ``hdfs://``, ``s3a://``, globs), listed
through Hadoop's FileSystem API on the driver, so whatever Spark can read works here.  A
directory is searched recursively for ``*.parquet`` and ``*.jsonl``; names starting with
``.`` (unfinished files: the writers' temporary names) or ``_`` (Spark's markers) are
skipped, as is everything under the job's own output directory.
"""

from concurrent.futures import ThreadPoolExecutor

from proxy.framelog import SCHEMA

from loadgen.analysis import AnalysisError
from loadgen.analysis.session import first_line

SUFFIXES = (".parquet", ".jsonl")

#: The columns the analysis reads (Parquet reads only these; ``attrs`` and the byte
#: split are never needed).
READ_COLUMNS = ("ts_ns", "source", "run_id", "route", "protocol", "conn_id", "peer",
                "opcode_name", "kind", "correlation_id", "status", "outcome",
                "frame_bytes", "messages", "latency_ns", "request_opcode_name")

#: Parquet physical type of each SCHEMA column ("MAP": a group).
_PARQUET_TYPES = {"int64": "INT64", "int32": "INT32", "string": "BINARY"}


class FrameLogs:
    """The frame-log files found: ``parquet`` and ``jsonl`` (Hadoop path strings)."""

    def __init__(self):
        self.parquet = []
        self.jsonl = []
        self._seen = set()

    def add(self, path):
        if path in self._seen:
            return False
        self._seen.add(path)
        (self.parquet if path.endswith(".parquet") else self.jsonl).append(path)
        return True

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


def _hidden(rel):
    return any(part.startswith((".", "_")) for part in rel.split("/") if part)


def find_frame_logs(spark, paths, exclude=None):
    """Every frame-log file under ``paths``; AnalysisError naming a path that does not
    exist or holds no frame logs.  ``exclude``: a directory to leave out (the output)."""
    jvm = spark._jvm
    hconf = spark._jsc.hadoopConfiguration()
    Path = jvm.org.apache.hadoop.fs.Path
    skip = None
    if exclude:
        out = Path(exclude)
        skip = out.getFileSystem(hconf).makeQualified(out).toString().rstrip("/") + "/"
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
                        if (name.endswith(SUFFIXES) and not _hidden(rel)
                                and not (skip and name.startswith(skip))):
                            logs.add(name)
                            found += 1
                except Exception as exc:
                    raise AnalysisError(f"{given}: cannot list: {first_line(exc)}") from None
            else:
                name = root.toString()
                if name.endswith(SUFFIXES) and not root.getName().startswith((".", "_")):
                    logs.add(name)
                    found += 1
        if not found:
            raise AnalysisError(
                f"{given}: no frame logs there (files named *.parquet or *.jsonl; names "
                "starting with '.' are unfinished and skipped)")
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
        return f"{path}: unreadable: {_java_message(exc)}"
    missing, wrong = [], []
    for field in SCHEMA:
        if not schema.containsField(field.name):
            missing.append(field.name)
            continue
        actual = schema.getType(field.name)
        want = _PARQUET_TYPES.get(str(field.type), "a group")
        if _type_name(actual) != want:
            wrong.append(f"{field.name} is {_type_name(actual)}, expected {want}")
    if missing or wrong:
        what = []
        if missing:
            shown = ", ".join(missing[:5]) + (", ..." if len(missing) > 5 else "")
            what.append(f"lacks column{'s' if len(missing) > 1 else ''} {shown}")
        what.extend(wrong[:3])
        return (f"{path}: not a frame log (foreign Parquet schema: {'; '.join(what)})")
    return None


def _java_message(exc):
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
    """One DataFrame of READ_COLUMNS over every file (Parquet and JSON Lines)."""
    schema = spark_schema(READ_COLUMNS)
    parts = []
    if logs.parquet:
        parts.append(spark.read.schema(schema).parquet(*logs.parquet))
    if logs.jsonl:
        parts.append(spark.read.schema(schema).option("mode", "FAILFAST").json(list(logs.jsonl)))
    frames = parts[0]
    for part in parts[1:]:
        frames = frames.unionByName(part)
    return frames
