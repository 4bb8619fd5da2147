"""What every protocol's Locust users share (standard library only):

* the ``FRAMETAP_*`` settings readers :func:`env_int`, :func:`env_float`,
  :func:`env_bool`, :func:`env_choice` (a bad value is a ValueError naming it);
* :class:`Backoff`, the waits between reconnections to a peer that keeps failing;
* :class:`RequestReporter`, the users' mixin: :meth:`~RequestReporter.timed` times a
  request and fires Locust's ``request`` event, :meth:`~RequestReporter.on_wire` gives it
  its client-side frame-log row (:mod:`loadgen.clientlog`).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from loadgen.clientbase import SocketClient

__all__ = ["env_int", "env_float", "env_bool", "env_choice", "Backoff", "RequestReporter"]


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
