"""Locust users for FlyMQ: a producer and a consumer-group member.

Host: Locust's ``--host`` as ``flymq://HOST:PORT``, ``HOST:PORT`` or ``HOST`` (port 9092).

Every request fires ``environment.events.request`` with ``request_type="flymq"``, ``name``
= the spec's opcode name (``PRODUCE``, ``FETCH``, ...), ``response_time`` in ms measured with
``perf_counter()``, ``response_length`` = response frame bytes, and failures through
``exception=`` (ERROR responses, socket errors, timeouts). A connection that failed is
re-opened on the next request, after a back-off while reconnections keep failing
(:class:`loadgen.userbase.Backoff`: FRAMETAP_RECONNECT_DELAY, FRAMETAP_RECONNECT_MAX_DELAY).

With the client-side frame log on (``--frametap-framelog DIR``, :mod:`loadgen.clientlog`)
every reported request that went out on a connection is also one frame-log row whose
``correlation_id`` is the request's 1-based number on its connection, counted over every
request sent on it (the proxy correlates FlyMQ FIFO and numbers requests the same way);
``messages`` is 1 for PRODUCE and the records a FETCH returned. A failed connect
(``CONNECT``) sent nothing and has no row.

Settings (environment variables, read when a user starts):

==============================  =========================================  ==================
variable                        meaning                                    default
==============================  =========================================  ==================
FRAMETAP_FLYMQ_TOPICS           comma-separated topics to use              orders,payments,clickstream
FRAMETAP_FLYMQ_PARTITIONS       partitions when creating a topic           3
FRAMETAP_FLYMQ_MESSAGE_SIZE     value size in bytes                        512
FRAMETAP_FLYMQ_KEYS             distinct message keys (``user-00042``)     1000
FRAMETAP_FLYMQ_GROUP            consumer group of FlyMQConsumer            frametap-load
FRAMETAP_FLYMQ_FETCH_MAX        max_messages per FETCH                     100
FRAMETAP_FLYMQ_COMMIT_EVERY     COMMIT after this many FETCHes             10
FRAMETAP_FLYMQ_METADATA_EVERY   producer: ~1 METADATA per this many        50
                                PRODUCEs (task weight ratio)
FRAMETAP_FLYMQ_USER /           when set, AUTH with these after connect    (none)
FRAMETAP_FLYMQ_PASSWORD
FRAMETAP_FLYMQ_TIMEOUT          socket timeout in seconds                  10
==============================  =========================================  ==================
"""

from __future__ import annotations

import itertools
import os
import random
import string
import time
from dataclasses import dataclass

from locust import User, between, task

from loadgen.userbase import RequestReporter, env_float, env_int
from loadgen.flymq.client import FlyMQClient, FlyMQServerError, parse_host

__all__ = ["FlyMQUser", "FlyMQProducer", "FlyMQConsumer", "FlyMQSettings", "parse_host"]


@dataclass
class FlyMQSettings:
    """The FRAMETAP_FLYMQ_* settings (see the module docstring)."""

    topics: list[str]
    partitions: int = 3
    message_size: int = 512
    keys: int = 1000
    group: str = "frametap-load"
    fetch_max: int = 100
    commit_every: int = 10
    user: str | None = None
    password: str | None = None
    timeout: float = 10.0

    @classmethod
    def from_env(cls) -> "FlyMQSettings":
        topics_text = os.environ.get("FRAMETAP_FLYMQ_TOPICS", "orders,payments,clickstream")
        topics = [t.strip() for t in topics_text.split(",") if t.strip()]
        if not topics:
            raise ValueError(f"FRAMETAP_FLYMQ_TOPICS={topics_text!r}: expected a "
                             f"comma-separated list of topic names")
        return cls(
            topics=topics,
            partitions=env_int("FRAMETAP_FLYMQ_PARTITIONS", 3),
            message_size=env_int("FRAMETAP_FLYMQ_MESSAGE_SIZE", 512, minimum=0),
            keys=env_int("FRAMETAP_FLYMQ_KEYS", 1000),
            group=os.environ.get("FRAMETAP_FLYMQ_GROUP", "").strip() or "frametap-load",
            fetch_max=env_int("FRAMETAP_FLYMQ_FETCH_MAX", 100),
            commit_every=env_int("FRAMETAP_FLYMQ_COMMIT_EVERY", 10),
            user=os.environ.get("FRAMETAP_FLYMQ_USER") or None,
            password=os.environ.get("FRAMETAP_FLYMQ_PASSWORD", ""),
            timeout=env_float("FRAMETAP_FLYMQ_TIMEOUT", 10.0),
        )


class FlyMQUser(RequestReporter, User):
    """Abstract Locust user owning one :class:`FlyMQClient` (plain socket)."""

    abstract = True
    wait_time = between(0.001, 0.01)
    request_type = "flymq"

    def __init__(self, environment):
        super().__init__(environment)
        self.client: FlyMQClient | None = None
        self.settings: FlyMQSettings | None = None
        self._address: tuple[str, int] | None = None

    def on_start(self) -> None:
        self.settings = FlyMQSettings.from_env()
        self._address = parse_host(self.host)
        with self.timed("CONNECT", quiet=True):  # connect (and AUTH) now; failures only
            self._connect()

    def on_stop(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    def _connect(self) -> FlyMQClient:
        """The open client, (re)connecting and authenticating when needed."""
        client = self.client
        if client is None or client.closed:
            host, port = self._address
            self.before_connect()        # back off while the server keeps failing
            client = FlyMQClient(host, port, timeout=self.settings.timeout)
            self.client = client
            if self.settings.user:
                with self.timed("AUTH") as req:
                    self.on_wire(req, client)
                    client.auth(self.settings.user, self.settings.password)
                    req["response_length"] = client.last_response_bytes
                if req["exception"] is not None:
                    client.close()  # retried on the next request
        return client

    def _create_topic(self, topic: str) -> None:
        """CREATE_TOPIC (a topic that already exists is a success, as on the real server)."""
        with self.timed("CREATE_TOPIC") as req:
            client = self._connect()
            self.on_wire(req, client, resource=topic)
            client.create_topic(topic, self.settings.partitions)
            req["response_length"] = client.last_response_bytes

    def _metadata(self, topic: str):
        """METADATA; the response, or None when it failed (reported)."""
        meta = None
        with self.timed("METADATA") as req:
            client = self._connect()
            self.on_wire(req, client, resource=topic)
            meta = client.metadata(topic)
            req["response_length"] = client.last_response_bytes
        return meta


_PAD_ALPHABET = (string.ascii_letters + string.digits).encode()
_EVENTS = ("order_created", "order_paid", "item_viewed", "cart_updated", "refund_issued")


class FlyMQProducer(FlyMQUser):
    """Produces keyed JSON-like events of FRAMETAP_FLYMQ_MESSAGE_SIZE bytes to the topics,
    with an occasional METADATA lookup."""

    _sequence = itertools.count()

    def on_start(self) -> None:
        super().on_start()
        self._rng = random.Random()
        self._pad = bytes(self._rng.choice(_PAD_ALPHABET) for _ in range(4096))
        for topic in self.settings.topics:
            # a topic that already exists is a success, as on the real server
            self._create_topic(topic)

    def _make_value(self, key: bytes, topic: str) -> bytes:
        head = (b'{"event":"%s","topic":"%s","key":"%s","seq":%d,"ts_ms":%d,"pad":"' % (
            self._rng.choice(_EVENTS).encode(), topic.encode(), key, next(self._sequence),
            time.time_ns() // 1_000_000))
        size = self.settings.message_size
        pad_len = size - len(head) - 2
        if pad_len < 0:
            return (head + b'"}')[:size]
        pad = (self._pad * (pad_len // len(self._pad) + 1))[:pad_len]
        return head + pad + b'"}'

    @task(50)
    def produce(self) -> None:
        topic = self._rng.choice(self.settings.topics)
        key = b"user-%05d" % self._rng.randrange(self.settings.keys)
        value = self._make_value(key, topic)
        with self.timed("PRODUCE") as req:
            client = self._connect()
            self.on_wire(req, client, resource=topic, messages=1)
            client.produce(topic, value, key)
            req["response_length"] = client.last_response_bytes

    @task(1)
    def metadata(self) -> None:
        self._metadata(self._rng.choice(self.settings.topics))


class FlyMQConsumer(FlyMQUser):
    """One consumer-group member: SUBSCRIBE once (mode ``commit``) to one partition, then
    a FETCH loop with a COMMIT every FRAMETAP_FLYMQ_COMMIT_EVERY fetches."""

    _instances = itertools.count()

    def on_start(self) -> None:
        super().on_start()
        s = self.settings
        index = next(self._instances)
        self.topic = s.topics[index % len(s.topics)]
        self._create_topic(self.topic)
        meta = self._metadata(self.topic)
        partitions = meta.partitions if meta is not None and meta.partitions else 1
        self.partition = (index // len(s.topics)) % partitions
        self.offset = 0
        with self.timed("SUBSCRIBE") as req:
            client = self._connect()
            self.on_wire(req, client, resource=self.topic)
            self.offset = client.subscribe(self.topic, s.group, self.partition, "commit")
            req["response_length"] = client.last_response_bytes
        self.fetches = 0
        self.consumed = 0

    @task
    def poll(self) -> None:
        s = self.settings
        with self.timed("FETCH") as req:
            client = self._connect()
            self.on_wire(req, client, resource=self.topic)
            resp = client.fetch(self.topic, self.partition, self.offset, s.fetch_max)
            req["response_length"] = client.last_response_bytes
            self.frame_fields(req, messages=len(resp.messages))
        if req["exception"] is not None:
            if isinstance(req["exception"], FlyMQServerError):
                # e.g. offset out of range after the topic was re-created: restart from
                # the log start (the server clamps offsets below it)
                self.offset = 0
            return
        self.offset = resp.next_offset
        self.consumed += len(resp.messages)
        self.fetches += 1
        if self.fetches % s.commit_every == 0:
            with self.timed("COMMIT") as req:
                client = self._connect()
                self.on_wire(req, client, resource=self.topic)
                client.commit(self.topic, s.group, self.partition, self.offset)
                req["response_length"] = client.last_response_bytes
