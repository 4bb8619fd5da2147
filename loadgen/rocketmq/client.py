"""Synchronous RocketMQ remoting client over a plain ``socket`` (gevent-patchable, used by Locust).

Wire format (docs/design.md, "RocketMQ remoting"; Apache ``RemotingCommand``): every frame is
``length u32 | header-length word u32 | header | body`` where ``length`` counts everything
after itself, the header-length word's high byte is the serialization type (0 JSON,
1 ROCKETMQ binary) and its low 24 bits the header length. Requests and responses are
matched by ``opaque`` (one counter per connection, incremented per request); ``flag``
bit 0 marks a response, bit 1 a oneway request.

One :class:`RocketMQClient` is one TCP connection, to a name server or to a broker:

* name server: :meth:`~RocketMQClient.get_route` (GET_ROUTEINFO_BY_TOPIC);
* broker: :meth:`~RocketMQClient.send` (SEND_MESSAGE_V2 with the short ``a``..``n``
  header keys, or SEND_MESSAGE with the long ones), :meth:`~RocketMQClient.send_batch`
  (SEND_BATCH_MESSAGE), :meth:`~RocketMQClient.pull` (PULL_MESSAGE),
  :meth:`~RocketMQClient.update_offset`, :meth:`~RocketMQClient.query_offset`,
  :meth:`~RocketMQClient.get_max_offset`, :meth:`~RocketMQClient.heartbeat`,
  :meth:`~RocketMQClient.consumer_ids`, :meth:`~RocketMQClient.unregister`;
  :meth:`~RocketMQClient.request` for anything else.

Ext-field values go out as strings (what the Java client's ``HashMap<String, String>``
sends); values that arrive as JSON numbers or booleans (C++/Go peers) are turned into
strings on decode, so callers always see ``str``.

Requests the server sends on its own (NOTIFY_CONSUMER_IDS_CHANGED,
CHECK_TRANSACTION_STATE, GET_CONSUMER_RUNNING_INFO...) are recorded in
``server_requests``; unless oneway they are answered: SUCCESS for
NOTIFY_CONSUMER_IDS_CHANGED, REQUEST_CODE_NOT_SUPPORTED otherwise.

Errors: a response code other than SUCCESS raises :class:`RocketMQServerError` (the
connection stays usable) where the method has no defined meaning for it (e.g.
:meth:`~RocketMQClient.pull` turns PULL_NOT_FOUND into ``NO_NEW_MSG``); a malformed frame
raises :class:`RocketMQProtocolError` and a socket error or EOF ``OSError`` /
``ConnectionError`` - after those the connection is closed and later calls raise
``ConnectionError``. No response within ``timeout`` raises ``TimeoutError``; the
connection stays open and a late answer is dropped by opaque.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import NamedTuple

from loadgen import clientbase
from proxy.protocols.rocketmq.codec import (
    Message,
    RemotingCommand,
    RocketMQCodecError,
    StoredMessage,
    TopicRouteData,
    decode,
    decode_stored_messages,
    decode_topic_route,
    encode,
    encode_message_batch,
    encode_properties,
    loads_java_json,
)

from proxy.protocols.rocketmq.constants import (
    DEFAULT_NAMESRV_PORT,
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    GET_CONSUMER_LIST_BY_GROUP,
    GET_MAX_OFFSET,
    GET_ROUTEINFO_BY_TOPIC,
    HEART_BEAT,
    MAX_FRAME_BYTES,
    NOTIFY_CONSUMER_IDS_CHANGED,
    PERM_READ,
    PERM_WRITE,
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    PULL_MESSAGE,
    PULL_NOT_FOUND,
    PULL_OFFSET_MOVED,
    PULL_RETRY_IMMEDIATELY,
    QUERY_CONSUMER_OFFSET,
    QUERY_NOT_FOUND,
    REQUEST_CODE_NOT_SUPPORTED,
    SEND_BATCH_MESSAGE,
    SEND_MESSAGE,
    SEND_MESSAGE_V2,
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    SUCCESS,
    UNREGISTER_CLIENT,
    UPDATE_CONSUMER_OFFSET,
    request_name,
    response_name,
)

__all__ = [
    "RocketMQClient", "RemotingCommand", "StoredMessage", "RocketMQError",
    "RocketMQServerError", "RocketMQProtocolError", "TopicRoute", "SendResult",
    "PullResult", "parse_host", "parse_route", "command_name", "new_unique_key",
    "DEFAULT_TOPIC", "SEND_STATUS",
]

#: Topic whose route a producer uses when its own topic does not exist yet
#: (the broker creates the topic on the first send: ``autoCreateTopicEnable``).
DEFAULT_TOPIC = "TBW102"
#: Client version sent in headers (MQVersion.Version.V4_9_4 ordinal).
DEFAULT_VERSION = 433

#: SendResult status names for the response codes a send can succeed with
#: (Apache ``SendStatus``; ``MQClientAPIImpl.processSendResponse``).
SEND_STATUS = {0: "SEND_OK", 10: "FLUSH_DISK_TIMEOUT", 12: "FLUSH_SLAVE_TIMEOUT",
               11: "SLAVE_NOT_AVAILABLE"}

# PullStatus by pull response code (MQClientAPIImpl.processPullResponse).
_PULL_STATUS = {SUCCESS: "FOUND", PULL_NOT_FOUND: "NO_NEW_MSG",
                PULL_RETRY_IMMEDIATELY: "NO_MATCHED_MSG", PULL_OFFSET_MOVED: "OFFSET_ILLEGAL"}



def parse_host(host: str | None, default_port: int = DEFAULT_NAMESRV_PORT) -> tuple[str, int]:
    """``rocketmq://h:p``, ``h:p`` or ``h`` -> ``(h, p)``; ValueError otherwise."""
    return clientbase.parse_host(host, ("rocketmq",), default_port,
                                 "RocketMQ users need a name server: run Locust with --host "
                                 "HOST:PORT (or rocketmq://HOST:PORT)")


# ---------------------------------------------------------------------- errors

class RocketMQError(Exception):
    """Base class of this client's errors; ``request`` names the request involved."""

    request: str | None = None


class RocketMQServerError(RocketMQError):
    """A response carried a code this call does not accept."""

    def __init__(self, request: str, code: int, remark: str | None = ""):
        self.request = request
        self.code = code
        self.status = response_name(code)
        self.remark = remark or ""
        super().__init__(f"rocketmq: {request} failed: {self.status} ({code})"
                         f"{': ' + self.remark if self.remark else ''}")


class RocketMQProtocolError(RocketMQError, ValueError):
    """The peer sent something this client cannot parse."""


# ---------------------------------------------------------------------- commands

def _ext_int(cmd: RemotingCommand, key: str, default: int | None = None) -> int | None:
    """Integer ext field ``key`` of ``cmd`` (``default`` when absent or empty)."""
    text = cmd.ext_fields.get(key)
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise RocketMQProtocolError(f"rocketmq: {command_name(cmd)}: ext field {key}="
                                    f"{text!r} is not an integer") from None


def command_name(cmd: RemotingCommand) -> str:
    """Apache's name of ``cmd.code`` (the response table for responses)."""
    return response_name(cmd.code) if cmd.is_response else request_name(cmd.code)


# ---------------------------------------------------------------------- route data

@dataclass
class TopicRoute:
    """A topic's route data (codec :class:`TopicRouteData`) with queue helpers."""

    topic: str
    data: TopicRouteData

    def broker_address(self, broker_name: str) -> str | None:
        """The master's (id 0) address of ``broker_name``, else any replica's."""
        for bd in self.data.broker_datas:
            if bd.broker_name == broker_name:
                addrs = bd.broker_addrs
                return addrs.get(0) or next(iter(addrs.values()), None)
        return None

    @property
    def brokers(self) -> dict:
        """broker name -> master address."""
        return {bd.broker_name: self.broker_address(bd.broker_name)
                for bd in self.data.broker_datas}

    def _queues(self, write: bool) -> list:
        out = []
        for qd in sorted(self.data.queue_datas, key=lambda q: q.broker_name or ""):
            addr = self.broker_address(qd.broker_name)
            if addr is None or not qd.perm & (PERM_WRITE if write else PERM_READ):
                continue
            count = qd.write_queue_nums if write else qd.read_queue_nums
            out += [(qd.broker_name, addr, i) for i in range(count)]
        return out

    def write_queues(self) -> list:
        """``[(broker name, broker address, queue id)]`` a producer can send to."""
        return self._queues(write=True)

    def read_queues(self) -> list:
        """``[(broker name, broker address, queue id)]`` a consumer can pull from."""
        return self._queues(write=False)


def parse_route(topic: str, body: bytes) -> TopicRoute:
    """TopicRoute from a GET_ROUTEINFO_BY_TOPIC response body."""
    try:
        return TopicRoute(topic, decode_topic_route(body))
    except RocketMQCodecError as exc:
        raise RocketMQProtocolError(f"rocketmq: route data for {topic!r}: {exc}") from None


# ---------------------------------------------------------------------- results

class SendResult(NamedTuple):
    status: str              # SEND_OK, FLUSH_DISK_TIMEOUT, ...
    msg_id: str              # the UNIQ_KEY (client message id); comma list for a batch
    offset_msg_id: str       # the broker's msgId (store host + commit-log offset)
    queue_id: int
    queue_offset: int


class PullResult(tuple):
    """``(status, next_begin_offset, messages)``; also ``.min_offset``, ``.max_offset``,
    ``.suggest_broker_id``. status: FOUND, NO_NEW_MSG, NO_MATCHED_MSG, OFFSET_ILLEGAL."""

    def __new__(cls, status, next_begin_offset, messages, min_offset=0, max_offset=0,
                suggest_broker_id=0):
        self = super().__new__(cls, (status, next_begin_offset, messages))
        self.min_offset = min_offset
        self.max_offset = max_offset
        self.suggest_broker_id = suggest_broker_id
        return self

    status = property(lambda self: self[0])
    next_begin_offset = property(lambda self: self[1])
    messages = property(lambda self: self[2])


_UNIQ_COUNTER = itertools.count(int.from_bytes(os.urandom(2), "big"))
_UNIQ_LOCK = threading.Lock()


def new_unique_key() -> str:
    """A 32-hex-digit client message id shaped like MessageClientIDSetter's: ip(4)
    pid(2) class hash(4) | time since start of month in ms(4) counter(2)."""
    with _UNIQ_LOCK:
        counter = next(_UNIQ_COUNTER) & 0xFFFF
    try:
        ip = socket.inet_aton(socket.gethostbyname(socket.gethostname()))
    except OSError:
        ip = b"\x7f\x00\x00\x01"
    now = time.time()
    t = time.gmtime(now)
    month_start = time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, 0)) - time.timezone
    return (ip + struct.pack(">H", os.getpid() & 0xFFFF) + b"FTAP"
            + struct.pack(">IH", int((now - month_start) * 1000) & 0xFFFFFFFF, counter)
            ).hex().upper()


# ---------------------------------------------------------------------- client

class RocketMQClient(clientbase.SocketClient):
    """One remoting connection (name server or broker), opened in the constructor.

    ``serialize``: ``"json"`` or ``"rocketmq"`` (binary header) for requests.
    ``last_response_bytes``: size of the last response frame (for Locust).
    """

    what = "rocketmq"

    def __init__(self, host: str, port: int, timeout: float = 10.0,
                 serialize: str = "json", language: str = "PYTHON",
                 version: int = DEFAULT_VERSION, tls=clientbase.DEFAULT_TLS):
        if serialize not in ("json", "rocketmq"):
            raise ValueError(f"serialize={serialize!r}: expected 'json' or 'rocketmq'")
        self.host, self.port = host, int(port)
        self.timeout = timeout
        self.serialize_type = SERIALIZE_JSON if serialize == "json" else SERIALIZE_ROCKETMQ
        self.language = language
        self.version = version
        self._opaque = itertools.count(1)
        self._sock: socket.socket | None = None
        self.server_requests: list = []     # RemotingCommands the server sent us
        self.last_response_bytes = 0
        sock = clientbase.connect_tcp(host, self.port, timeout, tls)   # TLS: loadgen.tlsopts
        self._sock = sock
        self._connected(sock)   # conn_id, local_address (``ip:port``, ``[v6]:port``)

    # ------------------------------------------------------------------ plumbing

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def split_frame(self, buf):
        return decode(buf, max_frame_bytes=MAX_FRAME_BYTES)

    def bad_frame(self, exc: ValueError) -> Exception:
        return RocketMQProtocolError(f"rocketmq: from {self.address}: {exc}")

    def _answer_server_request(self, cmd: RemotingCommand) -> None:
        self.server_requests.append(cmd)
        del self.server_requests[:-100]  # keep the last 100
        if cmd.is_oneway:
            return
        if cmd.code == NOTIFY_CONSUMER_IDS_CHANGED:
            code, remark = SUCCESS, None
        else:
            code, remark = REQUEST_CODE_NOT_SUPPORTED, (
                f"frametap load client does not handle {request_name(cmd.code)}")
        self._send_frame(encode(RemotingCommand(
            code=code, opaque=cmd.opaque, flag=FLAG_RESPONSE, language=self.language,
            version=self.version, remark=remark, serialize_type=cmd.serialize_type)))

    def request(self, code: int, ext_fields: dict | None = None, body: bytes = b"",
                oneway: bool = False, timeout: float | None = None) -> RemotingCommand | None:
        """Send request ``code`` and return its response (None when ``oneway``).

        Does not look at the response code: the typed methods below do.
        """
        opaque = next(self._opaque) & 0x7FFFFFFF
        cmd = RemotingCommand(code=code, opaque=opaque, flag=FLAG_ONEWAY if oneway else 0,
                              language=self.language, version=self.version,
                              ext_fields=ext_fields or {}, body=body or b"",
                              serialize_type=self.serialize_type)
        self._send_frame(encode(cmd))
        # the proxy's correlation id: opaque as a signed decimal (an i32 on the wire)
        sent = self._sent(str(opaque), code, request_name(code),
                          "oneway" if oneway else "request")
        if oneway:
            return None
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            frame = self._read_frame(deadline)
            if frame is None:
                raise TimeoutError(f"rocketmq: no response from {self.address} within "
                                   f"{self.timeout} s")
            self.last_response_bytes = self.frame_bytes
            if not frame.is_response:
                self._answer_server_request(frame)
                continue
            if frame.opaque == opaque:
                sent.status = response_name(frame.code)
                return frame
            # a late response to a request that timed out: drop it

    def _call(self, code: int, ext_fields: dict, body: bytes = b"",
              ok=(SUCCESS,), timeout: float | None = None) -> RemotingCommand:
        resp = self.request(code, ext_fields, body, timeout=timeout)
        if resp.code not in ok:
            raise RocketMQServerError(request_name(code), resp.code, resp.remark)
        return resp

    # ------------------------------------------------------------------ name server

    def get_route(self, topic: str) -> TopicRoute:
        """GET_ROUTEINFO_BY_TOPIC; RocketMQServerError TOPIC_NOT_EXIST (17) when unknown."""
        resp = self._call(GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        return parse_route(topic, resp.body)

    # ------------------------------------------------------------------ broker

    def send(self, topic: str, body: bytes, queue_id: int, keys: str | None = None,
             tags: str | None = None, properties: dict | None = None, v2: bool = True,
             producer_group: str = "frametap-producer", default_topic: str = DEFAULT_TOPIC,
             default_topic_queues: int = 4, sys_flag: int = 0, flag: int = 0,
             broker_name: str | None = None, wait_store: bool = True) -> SendResult:
        """SEND_MESSAGE_V2 (short keys ``a``..``n``) or, with ``v2=False``, SEND_MESSAGE.

        The properties carry KEYS, TAGS, a fresh UNIQ_KEY and WAIT like the Java client's.
        """
        props = {}
        if keys:
            props["KEYS"] = keys
        if tags:
            props["TAGS"] = tags
        props["UNIQ_KEY"] = unique = new_unique_key()
        props["WAIT"] = "true" if wait_store else "false"
        props.update(properties or {})
        header = self._send_header(producer_group, topic, default_topic, default_topic_queues,
                                   queue_id, sys_flag, flag, encode_properties(props),
                                   False, broker_name, v2)
        code = SEND_MESSAGE_V2 if v2 else SEND_MESSAGE
        resp = self._call(code, header, body, ok=tuple(SEND_STATUS))
        return self._send_result(resp, unique, queue_id)

    def send_batch(self, topic: str, bodies: list, queue_id: int, keys: list | None = None,
                   tags: str | None = None, producer_group: str = "frametap-producer",
                   default_topic: str = DEFAULT_TOPIC, default_topic_queues: int = 4,
                   broker_name: str | None = None) -> SendResult:
        """SEND_BATCH_MESSAGE (V2 header, ``m`` = batch) of ``bodies``; ``msg_id`` is the
        comma-separated list of the messages' UNIQ_KEYs."""
        if not bodies:
            raise ValueError("rocketmq: send_batch needs at least one body")
        per_message, uniques = [], []
        for i in range(len(bodies)):
            props = {}
            if keys and i < len(keys) and keys[i]:
                props["KEYS"] = keys[i]
            if tags:
                props["TAGS"] = tags
            props["UNIQ_KEY"] = u = new_unique_key()
            props["WAIT"] = "true"
            uniques.append(u)
            per_message.append(props)
        header = self._send_header(producer_group, topic, default_topic, default_topic_queues,
                                   queue_id, 0, 0, "", True, broker_name, True)
        body = encode_message_batch(Message(b, properties=p) for b, p in zip(bodies, per_message))
        resp = self._call(SEND_BATCH_MESSAGE, header, body,
                          ok=tuple(SEND_STATUS))
        return self._send_result(resp, ",".join(uniques), queue_id)

    @staticmethod
    def _send_header(group, topic, default_topic, default_queues, queue_id, sys_flag, flag,
                     props, batch, broker_name, v2) -> dict:
        born = int(time.time() * 1000)
        if v2:
            # SendMessageRequestHeaderV2: a producerGroup, b topic, c defaultTopic,
            # d defaultTopicQueueNums, e queueId, f sysFlag, g bornTimestamp, h flag,
            # i properties, j reconsumeTimes, k unitMode, m batch, n brokerName
            header = {"a": group, "b": topic, "c": default_topic, "d": default_queues,
                      "e": queue_id, "f": sys_flag, "g": born, "h": flag, "i": props,
                      "j": 0, "k": False, "m": batch}
            if broker_name:
                header["n"] = broker_name
        else:
            header = {"producerGroup": group, "topic": topic, "defaultTopic": default_topic,
                      "defaultTopicQueueNums": default_queues, "queueId": queue_id,
                      "sysFlag": sys_flag, "bornTimestamp": born, "flag": flag,
                      "properties": props, "reconsumeTimes": 0, "unitMode": False,
                      "batch": batch}
            if broker_name:
                header["brokerName"] = broker_name
        return header

    @staticmethod
    def _send_result(resp: RemotingCommand, unique: str, queue_id: int) -> SendResult:
        return SendResult(SEND_STATUS[resp.code], unique, resp.ext_fields.get("msgId", ""),
                          _ext_int(resp, "queueId", queue_id), _ext_int(resp, "queueOffset", -1))

    def pull(self, topic: str, group: str, queue_id: int, offset: int, max_nums: int = 32,
             subscription: str = "*", commit_offset: int | None = None,
             suspend_ms: int = 0, timeout: float | None = None) -> PullResult:
        """PULL_MESSAGE -> ``(status, next_begin_offset, messages)``.

        ``suspend_ms`` > 0 asks the broker to hold the pull that long when there is
        nothing new (long polling); ``commit_offset`` also commits the group's offset.
        """
        sys_flag = PULL_FLAG_SUBSCRIPTION
        if suspend_ms > 0:
            sys_flag |= PULL_FLAG_SUSPEND
        if commit_offset is not None:
            sys_flag |= PULL_FLAG_COMMIT_OFFSET
        header = {"consumerGroup": group, "topic": topic, "queueId": queue_id,
                  "queueOffset": offset, "maxMsgNums": max_nums, "sysFlag": sys_flag,
                  "commitOffset": commit_offset if commit_offset is not None else 0,
                  "suspendTimeoutMillis": suspend_ms, "subscription": subscription,
                  "subVersion": 0, "expressionType": "TAG"}
        if timeout is None:
            timeout = self.timeout + suspend_ms / 1000.0
        resp = self._call(PULL_MESSAGE, header, ok=tuple(_PULL_STATUS), timeout=timeout)
        status = _PULL_STATUS[resp.code]
        messages = []
        if resp.code == SUCCESS and resp.body:
            try:
                messages = decode_stored_messages(resp.body)
            except RocketMQCodecError as exc:
                raise RocketMQProtocolError(f"rocketmq: PULL_MESSAGE body: {exc}") from None
        return PullResult(status, _ext_int(resp, "nextBeginOffset", offset), messages,
                          _ext_int(resp, "minOffset", 0), _ext_int(resp, "maxOffset", 0),
                          _ext_int(resp, "suggestWhichBrokerId", 0))

    def update_offset(self, group: str, topic: str, queue_id: int, offset: int,
                      oneway: bool = False) -> None:
        """UPDATE_CONSUMER_OFFSET (oneway, like the Java client's persistAll, on request)."""
        header = {"consumerGroup": group, "topic": topic, "queueId": queue_id,
                  "commitOffset": offset}
        if oneway:
            self.request(UPDATE_CONSUMER_OFFSET, header, oneway=True)
        else:
            self._call(UPDATE_CONSUMER_OFFSET, header)

    def query_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        """QUERY_CONSUMER_OFFSET: the group's committed offset, None when QUERY_NOT_FOUND."""
        resp = self._call(QUERY_CONSUMER_OFFSET,
                          {"consumerGroup": group, "topic": topic, "queueId": queue_id},
                          ok=(SUCCESS, QUERY_NOT_FOUND))
        if resp.code == QUERY_NOT_FOUND:
            return None
        return _ext_int(resp, "offset", 0)

    def get_max_offset(self, topic: str, queue_id: int) -> int:
        """GET_MAX_OFFSET: the queue's next offset (number of messages ever stored)."""
        resp = self._call(GET_MAX_OFFSET, {"topic": topic, "queueId": queue_id})
        return _ext_int(resp, "offset", 0)

    def heartbeat(self, client_id: str, producer_groups=(), consumer_groups=None,
                  consume_type: str = "CONSUME_ACTIVELY") -> RemotingCommand:
        """HEART_BEAT with a HeartbeatData body. ``consumer_groups``: a mapping group ->
        topics subscribed with ``*`` (or an iterable of group names, no subscriptions)."""
        if consumer_groups is None:
            consumer_groups = {}
        elif not isinstance(consumer_groups, dict):
            consumer_groups = {g: () for g in consumer_groups}
        now = int(time.time() * 1000)
        data = {
            "clientID": client_id,
            "producerDataSet": [{"groupName": g} for g in producer_groups],
            "consumerDataSet": [{
                "groupName": g, "consumeType": consume_type, "messageModel": "CLUSTERING",
                "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
                "subscriptionDataSet": [{
                    "classFilterMode": False, "topic": t, "subString": "*", "tagsSet": [],
                    "codeSet": [], "subVersion": now, "expressionType": "TAG"}
                    for t in topics]}
                for g, topics in consumer_groups.items()],
        }
        return self._call(HEART_BEAT, {}, json.dumps(data, separators=(",", ":")).encode())

    def consumer_ids(self, group: str) -> list:
        """GET_CONSUMER_LIST_BY_GROUP: client ids of the group's live consumers (Apache
        answers SYSTEM_ERROR when there are none)."""
        resp = self._call(GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
        try:
            ids = loads_java_json(resp.body, what="consumer list").get("consumerIdList")
        except (RocketMQCodecError, AttributeError) as exc:
            raise RocketMQProtocolError(f"rocketmq: GET_CONSUMER_LIST_BY_GROUP body: "
                                        f"{exc}") from None
        return [str(i) for i in ids or []]

    def unregister(self, client_id: str, producer_group: str | None = None,
                   consumer_group: str | None = None) -> None:
        """UNREGISTER_CLIENT (what a client sends on shutdown)."""
        header = {"clientID": client_id}
        if producer_group:
            header["producerGroup"] = producer_group
        if consumer_group:
            header["consumerGroup"] = consumer_group
        self._call(UNREGISTER_CLIENT, header)
