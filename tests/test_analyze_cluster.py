"""frametap analyze on a real Spark cluster, and as a spark-submit application.

A standalone master and one worker (1 core, 1 GiB) run on 127.0.0.1 from pyspark's
own distribution (``bin/spark-class``), each in its own process group that is killed
afterwards (executors are the worker's children, in its group).  The command run with
``--master spark://127.0.0.1:P`` - and ``spark-submit loadgen/analysis/job.py`` - must
write the same tables as local mode.  The driver and the executor share this machine,
so both see the log files and the output directory under local paths.

Without Java these tests skip, or fail when FRAMETAP_CI is set.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.test_analyze import known_rows, need, require_java, write_known
from tests._support.processes import ROOT

pytestmark = pytest.mark.slow

TABLES = ("summary.csv", "timeline.csv", "slowest.csv", "decomposition.csv")


def pyspark_home():
    import pyspark
    return os.path.dirname(os.path.abspath(pyspark.__file__))


def spark_env():
    env = dict(os.environ, SPARK_HOME=pyspark_home(), SPARK_LOCAL_IP="127.0.0.1",
               PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env.pop("PYSPARK_GATEWAY_PORT", None)
    return env


class Daemon:
    """A Spark master or worker in the foreground of its own process group."""

    def __init__(self, args, log_path, env):
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [os.path.join(pyspark_home(), "bin", "spark-class"), *args], env=env,
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)

    def stop(self):
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # the group is empty afterwards: no executor or launcher left behind
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                break
            os.killpg(self.proc.pid, signal.SIGKILL)
            time.sleep(0.2)
        else:
            raise AssertionError(f"process group {self.proc.pid} outlived SIGKILL")
        self.log.close()


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    """The known run without its bulk route: small, so every percentile is exact and
    local and cluster results must agree to the character."""
    directory = tmp_path_factory.mktemp("cluster-logs")
    files = known_rows()
    files["bulk"] = []
    write_known(str(directory), files)
    return str(directory)


def run_analyze(args, env, timeout=300):
    return subprocess.run([sys.executable, "-m", "proxy", "analyze", *args], env=env,
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


#: small tables: a handful of shuffle partitions, not 200 tasks on the worker's one core
QUICK = ["--conf", "spark.sql.shuffle.partitions=4"]


@pytest.fixture(scope="module")
def local_tables(logs, cluster_starting, tmp_path_factory):
    """The tables of a local-mode run, made by spark-submit running the job module."""
    require_java()
    out = tmp_path_factory.mktemp("local-out")
    submit = os.path.join(pyspark_home(), "bin", "spark-submit")
    r = subprocess.run([submit, "--master", "local[2]", "--conf", "spark.ui.enabled=false",
                        *QUICK, os.path.join(ROOT, "loadgen", "analysis", "job.py"), logs,
                        "--out", str(out)],
                       env=spark_env(), capture_output=True, text=True, timeout=300, cwd="/")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "report:" in r.stdout and "PRODUCE" in r.stdout
    return {name: (out / name).read_text() for name in TABLES}


#: what the master logs once bound (its ports are 0: Spark picks and reports them)
MASTER_URL_RE = re.compile(r"Starting Spark master at (spark://\S+)")
MASTER_UI_RE = re.compile(r"Successfully started service 'MasterUI' on port (\d+)")


def start_master(work, timeout=90):
    """A standalone master on port 0 (RPC and web UI; the REST server off): (Daemon,
    its ``spark://`` URL, its web UI port), read from what it logs once bound."""
    env = spark_env()
    env["SPARK_MASTER_OPTS"] = (env.get("SPARK_MASTER_OPTS", "") +
                                " -Dspark.master.rest.enabled=false").strip()
    master = Daemon(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                     "--port", "0", "--webui-port", "0"], work / "master.log", env)
    master.env = env
    try:
        deadline = time.monotonic() + timeout
        while True:
            text = (work / "master.log").read_text(errors="replace")
            url, ui = MASTER_URL_RE.search(text), MASTER_UI_RE.search(text)
            if url and ui:
                return master, url.group(1), int(ui.group(1))
            if master.proc.poll() is not None:
                need(f"spark master exited ({master.proc.returncode}): "
                     f"see {work / 'master.log'}")
            if time.monotonic() > deadline:
                raise AssertionError(f"spark master did not report its ports in "
                                     f"{timeout} s (see {work / 'master.log'})")
            time.sleep(0.2)
    except BaseException:
        master.stop()
        raise


class Cluster:
    """A standalone master and one worker, started; ``wait()`` returns the master URL
    once the worker has registered (the worker boots while the local run works).

    Every port is 0 (master, its web UI, the worker's): Spark binds them and logs which
    it got, so nothing is picked first and lost to another process; the master's REST
    submission server (a fixed 6066) is off."""

    def __init__(self, work, timeout=90):
        self.work = work
        self.worker = None
        self.master, self.url, self.ui = start_master(work, timeout)
        env = self.master.env
        try:
            self.worker = Daemon(["org.apache.spark.deploy.worker.Worker", self.url,
                                  "--host", "127.0.0.1", "-c", "1", "-m", "1g",
                                  "--webui-port", "0",
                                  "--work-dir", str(work / "work")], work / "worker.log", env)
        except BaseException:
            self.stop()
            raise

    def wait(self, timeout=90):
        deadline, alive = time.monotonic() + timeout, 0
        while time.monotonic() < deadline:
            for d in (self.master, self.worker):
                if d.proc.poll() is not None:
                    need(f"spark daemon exited ({d.proc.returncode}): see {d.log.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.ui}/json/",
                                            timeout=2) as r:
                    state = json.load(r)
                alive = sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")
            except OSError:
                alive = 0
            if alive:
                return self.url
            time.sleep(0.5)
        raise AssertionError(f"no worker registered with {self.url} in {timeout} s "
                             f"(see {self.work})")

    def stop(self):
        if self.worker is not None:
            self.worker.stop()
        self.master.stop()


@pytest.fixture(scope="module")
def cluster_starting(tmp_path_factory):
    require_java()
    cluster = Cluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def cluster(cluster_starting):
    """``spark://127.0.0.1:P`` of a running master with one registered worker."""
    return cluster_starting.wait()


def test_cluster_gives_the_same_tables_as_local(logs, local_tables, cluster, tmp_path):
    """``frametap analyze --master spark://...``: the same tables as local mode (made by
    ``spark-submit loadgen/analysis/job.py``, which so is tested too)."""
    out = tmp_path / "out"
    r = run_analyze([logs, "--out", str(out), "--master", cluster, *QUICK], spark_env())
    assert r.returncode == 0, r.stderr
    assert {name: (out / name).read_text() for name in TABLES} == local_tables
    assert (out / "report.html").stat().st_size > 1_000_000
    # the command's own output: the table on stdout, progress and nothing else on stderr
    assert "PRODUCE" in r.stdout and f"report: {out}/report.html" in r.stdout
    assert "rank error <= 0.01 %" in r.stdout
    noise = [line for line in r.stderr.splitlines() if not line.startswith("analyze: ")]
    assert noise == [], r.stderr
    assert "analyze: [9/9] report" in r.stderr


def test_a_master_without_workers_is_one_line(logs, tmp_path):
    """A standalone master that accepts the application but has no worker to give it an
    executor: every job would wait for ever ("Initial job has not accepted any
    resources"); the command gives up after --connect-timeout, in one line."""
    require_java()
    master, url, ui = start_master(tmp_path)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as r:
                    if json.load(r).get("status") == "ALIVE":
                        break
            except OSError:
                pass
            if master.proc.poll() is not None:
                need(f"spark master exited ({master.proc.returncode})")
            time.sleep(0.5)
        started = time.monotonic()
        r = run_analyze([logs, "--out", str(tmp_path / "out"), "--master", url,
                         "--connect-timeout", "20", "--quiet"],
                        spark_env(), timeout=180)
        took = time.monotonic() - started
    finally:
        master.stop()
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.splitlines()
    assert lines == [f"frametap: error: --master {url}: no worker gave this "
                     "application an executor within 20 s (--connect-timeout); do the master's "
                     "workers have free cores and memory? (its web UI, http://127.0.0.1:8080 "
                     "by default, lists them)"], r.stderr
    assert took < 90
