"""``frametap analyze``: the PySpark job that turns frame logs into tables and a report
(docs/analysis.md; the contract is docs/design.md, "Analysis outputs").

Modules, in the order the job uses them:

* ``session`` - a quiet SparkSession (local by default, any master, or the one
  ``spark-submit`` made), the Java check, and the progress line on stderr.
* ``inputs`` - finds the frame-log files under the given paths (any Hadoop file system),
  and the run files beside them, rejects foreign Parquet files, reads the columns the
  analysis needs, and names a file whose pages do not decode.
* ``runs`` - what the run files say: the proxy's routes (which name the client rows'
  routes), Locust's settings and totals, the demo's settings.
* ``tables`` - the aggregations: summary, timeline, slowest, decomposition, legs, errors,
  and the small series and totals the report draws.  DataFrame API only (no Python UDFs), so executors need no
  Python, and only aggregated tables reach the driver.
* ``outputs`` - Parquet directories and single-file CSVs with a header.
* ``report`` - the self-contained ``report.html`` (plotly.js inlined once): headline,
  per-opcode selector, client/proxy comparison, errors by status.
* ``job`` - the command itself; also runnable as ``spark-submit loadgen/analysis/job.py``.

Importing this package is cheap: pyspark is imported only when a job runs, so
``frametap --help`` stays fast.
"""

from proxy.errors import ConfigError

#: ``percentile_approx`` accuracy.  Spark's relative (rank) error is 1/accuracy, so every
#: percentile is a logged latency whose rank is within 0.01 % of the requested rank.
ACCURACY = 10000
RANK_ERROR = 1.0 / ACCURACY


class AnalysisError(ConfigError):
    """A problem with the user's input or environment (no Java, no frame logs, an
    unreadable or foreign file): one line on stderr, exit status 2."""
