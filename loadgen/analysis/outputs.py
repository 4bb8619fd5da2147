"""Writing the analysis outputs into ``--out DIR`` (any Hadoop file system).

A table is a Parquet directory (``summary/``; one file, sorted) and/or one CSV file with
a header (``summary.csv``).  Spark writes a CSV as a directory of part files, so the job
writes one part into a hidden temporary directory and renames it into place.  Times in
CSV are ISO 8601 UTC with milliseconds (``2026-11-23T10:00:00.123Z``); decimals are
written plainly (``0.0001``, never ``1.0E-4``).
"""

from pyspark.sql import functions as F
from pyspark.sql import types as T

ISO_MS = "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"


def iso_from_ns(col):
    """An int64 ns-since-epoch column as ISO 8601 UTC text (needs session time zone UTC)."""
    return F.date_format(F.timestamp_micros(F.expr(f"{col} div 1000")), ISO_MS)


def csv_ready(df):
    """``df`` with timestamps as ISO text and doubles as plain decimals (6 places at most,
    trailing zeros dropped)."""
    cols = []
    for field in df.schema.fields:
        c = F.col(field.name)
        if isinstance(field.dataType, T.TimestampType):
            c = F.date_format(c, ISO_MS)
        elif isinstance(field.dataType, (T.DoubleType, T.FloatType)):
            c = F.when(c.isNotNull(),
                       F.regexp_replace(F.format_string("%.6f", c), r"\.?0+$", ""))
        cols.append(c.alias(field.name))
    return df.select(*cols)


def plain(value):
    """A value as ``csv_ready`` writes it: decimals plainly (at most 6 places, trailing
    zeros dropped), nulls empty."""
    if value is None:
        return ""
    if isinstance(value, float):
        text = ("%.6f" % value).rstrip("0").rstrip(".")
        return text if text not in ("", "-0") else "0"
    return str(value)


class OutputDir:
    """``--out DIR``: created when missing; outputs replace earlier ones of the same name."""

    def __init__(self, spark, out):
        from loadgen.analysis import AnalysisError
        from loadgen.analysis.inputs import java_message
        self.spark = spark
        jvm = spark._jvm
        self.Path = jvm.org.apache.hadoop.fs.Path
        path = self.Path(out)
        try:
            self.fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
            if self.fs.exists(path) and not self.fs.getFileStatus(path).isDirectory():
                raise AnalysisError(f"--out {out}: exists and is not a directory")
            if not self.fs.mkdirs(path):
                raise AnalysisError(f"--out {out}: cannot create the directory")
        except AnalysisError:
            raise
        except Exception as exc:
            raise AnalysisError(f"--out {out}: {java_message(exc)}") from None
        self.root = self.fs.makeQualified(path).toString().rstrip("/")

    def path(self, name):
        return self.root + "/" + name

    def parquet(self, df, name, sort=()):
        """Write ``df`` as ``DIR/name/`` (one sorted file); returns it read back, so the
        CSV and the report come from what was written instead of computing it again."""
        target = self.path(name)
        part = df.coalesce(1)
        if sort:
            part = part.sortWithinPartitions(*sort)
        part.write.mode("overwrite").option("compression", "zstd").parquet(target)
        return self.spark.read.parquet(target)

    def csv(self, df, name):
        """Write ``df`` as the single file ``DIR/name`` with a header (also when empty),
        rows in ``df``'s order (callers pass one sorted partition)."""
        tmp = self.path("." + name + ".tmp")
        part = csv_ready(df).coalesce(1)
        (part.write.mode("overwrite").option("header", "true").option("compression", "none")
         .csv(tmp))
        tmp_path, target = self.Path(tmp), self.Path(self.path(name))
        parts = [s.getPath() for s in self.fs.listStatus(tmp_path)
                 if s.getPath().getName().startswith("part-")]
        self.fs.delete(target, False)
        if parts:
            if not self.fs.rename(parts[0], target):
                raise OSError(f"cannot move {parts[0].toString()} to {target.toString()}")
        else:                              # no part file at all: write the header ourselves
            stream = self.fs.create(target, True)
            stream.write(bytearray((",".join(df.columns) + "\n").encode()))
            stream.close()
        self.fs.delete(tmp_path, True)
        # a local file system keeps a checksum beside each file; that one is stale now
        crc = self.Path(self.path("." + name + ".crc"))
        if self.fs.exists(crc):
            self.fs.delete(crc, False)
        return target.toString()

    def csv_rows(self, rows, columns, name):
        """Write a small table already on the driver (``rows``: dicts) as the single file
        ``DIR/name`` with a header, in the format ``csv`` writes."""
        import csv
        import io
        buf = io.StringIO()
        out = csv.writer(buf, lineterminator="\n")
        out.writerow(columns)
        for r in rows:
            out.writerow([plain(r.get(c)) for c in columns])
        return self.write_text(name, buf.getvalue())

    def write_text(self, name, text):
        """Write ``text`` (UTF-8) as ``DIR/name`` (the report) from the driver."""
        target = self.Path(self.path(name))
        stream = self.fs.create(target, True)
        data = text.encode("utf-8")
        step = 1 << 20
        for i in range(0, len(data), step):
            stream.write(bytearray(data[i:i + step]))
        stream.close()
        crc = self.Path(self.path("." + name + ".crc"))
        if self.fs.exists(crc):
            self.fs.delete(crc, False)
        return target.toString()
