"""Locust users for RocketMQ: a producer and a pull consumer, both routed by the name server.

Host: Locust's ``--host`` is the *name server*, as ``rocketmq://HOST:PORT``, ``HOST:PORT``
or ``HOST`` (port 9876). Like Apache's clients, the users ask the name server for the
topic's route (GET_ROUTEINFO_BY_TOPIC) and then connect to the broker addresses the route
data names - so a proxy in front of the name server alone sees only route lookups, and a
proxy that rewrites route data (docs/design.md, "RocketMQ remoting") sees the broker traffic too.
One connection per broker address per user.

Every request fires ``environment.events.request`` with ``request_type="rocketmq"``,
``name`` = Apache's request code name (``proxy.protocols.rocketmq.constants``),
``response_time`` in ms from ``perf_counter()`` and failures through ``exception=``:

* ``GET_ROUTEINFO_BY_TOPIC``: at start and every FRAMETAP_ROCKETMQ_ROUTE_EVERY seconds.
  When the topic does not exist yet the producer, like Java's, looks up the default
  topic ``TBW102`` next (the broker creates the topic on the first send); that
  TOPIC_NOT_EXIST answer is then not a failure. ``response_length`` = frame bytes.
* ``HEART_BEAT``: to every broker of the route at start and every
  FRAMETAP_ROCKETMQ_HEARTBEAT_EVERY seconds (producer group, or consumer group with a
  ``*`` subscription of the topic).
* ``SEND_MESSAGE_V2`` (default; short header keys), ``SEND_MESSAGE`` (with
  FRAMETAP_ROCKETMQ_SEND_V2=0) or ``SEND_BATCH_MESSAGE`` (FRAMETAP_ROCKETMQ_BATCH > 1):
  one per task, queues taken round-robin over the route's write queues;
  ``response_length`` = message body bytes. Keys ``order-<user>-<seq>``, a tag from
  FRAMETAP_ROCKETMQ_TAGS, JSON bodies ``{"seq":..,"ts_ns":..,"pad":".."}``.
* ``PULL_MESSAGE``: one per task, queues round-robin over the route's read queues;
  ``response_length`` = body bytes of the messages pulled. NO_NEW_MSG / NO_MATCHED_MSG /
  OFFSET_ILLEGAL are answers, not failures (the offset follows ``nextBeginOffset``).
* ``QUERY_CONSUMER_OFFSET`` (and ``GET_MAX_OFFSET`` when the group has no committed
  offset and FRAMETAP_ROCKETMQ_START is ``last``): once per queue when the consumer first
  sees it.
* ``GET_CONSUMER_LIST_BY_GROUP``: after each consumer heartbeat and when a broker sends
  NOTIFY_CONSUMER_IDS_CHANGED; the consumer then takes its share of the read queues as
  Java's ``AllocateMessageQueueAveragely`` does (consumers of one group split the queues;
  FRAMETAP_ROCKETMQ_REBALANCE=0: every consumer pulls every queue).
* ``UPDATE_CONSUMER_OFFSET``: every FRAMETAP_ROCKETMQ_COMMIT_EVERY seconds and on stop,
  per queue whose offset moved; oneway by default (as Java's offset store does), then
  reported with its send time.
* ``UNREGISTER_CLIENT``: on stop, to every broker (FRAMETAP_ROCKETMQ_UNREGISTER=1).

A failed connect is reported under the request it was for; a broken connection is
re-opened on the next task, and a broker failure also triggers a fresh route lookup.

With the client-side frame log on (``--frametap-framelog DIR``, :mod:`loadgen.clientlog`)
every reported request that went out is also one frame-log row on the connection it used
(name server or broker), ``correlation_id`` = its ``opaque`` as a signed decimal, as the
proxy logs it; a oneway UPDATE_CONSUMER_OFFSET is ``kind="oneway"``. ``messages``: the
messages sent (SEND_*) or pulled (PULL_MESSAGE). A failed connect sent nothing and has
no row.

Settings (environment variables, read when a user starts):

===================================  ====================================  ==================
variable                             meaning                               default
===================================  ====================================  ==================
FRAMETAP_ROCKETMQ_TOPIC              topic to produce to / consume from    frametap-load
FRAMETAP_ROCKETMQ_PRODUCER_GROUP     producer group                        frametap-producer
FRAMETAP_ROCKETMQ_CONSUMER_GROUP     consumer group                        frametap-consumer
FRAMETAP_ROCKETMQ_MESSAGE_SIZE       message body bytes                    256
FRAMETAP_ROCKETMQ_TAGS               comma list of tags to pick from       TagA,TagB,TagC
FRAMETAP_ROCKETMQ_BATCH              messages per send; > 1 uses           1
                                     SEND_BATCH_MESSAGE
FRAMETAP_ROCKETMQ_SEND_V2            1: SEND_MESSAGE_V2, 0: SEND_MESSAGE   1
FRAMETAP_ROCKETMQ_SERIALIZE          header encoding: json or rocketmq     json
FRAMETAP_ROCKETMQ_ROUTE_EVERY        seconds between route lookups         30
FRAMETAP_ROCKETMQ_HEARTBEAT_EVERY    seconds between heartbeats            30
FRAMETAP_ROCKETMQ_PULL_BATCH         maxMsgNums per pull                   32
FRAMETAP_ROCKETMQ_PULL_SUSPEND_MS    long-polling hold asked of the        0
                                     broker when nothing is new (0: none)
FRAMETAP_ROCKETMQ_START              where a group without a committed     last
                                     offset starts: first or last
FRAMETAP_ROCKETMQ_REBALANCE          1: split queues among the group's     1
                                     consumers, 0: pull them all
FRAMETAP_ROCKETMQ_COMMIT_EVERY       seconds between offset commits        5
FRAMETAP_ROCKETMQ_COMMIT_ONEWAY      1: UPDATE_CONSUMER_OFFSET oneway      1
FRAMETAP_ROCKETMQ_UNREGISTER         1: UNREGISTER_CLIENT on stop          1
FRAMETAP_ROCKETMQ_TIMEOUT            connect / response timeout, seconds   10
===================================  ====================================  ==================
"""

from __future__ import annotations

import itertools
import os
import random
import string
import time
from dataclasses import dataclass

from locust import User, between, task

from loadgen.userbase import Backoff, RequestReporter, env_bool, env_choice, env_float, env_int
from loadgen.rocketmq.client import (
    DEFAULT_TOPIC,
    RocketMQClient,
    RocketMQServerError,
    TopicRoute,
    parse_host,
)
from proxy.protocols.rocketmq.constants import (
    GET_ROUTEINFO_BY_TOPIC,
    NOTIFY_CONSUMER_IDS_CHANGED,
    TOPIC_NOT_EXIST,
    request_name,
)

__all__ = ["RocketMQUser", "RocketMQProducer", "RocketMQConsumer", "RocketMQSettings",
           "allocate_averagely"]

REQUEST_TYPE = "rocketmq"
_ROUTE = request_name(GET_ROUTEINFO_BY_TOPIC)


@dataclass
class RocketMQSettings:
    """The FRAMETAP_ROCKETMQ_* settings (see the module docstring)."""

    topic: str = "frametap-load"
    producer_group: str = "frametap-producer"
    consumer_group: str = "frametap-consumer"
    message_size: int = 256
    tags: tuple = ("TagA", "TagB", "TagC")
    batch: int = 1
    send_v2: bool = True
    serialize: str = "json"
    route_every: float = 30.0
    heartbeat_every: float = 30.0
    pull_batch: int = 32
    pull_suspend_ms: int = 0
    start: str = "last"
    rebalance: bool = True
    commit_every: float = 5.0
    commit_oneway: bool = True
    unregister: bool = True
    timeout: float = 10.0

    @classmethod
    def from_env(cls) -> "RocketMQSettings":
        env = os.environ.get
        tags = tuple(t.strip() for t in env("FRAMETAP_ROCKETMQ_TAGS", "").split(",")
                     if t.strip()) or ("TagA", "TagB", "TagC")
        return cls(
            topic=env("FRAMETAP_ROCKETMQ_TOPIC", "").strip() or "frametap-load",
            producer_group=(env("FRAMETAP_ROCKETMQ_PRODUCER_GROUP", "").strip()
                            or "frametap-producer"),
            consumer_group=(env("FRAMETAP_ROCKETMQ_CONSUMER_GROUP", "").strip()
                            or "frametap-consumer"),
            message_size=env_int("FRAMETAP_ROCKETMQ_MESSAGE_SIZE", 256, minimum=0),
            tags=tags,
            batch=env_int("FRAMETAP_ROCKETMQ_BATCH", 1),
            send_v2=env_bool("FRAMETAP_ROCKETMQ_SEND_V2", True),
            serialize=env_choice("FRAMETAP_ROCKETMQ_SERIALIZE", "json", ("json", "rocketmq")),
            route_every=env_float("FRAMETAP_ROCKETMQ_ROUTE_EVERY", 30.0),
            heartbeat_every=env_float("FRAMETAP_ROCKETMQ_HEARTBEAT_EVERY", 30.0),
            pull_batch=env_int("FRAMETAP_ROCKETMQ_PULL_BATCH", 32),
            pull_suspend_ms=env_int("FRAMETAP_ROCKETMQ_PULL_SUSPEND_MS", 0, minimum=0),
            start=env_choice("FRAMETAP_ROCKETMQ_START", "last", ("first", "last")),
            rebalance=env_bool("FRAMETAP_ROCKETMQ_REBALANCE", True),
            commit_every=env_float("FRAMETAP_ROCKETMQ_COMMIT_EVERY", 5.0),
            commit_oneway=env_bool("FRAMETAP_ROCKETMQ_COMMIT_ONEWAY", True),
            unregister=env_bool("FRAMETAP_ROCKETMQ_UNREGISTER", True),
            timeout=env_float("FRAMETAP_ROCKETMQ_TIMEOUT", 10.0),
        )


class RocketMQUser(RequestReporter, User):
    """Abstract Locust user: one name-server connection plus one connection per broker
    address of the topic's route (plain sockets, :class:`RocketMQClient`).

    Subclasses implement :meth:`on_route` (the queues changed) and their task; they call
    :meth:`maintain` first in each task for the periodic route lookup and heartbeats.
    """

    abstract = True
    wait_time = between(0.001, 0.01)
    request_type = REQUEST_TYPE
    _instances = itertools.count()

    def __init__(self, environment):
        super().__init__(environment)
        self.settings: RocketMQSettings | None = None
        self.namesrv: RocketMQClient | None = None
        self.brokers: dict[str, RocketMQClient] = {}
        self.route: TopicRoute | None = None
        self.queues: list = []
        self._next_route = 0.0
        self._next_heartbeat = 0.0
        self._backoffs: dict[str | None, Backoff] = {}

    # ------------------------------------------------------------------ lifecycle

    def on_start(self) -> None:
        self.settings = RocketMQSettings.from_env()
        self._namesrv_address = parse_host(self.host)
        self.index = next(self._instances)
        self.client_id = f"127.0.0.1@frametap-{os.getpid()}-{self.index}"
        self.maintain()

    def on_stop(self) -> None:
        if self.settings is not None and self.settings.unregister:
            for addr in list(self.brokers):
                with self.timed("UNREGISTER_CLIENT", broker=addr) as req:
                    client = self._client(addr)
                    self.on_wire(req, client)
                    client.unregister(self.client_id, **self.groups())
                    req["response_length"] = client.last_response_bytes
        for client in list(self.brokers.values()) + [self.namesrv]:
            if client is not None:
                client.close()
        self.brokers.clear()
        self.namesrv = None

    def groups(self) -> dict:
        """``producer_group`` / ``consumer_group`` keywords for UNREGISTER_CLIENT."""
        return {}

    def heartbeat_groups(self) -> dict:
        """Keywords for :meth:`RocketMQClient.heartbeat`."""
        return {}

    def on_route(self, route: TopicRoute) -> None:
        """The route (and so ``self.queues``) was (re)loaded."""

    # ------------------------------------------------------------------ plumbing

    def _backoff(self, addr: str | None) -> Backoff:
        """The reconnection back-off of one address (the name server's when None): a
        dead broker is retried ever more slowly while the name server answers."""
        backoff = self._backoffs.get(addr)
        if backoff is None:
            backoff = self._backoffs[addr] = Backoff.from_env()
        return backoff

    def _client(self, addr: str | None) -> RocketMQClient:
        """The connection to the broker at ``addr`` (the name server when None), opened
        when needed, after a back-off while connections to it keep failing
        (:class:`loadgen.userbase.Backoff`). An exception from opening it is marked
        ``connecting = True``."""
        try:
            if addr is None:
                if self.namesrv is None or self.namesrv.closed:
                    host, port = self._namesrv_address
                    self._backoff(None).before_connect()
                    self.namesrv = RocketMQClient(host, port, timeout=self.settings.timeout,
                                                  serialize=self.settings.serialize)
                return self.namesrv
            client = self.brokers.get(addr)
            if client is None or client.closed:
                host, port = parse_host(addr)
                self._backoff(addr).before_connect()
                client = RocketMQClient(host, port, timeout=self.settings.timeout,
                                        serialize=self.settings.serialize)
                self.brokers[addr] = client
            return client
        except Exception as exc:
            exc.connecting = True
            raise

    def _succeeded(self, req: dict, addr: str | None) -> bool:
        """After a :meth:`timed` request to ``addr``: True when it succeeded. On failure,
        broker trouble (not an error answer or a timeout) makes the next task look the
        route up again (the next connection to it waits: :meth:`_client`)."""
        exc = req["exception"]
        if exc is None:
            self._backoff(addr).ok()
            return True
        if addr is not None and not isinstance(exc, (RocketMQServerError, TimeoutError)):
            self._next_route = 0.0
        return False

    def _lookup_route(self, topic: str, not_found_ok: bool):
        """One GET_ROUTEINFO_BY_TOPIC; returns the route, None when the topic does not
        exist and ``not_found_ok`` (reported as a success), False on failure."""
        route = False
        with self.timed(_ROUTE, topic=topic) as req:
            client = self._client(None)
            self.on_wire(req, client, resource=topic)
            try:
                route = client.get_route(topic)
            except RocketMQServerError as exc:
                if exc.code != TOPIC_NOT_EXIST or not not_found_ok:
                    raise
                route = None
                req["context"]["status"] = "TOPIC_NOT_EXIST"
            req["response_length"] = client.last_response_bytes
        if req["exception"] is None:
            self._backoff(None).ok()
        return route

    def refresh_route(self) -> bool:
        """Look the topic's route up (falling back to TBW102 for a producer whose topic
        does not exist yet); True when there is a route (this one or an older one)."""
        route = self._lookup_route(self.settings.topic, self.follow_default_topic)
        if route is None:
            route = self._lookup_route(DEFAULT_TOPIC, False)
        if not route:
            if self.route is None:
                time.sleep(min(1.0, self.settings.timeout))  # nothing to do: don't spin
            self._next_route = time.monotonic() + min(1.0, self.settings.timeout)
            return self.route is not None
        self._next_route = time.monotonic() + self.settings.route_every
        self.route = route
        self.on_route(route)
        # drop connections to brokers that left the route
        live = set(route.brokers.values())
        for addr in [a for a in self.brokers if a not in live]:
            self.brokers.pop(addr).close()
        return True

    #: Producer: on TOPIC_NOT_EXIST use the default topic's route (Java's behaviour).
    follow_default_topic = False

    def heartbeat_all(self) -> None:
        self._next_heartbeat = time.monotonic() + self.settings.heartbeat_every
        if self.route is None:
            return
        for addr in sorted(set(a for a in self.route.brokers.values() if a)):
            with self.timed("HEART_BEAT", broker=addr) as req:
                client = self._client(addr)
                self.on_wire(req, client)
                client.heartbeat(self.client_id, **self.heartbeat_groups())
                req["response_length"] = client.last_response_bytes
            self._succeeded(req, addr)

    def maintain(self) -> bool:
        """Periodic route lookup and heartbeats; True when there are queues to use."""
        now = time.monotonic()
        if now >= self._next_route or self.route is None:
            had = self.route
            if not self.refresh_route():
                return False
            if had is None:
                self._next_heartbeat = 0.0  # first route: heartbeat right away
        if time.monotonic() >= self._next_heartbeat:
            self.heartbeat_all()
        return bool(self.queues)


_PAD_ALPHABET = string.ascii_letters + string.digits


class RocketMQProducer(RocketMQUser):
    """Sends FRAMETAP_ROCKETMQ_BATCH message(s) per task round-robin over the route's
    write queues, with keys ``order-<user>-<seq>`` and a tag from FRAMETAP_ROCKETMQ_TAGS."""

    follow_default_topic = True

    def on_start(self) -> None:
        self._rng = random.Random()
        self._pad = "".join(self._rng.choice(_PAD_ALPHABET) for _ in range(4096))
        self._seq = itertools.count()
        self._queue_cycle = None
        self.sent = 0
        super().on_start()

    def groups(self) -> dict:
        return {"producer_group": self.settings.producer_group}

    def heartbeat_groups(self) -> dict:
        return {"producer_groups": [self.settings.producer_group]}

    def on_route(self, route: TopicRoute) -> None:
        queues = route.write_queues()
        if queues != self.queues:
            self.queues = queues
            start = self._rng.randrange(len(queues)) if queues else 0
            self._queue_cycle = itertools.islice(itertools.cycle(queues), start, None)

    def make_body(self, seq: int) -> bytes:
        head = '{"seq":%d,"ts_ns":%d,"pad":"' % (seq, time.time_ns())
        size = self.settings.message_size
        pad_len = size - len(head) - 2
        if pad_len < 0:
            return (head + '"}').encode()[:size]
        return (head + (self._pad * (pad_len // len(self._pad) + 1))[:pad_len] + '"}').encode()

    @task
    def send(self) -> None:
        if not self.maintain():
            if self.route is not None:  # a route without writable queues: idle a little
                time.sleep(min(1.0, self.settings.timeout))
            return
        s = self.settings
        broker_name, addr, queue_id = next(self._queue_cycle)
        tags = self._rng.choice(s.tags)
        seqs = [next(self._seq) for _ in range(s.batch)]
        bodies = [self.make_body(q) for q in seqs]
        keys = [f"order-{self.index}-{q}" for q in seqs]
        size = sum(len(b) for b in bodies)
        if s.batch > 1:
            name = "SEND_BATCH_MESSAGE"
        else:
            name = "SEND_MESSAGE_V2" if s.send_v2 else "SEND_MESSAGE"
        with self.timed(name, broker=addr) as req:
            client = self._client(addr)
            self.on_wire(req, client, resource=s.topic, messages=len(bodies))
            if s.batch > 1:
                client.send_batch(s.topic, bodies, queue_id, keys=keys, tags=tags,
                                  producer_group=s.producer_group, broker_name=broker_name)
            else:
                client.send(s.topic, bodies[0], queue_id, keys=keys[0], tags=tags,
                            v2=s.send_v2, producer_group=s.producer_group,
                            broker_name=broker_name)
            req["response_length"] = size  # the message body bytes sent
        if self._succeeded(req, addr):
            self.sent += len(bodies)


class RocketMQConsumer(RocketMQUser):
    """Pulls the route's read queues round-robin for FRAMETAP_ROCKETMQ_CONSUMER_GROUP,
    starting at the group's committed offset (else FRAMETAP_ROCKETMQ_START), and commits
    its offsets every FRAMETAP_ROCKETMQ_COMMIT_EVERY seconds and on stop."""

    def on_start(self) -> None:
        self.offsets: dict = {}      # (broker name, queue id) -> next offset to pull
        self.committed: dict = {}    # (broker name, queue id) -> offset last committed
        self.received_messages = 0
        self.all_queues: list = []
        self._rebalance_due = False
        self._queue_cycle = None
        self._next_commit = time.monotonic()
        super().on_start()
        self._next_commit = time.monotonic() + self.settings.commit_every

    def on_stop(self) -> None:
        if self.settings is not None:
            self.commit_offsets()
        super().on_stop()

    def groups(self) -> dict:
        return {"consumer_group": self.settings.consumer_group}

    def heartbeat_groups(self) -> dict:
        return {"consumer_groups": {self.settings.consumer_group: [self.settings.topic]}}

    def on_route(self, route: TopicRoute) -> None:
        self.all_queues = route.read_queues()
        if not self.settings.rebalance:
            self._use_queues(self.all_queues)
        else:  # keep what is still there until the next rebalance
            self._use_queues([q for q in self.queues if q in self.all_queues])
            self._rebalance_due = True

    def _use_queues(self, queues: list) -> None:
        if queues != self.queues:
            # queues handed to another consumer: commit where we got to, then forget them
            # (else a later commit of ours would overwrite the new owner's progress)
            for broker_name, addr, queue_id in set(self.queues) - set(queues):
                key = (broker_name, queue_id)
                offset = self.offsets.pop(key, None)
                if offset is not None and self.committed.get(key) != offset:
                    self._commit(addr, queue_id, offset)
                self.committed.pop(key, None)
            self.queues = queues
            start = random.randrange(len(queues)) if queues else 0
            self._queue_cycle = itertools.islice(itertools.cycle(queues), start, None)

    def heartbeat_all(self) -> None:
        super().heartbeat_all()
        self.rebalance()

    def rebalance(self) -> None:
        """Take this consumer's share of the read queues (AllocateMessageQueueAveragely
        over the sorted consumer ids of the group, as the first broker reports them)."""
        self._rebalance_due = False
        if not self.settings.rebalance or self.route is None:
            return
        addrs = sorted(set(a for _n, a, _q in self.all_queues))
        if not addrs:
            self._use_queues([])
            return
        group = self.settings.consumer_group
        with self.timed("GET_CONSUMER_LIST_BY_GROUP", broker=addrs[0]) as req:
            client = self._client(addrs[0])
            self.on_wire(req, client)
            ids = client.consumer_ids(group)
            req["response_length"] = client.last_response_bytes
        if not self._succeeded(req, addrs[0]):
            return
        self._use_queues(allocate_averagely(self.all_queues, sorted(ids), self.client_id))

    @property
    def _notified(self) -> bool:
        """A broker told us the group's membership changed (NOTIFY_CONSUMER_IDS_CHANGED)."""
        seen = False
        for client in self.brokers.values():
            if any(r.code == NOTIFY_CONSUMER_IDS_CHANGED for r in client.server_requests):
                seen = True
                client.server_requests.clear()
        return seen

    def _initial_offset(self, addr: str, key: tuple) -> int | None:
        s = self.settings
        queue_id = key[1]
        with self.timed("QUERY_CONSUMER_OFFSET", broker=addr) as req:
            client = self._client(addr)
            self.on_wire(req, client, resource=s.topic)
            offset = client.query_offset(s.consumer_group, s.topic, queue_id)
            req["response_length"] = client.last_response_bytes
        if not self._succeeded(req, addr):
            return None
        if offset is None:  # QUERY_NOT_FOUND: the group has not committed this queue yet
            if s.start == "first":
                offset = 0
            else:
                with self.timed("GET_MAX_OFFSET", broker=addr) as req:
                    client = self._client(addr)
                    self.on_wire(req, client, resource=s.topic)
                    offset = client.get_max_offset(s.topic, queue_id)
                    req["response_length"] = client.last_response_bytes
                if not self._succeeded(req, addr):
                    return None
        else:
            self.committed[key] = offset
        return offset

    @task
    def pull(self) -> None:
        if (self._rebalance_due or self._notified) and self.route is not None:
            self.rebalance()
        if not self.maintain():
            if self.route is not None:  # routed, but no queue is ours: idle a little
                time.sleep(min(1.0, self.settings.timeout))
                self._rebalance_due = True
            return
        s = self.settings
        broker_name, addr, queue_id = next(self._queue_cycle)
        key = (broker_name, queue_id)
        offset = self.offsets.get(key)
        if offset is None:
            offset = self._initial_offset(addr, key)
            if offset is None:
                return
            self.offsets[key] = offset
        with self.timed("PULL_MESSAGE", broker=addr) as req:
            client = self._client(addr)
            self.on_wire(req, client, resource=s.topic)
            result = client.pull(s.topic, s.consumer_group, queue_id, offset,
                                 max_nums=s.pull_batch, suspend_ms=s.pull_suspend_ms)
            req["response_length"] = sum(len(m.body) for m in result.messages)
            self.frame_fields(req, messages=len(result.messages))
        if self._succeeded(req, addr):
            self.offsets[key] = result.next_begin_offset
            self.received_messages += len(result.messages)
        if time.monotonic() >= self._next_commit:
            self.commit_offsets()

    def commit_offsets(self) -> None:
        """UPDATE_CONSUMER_OFFSET for every queue whose offset moved since the last one."""
        s = self.settings
        self._next_commit = time.monotonic() + s.commit_every
        if self.route is None:
            return
        for (broker_name, queue_id), offset in sorted(self.offsets.items()):
            if self.committed.get((broker_name, queue_id)) == offset:
                continue
            addr = self.route.broker_address(broker_name)
            if addr is not None and self._commit(addr, queue_id, offset):
                self.committed[(broker_name, queue_id)] = offset

    def _commit(self, addr: str, queue_id: int, offset: int) -> bool:
        s = self.settings
        with self.timed("UPDATE_CONSUMER_OFFSET", broker=addr) as req:
            client = self._client(addr)
            self.on_wire(req, client, resource=s.topic)
            client.update_offset(s.consumer_group, s.topic, queue_id, offset,
                                 oneway=s.commit_oneway)
            if not s.commit_oneway:  # a oneway request has no response
                req["response_length"] = client.last_response_bytes
        return self._succeeded(req, addr)


def allocate_averagely(queues: list, consumer_ids: list, client_id: str) -> list:
    """Apache's ``AllocateMessageQueueAveragely``: the contiguous share of ``queues``
    (sorted) for ``client_id`` among the sorted ``consumer_ids``; [] when not listed."""
    queues = sorted(queues)
    if client_id not in consumer_ids or not queues:
        return []
    n, c = len(queues), len(consumer_ids)
    index = consumer_ids.index(client_id)
    mod = n % c
    if n <= c:
        size = 1
    elif mod > 0 and index < mod:
        size = n // c + 1
    else:
        size = n // c
    start = index * size if mod > 0 and index < mod else index * size + mod
    return [queues[(start + i) % n] for i in range(min(size, n - start))]
