"""Locust RPC users for Thrift (Kitex TTHeader by default; THeader or framed on request).

Host: Locust's ``--host`` as ``ttheader://HOST:PORT``, ``HOST:PORT`` or ``HOST`` (port 8888).

:class:`ThriftUser` calls the reference service (``frametap_demo.thrift``) with a weighted
method mix: ``getUser`` 40, ``echo`` 20, ``placeOrder`` 15, ``listUsers`` 10, ``ping`` 5, the
oneway ``log`` 5, and ``retired`` 1 (a method the server does not have: its
TApplicationException UNKNOWN_METHOD is a failure, as is a declared ``NotFound`` — about
1% of user ids do not exist). Every call fires ``environment.events.request`` with
``request_type="ttheader"``, ``name`` = the method, ``response_time`` in ms from
``perf_counter()`` (a oneway call: the time to send it), ``response_length`` = the reply
frame's bytes, failures through ``exception=``. A connection that failed is re-opened on
the next call, after a back-off while reconnections keep failing
(:class:`loadgen.userbase.Backoff`).

Client-side frame log (``--frametap-framelog DIR``): one row per call, ``correlation_id``
= the call's seq id (what the proxy correlates on), ``status`` as the proxy names the
reply's (``OK``, ``EXCEPTION``, ``UNKNOWN_METHOD``), ``kind="oneway"`` for ``log``.

Settings (environment variables, read when a user starts):

===============================  ===================================  ===========
variable                         meaning                              default
===============================  ===================================  ===========
FRAMETAP_TTHEADER_TRANSPORT      ttheader, theader or framed          ttheader
FRAMETAP_TTHEADER_PROTOCOL       binary or compact                    binary
FRAMETAP_TTHEADER_ZLIB           THeader: zlib-compress payloads      false
FRAMETAP_TTHEADER_TIMEOUT        socket timeout in seconds            10
===============================  ===================================  ===========
"""

from __future__ import annotations

import random

from locust import User, between, task

from loadgen.userbase import RequestReporter, env_bool, env_choice, env_float
from loadgen.ttheader.client import PROTOCOLS, TRANSPORTS, ThriftClient, parse_host
from loadgen.ttheader.server import USERS

__all__ = ["ThriftUser", "parse_host"]


class ThriftUser(RequestReporter, User):
    """One connection, a weighted mix of the service's methods (see the module docstring)."""

    wait_time = between(0.001, 0.01)
    request_type = "ttheader"

    def __init__(self, environment):
        super().__init__(environment)
        self.client: ThriftClient | None = None
        self._address: tuple[str, int] | None = None
        self.rng = random.Random()

    def on_start(self) -> None:
        self.transport = env_choice("FRAMETAP_TTHEADER_TRANSPORT", "ttheader", TRANSPORTS)
        self.protocol = env_choice("FRAMETAP_TTHEADER_PROTOCOL", "binary", PROTOCOLS)
        self.zlib = env_bool("FRAMETAP_TTHEADER_ZLIB", False)
        self.timeout = env_float("FRAMETAP_TTHEADER_TIMEOUT", 10.0)
        self._address = parse_host(self.host)
        with self.timed("CONNECT", quiet=True):
            self._connect()

    def on_stop(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    def _connect(self) -> ThriftClient:
        client = self.client
        if client is None or client.closed:
            host, port = self._address
            self.before_connect()        # back off while the server keeps failing
            client = ThriftClient(host, port, self.transport, self.protocol, self.timeout,
                                  zlib=self.zlib)
            self.client = client
        return client

    def _call(self, method: str, *args):
        result = None
        with self.timed(method) as req:
            client = self._connect()
            self.on_wire(req, client, resource=method)
            result = client.call(method, *args)
            req["response_length"] = client.last_response_bytes
        return result

    def _user_id(self) -> int:
        return self.rng.randint(1, USERS + USERS // 100)     # ~1% unknown: NotFound

    @task(40)
    def get_user(self) -> None:
        self._call("getUser", self._user_id())

    @task(20)
    def echo(self) -> None:
        self._call("echo", "hello %d" % self.rng.randrange(1 << 30))

    @task(15)
    def place_order(self) -> None:
        items = [self.rng.randrange(1, 5000) for _ in range(self.rng.randint(1, 6))]
        self._call("placeOrder", self._user_id(), items)

    @task(10)
    def list_users(self) -> None:
        self._call("listUsers", self.rng.randint(1, 20), {"region": "eu"})

    @task(5)
    def ping(self) -> None:
        self._call("ping")

    @task(5)
    def log(self) -> None:
        self._call("log", "user event %d" % self.rng.randrange(1 << 30))

    @task(1)
    def retired(self) -> None:
        self._call("retired")
