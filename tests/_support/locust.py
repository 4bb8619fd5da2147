"""Locust runs for tests: one command line, one environment, one way to read the result.

Locust only ever runs in subprocesses (importing it would gevent-patch pytest).

    run = run_locust("flymq", srv.address, ["FlyMQProducer"], users=2, duration="3s")
    run.returncode, run.stats["PRODUCE"]["num_requests"], run.stderr

    run = run_locust(..., processes=2)     # --processes 2, master port retried on collision

    with start_locust(tmp, "flymq", host, args=["--frametap-metrics", "127.0.0.1:0"]) as run:
        run.metrics                                  # bound on port 0, from its ready file
        out, err = run.communicate(60)

    with start_locust_master(tmp, "flymq", host, expect_workers=2) as master:
        start_locust_worker(master, "flymq")         # master.master_port: bound on port 0

``--json`` is on by default and read strictly: stdout must be one JSON document (a
``--processes`` worker prints none of its own, see loadgen/plugins.py), so a stray print
or a second document fails the test instead of being skipped over.
"""

import csv as _csv
import json
import subprocess
import sys

from tests._support.ports import PortCollision, collided, retry_on_collision
from tests._support.processes import ROOT, ReadyProcess, frametap_env, host_port

__all__ = ["LOCUST", "FRAMETAP_LOAD", "locust_env", "locust_cmd", "LocustRun", "run_locust",
           "json_stats", "csv_stats", "start_locust", "start_locust_master",
           "start_locust_worker", "LocustProcess"]

LOCUST = [sys.executable, "-m", "locust", "-f", "loadgen/locustfile.py"]
#: ``frametap load``: the same locustfile, frametap's plugins installed before Locust
#: parses its command line
FRAMETAP_LOAD = [sys.executable, "-m", "proxy", "load"]


def locust_env(protocol, extra=None):
    """Environment of a Locust subprocess offering ``protocol``'s users (a comma list, or
    "" for all); FRAMETAP_* settings of the caller's own environment that would change a
    run (run id, FlyMQ credentials) are dropped."""
    env = frametap_env()
    for key in ("FRAMETAP_RUN_ID", "FRAMETAP_FLYMQ_USER", "FRAMETAP_FLYMQ_PASSWORD"):
        env.pop(key, None)
    env["FRAMETAP_PROTOCOLS"] = protocol
    env.update(extra or {})
    return env


def locust_cmd(host, classes=(), users=4, duration="4s", args=(), json_out=True,
               csv=None, spawn_rate=None, loglevel="WARNING", entry=None):
    """A headless run's command line (``--json`` summary on stdout unless ``json_out``
    is False; ``csv``: a ``--csv`` prefix; ``entry``: :data:`LOCUST` by default, or
    :data:`FRAMETAP_LOAD`)."""
    cmd = list(entry or LOCUST) + [
        "--headless", "-u", str(users), "-r", str(spawn_rate or users), "-t", duration,
        "--host", host, "--only-summary", "--loglevel", loglevel]
    if json_out:
        cmd += ["--json", "--skip-log"]
    if csv is not None:
        cmd += ["--csv", str(csv)]
    return cmd + list(args) + list(classes)


def json_stats(stdout):
    """Locust's ``--json`` entries: the whole of stdout is one JSON document."""
    try:
        entries = json.loads(stdout)
    except ValueError as exc:
        raise AssertionError(f"stdout is not one JSON document ({exc}):\n{stdout[-3000:]}")
    assert isinstance(entries, list), stdout[-2000:]
    return entries


def csv_stats(prefix):
    """{(Type, Name): row} of ``<prefix>_stats.csv``."""
    with open(f"{prefix}_stats.csv", newline="") as f:
        return {(row["Type"], row["Name"]): row for row in _csv.DictReader(f)}


class LocustRun:
    """A finished run: ``returncode``, ``stdout``, ``stderr``; with ``--json``,
    ``entries`` (Locust's list) and ``stats`` ({name: entry})."""

    def __init__(self, proc, json_on):
        self.returncode = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.args = proc.args
        self.entries = json_stats(proc.stdout) if json_on else None

    @property
    def stats(self):
        assert self.entries is not None, "run without --json"
        return {e["name"]: e for e in self.entries}

    def requests(self, without=()):
        return sum(e["num_requests"] for e in self.entries if e["name"] not in without)


def run_locust(protocol, host, classes=(), users=4, duration="4s", args=(), env=None,
               json_out=True, csv=None, processes=None, timeout=120, entry=None):
    """One headless Locust run of ``protocol``'s users (``classes``: Locust user class
    names, all of them when empty) against ``host``; returns a :class:`LocustRun`.

    ``processes=N`` runs ``--processes N``: Locust forks its workers before the master
    binds, so the master's port cannot be 0 — it is a free port, and the run is retried
    with another one when Locust says the port was taken (``Socket bind failure``)."""
    env = locust_env(protocol, env)

    def once(port=None):
        extra = list(args)
        if port is not None:
            extra = ["--processes", str(processes), "--master-bind-host", "127.0.0.1",
                     "--master-bind-port", str(port), "--master-port", str(port)] + extra
        cmd = locust_cmd(host, classes, users, duration, extra, json_out, csv, entry=entry)
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)
        if port is not None and proc.returncode != 0 and collided(proc.stderr):
            raise PortCollision(proc.stderr[-500:])
        return LocustRun(proc, json_out)

    if processes:
        return retry_on_collision(once)
    return once()


class LocustProcess(ReadyProcess):
    """A running headless Locust (plain, ``--master`` or ``--processes`` parent) that
    wrote its ``--frametap-ready-file``: :attr:`master_port` for workers, :attr:`metrics`
    (``host:port`` of ``--frametap-metrics``, when given). Its stdout (the ``--json``
    document) is read by :meth:`communicate`; stderr goes to the log file."""

    @property
    def master_port(self):
        return host_port(self.ready["master"])[1]

    @property
    def metrics(self):
        return self.ready["metrics"]

    def communicate(self, timeout=None):
        """(stdout, stderr log text) once Locust exits."""
        out, _ = self.proc.communicate(timeout=timeout)
        return out, self.log_text()




def start_locust(tmp, protocol, host, classes=(), users=4, duration="10s", args=(),
                 env=None, processes=None, name="locust"):
    """A headless run in the background, returned once it listens (its ready file
    written). ``processes=N``: ``--processes N`` on a free master port, started again on
    another when Locust reports the port taken (its workers are forked before the master
    binds, so it cannot be 0)."""
    def once(port=None):
        extra = list(args)
        if port is not None:
            extra = ["--processes", str(processes), "--master-bind-host", "127.0.0.1",
                     "--master-bind-port", str(port), "--master-port", str(port)] + extra
        try:
            return LocustProcess(locust_cmd(host, classes, users, duration, extra), tmp, name,
                                 env=locust_env(protocol, env),
                                 ready_option="--frametap-ready-file", stdout=subprocess.PIPE)
        except AssertionError as exc:
            if port is not None and collided(str(exc)):
                raise PortCollision(str(exc)[-500:]) from None
            raise

    if processes:
        return retry_on_collision(once)
    return once()


def start_locust_master(tmp, protocol, host, classes=(), expect_workers=1, users=4,
                        duration="10s", args=(), env=None, name="locust-master"):
    """A headless ``--master`` on 127.0.0.1 port 0 (``--json`` on stdout, which the
    caller reads with :meth:`LocustProcess.communicate`); returns once it listens."""
    return start_locust(tmp, protocol, host, classes, users, duration,
                        ["--master", "--master-bind-host", "127.0.0.1", "--master-bind-port",
                         "0", "--expect-workers", str(expect_workers)] + list(args),
                        env=env, name=name)


def start_locust_worker(master, protocol, env=None, log=None, args=()):
    """A ``--worker`` of ``master`` (a :class:`LocustProcess`), its stderr in the file
    ``log`` (discarded when None); returns the Popen."""
    cmd = LOCUST + ["--worker", "--master-host", "127.0.0.1", "--master-port",
                    str(master.master_port), "--loglevel", "WARNING", *args]
    if log is None:
        return subprocess.Popen(cmd, cwd=ROOT, env=locust_env(protocol, env),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(log, "w") as err:          # the child keeps its own descriptor
        return subprocess.Popen(cmd, cwd=ROOT, env=locust_env(protocol, env),
                                stdout=subprocess.DEVNULL, stderr=err)
