"""A private, throw-away RabbitMQ node with the stream plugin, for integration tests.

Nothing here touches the Debian package's own node (``rabbit@<host>`` on 5672/5552, HOME
``/var/lib/rabbitmq``): the node gets a random name ``frametap-test-<hex>@localhost``,
free ports, its own HOME (with its own Erlang cookie), its own data, log, config and
enabled-plugins files under one temporary directory, and listens on 127.0.0.1 only.
It is started through ``/usr/lib/rabbitmq/bin/rabbitmq-server`` directly (the
``/usr/sbin`` wrappers ``su`` to the ``rabbitmq`` user and its cookie). RabbitMQ cannot
bind port 0 and report it, so the ports are picked free and a node whose start fails with
"address in use" (``eaddrinuse``) is started again on new ones.

Use the fixture in a test module with::

    from tests.rabbitmq_node import rabbitmq_node  # noqa: F401  (pytest fixture)

    def test_something(rabbitmq_node):
        connect(rabbitmq_node.host, rabbitmq_node.stream_port)

The fixture is session-scoped and shared: however many modules import it, one node
is started (on first use) and shut down at the end of the session.

When ``rabbitmq-server`` is not installed the fixture skips, or fails when
``FRAMETAP_CI`` is set (CI must not silently skip the real-server tests).

Environment:

* ``FRAMETAP_RABBITMQ_BIN``: directory of ``rabbitmq-server``/``rabbitmqctl``
  (default ``/usr/lib/rabbitmq/bin``);
* ``FRAMETAP_RABBITMQ_START_TIMEOUT``: seconds to wait for the node (default 60);
* ``FRAMETAP_RABBITMQ_KEEP``: keep the node's directory after shutdown (for debugging).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import string
import subprocess
import tempfile
import threading
import time

import pytest

from tests._support.ports import collided, free_port

__all__ = ["RabbitMQNode", "RabbitMQNodeError", "rabbitmq_node", "rabbitmq_available",
           "NOT_INSTALLED"]

RABBITMQ_BIN = os.environ.get("FRAMETAP_RABBITMQ_BIN", "/usr/lib/rabbitmq/bin")
NOT_INSTALLED = "rabbitmq-server not installed: .ci/run installs it with apt-get"


def rabbitmq_available(bin_dir: str = RABBITMQ_BIN) -> bool:
    """True when the RabbitMQ server and CLI scripts are installed in ``bin_dir``."""
    return all(os.access(os.path.join(bin_dir, name), os.X_OK)
               for name in ("rabbitmq-server", "rabbitmqctl"))


def _port_accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class RabbitMQNodeError(RuntimeError):
    """The node did not start (the message carries the log tail) or a CLI call failed."""


class RabbitMQNode:
    """One private RabbitMQ node; :meth:`start` it, :meth:`stop` it.

    Attributes: ``host`` (127.0.0.1), ``stream_port``, ``amqp_port``, ``dist_port``,
    ``nodename``, ``base_dir`` (everything the node writes), ``home``, ``log_file``,
    ``startup_seconds`` (wall time :meth:`start` took).
    """

    host = "127.0.0.1"

    def __init__(self, bin_dir: str = RABBITMQ_BIN, start_timeout: float | None = None,
                 tls: dict | None = None):
        #: ``{"ca", "cert", "key"}`` PEM paths: a stream TLS listener too
        #: (``stream.listeners.ssl.1`` on :attr:`tls_port`); its advertised TLS port is
        #: ``advertised_tls_port`` (default: :attr:`tls_port`)
        self.tls = tls
        self.tls_port = free_port() if tls else None
        self.advertised_tls_port = self.tls_port
        self.bin_dir = bin_dir
        self.start_timeout = start_timeout if start_timeout is not None else float(
            os.environ.get("FRAMETAP_RABBITMQ_START_TIMEOUT", "") or 60.0)
        self.nodename = f"frametap-test-{secrets.token_hex(4)}@localhost"
        # RabbitMQ cannot bind port 0 and say which it got (the stream listener must
        # advertise its port in its own config): free ports, and _acquire() starts a new
        # node on new ones when one was taken before the node bound it
        self.amqp_port = free_port()
        self.stream_port = free_port()
        self.dist_port = free_port()
        while len({self.amqp_port, self.stream_port, self.dist_port}) < 3:  # pragma: no cover
            self.dist_port = free_port()
        while tls and self.tls_port in (self.amqp_port, self.stream_port, self.dist_port):
            self.tls_port = self.advertised_tls_port = free_port()  # pragma: no cover
        self.base_dir: str | None = None
        self.home: str | None = None
        self.log_file: str | None = None
        self.startup_seconds: float | None = None
        self._proc: subprocess.Popen | None = None
        self._console: str | None = None
        self._env: dict[str, str] | None = None

    # ------------------------------------------------------------------ setup

    @property
    def stream_address(self) -> str:
        """``host:port`` of the stream listener."""
        return f"{self.host}:{self.stream_port}"

    def _prepare(self) -> None:
        base = tempfile.mkdtemp(prefix="frametap-rabbitmq-")
        self.base_dir = base
        self.home = os.path.join(base, "home")
        for sub in ("home", "mnesia", "log"):
            os.makedirs(os.path.join(base, sub))
        # The CLI tools and the node authenticate to each other with this cookie; the
        # RABBITMQ_ERLANG_COOKIE variable is deprecated, the file must be mode 0600.
        cookie = os.path.join(self.home, ".erlang.cookie")
        fd = os.open(cookie, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("".join(secrets.choice(string.ascii_uppercase) for _ in range(20)))
        conf = os.path.join(base, "rabbitmq.conf")
        with open(conf, "w") as f:
            f.write(
                f"listeners.tcp.default = 127.0.0.1:{self.amqp_port}\n"
                f"stream.listeners.tcp.1 = 127.0.0.1:{self.stream_port}\n"
                f"stream.advertised_host = {self.host}\n"
                f"stream.advertised_port = {self.stream_port}\n"
                "loopback_users = none\n"
                "log.console = false\n"
                "log.file.level = info\n"
                # a test node on a busy CI box: don't block publishers on a small disk
                "disk_free_limit.absolute = 1MB\n"
            )
            if self.tls:
                f.write(
                    f"stream.listeners.ssl.1 = 127.0.0.1:{self.tls_port}\n"
                    f"stream.advertised_tls_host = {self.host}\n"
                    f"stream.advertised_tls_port = {self.advertised_tls_port}\n"
                    f"ssl_options.cacertfile = {self.tls['ca']}\n"
                    f"ssl_options.certfile = {self.tls['cert']}\n"
                    f"ssl_options.keyfile = {self.tls['key']}\n"
                    "ssl_options.verify = verify_none\n"
                    "ssl_options.fail_if_no_peer_cert = false\n")
        plugins = os.path.join(base, "enabled_plugins")
        with open(plugins, "w") as f:
            f.write("[rabbitmq_stream].\n")
        env_conf = os.path.join(base, "rabbitmq-env.conf")  # keeps /etc/rabbitmq's out
        open(env_conf, "w").close()
        self.log_file = os.path.join(base, "log", f"{self.nodename}.log")
        self._console = os.path.join(base, "log", "console.log")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update({
            "HOME": self.home,
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.amqp_port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": os.path.join(base, "mnesia"),
            "RABBITMQ_LOG_BASE": os.path.join(base, "log"),
            "RABBITMQ_CONFIG_FILE": conf,
            "RABBITMQ_ADVANCED_CONFIG_FILE": os.path.join(base, "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": plugins,
            "RABBITMQ_CONF_ENV_FILE": env_conf,
            "RABBITMQ_PID_FILE": os.path.join(base, "node.pid"),
            # the Erlang distribution listener on loopback only
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        })
        self._env = env

    # ------------------------------------------------------------------ control

    def ctl(self, *args: str, timeout: float = 60.0,
            check: bool = True) -> subprocess.CompletedProcess:
        """Run ``rabbitmqctl -n <node> ARGS`` (same HOME/cookie); output as text.

        Raises :class:`RabbitMQNodeError` on a non-zero exit when ``check``.
        """
        if self._env is None:
            raise RabbitMQNodeError("rabbitmq node: ctl() before start()")
        cmd = [os.path.join(self.bin_dir, "rabbitmqctl"), "-n", self.nodename, *args]
        proc = subprocess.run(cmd, env=self._env, cwd=self.home, capture_output=True,
                              text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RabbitMQNodeError(
                f"rabbitmqctl {' '.join(args)} exited {proc.returncode}:\n"
                f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        return proc

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the node log and of its console output."""
        out = []
        for path in (self._console, self.log_file):
            if path and os.path.exists(path):
                with open(path, errors="replace") as f:
                    text = f.read().splitlines()
                tail = text[-lines:]
                errors = [line for line in text[:-lines]
                          if "[error]" in line or "[critical]" in line][-10:]
                if errors:
                    out.append(f"--- {path} (errors before the tail)\n" + "\n".join(errors))
                out.append(f"--- {path} (last {len(tail)} lines)\n" + "\n".join(tail))
        return "\n".join(out) or "(no log written)"

    def start(self) -> "RabbitMQNode":
        """Start the node and wait (up to ``start_timeout``) until the stream port
        accepts connections and ``rabbitmqctl await_startup`` succeeds."""
        if self._proc is not None:
            return self
        t0 = time.monotonic()
        self._prepare()
        console = open(self._console, "wb")
        try:
            # own session: stop() can signal the whole tree (beam.smp, erl_child_setup)
            self._proc = subprocess.Popen(
                [os.path.join(self.bin_dir, "rabbitmq-server")], env=self._env,
                cwd=self.home, stdin=subprocess.DEVNULL, stdout=console,
                stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            console.close()
        deadline = t0 + self.start_timeout
        last_ctl = ""
        try:
            while True:
                if self._proc.poll() is not None:
                    raise RabbitMQNodeError(
                        f"rabbitmq node {self.nodename} exited with status "
                        f"{self._proc.returncode} during startup")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RabbitMQNodeError(
                        f"rabbitmq node {self.nodename}: not ready after "
                        f"{self.start_timeout:.0f} s (stream port {self.stream_port} "
                        f"{'accepts' if _port_accepts(self.host, self.stream_port) else 'closed'})"
                        + (f"; last rabbitmqctl await_startup: {last_ctl}" if last_ctl else ""))
                # The stream listener opens late in the boot; then await_startup (which
                # fails at once while the node is not yet reachable, hence the retries).
                if _port_accepts(self.host, self.stream_port) and (
                        not self.tls or _port_accepts(self.host, self.tls_port)):
                    proc = self.ctl("await_startup", "--timeout", str(max(1, int(remaining))),
                                    timeout=remaining + 10, check=False)
                    if proc.returncode == 0:
                        break
                    last_ctl = (proc.stdout + proc.stderr).strip()[-1500:]
                time.sleep(0.2)
        except BaseException as exc:
            tail = self.log_tail()
            base = self.base_dir
            self._kill()
            if isinstance(exc, RabbitMQNodeError):
                raise RabbitMQNodeError(f"{exc}\nnode directory kept: {base}\n{tail}") from None
            raise
        self.startup_seconds = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """``rabbitmqctl shutdown``, then kill whatever of the node's process tree is left
        (a shared ``epmd`` daemon may stay) and remove the node's directory."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            try:
                self.ctl("shutdown", "--timeout", "20", timeout=40, check=False)
            except subprocess.TimeoutExpired:
                pass
        self._kill()
        if self.base_dir and not os.environ.get("FRAMETAP_RABBITMQ_KEEP"):
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)  # the session started above, nothing else
            except ProcessLookupError:
                break
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                continue
            # the leader is gone; give the rest of its group a moment, then make sure
            time.sleep(0.2)

    def __enter__(self) -> "RabbitMQNode":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (f"<RabbitMQNode {self.nodename} stream={self.stream_address} "
                f"amqp={self.host}:{self.amqp_port}>")


# One node per pytest session even when several modules import the fixture (each import
# registers its own fixture definition, so a plain session fixture would start one node
# per importing module).
_shared_lock = threading.Lock()
_shared_node: RabbitMQNode | None = None
_shared_users = 0


def _acquire() -> RabbitMQNode:
    global _shared_node, _shared_users
    with _shared_lock:
        for attempt in range(3):
            if _shared_node is not None:
                break
            try:
                _shared_node = RabbitMQNode().start()
            except RabbitMQNodeError as exc:
                # a port picked free was taken before the node bound it: new ports
                if attempt == 2 or not collided(str(exc)):
                    raise
                import warnings
                warnings.warn("a RabbitMQ node's port was taken before it bound it; "
                              "starting one on new ports")
        _shared_users += 1
        return _shared_node


def _release() -> None:
    global _shared_node, _shared_users
    with _shared_lock:
        _shared_users -= 1
        if _shared_users == 0 and _shared_node is not None:
            node, _shared_node = _shared_node, None
            node.stop()


@pytest.fixture(scope="session")
def rabbitmq_node():
    """A started private RabbitMQ node with the stream plugin (see the module docstring):
    ``.host``, ``.stream_port``, ``.amqp_port``, ``.nodename``, ``.ctl(*args)``."""
    if not rabbitmq_available():
        if os.environ.get("FRAMETAP_CI"):
            pytest.fail(NOT_INSTALLED, pytrace=False)
        pytest.skip(NOT_INSTALLED)
    try:
        node = _acquire()
    except RabbitMQNodeError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield node
    finally:
        _release()
