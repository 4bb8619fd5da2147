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


class JvmStderr:
    """Copies the JVM's stderr (the read end ``fd`` of its pipe) to ours, without its
    start-up noise, until every writer has gone (on its own thread).  Until
    ``release()`` the lines are held back: when Spark fails to start, ``reason()``
    turns them into one line instead of a Java stack, and the rest is dropped."""

    def __init__(self, fd, console):
        self.console = console
        self.held = []
        self.lock = threading.Lock()
        self.released = False
        self.muted = False
        threading.Thread(target=self._run, args=(fd,), name="frametap-jvm-stderr",
                         daemon=True).start()

    def _run(self, fd):
        with os.fdopen(fd, "rb") as stream:
            for raw in iter(stream.readline, b""):
                line = raw.decode("utf-8", "replace").rstrip()
                if not line or JVM_NOISE.match(line):
                    continue
                with self.lock:
                    if not self.released:
                        self.held.append(line)
                        continue
                    if self.muted:
                        continue
                self.console.say(line)

    def release(self, show=True, mute=False):
        """From now on lines go straight to the console (the held ones first, unless
        ``show`` is false) - or nowhere, with ``mute`` (the command reports a failure
        in its own line)."""
        with self.lock:
            held, self.held, self.released = self.held, [], True
            self.muted = mute
        if show:
            for line in held:
                self.console.say(line)

    def reason(self):
        """What the JVM said when it failed: its exception's message, or None."""
        with self.lock:
            lines = list(self.held)
        for line in lines:
            m = re.match(r'Exception in thread "[^"]*" (?:[\w.$]+): (.+)', line)
            if m:
                return m.group(1).strip()[:300]
        for line in lines:
            m = re.match(r"(?:Error|[\w.$]+(?:Exception|Error)): (.+)", line)
            if m:
                return m.group(1).strip()[:300]
        return None


#: what ``--master`` accepts (Spark's own forms; Spark 4 has no Mesos)
MASTER_FORMS = re.compile(r"^(local(\[(\*|\d+)(,\s*\d+)?\])?|local-cluster\[\d+,\s*\d+,\s*\d+\]"
                          r"|yarn|spark://[^\s/]+|k8s://\S+)$")


def check_master(master):
    """AnalysisError for a ``--master`` Spark would refuse (before any JVM starts)."""
    if not MASTER_FORMS.match(master):
        raise AnalysisError(f"--master {master}: expected local[*], local[N], "
                            "spark://HOST:PORT, yarn or k8s://https://HOST:PORT")


def master_addresses(master):
    """[(host, port)] of a ``spark://h1:p1,h2:p2`` master (port 7077 when omitted)."""
    out = []
    for part in master[len("spark://"):].split(","):
        part = part.strip()
        if part.startswith("["):
            host, _, rest = part[1:].partition("]")
            port = rest[1:] if rest.startswith(":") else ""
        else:
            host, _, port = part.partition(":")
        out.append((host, int(port) if port.isdigit() else 7077))
    return out


def probe_master(master, timeout):
    """AnalysisError unless one of a ``spark://`` master's addresses accepts a TCP
    connection within ``timeout`` seconds (Spark itself would retry for a minute)."""
    import socket
    problems = []
    for host, port in master_addresses(master):
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            return
        except socket.gaierror as exc:
            problems.append(f"{host}: unknown host ({exc.strerror or exc})")
        except (TimeoutError, socket.timeout):
            problems.append(f"{host}:{port}: no answer within {timeout:g} s")
        except OSError as exc:
            problems.append(f"{host}:{port}: {(exc.strerror or str(exc)).lower()}")
    raise AnalysisError(f"--master {master}: cannot reach the Spark master: "
                        f"{'; '.join(problems)}")


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


#: how long a cluster master may take to accept the application and give it an
#: executor (``--connect-timeout``)
CONNECT_TIMEOUT = 15.0


def start_session(master=None, conf=(), console=None, connect_timeout=CONNECT_TIMEOUT):
    """``(spark, owned)``: a SparkSession and whether this process started it (and so
    must stop it).  ``conf`` is ``[(key, value)]`` from ``--conf``.

    Under ``spark-submit`` the session exists already: it is reused, and ``--master`` /
    JVM settings are spark-submit's business.

    A cluster master gets ``connect_timeout`` seconds to accept the application (Spark
    alone waits a minute and more, then fails with a Java stack), and a ``spark://``
    master as long again to give it an executor; each failure is one AnalysisError.
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
    check_master(master)
    if master.startswith("spark://"):
        probe_master(master, min(connect_timeout, 5.0))
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
    # it fails to start (an old Java, a refused setting) is shown too - in one line
    read_end, write_end = os.pipe()
    jvm_stderr = JvmStderr(read_end, console)
    try:
        gateway = launch_gateway(spark_conf, popen_kwargs={"stderr": write_end})
    except Exception as exc:
        shutil.rmtree(log_dir, ignore_errors=True)
        time.sleep(0.2)                      # the JVM's last words are still in the pipe
        why = jvm_stderr.reason()
        jvm_stderr.release(show=False, mute=True)
        if why:
            raise AnalysisError(f"Spark did not start: {why}") from None
        raise AnalysisError(f"Spark's JVM did not start ({first_line(exc)}); is Java 17+ "
                            "installed?") from None
    finally:
        os.close(write_end)                 # the JVM holds its own copy
    try:
        sc = _bounded(lambda: SparkContext(conf=spark_conf, gateway=gateway),
                      None if _local(master) else connect_timeout)
    except TimeoutError:
        jvm_stderr.release(show=False, mute=True)       # the one line below says it
        _kill(gateway)
        shutil.rmtree(log_dir, ignore_errors=True)
        raise AnalysisError(f"--master {master}: the master did not accept this application "
                            f"within {connect_timeout:g} s (--connect-timeout); is it a "
                            f"running Spark {_spark_version()} master?") from None
    except Exception as exc:
        jvm_stderr.release(show=False, mute=True)
        _kill(gateway)
        shutil.rmtree(log_dir, ignore_errors=True)
        raise AnalysisError(f"cannot start Spark with master {master}: "
                            f"{first_line(exc)}") from None
    try:
        if master.startswith("spark://"):
            _wait_for_executor(sc, master, connect_timeout)
        sc.setLogLevel("ERROR")
        spark = SparkSession(sc)
    except AnalysisError:
        jvm_stderr.release(show=False, mute=True)
        _stop_quietly(sc, gateway)
        shutil.rmtree(log_dir, ignore_errors=True)
        raise
    except Exception as exc:
        jvm_stderr.release(show=False, mute=True)
        _stop_quietly(sc, gateway)
        shutil.rmtree(log_dir, ignore_errors=True)
        raise AnalysisError(f"cannot start Spark with master {master}: "
                            f"{_stopped_reason(exc)}") from None
    jvm_stderr.release()          # the session is up: what the JVM says is shown from now
    spark._frametap_log_dir = log_dir
    return spark, True


def _bounded(fn, timeout):
    """``fn()``, or TimeoutError when it has not returned within ``timeout`` seconds
    (None: no bound).  It runs on a daemon thread that is left behind on a timeout (the
    caller then kills the JVM it waits for)."""
    if timeout is None:
        return fn()
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:      # noqa: BLE001 - handed to the caller
            box["error"] = exc
    worker = threading.Thread(target=run, name="frametap-spark-start", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise TimeoutError
    if "error" in box:
        raise box["error"]
    return box["value"]


def _wait_for_executor(sc, master, timeout):
    """AnalysisError unless a standalone master gives the application an executor in
    ``timeout`` seconds (without one every job waits forever)."""
    deadline = time.monotonic() + timeout
    while True:
        if sc._jsc.sc().getExecutorMemoryStatus().size() > 1:     # the driver is one
            return
        if sc._jsc.sc().isStopped():
            raise AnalysisError(f"--master {master}: the master stopped this application "
                                "(see the master's log)")
        if time.monotonic() > deadline:
            host = master_addresses(master)[0][0]
            raise AnalysisError(f"--master {master}: no worker gave this application an "
                                f"executor within {timeout:g} s (--connect-timeout); do "
                                f"the master's workers have free cores and memory? (its "
                                f"web UI, http://{host}:8080 by default, lists them)")
        time.sleep(0.25)


def _kill(gateway):
    """End the JVM (a thread may still wait on it: it then gets a closed connection)."""
    proc = getattr(gateway, "proc", None)
    if proc is not None and proc.poll() is None:
        proc.kill()
        try:
            proc.wait(10)
        except Exception:
            pass
    try:
        gateway.shutdown()
    except Exception:
        pass


def _stop_quietly(sc, gateway):
    try:
        sc.setLogLevel("OFF")
        sc.stop()
    except Exception:
        _kill(gateway)


def _stopped_reason(exc):
    text = first_line(exc)
    if "stopped SparkContext" in text:
        return "Spark stopped the application as it started (see the lines above)"
    return text


def _spark_version():
    import pyspark
    return pyspark.__version__


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
