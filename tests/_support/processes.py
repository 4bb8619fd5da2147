"""Subprocesses for tests: ``frametap proxy``, ``frametap serve P`` and any program that
writes a ready file, started on port 0 and waited for until they say where they listen.

    with proxy_process(tmp_path, ["--protocol", "flymq", "--listen", "127.0.0.1:0",
                                  "--upstream", up, "--admin", "127.0.0.1:0"]) as proxy:
        proxy.address("flymq")     # "127.0.0.1:40123", the route's bound address
        proxy.admin_url            # "http://127.0.0.1:40124"

    with server_process(tmp_path, "flymq") as srv:     # listens on 127.0.0.1:0
        srv.address, srv.port

The process writes its ready file (``--ready-file``, see proxy/readyfile.py) once every
listener is bound; nothing is guessed, so no other process can take a port in between.
Output goes to a log file in ``tmp`` (``.log_text()``); ``stop()`` sends SIGTERM, waits,
and kills what does not exit.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["ROOT", "FRAMETAP", "frametap_env", "ReadyProcess", "ProxyProcess",
           "ServerProcess", "proxy_process", "server_process", "stop_process",
           "host_port"]

ROOT = Path(__file__).resolve().parents[2]
FRAMETAP = [sys.executable, "-m", "proxy"]


def frametap_env(extra=None, **more):
    """The environment for a frametap/Locust subprocess: this checkout first on
    PYTHONPATH (a console script would otherwise import the installed copy)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"]
                                     if env.get("PYTHONPATH") else "")
    env.update(extra or {})
    env.update(more)
    return env


def host_port(address):
    """``"h:p"`` / ``"[v6]:p"`` -> ``(h, p)``."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def read_to_eof(sock, size=65536):
    """Every byte a socket gives until the peer closes (its timeout applies per read)."""
    chunks = []
    while True:
        chunk = sock.recv(size)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def stop_process(proc, timeout=10.0):
    """SIGTERM, wait ``timeout``, then SIGKILL; returns the exit status."""
    if proc is None:
        return None
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode


class ReadyProcess:
    """A subprocess started with a ready-file option: :attr:`ready` is the JSON it wrote.

    ``ready_option``: the flag naming the file (``--ready-file``); ``stdout``: None logs
    stdout and stderr to ``<tmp>/<name>.log``, ``subprocess.PIPE`` keeps stdout for the
    caller (stderr still goes to the log)."""

    def __init__(self, argv, tmp, name, env=None, cwd=ROOT, ready_option="--ready-file",
                 timeout=30.0, stdout=None, **popen):
        tmp = Path(tmp)
        tmp.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.ready_path = tmp / f"{name}.ready.json"
        self.log_path = tmp / f"{name}.log"
        self.argv = list(argv) + [ready_option, str(self.ready_path)]
        self.ready = None
        log = open(self.log_path, "w")
        try:
            self.proc = subprocess.Popen(
                self.argv, cwd=cwd, env=frametap_env() if env is None else env,
                stdout=log if stdout is None else stdout,
                stderr=log if stdout is not None else subprocess.STDOUT,
                text=True, **popen)
        finally:
            log.close()
        try:
            self.ready = self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            try:
                return json.loads(self.ready_path.read_text())
            except FileNotFoundError:
                pass
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited ({self.proc.returncode}) before it "
                                     f"was ready:\n{self.log_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} did not write {self.ready_path} in "
                                     f"{timeout:.0f}s:\n{self.log_text()[-3000:]}")
            time.sleep(0.05)

    @property
    def pid(self):
        return self.proc.pid

    def poll(self):
        return self.proc.poll()

    def log_text(self):
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def send_signal(self, sig):
        self.proc.send_signal(sig)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def wait(self, timeout=None):
        return self.proc.wait(timeout)

    def stop(self, timeout=10.0):
        """SIGTERM, then SIGKILL after ``timeout``; returns the exit status."""
        status = stop_process(self.proc, timeout)
        if self.proc.stdout is not None and not self.proc.stdout.closed:
            self.proc.stdout.close()
        return status

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class ProxyProcess(ReadyProcess):
    """``frametap proxy ... --ready-file``: route addresses by name, the admin address."""

    def address(self, route=None):
        """``host:port`` of ``route`` (the only route when None)."""
        routes = self.ready["routes"]
        if route is None:
            assert len(routes) == 1, routes
            return next(iter(routes.values()))
        return routes[route]

    def port(self, route=None):
        return host_port(self.address(route))[1]

    @property
    def admin(self):
        """``host:port`` of the admin endpoint."""
        assert self.ready["admin"], "the proxy has no admin endpoint"
        return self.ready["admin"]

    @property
    def admin_port(self):
        return host_port(self.admin)[1]

    @property
    def admin_url(self):
        return "http://" + self.admin


class ServerProcess(ReadyProcess):
    """``frametap serve P ... --ready-file``: its listeners (``listen``, ``roles``)."""

    @property
    def address(self):
        """``host:port`` of the first listener."""
        return self.ready["listen"][0]

    @property
    def port(self):
        return host_port(self.address)[1]

    def role(self, name):
        """``host:port`` of the listener with role ``name`` (rocketmq: broker, namesrv)."""
        return self.ready["roles"][name]


def proxy_process(tmp, args=(), config=None, name="proxy", log_level=None, **kw):
    """Start ``frametap proxy`` with ``args`` (or ``-c`` a file holding ``config``, TOML
    text) and wait until it is ready. Listen addresses should use port 0."""
    argv = FRAMETAP + ["proxy"]
    if config is not None:
        path = Path(tmp) / f"{name}.toml"
        Path(tmp).mkdir(parents=True, exist_ok=True)
        path.write_text(config)
        argv += ["-c", str(path)]
    argv += list(args)
    if log_level:
        argv += ["--log-level", log_level]
    return ProxyProcess(argv, tmp, name, **kw)


def server_process(tmp, protocol, *args, name=None, **kw):
    """Start ``frametap serve protocol args...`` and wait until it is ready. Without a
    listen option the server listens on 127.0.0.1:0 (rocketmq: both listeners)."""
    args = list(args)
    if protocol == "rocketmq":
        for flag in ("--namesrv", "--broker"):
            if flag not in args:
                args += [flag, "127.0.0.1:0"]
    elif "--listen" not in args:
        args += ["--listen", "127.0.0.1:0"]
    return ServerProcess(FRAMETAP + ["serve", protocol] + args, tmp,
                         name or f"{protocol}-server", **kw)
