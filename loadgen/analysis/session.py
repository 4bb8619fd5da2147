"""A quiet SparkSession for the analysis, and the progress line.

``start_session`` starts Spark's JVM itself (so it can check for Java first, quiet
log4j before the JVM prints anything, and filter the JVM's own start-up warnings), or
reuses the session ``spark-submit`` already made.  ``Console`` owns stderr: the progress
line (one line, rewritten in place on a terminal) and everything else printed there.
"""

import os
import re
import shutil
import sys
import tempfile
import threading
import time

from loadgen.analysis import AnalysisError

#: log4j2 for the driver JVM: errors only, one line each, no stack traces (a failing job
#: reaches Python as an exception, which the command reports in one line).  The
#: executor's and task manager's errors are those failures again; TaskSchedulerImpl's
#: warnings stay, because "Initial job has not accepted any resources" is how a
#: cluster without free workers shows itself.
LOG4J2 = """\
status = error
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = spark: %p %c{1}: %m%n
appender.stderr.layout.alwaysWriteExceptions = false
logger.executor.name = org.apache.spark.executor.Executor
logger.executor.level = off
logger.tsm.name = org.apache.spark.scheduler.TaskSetManager
logger.tsm.level = off
logger.tsi.name = org.apache.spark.scheduler.TaskSchedulerImpl
logger.tsi.level = warn
logger.parquet.name = org.apache.parquet
logger.parquet.level = off
"""

#: JVM start-up lines that are not log4j's and say nothing to a user of this command.
JVM_NOISE = re.compile(r"^(WARNING: Using incubator modules|Using Spark's default log4j"
                       r"|Setting default log level|To adjust logging level)")


def java_problem(environ=None):
    """Why Spark cannot start a JVM here (the same lookup as Spark's ``bin/spark-class``:
    ``$JAVA_HOME/bin/java`` when JAVA_HOME is set, else ``java`` on PATH), or None."""
    env = os.environ if environ is None else environ
    home = env.get("JAVA_HOME")
    if home:
        java = os.path.join(home, "bin", "java")
        if not (os.path.isfile(java) and os.access(java, os.X_OK)):
            return (f"JAVA_HOME={home} has no bin/java; Spark needs a Java 17+ runtime: "
                    "point JAVA_HOME at one (or unset it to use java on PATH)")
        return None
    if shutil.which("java", path=env.get("PATH", os.defpath)) is None:
        return ("no Java runtime: Spark needs Java 17+ (e.g. apt-get install "
                "openjdk-17-jre-headless) on PATH, or JAVA_HOME set")
    return None


class Console:
    """stderr for the job: a progress line that rewrites itself on a terminal, and
    ``say`` for whole lines (which first clear the progress line)."""

    def __init__(self, stream=None, quiet=False):
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.lock = threading.Lock()
        self._shown = 0            # characters of the progress line on screen

    def say(self, line):
        with self.lock:
            self._clear()
            self.stream.write(line.rstrip("\n") + "\n")
            self.stream.flush()

    def status(self, line):
        """Show ``line`` as the progress line (a terminal only; else ignored)."""
        if self.quiet or not self.tty:
            return
        with self.lock:
            text = line[:max(20, shutil.get_terminal_size((100, 20)).columns - 1)]
            pad = max(0, self._shown - len(text))
            self.stream.write("\r" + text + " " * pad)
            self.stream.flush()
            self._shown = len(text)

    def step(self, line):
        """A step starts: on a terminal the progress line shows it; elsewhere (CI logs)
        one plain line per step."""
        if self.quiet:
            return
        if self.tty:
            self.status(line)
        else:
            self.say(line)

    def done(self):
        with self.lock:
            self._clear()

    def _clear(self):
        if self._shown:
            self.stream.write("\r" + " " * self._shown + "\r")
            self._shown = 0


class Progress:
    """Polls ``statusTracker()`` twice a second and shows, on one line: the job's step,
    Spark stages done / known, the running stage's tasks, and the elapsed time."""

    def __init__(self, spark, console, group="frametap-analyze", interval=0.5):
        self.sc = spark.sparkContext
        self.console = console
        self.group = group
        self.interval = interval
        self.started = time.monotonic()
        self.label = "starting"
        self.step_no = 0
        self.steps = 0
        self._stop = threading.Event()
        self._thread = None
        self._finished = {}        # job id -> its stage ids, once it succeeded

    def __enter__(self):
        # every job of this thread lands in our group, which the poller watches
        self.sc.setJobGroup(self.group, "frametap analyze", interruptOnCancel=False)
        self._thread = threading.Thread(target=self._run, name="frametap-progress",
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
        self.console.done()
        return False

    def elapsed(self):
        return time.monotonic() - self.started

    def step(self, label, step_no, steps):
        self.label, self.step_no, self.steps = label, step_no, steps
        self.console.step(f"analyze: [{step_no}/{steps}] {label} ({self.elapsed():.1f} s)")

    def _run(self):
        while not self._stop.wait(self.interval):
            try:
                line = self._line()
            except Exception:              # the JVM is going away: stop quietly
                return
            self.console.status(line)

    def _line(self):
        tracker = self.sc.statusTracker()
        stages, done, tasks = set(), set(), ""
        for job_id in tracker.getJobIdsForGroup(self.group):
            if job_id in self._finished:
                stages.update(self._finished[job_id])
                done.update(self._finished[job_id])
                continue
            job = tracker.getJobInfo(job_id)
            if job is None:
                continue
            ids = set(job.stageIds)
            stages.update(ids)
            if job.status == "SUCCEEDED":      # its skipped stages never run: done too
                done.update(ids)
                self._finished[job_id] = ids
        for stage_id in stages - done:
            info = tracker.getStageInfo(stage_id)
            if info is None:
                continue
            if info.numTasks and info.numCompletedTasks >= info.numTasks:
                done.add(stage_id)
            elif info.numActiveTasks or info.numCompletedTasks:
                tasks = f", tasks {info.numCompletedTasks}/{info.numTasks}"
        head = f"analyze: [{self.step_no}/{self.steps}] {self.label}"
        if not stages:                       # planning, or the JVM warming up
            return f"{head} ({self.elapsed():.1f} s)"
        return f"{head}: stages {len(done)}/{len(stages)}{tasks}, {self.elapsed():.1f} s"


def _pump_stderr(fd, console):
    """Copy the JVM's stderr (the read end ``fd`` of its pipe) to ours, without its
    start-up noise, until every writer has gone (on its own thread)."""
    with os.fdopen(fd, "rb") as stream:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip()
            if line and not JVM_NOISE.match(line):
                console.say(line)


def _local(master):
    return master.startswith("local")


def default_conf(master, cores=None):
    """Spark settings for this job (user ``--conf`` values override them)."""
    conf = {
        "spark.app.name": "frametap analyze",
        "spark.master": master,
        "spark.sql.session.timeZone": "UTC",      # CSV times are UTC, whatever the host says
        "spark.ui.showConsoleProgress": "false",  # we draw our own progress line
        "spark.sql.adaptive.enabled": "true",
        # the timeline has a group per second and opcode, each with a percentile sketch:
        # keep them in the hash map instead of falling back to sorting every row at 128
        # groups (a sketch of a small group is a few hundred bytes)
        "spark.sql.objectHashAggregate.sortBased.fallbackThreshold": "65536",
    }
    if _local(master):
        cores = cores or os.cpu_count() or 2
        conf.update({
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            # small aggregates: a handful of shuffle partitions, not 200 tiny tasks
            "spark.sql.shuffle.partitions": str(max(4, 2 * cores)),
            # smaller input splits keep every core busy to the end of each scan
            "spark.sql.files.maxPartitionBytes": "16m",
            # the driver is the executor here; 2 GiB holds the aggregation state of
            # 10 M records with room to spare (peak RSS of the whole process ~1.8 GiB)
            "spark.driver.memory": "2g",
        })
    return conf


def _quiet_pyspark_loggers():
    """PySpark logs every failed query as a JSON line on stderr before raising; the
    command reports the failure itself, in one line."""
    import logging

    from pyspark.logger import PySparkLogger
    for name in ("DataFrameQueryContextLogger", "SQLQueryContextLogger"):
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL + 1)


def start_session(master=None, conf=(), console=None):
    """``(spark, owned)``: a SparkSession and whether this process started it (and so
    must stop it).  ``conf`` is ``[(key, value)]`` from ``--conf``.

    Under ``spark-submit`` the session exists already: it is reused, and ``--master`` /
    JVM settings are spark-submit's business.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    console = console or Console()
    _quiet_pyspark_loggers()
    if "PYSPARK_GATEWAY_PORT" in os.environ or SparkContext._active_spark_context:
        spark = SparkSession.builder.getOrCreate()
        spark.conf.set("spark.sql.session.timeZone", "UTC")
        for key, value in conf:
            if key.startswith("spark.sql."):
                spark.conf.set(key, value)
        return spark, False

    problem = java_problem()
    if problem:
        raise AnalysisError(problem)
    master = master or "local[*]"
    settings = default_conf(master)
    settings.update(dict(conf))
    log_dir = tempfile.mkdtemp(prefix="frametap-log4j-")
    log_file = os.path.join(log_dir, "log4j2.properties")
    with open(log_file, "w") as f:
        f.write(LOG4J2)
    java_opts = f"-Dlog4j2.configurationFile=file:{log_file}"
    if settings.get("spark.driver.extraJavaOptions"):
        java_opts += " " + settings["spark.driver.extraJavaOptions"]
    settings["spark.driver.extraJavaOptions"] = java_opts
    spark_conf = SparkConf(loadDefaults=False).setAll(list(settings.items()))

    from pyspark.java_gateway import launch_gateway
    os.environ.setdefault("SPARK_HOME", _pyspark_home())
    # the JVM's stderr goes through a pipe we read from the start, so what it says when
    # it fails to start (an old Java, say) is shown too
    read_end, write_end = os.pipe()
    threading.Thread(target=_pump_stderr, args=(read_end, console),
                     name="frametap-jvm-stderr", daemon=True).start()
    try:
        gateway = launch_gateway(spark_conf, popen_kwargs={"stderr": write_end})
    except Exception as exc:
        shutil.rmtree(log_dir, ignore_errors=True)
        raise AnalysisError(f"Spark's JVM did not start ({first_line(exc)}); is Java 17+ "
                            "installed?") from None
    finally:
        os.close(write_end)                 # the JVM holds its own copy
    try:
        sc = SparkContext(conf=spark_conf, gateway=gateway)
    except Exception as exc:
        shutil.rmtree(log_dir, ignore_errors=True)
        raise AnalysisError(f"cannot start Spark with master {master}: "
                            f"{first_line(exc)}") from None
    sc.setLogLevel("ERROR")
    spark = SparkSession(sc)
    spark._frametap_log_dir = log_dir
    return spark, True


def stop_session(spark, owned):
    if not owned:
        return
    log_dir = getattr(spark, "_frametap_log_dir", None)
    spark.stop()
    if log_dir:
        shutil.rmtree(log_dir, ignore_errors=True)


def _pyspark_home():
    import pyspark
    return os.path.dirname(os.path.abspath(pyspark.__file__))


def first_line(exc):
    """The first meaningful line of an exception from Spark or py4j, without Spark's
    ``[ERROR_CLASS]`` prefix noise kept (it helps searching) and without stack traces."""
    text = getattr(exc, "desc", None) or str(exc)
    java = getattr(exc, "java_exception", None)
    if java is not None and not getattr(exc, "desc", None):
        try:
            text = java.toString()
        except Exception:
            pass
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("at ", "JVM stacktrace", "py4j.")):
            return line[:500]
    return type(exc).__name__
