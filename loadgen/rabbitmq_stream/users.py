"""Locust users for RabbitMQ Stream: a confirming publisher and a credit-driven consumer.

Host: Locust's ``--host`` as ``rabbitmq-stream://HOST:PORT``, ``HOST:PORT`` or ``HOST``
(port 5552). Users connect to that address only; they do not follow the broker address
advertised in Metadata (so a proxy in front of one node sees all the traffic).

Every request fires ``environment.events.request`` with ``request_type="rabbitmq-stream"``,
``name`` = the protocol's command name (constants.COMMANDS), ``response_time`` in ms
measured with ``perf_counter()`` and failures through ``exception=``:

* ``Publish``: one per batch, from sending the Publish frame to the receipt of the
  last PublishConfirm of the batch; ``response_length`` = message bytes in the batch.
  A PublishError or no confirm within FRAMETAP_STREAM_TIMEOUT is a failure. With a
  window above 1 the time includes however long the user took to look at the socket.
* ``Deliver``: one per chunk received by a consumer, timed from when the consumer
  started waiting for it (credit granted) to its arrival; ``response_length`` = chunk
  data bytes. Waits that end with nothing delivered are not reported (an idle stream
  is not an error).
* ``Create``, ``DeclarePublisher``, ``Subscribe``, ``Metadata``, ``QueryOffset``: the
  request/response round trip. ``Credit`` and ``StoreOffset`` have no response:
  ``StoreOffset`` is reported with its send time, ``Credit`` only when the server
  answers it with an error.
* A failed connection handshake is reported under the command that failed
  (``PeerProperties`` when the TCP connect itself fails, ``SaslAuthenticate``...). A
  broken connection is re-opened on the next task.

With the client-side frame log on (``--frametap-framelog DIR``, :mod:`loadgen.clientlog`)
the requests above are also frame-log rows on the connection they used, with the
correlation id the proxy logs: the request's correlation id for ``Create``,
``DeclarePublisher``, ``Subscribe``, ``Metadata``; for ``Publish`` one row
per publishing id, ``<publisherId>:<publishingId>``, ``messages = 1``, timed from the send
of the batch to that id's PublishConfirm (status ``OK``) or PublishError (the error
code's name); ``StoreOffset`` is ``kind="oneway"`` without correlation id. ``Deliver``,
``Credit`` errors and handshake failures are not requests of the user and have no row.

Settings (environment variables, read when a user starts):

===================================  ====================================  ================
variable                             meaning                               default
===================================  ====================================  ================
FRAMETAP_STREAM_NAME                 stream to use, created if missing     frametap-load
FRAMETAP_STREAM_USER /               SASL PLAIN credentials                guest / guest
FRAMETAP_STREAM_PASSWORD
FRAMETAP_STREAM_VHOST                virtual host                          /
FRAMETAP_STREAM_MAX_LENGTH_BYTES     ``max-length-bytes`` when creating    (none)
                                     the stream
FRAMETAP_STREAM_BATCH                messages per Publish                  10
FRAMETAP_STREAM_MESSAGE_SIZE         message body bytes                    256
FRAMETAP_STREAM_AMQP                 1: AMQP 1.0 data-section messages     1
                                     (rstream-readable), 0: raw bytes
FRAMETAP_STREAM_WINDOW               batches a publisher may have          1
                                     unconfirmed before it waits
FRAMETAP_STREAM_METADATA_EVERY       publisher: one Metadata per this      50
                                     many batches
FRAMETAP_STREAM_OFFSET               consumer start: first, last, next,    next
                                     or an offset number
FRAMETAP_STREAM_CREDIT               consumer's initial credit (chunks)    10
FRAMETAP_STREAM_STORE_EVERY          consumer: StoreOffset after this      10
                                     many chunks (and on stop)
FRAMETAP_STREAM_CONSUMER_REFERENCE   StoreOffset reference prefix; user    frametap-load-
                                     N stores as ``<prefix>N``             consumer-
FRAMETAP_STREAM_POLL                 consumer: seconds one poll waits      1
FRAMETAP_STREAM_TIMEOUT              socket / confirm timeout, seconds     10
===================================  ====================================  ================
"""

from __future__ import annotations

import itertools
import os
import random
import string
import time
from collections import deque
from dataclasses import dataclass, field
from time import perf_counter

from locust import User, between, constant, task

from loadgen.userbase import RequestReporter, env_float, env_int
from loadgen.rabbitmq_stream.client import (
    OFFSET_TYPES,
    StreamClient,
    StreamServerError,
    amqp_data,
    parse_host,
)
from proxy.protocols.rabbitmq_stream.constants import (
    CREATE,
    OFFSET_OFFSET,
    OK,
    PRECONDITION_FAILED,
    PUBLISH,
    command_name,
    status_name,
)

__all__ = ["StreamUser", "StreamPublisher", "StreamConsumer", "StreamSettings", "parse_host"]

REQUEST_TYPE = "rabbitmq-stream"


def _env_offset(name: str, default: str) -> tuple[int, int]:
    """``first``/``last``/``next`` or a non-negative offset -> (offset type, offset)."""
    text = os.environ.get(name, "").strip().lower() or default
    if text.isdigit():
        return OFFSET_OFFSET, int(text)
    if text in ("first", "last", "next"):
        return OFFSET_TYPES[text], 0
    raise ValueError(f"{name}={text!r}: expected first, last, next or an offset number")


@dataclass
class StreamSettings:
    """The FRAMETAP_STREAM_* settings (see the module docstring)."""

    stream: str = "frametap-load"
    user: str = "guest"
    password: str = "guest"
    vhost: str = "/"
    arguments: dict = field(default_factory=dict)
    batch: int = 10
    message_size: int = 256
    amqp: bool = True
    window: int = 1
    metadata_every: int = 50
    offset_type: int = OFFSET_TYPES["next"]
    offset: int = 0
    credit: int = 10
    store_every: int = 10
    consumer_reference: str = "frametap-load-consumer-"
    poll: float = 1.0
    timeout: float = 10.0

    @classmethod
    def from_env(cls) -> "StreamSettings":
        env = os.environ.get
        amqp_text = env("FRAMETAP_STREAM_AMQP", "1").strip().lower()
        if amqp_text not in ("", "0", "1", "true", "false", "yes", "no"):
            raise ValueError(f"FRAMETAP_STREAM_AMQP={amqp_text!r}: expected 1 or 0")
        max_bytes = env_int("FRAMETAP_STREAM_MAX_LENGTH_BYTES", 0, minimum=0)
        offset_type, offset = _env_offset("FRAMETAP_STREAM_OFFSET", "next")
        return cls(
            stream=env("FRAMETAP_STREAM_NAME", "").strip() or "frametap-load",
            user=env("FRAMETAP_STREAM_USER", "") or "guest",
            password=env("FRAMETAP_STREAM_PASSWORD", "guest"),
            vhost=env("FRAMETAP_STREAM_VHOST", "") or "/",
            arguments={"max-length-bytes": str(max_bytes)} if max_bytes else {},
            batch=env_int("FRAMETAP_STREAM_BATCH", 10),
            message_size=env_int("FRAMETAP_STREAM_MESSAGE_SIZE", 256, minimum=0),
            amqp=amqp_text not in ("0", "false", "no"),
            window=env_int("FRAMETAP_STREAM_WINDOW", 1),
            metadata_every=env_int("FRAMETAP_STREAM_METADATA_EVERY", 50),
            offset_type=offset_type,
            offset=offset,
            credit=env_int("FRAMETAP_STREAM_CREDIT", 10),
            store_every=env_int("FRAMETAP_STREAM_STORE_EVERY", 10),
            consumer_reference=(env("FRAMETAP_STREAM_CONSUMER_REFERENCE", "").strip()
                                or "frametap-load-consumer-"),
            poll=env_float("FRAMETAP_STREAM_POLL", 1.0),
            timeout=env_float("FRAMETAP_STREAM_TIMEOUT", 10.0),
        )


class StreamUser(RequestReporter, User):
    """Abstract Locust user owning one :class:`StreamClient` (plain socket).

    Subclasses set up their publisher/subscription in :meth:`on_connect`, which runs on
    every (re)connection.
    """

    abstract = True
    wait_time = between(0.001, 0.01)
    request_type = REQUEST_TYPE

    def __init__(self, environment):
        super().__init__(environment)
        self.client: StreamClient | None = None
        self.settings: StreamSettings | None = None
        self._address: tuple[str, int] | None = None

    def on_start(self) -> None:
        self.settings = StreamSettings.from_env()
        self._address = parse_host(self.host)
        self._connect()

    def on_stop(self) -> None:
        if self.client is not None:
            self.client.close(graceful=True)
            self.client = None

    # ------------------------------------------------------------------ plumbing

    def _connect(self) -> StreamClient | None:
        """The open client, (re)connecting when needed; None when that failed (the
        failure is reported under the handshake command that failed)."""
        client = self.client
        if client is not None and not client.closed:
            return client
        self.client = None
        s = self.settings
        host, port = self._address
        client = None
        self.before_connect()            # back off while the broker keeps failing
        with self.timed("PeerProperties", quiet=True) as req:  # reported only on failure
            try:
                client = StreamClient(host, port, user=s.user, password=s.password,
                                      vhost=s.vhost, timeout=s.timeout,
                                      connection_name=f"frametap-{type(self).__name__}")
            except Exception as exc:
                req["name"] = getattr(exc, "command", None) or "PeerProperties"
                raise
        if client is None:
            return None                  # the next attempt waits (before_connect)
        self.client = client
        if not self.on_connect(client):
            client.close()
            self.client = None           # e.g. access refused: the next attempt waits
            return None
        return client

    def on_connect(self, client: StreamClient) -> bool:
        """Set up a fresh connection; False when that failed (reported)."""
        return True

    def _ensure_stream(self, client: StreamClient) -> bool:
        """Create the stream unless it exists (reported as ``Create``)."""
        s = self.settings
        with self.timed(command_name(CREATE)) as req:
            self.on_wire(req, client, resource=s.stream)
            try:
                client.create(s.stream, s.arguments, exist_ok=True)
            except StreamServerError as exc:
                # exists with other arguments: fine for a load test
                if exc.code != PRECONDITION_FAILED:
                    raise
                meta = client.metadata(s.stream).streams.get(s.stream)
                if meta is None or meta.code != OK:
                    raise
            req["response_length"] = client.last_response_bytes
        return req["exception"] is None


_PAD_ALPHABET = (string.ascii_letters + string.digits).encode()


@dataclass
class _Batch:
    ids: set                 # publishing ids not yet confirmed or errored
    start: float             # perf_counter() before the send
    size: int
    errors: dict = field(default_factory=dict)    # publishing id -> PublishError code
    done_at: float = 0.0
    # for the frame log: every id in order, when each was answered, where it went
    order: list = field(default_factory=list)
    done: dict = field(default_factory=dict)      # publishing id -> perf_counter()
    wall_ns: int = 0
    conn_id: int = 0
    peer: str = ""


class StreamPublisher(StreamUser):
    """Declares publisher 0 on the stream and publishes FRAMETAP_STREAM_BATCH messages
    per task, keeping at most FRAMETAP_STREAM_WINDOW batches unconfirmed; one Metadata
    query per FRAMETAP_STREAM_METADATA_EVERY batches."""

    PUBLISHER_ID = 0
    _sequence = itertools.count()

    def on_start(self) -> None:
        self._rng = random.Random()
        self._pad = bytes(self._rng.choice(_PAD_ALPHABET) for _ in range(4096))
        self._inflight: deque[_Batch] = deque()
        self._by_id: dict[int, _Batch] = {}
        self.batches = 0
        super().on_start()

    def on_connect(self, client: StreamClient) -> bool:
        self._fail_inflight(ConnectionError("rabbitmq-stream: connection lost before "
                                            "the confirm"))
        if not self._ensure_stream(client):
            return False
        with self.timed("DeclarePublisher") as req:
            self.on_wire(req, client, resource=self.settings.stream)
            client.declare_publisher(self.PUBLISHER_ID, self.settings.stream)
            req["response_length"] = client.last_response_bytes
        return req["exception"] is None

    def on_stop(self) -> None:
        client = self.client
        deadline = time.monotonic() + min(2.0, self.settings.timeout if self.settings else 2)
        while self._inflight and client is not None and not client.closed \
                and time.monotonic() < deadline:
            self._collect(client, deadline - time.monotonic())
        super().on_stop()

    def _make_message(self) -> bytes:
        head = b'{"seq":%d,"ts_ns":%d,"pad":"' % (next(self._sequence), time.time_ns())
        size = self.settings.message_size
        pad_len = size - len(head) - 2
        if pad_len < 0:
            body = (head + b'"}')[:size]
        else:
            body = head + (self._pad * (pad_len // len(self._pad) + 1))[:pad_len] + b'"}'
        return amqp_data(body) if self.settings.amqp else body

    @task
    def publish(self) -> None:
        client = self._connect()
        if client is None:
            return
        s = self.settings
        messages = [self._make_message() for _ in range(s.batch)]
        wall_ns = time.time_ns()
        start = perf_counter()
        with self.timed("Publish", quiet=True) as req:  # reported here only when sending fails
            ids = client.publish_batch(self.PUBLISHER_ID, messages)
        if req["exception"] is not None:
            return
        batch = _Batch(set(ids), start, sum(len(m) for m in messages))
        if self.frame_log:
            batch.order, batch.wall_ns = ids, wall_ns
            batch.conn_id, batch.peer = client.conn_id, client.local_address
        self._inflight.append(batch)
        for pid in ids:
            self._by_id[pid] = batch
        self._collect(client, 0.0)
        # over the window: wait for the oldest batch (or its timeout)
        while len(self._inflight) >= s.window and not client.closed:
            remaining = self._inflight[0].start + s.timeout - perf_counter()
            self._collect(client, max(0.0, remaining))  # pops it when done or timed out
        self.batches += 1
        if self.batches % s.metadata_every == 0:
            self._metadata(client)

    def _metadata(self, client: StreamClient) -> None:
        stream = self.settings.stream
        with self.timed("Metadata") as req:
            self.on_wire(req, client, resource=stream)
            meta = client.metadata(stream).streams.get(stream)
            req["response_length"] = client.last_response_bytes
            if meta is None or meta.code != OK:
                code = meta.code if meta is not None else 0
                raise StreamServerError("Metadata", code, f"stream {stream!r}")

    def _collect(self, client: StreamClient, timeout: float) -> int:
        """Read confirms (waiting up to ``timeout`` for the first frame), report the
        batches that completed or timed out; returns the number of frames handled."""
        try:
            handled = client.pump(timeout)
        except Exception as exc:  # noqa: BLE001 - broken connection
            self._fail_inflight(exc)
            return 0
        confirmed, errored = client.take_confirms(self.PUBLISHER_ID)
        for pid, at in confirmed.items():
            batch = self._by_id.pop(pid, None)
            if batch is not None:
                batch.ids.discard(pid)
                batch.done[pid] = at
                batch.done_at = max(batch.done_at, at)
        for pid, code in errored.items():
            batch = self._by_id.pop(pid, None)
            if batch is not None:
                batch.ids.discard(pid)
                batch.errors[pid] = code
                batch.done[pid] = at = perf_counter()
                batch.done_at = max(batch.done_at, at)
        now = perf_counter()
        while self._inflight:
            batch = self._inflight[0]
            if batch.ids and now - batch.start < self.settings.timeout:
                break
            self._inflight.popleft()
            exc = None
            if batch.errors:
                codes = sorted({status_name(c) for c in batch.errors.values()})
                exc = StreamServerError("Publish", next(iter(batch.errors.values())),
                                        f"{len(batch.errors)} message(s) rejected: "
                                        f"{', '.join(codes)}")
            elif batch.ids:
                exc = TimeoutError(f"rabbitmq-stream: {len(batch.ids)} message(s) not "
                                   f"confirmed within {self.settings.timeout} s")
                for pid in batch.ids:
                    self._by_id.pop(pid, None)
                batch.done_at = now
            self.fire("Publish", (batch.done_at - batch.start) * 1000.0, batch.size,
                      exception=exc, **self._publish_rows(batch, batch.done_at))
        return handled

    def _fail_inflight(self, exc: Exception) -> None:
        now = perf_counter()
        while self._inflight:
            batch = self._inflight.popleft()
            self.fire("Publish", (now - batch.start) * 1000.0, batch.size, exception=exc,
                      **self._publish_rows(batch, now))
        self._by_id.clear()

    def _publish_rows(self, batch: _Batch, end: float) -> dict:
        """The Publish event's frame-log context: one item per publishing id (the proxy
        correlates each one with its PublishConfirm / PublishError)."""
        if not batch.order:
            return {}
        items = []
        prefix = f"{self.PUBLISHER_ID}:"
        for pid in batch.order:
            at = batch.done.get(pid)
            if at is None:      # no answer: the event's exception says why
                items.append((prefix + str(pid), (end - batch.start) * 1000.0, None, "error"))
            elif pid in batch.errors:
                items.append((prefix + str(pid), (at - batch.start) * 1000.0,
                              status_name(batch.errors[pid]), "error"))
            else:
                items.append((prefix + str(pid), (at - batch.start) * 1000.0, "OK", "ok"))
        return {"frametap": {"conn_id": batch.conn_id, "peer": batch.peer, "opcode": PUBLISH,
                             "ts_ns": batch.wall_ns, "resource": self.settings.stream,
                             "items": items}}


class StreamConsumer(StreamUser):
    """Subscribes (subscription 0) from FRAMETAP_STREAM_OFFSET with
    FRAMETAP_STREAM_CREDIT credits, grants one credit per chunk received, counts the
    delivered messages and stores its offset every FRAMETAP_STREAM_STORE_EVERY chunks.
    After a reconnection it resumes after the last chunk it saw."""

    SUBSCRIPTION_ID = 0
    wait_time = constant(0)  # the poll itself blocks
    _instances = itertools.count()

    def on_start(self) -> None:
        self.index = next(self._instances)
        self.received_messages = 0
        self.received_chunks = 0
        self.next_offset: int | None = None  # after the last record seen
        self._stored: int | None = None
        self._wait_start = perf_counter()
        super().on_start()
        self.reference = f"{self.settings.consumer_reference}{self.index}"

    def on_connect(self, client: StreamClient) -> bool:
        if not self._ensure_stream(client):
            return False
        s = self.settings
        if self.next_offset is not None:
            offset_type, offset = OFFSET_OFFSET, self.next_offset
        else:
            offset_type, offset = s.offset_type, s.offset
        with self.timed("Subscribe") as req:
            self.on_wire(req, client, resource=s.stream)
            client.subscribe(self.SUBSCRIPTION_ID, s.stream, offset_type, offset, s.credit)
            req["response_length"] = client.last_response_bytes
        self._wait_start = perf_counter()
        return req["exception"] is None

    def on_stop(self) -> None:
        client = self.client
        if client is not None and not client.closed:
            self._store_offset(client)
        super().on_stop()

    @task
    def poll(self) -> None:
        client = self._connect()
        if client is None:
            return
        try:
            delivery = client.poll_deliver(self.settings.poll)
        except Exception as exc:  # noqa: BLE001 - broken connection or bad chunk
            self.fire("Deliver", (perf_counter() - self._wait_start) * 1000.0,
                      exception=exc)
            client.close()
            return
        for sub, code in client.take_credit_errors():
            self.fire("Credit", 0.0, exception=StreamServerError(
                "Credit", code, f"subscription {sub}"))
        if delivery is None:
            self._wait_start = perf_counter()
            return
        now = perf_counter()
        try:
            client.credit(self.SUBSCRIPTION_ID, 1)
        except Exception as exc:  # noqa: BLE001
            self.fire("Credit", 0.0, exception=exc)
        self.fire("Deliver", (now - self._wait_start) * 1000.0, delivery.chunk_bytes,
                  num_records=delivery.num_records, chunk_first_offset=delivery.chunk_first_offset)
        self._wait_start = now
        self.received_chunks += 1
        self.received_messages += delivery.num_records
        self.next_offset = delivery.chunk_first_offset + delivery.num_records
        if self.received_chunks % self.settings.store_every == 0:
            self._store_offset(client)

    def _store_offset(self, client: StreamClient) -> None:
        if self.next_offset is None or self.next_offset - 1 == self._stored:
            return
        offset = self.next_offset - 1
        with self.timed("StoreOffset") as req:  # no response: the send time
            self.on_wire(req, client, resource=self.settings.stream)
            client.store_offset(self.reference, self.settings.stream, offset)
        if req["exception"] is None:
            self._stored = offset

