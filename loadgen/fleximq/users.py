"""Locust users for fleximq: requesters, responders, publishers/subscribers.

Host: Locust's ``--host`` as ``HOST:PORT``, ``tcp://HOST:PORT``, ``unix:/path``,
``ipc:///path`` (the document's IPC URL) or ``ws://HOST:PORT/PATH`` (WebSocket, one
frame per binary message).  Each user opens one connection and JOINs it
(``JOIN``, reported), with credentials from the settings when given.

``FlexiMQResponder``
    answers every REQ it receives with a REP (status 200, a small payload); it reports
    nothing itself: its work shows as the requesters' latency.  Responders of a Locust
    process register their ClientIDs for the requesters of the same process.
``FlexiMQRequester``
    ``REQ``: a REQ to a responder (one of this process's, at random) and its REP, timed end
    to end through the broker; with no responder known it addresses itself and answers
    its own REQ (so any mix of users makes traffic).  ``PING``: a PING and its PONG.
``FlexiMQPubSub``
    subscribes to the shared topic; ``PUB``: publishes to it and times until its own
    message is delivered back (PUB -> delivery through the broker).

Every request fires ``environment.events.request`` with ``request_type="fleximq"``,
``name`` = the message type (``JOIN``, ``REQ``, ``PING``, ``PUB``), the time measured
with ``perf_counter()`` (:func:`loadgen.userbase.RequestReporter.timed`) and non-2xx
statuses, socket errors and timeouts as failures.  With the client-side frame log on,
each is a row whose ``correlation_id`` is what the proxy writes for the frame
(constants.log_correlation_id): the ``reqrep.id`` (a ULID) for JOIN and REQ, ``ping:<timestamp>``
for PING, none for PUB (kind ``oneway``).

Settings (environment variables, read when a user starts):

==============================  ==========================================  ===========
variable                        meaning                                     default
==============================  ==========================================  ===========
FRAMETAP_FLEXIMQ_PAYLOAD_SIZE   bytes of the REQ / PUB payload              256
FRAMETAP_FLEXIMQ_PATHS          comma-separated routing paths of REQs       /api/users,/api/orders
FRAMETAP_FLEXIMQ_TOPIC          the PubSub users' topic                     frametap.events
FRAMETAP_FLEXIMQ_TOKEN          JOIN with token auth                        (none)
FRAMETAP_FLEXIMQ_USER /         JOIN with basic auth                        (none)
FRAMETAP_FLEXIMQ_PASSWORD
FRAMETAP_FLEXIMQ_API_KEY        JOIN with api_key auth                      (none)
FRAMETAP_FLEXIMQ_TIMEOUT        seconds to wait for an answer               10
==============================  ==========================================  ===========
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

from locust import User, between, constant, task

from loadgen.userbase import RequestReporter, env_float, env_int
from loadgen.fleximq.client import FlexiMQClient
from proxy.protocols.fleximq.codec import PUB, REQ

__all__ = ["FlexiMQUser", "FlexiMQRequester", "FlexiMQResponder", "FlexiMQPubSub",
           "FlexiMQSettings", "parse_host"]

#: ClientIDs of this process's responders (requesters pick from them)
RESPONDERS: list[int] = []


def parse_host(host: str | None) -> str:
    """Locust's --host as the client's address text (``h:p`` or ``unix:/path``):
    ``tcp://H:P``, ``fleximq://H:P``, ``ipc:///path``, ``unix:/path``, ``H:P`` or ``H``
    (port 7890); ValueError for anything else (checked as the proxy checks addresses)."""
    if not host:
        raise ValueError("fleximq: --host is required (HOST:PORT, unix:/path or "
                         "ws://HOST:PORT/PATH)")
    text = host.strip()
    if text.lower().startswith(("ws://", "wss://")):      # fleximq over WebSocket (§6.1)
        from proxy import websocket
        from proxy.errors import ConfigError
        try:
            websocket.parse_url(text, "--host")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return text
    if text.startswith("ipc://"):
        text = "unix:" + text[len("ipc://"):]
    else:
        scheme, sep, rest = text.partition("://")
        if sep:
            if scheme.lower() not in ("tcp", "fleximq"):
                raise ValueError(f"host {host!r}: expected scheme tcp://, fleximq:// or "
                                 f"ipc:// (or HOST:PORT, unix:/path)")
            text = rest.rstrip("/")
        if ":" not in text.replace("unix:", "", 1) and not text.startswith("unix:"):
            text += ":7890"
    from proxy.addresses import parse_address
    from proxy.errors import ConfigError
    try:
        parse_address(text, "--host", allow_unix=True)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return text


@dataclass
class FlexiMQSettings:
    payload_size: int = 256
    paths: tuple = ("/api/users", "/api/orders")
    topic: str = "frametap.events"
    auth: dict | None = None
    timeout: float = 10.0

    @classmethod
    def from_env(cls) -> "FlexiMQSettings":
        env = os.environ.get
        paths = tuple(p.strip() for p in env("FRAMETAP_FLEXIMQ_PATHS",
                                             "/api/users,/api/orders").split(",") if p.strip())
        auth = None
        if env("FRAMETAP_FLEXIMQ_TOKEN"):
            auth = {"type": "token", "token": env("FRAMETAP_FLEXIMQ_TOKEN")}
        elif env("FRAMETAP_FLEXIMQ_USER"):
            auth = {"type": "basic", "username": env("FRAMETAP_FLEXIMQ_USER"),
                    "password": env("FRAMETAP_FLEXIMQ_PASSWORD", "")}
        elif env("FRAMETAP_FLEXIMQ_API_KEY"):
            auth = {"type": "api_key", "api_key": env("FRAMETAP_FLEXIMQ_API_KEY")}
        return cls(payload_size=env_int("FRAMETAP_FLEXIMQ_PAYLOAD_SIZE", 256, minimum=0),
                   paths=paths or ("/",),
                   topic=env("FRAMETAP_FLEXIMQ_TOPIC", "").strip() or "frametap.events",
                   auth=auth, timeout=env_float("FRAMETAP_FLEXIMQ_TIMEOUT", 10.0))


class FlexiMQUser(RequestReporter, User):
    """Abstract: one joined :class:`FlexiMQClient` (reconnected and re-joined after a
    failure, on the next task, after a back-off while that keeps failing:
    :class:`loadgen.userbase.Backoff`)."""

    abstract = True
    wait_time = between(0.001, 0.01)
    request_type = "fleximq"

    def __init__(self, environment):
        super().__init__(environment)
        self.client: FlexiMQClient | None = None
        self.settings: FlexiMQSettings | None = None
        self.payload = b""

    def on_start(self) -> None:
        self.settings = FlexiMQSettings.from_env()
        self.address = parse_host(self.host)
        self.payload = b"x" * self.settings.payload_size
        self._connect()

    def on_stop(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    def joined(self) -> None:
        """Called once the connection is joined (subclasses)."""

    def _connect(self) -> FlexiMQClient | None:
        client = self.client
        if client is not None and not client.closed:
            return client
        self.before_connect()            # back off while the broker keeps failing
        with self.timed("CONNECT", quiet=True):
            client = FlexiMQClient(self.address, timeout=self.settings.timeout)
        if self.last_exception is not None:
            return None
        with self.timed("JOIN") as req:
            self.on_wire(req, client)
            client.join(self.settings.auth)
        if req["exception"] is not None:
            client.close()
            return None
        self.client = client
        self.joined()
        return client


class FlexiMQResponder(FlexiMQUser):
    """Answers the REQs that reach it (see the module docstring)."""

    wait_time = constant(0)

    def joined(self) -> None:
        RESPONDERS.append(self.client.client_id)

    def on_stop(self) -> None:
        if self.client is not None and self.client.client_id in RESPONDERS:
            RESPONDERS.remove(self.client.client_id)
        super().on_stop()

    @task
    def serve(self) -> None:
        client = self._connect()
        if client is None:
            return
        try:
            req = client.next_request(timeout=0.5)
        except TimeoutError:
            return
        except (ConnectionError, OSError):
            self._forget()
            return
        client.reply(req, {"ok": True, "n": len(req.payload)})
        # nothing but REQs is waited for here; a REQ that came in the same read as this
        # one is answered next (clearing it cost its requester a 10 s timeout)
        client.discard(keep=lambda f: f.type == REQ)

    def _forget(self) -> None:
        if self.client is not None and self.client.client_id in RESPONDERS:
            RESPONDERS.remove(self.client.client_id)
        if self.client is not None:
            self.client.close()
        self.client = None


class FlexiMQRequester(FlexiMQUser):
    """REQ/REP end to end, and PING."""

    @task(10)
    def request(self) -> None:
        client = self._connect()
        if client is None:
            return
        target = random.choice(RESPONDERS) if RESPONDERS else client.client_id
        path = random.choice(self.settings.paths)
        with self.timed("REQ") as req:
            self.on_wire(req, client, resource=path, messages=2)
            rid = client.send_request(target, path, self.payload)
            if target == client.client_id:     # no responder: answer ourselves
                own = client.wait(lambda f: f.type == REQ and f.rid == rid)
                client.reply(own, {"ok": True})
            rep = client.wait_reply(rid)
            req["response_length"] = len(rep.payload)
        client.inbox.clear()
        if req["exception"] is not None and client.closed:
            self.client = None

    @task(1)
    def ping(self) -> None:
        client = self._connect()
        if client is None:
            return
        with self.timed("PING") as req:
            self.on_wire(req, client)
            client.ping()
        if req["exception"] is not None and client.closed:
            self.client = None


class FlexiMQPubSub(FlexiMQUser):
    """SUB to the shared topic, then PUB -> delivery of its own message."""

    def joined(self) -> None:
        self.client.subscribe(self.settings.topic)
        self.seq = 0

    @task
    def publish(self) -> None:
        client = self._connect()
        if client is None:
            return
        self.seq += 1
        marker = (client.client_id, self.seq)
        topic = self.settings.topic
        with self.timed("PUB") as req:
            self.on_wire(req, client, resource=topic, messages=1)
            client.publish(topic, {"from": marker[0], "seq": marker[1], "data": self.payload})

            def mine(f):
                if f.type != PUB or f.client_id != marker[0]:
                    return False
                body = f.body()
                return isinstance(body, dict) and body.get("seq") == marker[1]
            got = client.wait(mine)
            req["response_length"] = len(got.payload)
        client.inbox.clear()                   # other publishers' messages
        if req["exception"] is not None and client.closed:
            self.client = None
