"""Plumbing shared by the protocols' load-generation code (standard library only).

* Reference servers: :func:`new_event_loop`, :class:`ServerThread` (a server on its own
  event loop in a background thread, for tests and the demo) and the ``frametap serve``
  command-line helpers (:func:`address_arg`, :func:`user_arg`, :func:`service_time_arg`,
  :func:`serve_main`).
* Sync clients: :func:`parse_host` (Locust's ``--host``), :func:`connect_tcp`,
  :class:`SocketClient` (``closed``, ``close()``, context manager; the connection's
  ``conn_id`` and ``local_address`` and the requests it sent, :class:`SentRequest`, for
  the client-side frame log), :func:`format_address`.
* Locust users: the ``FRAMETAP_*`` settings readers (:func:`env_int`, :func:`env_float`,
  :func:`env_bool`, :func:`env_choice`), :class:`Backoff` (waits between reconnections to
  a peer that keeps failing) and :class:`RequestReporter` (its
  :meth:`~RequestReporter.timed` context manager times a request and fires Locust's
  request event; :meth:`~RequestReporter.on_wire` gives a request its frame-log row,
  see :mod:`loadgen.clientlog`).

Nothing here imports Locust, so the servers can use it without gevent-patching anything.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import os
import random
import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from loadgen.servicetime import ServiceTime, parse_service_time

__all__ = [
    "new_event_loop", "ServerThread", "address_arg", "user_arg", "service_time_arg",
    "CommandLineError", "serve_main", "parse_host", "connect_tcp", "SocketClient",
    "SentRequest", "format_address",
    "env_int", "env_float", "env_bool", "env_choice", "Backoff", "RequestReporter",
]


# ---------------------------------------------------------------------- servers

def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop when uvloop is installed, else the default asyncio loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class ServerThread:
    """Run an asyncio server (``start()`` / ``close()`` coroutines) on its own event loop
    in a background thread; a context manager (start on enter, stop on exit).

    Subclasses set :attr:`thread_name` and :attr:`what` (used in the start-up error) and
    pass the server object to ``__init__``. :attr:`cancel_pending_tasks`: on stop, cancel
    the tasks still running after ``server.close()`` before waiting for them (up to 2 s);
    False only waits for them to see their closed sockets and finish.
    """

    thread_name = "server"
    what = "server"
    cancel_pending_tasks = True

    def __init__(self, server):
        self.server = server
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def port(self) -> int:
        """The bound port (of a server with ``host`` / ``port`` attributes)."""
        return self.server.port

    @property
    def address(self) -> str:
        """``host:port`` of a server with ``host`` / ``port`` attributes."""
        return f"{self.server.host}:{self.server.port}"

    def call(self, fn, *args, timeout: float = 10.0):
        """Run ``fn(*args)`` on the server's loop (to inspect state safely)."""
        async def _call():
            return fn(*args)
        return asyncio.run_coroutine_threadsafe(_call(), self._loop).result(timeout)

    def start(self, timeout: float = 10.0):
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"{self.what} thread did not start in time")
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        loop = new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            try:
                loop.run_until_complete(self.server.start())
            except BaseException as exc:
                self._error = exc
                return
            finally:
                self._ready.set()
            loop.run_forever()
            loop.run_until_complete(self.server.close())
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            if self.cancel_pending_tasks:
                for t in pending:
                    t.cancel()
            if pending:
                loop.run_until_complete(asyncio.wait(pending, timeout=2))
        finally:
            loop.close()

    def stop(self, timeout: float = 10.0) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ---------------------------------------------------------------------- command line

def address_arg(text: str, example_port: int) -> tuple[str, int]:
    """argparse ``HOST:PORT`` -> ``(host, port)``; the error names ``example_port``."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected HOST:PORT with PORT 0..65535, e.g. 127.0.0.1:{example_port}")
    return host.strip("[]"), int(port_text)


def user_arg(text: str) -> tuple[str, str]:
    """argparse ``NAME:PASSWORD`` -> ``(name, password)``."""
    name, sep, password = text.partition(":")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{name or text!r}: expected NAME:PASSWORD")
    return name, password


def service_time_arg(text: str) -> ServiceTime:
    """argparse service-time distribution (:func:`loadgen.servicetime.parse_service_time`)."""
    try:
        return parse_service_time(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class CommandLineError(Exception):
    """A usage error found after parsing; :func:`serve_main` prints it and exits 2."""


async def _serve_until_signalled(server, banner: Callable[[object], str],
                                 ready_file: str | None = None, name: str = "") -> None:
    await server.start()
    print(banner(server), flush=True)
    if ready_file is not None:
        _write_ready_file(server, ready_file, name)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
            pass
    try:
        await stop.wait()
    finally:
        if ready_file is not None:
            from proxy.readyfile import remove_ready_file
            remove_ready_file(ready_file)
        await server.close()


def _write_ready_file(server, path: str, name: str) -> None:
    """``--ready-file``: the server's bound listeners (see :mod:`proxy.readyfile`)."""
    from proxy.readyfile import write_ready_file
    bound = server.bound_addresses()
    try:
        write_ready_file(path, {"pid": os.getpid(), "server": name,
                                "listen": [address for _role, address in bound],
                                "roles": {role: address for role, address in bound if role}})
    except OSError as exc:
        raise CommandLineError(f"--ready-file {path}: cannot write: "
                               f"{exc.strerror or exc}") from None


READY_FILE_HELP = ("once every listener is bound, write JSON naming them to PATH (atomically; "
                   "removed on exit): {\"pid\": N, \"server\": NAME, \"listen\": [ADDR, ...], "
                   "\"roles\": {ROLE: ADDR}}. With port 0 in a listen address the kernel "
                   "picks a free port and this file says which")


def serve_main(parser: argparse.ArgumentParser, argv: list[str] | None,
               make_server: Callable[[argparse.Namespace], tuple[object, str]],
               banner: Callable[[object], str]) -> int:
    """``frametap serve <protocol>``: parse ``argv``, set up logging, build the server
    with ``make_server(args)`` -> ``(server, listen text)``, print ``banner(server)`` once
    it listens (and write ``--ready-file``, which this adds to every server's options)
    and serve until SIGINT/SIGTERM. Returns the exit status: 0 (also for
    ``--help``), 2 for a bad argument, a :class:`CommandLineError` or a listen address
    that cannot be bound (docs/design.md, "Command line")."""
    if not any("--ready-file" in action.option_strings for action in parser._actions):
        parser.add_argument("--ready-file", metavar="PATH", default=None,
                            help=READY_FILE_HELP)
    if not any("--tls-cert" in action.option_strings for action in parser._actions):
        parser.add_argument("--tls-cert", metavar="FILE", default=None,
                            help="serve TLS with this certificate (PEM; with --tls-key)")
        parser.add_argument("--tls-key", metavar="FILE", default=None,
                            help="the certificate's private key (PEM)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a bad argument (2, message already printed)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        server, listen = make_server(args)
        if args.tls_cert or args.tls_key:
            if not (args.tls_cert and args.tls_key):
                raise CommandLineError("--tls-cert and --tls-key go together")
            from loadgen.tlsopts import server_context
            try:
                server.ssl_context = server_context(args.tls_cert, args.tls_key)
            except ValueError as exc:
                raise CommandLineError(str(exc)) from None
    except CommandLineError as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 2
    try:
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            runner.run(_serve_until_signalled(server, banner, args.ready_file,
                                              parser.prog.rpartition(" ")[2]))
    except OSError as exc:
        print(f"{parser.prog}: cannot listen on {listen}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2  # a port in use is a user error (docs/design.md, "Command line")
    except CommandLineError as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


# ---------------------------------------------------------------------- sync clients

def parse_host(host: str | None, schemes: tuple[str, ...], default_port: int,
               missing: str) -> tuple[str, int]:
    """``scheme://h:p``, ``h:p``, ``[v6]:p`` or ``h`` -> ``(h, p)``; ValueError otherwise.

    ``schemes``: accepted URL schemes (the first is named in the error); ``missing``:
    the error message when ``host`` is empty.
    """
    if not host:
        raise ValueError(missing)
    text = host.strip()
    if "://" in text:
        scheme, _, text = text.partition("://")
        if scheme.lower() not in schemes:
            raise ValueError(f"host {host!r}: expected scheme {schemes[0]}:// (or HOST:PORT)")
    text = text.rstrip("/")
    if text.startswith("["):  # [v6]:port
        addr, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        addr, _, port_text = text.partition(":")
    else:
        addr, port_text = text, ""
    if not addr:
        raise ValueError(f"host {host!r}: expected HOST:PORT")
    if not port_text:
        return addr, default_port
    if not port_text.isdigit() or not 0 < int(port_text) <= 65535:
        raise ValueError(f"host {host!r}: port {port_text!r} is not 1..65535")
    return addr, int(port_text)


#: connect_tcp(tls=DEFAULT_TLS): the process's TLS setting (loadgen.tlsopts.default())
DEFAULT_TLS = object()


def connect_tcp(host: str, port: int, timeout: float | None,
                tls=DEFAULT_TLS) -> socket.socket:
    """A connected TCP socket with TCP_NODELAY (one request in flight: no Nagle delay);
    a TLS socket (handshake done) when ``tls`` (a loadgen.tlsopts.ClientTLS), or by
    default the process's ``--tls`` options, say so."""
    sock = socket.create_connection((host, port), timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if tls is DEFAULT_TLS:
        from loadgen.tlsopts import default
        tls = default()
    if tls is not None:
        try:
            sock = tls.wrap(sock, host)
        except BaseException:
            sock.close()
            raise
    return sock


#: Per-process numbering of the sync clients' connections (the frame log's ``conn_id``).
_CONN_IDS = itertools.count(1)


class SentRequest:
    """One request a client put on the wire, as the proxy's parser will see it.

    ``seq``: 1-based number of the request on its connection (every request frame the
    client sent, reported to Locust or not); ``correlation_id``: the protocol's id as the
    proxy's frame log writes it (a decimal string; None when the frame carries none);
    ``opcode`` / ``opcode_name``: the request's opcode and the proxy's name for it (the
    protocol's own table, as the parser names it); ``kind``: ``"request"``,
    or ``"oneway"`` for a request that gets no answer; ``status``: the protocol's status
    name of the answer once it arrived (the proxy's ``status`` of the response), else None.
    """

    __slots__ = ("seq", "correlation_id", "opcode", "opcode_name", "kind", "status")

    def __init__(self, seq: int, correlation_id: str | None, opcode: int, opcode_name: str,
                 kind: str = "request"):
        self.seq = seq
        self.correlation_id = correlation_id
        self.opcode = opcode
        self.opcode_name = opcode_name
        self.kind = kind
        self.status: str | None = None

    def __repr__(self) -> str:
        return (f"SentRequest({self.seq}, {self.correlation_id!r}, {self.opcode}, "
                f"{self.opcode_name!r}, {self.kind!r}, status={self.status!r})")


class SocketClient:
    """Base of the sync clients: one TCP connection in ``self._sock`` (None once closed);
    a context manager that closes it on exit.

    For the client-side frame log (docs/design.md, "Frame log"), a client calls
    :meth:`_connected` once its socket is connected, which sets ``conn_id`` (a
    per-process connection number) and ``local_address`` (this end's ``ip:port``, the
    ``peer`` the proxy logs for it; both stay readable after ``close()``), and
    :meth:`_sent` for every request frame it sends. ``requests_sent`` counts those;
    ``recent`` keeps the last few (:class:`SentRequest`), for :meth:`sent_after`.
    """

    _sock: socket.socket | None
    conn_id = 0
    local_address = ""
    remote_address = ""
    requests_sent = 0
    recent: deque = deque(maxlen=0)   # replaced per connection by _connected()

    def _connected(self, sock: socket.socket) -> None:
        """Number the connection and note its local address (``[v6]:port`` for IPv6)."""
        self.conn_id = next(_CONN_IDS)
        self.local_address = format_address(sock.getsockname())
        try:            # where it went: the client frame log's route (the proxy's listener)
            self.remote_address = format_address(sock.getpeername())
        except (OSError, AttributeError, IndexError, TypeError):
            self.remote_address = ""
        self.requests_sent = 0
        self.recent = deque(maxlen=16)

    def _sent(self, correlation_id: str | None, opcode: int, opcode_name: str,
              kind: str = "request") -> SentRequest:
        """Record a request frame just sent; returns its record (the caller sets
        ``status`` when the answer comes)."""
        self.requests_sent += 1
        sent = SentRequest(self.requests_sent, correlation_id, opcode, opcode_name, kind)
        self.recent.append(sent)
        return sent

    def sent_after(self, mark: int) -> SentRequest | None:
        """The first request sent after ``requests_sent`` was ``mark`` (None when none was,
        or when it is no longer among the recent ones)."""
        if self.requests_sent <= mark:
            return None
        first = None
        for sent in reversed(self.recent):
            if sent.seq <= mark:
                break
            first = sent
        return first if first is not None and first.seq == mark + 1 else None

    @property
    def closed(self) -> bool:
        return self._sock is None

    def close(self) -> None:
        """Close the connection (idempotent)."""
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:  # pragma: no cover
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def format_address(addr) -> str:
    """A socket address as ``ip:port``, ``[ip6]:port`` for IPv6."""
    return f"[{addr[0]}]:{addr[1]}" if ":" in addr[0] else f"{addr[0]}:{addr[1]}"


# ---------------------------------------------------------------------- Locust users

def _env_number(name: str, default, convert, valid, expected: str):
    """``convert(text)`` of environment variable ``name`` (``default`` when unset or
    blank); ValueError naming the variable, the value and ``expected`` otherwise."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = convert(text)
    except ValueError:
        value = None
    if value is None or not valid(value):
        raise ValueError(f"{name}={text!r}: expected {expected}")
    return value


def env_int(name: str, default: int, minimum: int = 1) -> int:
    """Integer environment variable ``name`` (``default`` when unset or blank)."""
    return _env_number(name, default, int, lambda v: v >= minimum,
                       f"an integer >= {minimum}")


def env_float(name: str, default: float) -> float:
    """Positive number of seconds from environment variable ``name``."""
    return _env_number(name, default, float, lambda v: v > 0, "a number of seconds > 0")


def env_bool(name: str, default: bool) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off`` from environment variable ``name``."""
    text = os.environ.get(name, "").strip().lower()
    if not text:
        return default
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={text!r}: expected 1 or 0")


def env_choice(name: str, default: str, choices: tuple) -> str:
    """One of ``choices`` (lower-cased) from environment variable ``name``."""
    text = os.environ.get(name, "").strip().lower() or default
    if text not in choices:
        raise ValueError(f"{name}={text!r}: expected one of {', '.join(choices)}")
    return text


class Backoff:
    """Waits between reconnections to a peer that keeps failing (a dead server, or a
    proxy whose upstream is down: the connect succeeds, the first request fails).

    :meth:`before_connect` is called before every connection attempt: the first one
    after a success goes ahead at once; each further attempt without a successful
    request in between waits ``first`` seconds, doubling up to ``cap``, each wait
    ±``jitter`` (a fraction) so that many users do not retry in step. :meth:`ok` (a
    request succeeded) starts over. Settings: ``FRAMETAP_RECONNECT_DELAY`` (``first``,
    default 0.1 s) and ``FRAMETAP_RECONNECT_MAX_DELAY`` (``cap``, default 5 s).
    """

    __slots__ = ("first", "cap", "jitter", "attempts", "_rng", "_sleep")

    def __init__(self, first: float = 0.1, cap: float = 5.0, jitter: float = 0.2,
                 rng: random.Random | None = None, sleep: Callable[[float], None] = None):
        self.first = first
        self.cap = max(cap, first)
        self.jitter = jitter
        self.attempts = 0            # connection attempts since the last success
        self._rng = rng or random.Random()
        self._sleep = sleep or time.sleep      # gevent's, once Locust patched time

    @classmethod
    def from_env(cls) -> "Backoff":
        return cls(env_float("FRAMETAP_RECONNECT_DELAY", 0.1),
                   env_float("FRAMETAP_RECONNECT_MAX_DELAY", 5.0))

    def delay(self) -> float:
        """The wait before the next attempt (0 for the first after a success)."""
        if self.attempts == 0:
            return 0.0
        base = min(self.cap, self.first * 2 ** min(self.attempts - 1, 62))
        return min(self.cap, base * (1 + self.jitter * (2 * self._rng.random() - 1)))

    def before_connect(self) -> float:
        """Wait as long as :meth:`delay` says, count the attempt; returns the wait."""
        wait = self.delay()
        self.attempts += 1
        if wait > 0:
            self._sleep(wait)
        return wait

    def ok(self) -> None:
        self.attempts = 0


class _OnWire:
    """Placeholder in a timed request's context until the block ends: the request goes
    out on ``client`` as its first request after ``mark``."""

    __slots__ = ("client", "mark", "fields")

    def __init__(self, client: SocketClient, fields: dict):
        self.client = client
        self.mark = client.requests_sent
        self.fields = fields

    def resolve(self, ts_ns: int) -> dict | None:
        """The ``frametap`` context of the request that started at ``ts_ns`` (wall
        clock), or None when it never went out."""
        client = self.client
        sent = client.sent_after(self.mark)
        if sent is None:
            return None
        ft = {"ts_ns": ts_ns, "conn_id": client.conn_id, "peer": client.local_address,
              "target": client.remote_address or None,
              "correlation_id": sent.correlation_id, "opcode": sent.opcode,
              "opcode_name": sent.opcode_name, "kind": sent.kind, "status": sent.status}
        if self.fields:
            ft.update(self.fields)
        return ft


class RequestReporter:
    """Mixin for Locust users: report requests to Locust as ``request_type``.

    :meth:`timed` times a block (a round trip); :meth:`fire` reports a request timed some
    other way (e.g. a publish confirmed by a later read). ``last_exception`` is the
    failure of the last :meth:`timed` block (None when it succeeded).

    **Client-side frame log** (:mod:`loadgen.clientlog`, docs/design.md "Frame log").
    A request event whose ``context`` has a ``"frametap"`` entry becomes frame-log
    row(s) with ``source="client"``; events without one (connection set-up, Deliver
    chunks, ...) are not logged. The entry is a dict:

    ===================  =====================================================================
    key                  meaning
    ===================  =====================================================================
    ``conn_id``          the client connection's per-process number (``SocketClient.conn_id``)
    ``peer``             the client socket's local ``ip:port`` (``[v6]:port``): the proxy's
                         ``peer`` for that connection
    ``target``           where the connection goes (``ip:port``; default: Locust's host):
                         the row's ``route``
    ``correlation_id``   the id the proxy's parser gives the request (a string; None when
                         the frame carries none, e.g. RabbitMQ Stream StoreOffset)
    ``opcode``           the request's opcode (optional)
    ``opcode_name``      the proxy's opcode name of the request (default: the event's
                         ``name``); when they differ the row keeps Locust's name in
                         ``attrs["locust_name"]``
    ``kind``             ``"request"`` (default), ``"oneway"`` for a request without answer
    ``status``           the protocol's status name of the answer, as the proxy names the
                         response's status; None when no answer came (the row then says
                         ``"timeout"`` for a TimeoutError, else the exception's class name)
    ``messages``         messages the exchange carried (sent or received; default 0)
    ``resource``         topic / stream (optional)
    ``ts_ns``            wall-clock start in ns (default: the event's ``start_time``, else
                         now minus ``response_time``)
    ``items``            optional list of ``(correlation_id, response_time_ms, status,
                         outcome)``: one row per item instead of one per event (RabbitMQ
                         Stream Publish: one per publishing id), each with ``messages = 1``;
                         a None status is filled from the event's exception as above
    ===================  =====================================================================

    Users do not build it by hand for a timed round trip: inside the ``with`` block they
    call ``self.on_wire(req, client)`` before the client call, and when the block ends
    the entry is filled from the first request ``client`` sent after that (its
    :class:`SentRequest`), whatever the block's outcome; nothing is logged when no request
    went out. Only when :attr:`frame_log` is on (the plugin sets it when it starts): off,
    ``on_wire`` does nothing. The row's ``outcome`` is the client's verdict (``"ok"`` when
    the event has no exception), which can differ from the proxy's for answers the users
    accept (e.g. RocketMQ TOPIC_NOT_EXIST while a producer falls back to TBW102).
    """

    request_type = ""
    last_exception: Exception | None = None
    #: True while the client-side frame log runs in this process (set by loadgen.clientlog).
    frame_log = False
    #: the user's reconnection back-off (:meth:`before_connect`), made on first use
    backoff: Backoff | None = None

    def before_connect(self) -> float:
        """Call before opening a connection: waits when the previous connections
        failed without a successful request (:class:`Backoff`); returns the wait."""
        if self.backoff is None:
            self.backoff = Backoff.from_env()
        return self.backoff.before_connect()

    def on_wire(self, req: dict, client: SocketClient, **fields) -> None:
        """Inside a :meth:`timed` block: the request goes out on ``client`` (its first
        request from now on); ``fields`` add to its frame-log entry (``messages``,
        ``resource``...). No-op unless the frame log is on."""
        if self.frame_log and client is not None:
            req["context"]["frametap"] = _OnWire(client, fields)

    def frame_fields(self, req: dict, **fields) -> None:
        """Inside a :meth:`timed` block, after :meth:`on_wire`: more frame-log fields
        learnt from the answer (``messages=len(records)``)."""
        wire = req["context"].get("frametap") if self.frame_log else None
        if wire.__class__ is _OnWire:
            wire.fields.update(fields)

    @contextmanager
    def timed(self, name: str, response_length: int = 0, quiet: bool = False,
              **context) -> Iterator[dict]:
        """Time the ``with`` block and report it to Locust as request ``name``.

        Shaped like Locust's ``EventHook.measure``: yields the request's metadata dict
        (``request_type``, ``name``, ``response_length``, ``context``, ``exception``,
        ``start_time``), which the block may change (``req["response_length"] = n``, or
        ``req["exception"] = exc`` to fail without raising); ``response_time`` is added
        at the end, in milliseconds from :func:`time.perf_counter` (an unrounded float),
        and the dict is fired as the ``request`` event. An ``Exception`` raised in the
        block is the request's failure and does not propagate.

        The one convention for every protocol's users: what the block obtains it binds
        itself, and after the block ``req["exception"] is None`` means success.
        ``quiet``: report only a failure (e.g. a connection set up in ``on_start``).
        """
        start_ns = time.time_ns()
        meta = {"request_type": self.request_type, "name": name,
                "response_length": response_length, "context": context,
                "exception": None, "start_time": start_ns / 1e9}
        start = time.perf_counter()
        try:
            yield meta
        except Exception as exc:  # noqa: BLE001 - every failure is reported to Locust
            meta["exception"] = exc
        # A BaseException (GreenletExit when Locust stops the user mid-request) propagates
        # unreported: that request never completed (Locust's measure would count it as a
        # success with whatever the block had set).
        meta["response_time"] = (time.perf_counter() - start) * 1000.0
        self.last_exception = meta["exception"]
        if meta["exception"] is None and not quiet and self.backoff is not None:
            self.backoff.ok()            # the peer answers: reconnect at once next time
        ctx = meta["context"]
        if ctx:
            wire = ctx.get("frametap")
            if wire.__class__ is _OnWire:
                ft = wire.resolve(start_ns)
                if ft is None:
                    del ctx["frametap"]
                else:
                    ctx["frametap"] = ft
        if not quiet or meta["exception"] is not None:
            self.environment.events.request.fire(**meta)

    def fire(self, name: str, response_time: float, length: int = 0,
             exception: Exception | None = None, **context) -> None:
        """Report one request timed elsewhere (``response_time`` in ms); ``context`` is
        the event's context (``frametap=`` for its frame-log row, see the class)."""
        if exception is None and self.backoff is not None:
            self.backoff.ok()
        self.environment.events.request.fire(
            request_type=self.request_type, name=name, response_time=response_time,
            response_length=length, exception=exception, context=context)
