"""Reference RocketMQ name server + broker (asyncio, uvloop when installed).

``frametap serve rocketmq`` runs both in one process on two listeners, in memory. They
speak Apache RocketMQ's remoting protocol (:mod:`proxy.protocols.rocketmq.codec`): every
response answers in the serialization the request used (JSON or ROCKETMQ binary header),
with ``flag`` = 1 and the request's opaque; oneway requests (flag bit 1) get no response.

Name server (``namesrv_port``)
    * GET_ROUTEINFO_BY_TOPIC: TopicRouteData as the Java name server writes it (fastjson,
      ``"brokerAddrs":{0:"<advertised broker>"}``), one broker group with ``queues``
      read and write queues, perm 6. Unknown topics are created on first lookup
      (``auto_create_topics``, default on; off: TOPIC_NOT_EXIST with Apache's remark).
    * GET_BROKER_CLUSTER_INFO (ClusterInfo JSON), GET_ALL_TOPIC_LIST_FROM_NAMESERVER
      (``{"topicList":[...]}``), HEART_BEAT / UNREGISTER_CLIENT (SUCCESS).
    * Anything else: REQUEST_CODE_NOT_SUPPORTED, remark ``" request type N not supported"``.

Broker (``broker_port``)
    * SEND_MESSAGE (V1 header names), SEND_MESSAGE_V2 (short keys ``a``..``n``) and
      SEND_BATCH_MESSAGE (MessageDecoder batch body): messages go into an in-memory
      commit log per (topic, queue); the SendMessageResponseHeader extFields carry the real
      offset ``msgId`` (store host + port + commit-log offset, comma-joined for a batch),
      ``queueId``, ``queueOffset`` (the first message's for a batch) and ``transactionId``
      (the UNIQ_KEY property), plus ``MSG_REGION`` / ``TRACE_ON`` as Apache adds. A queue id
      below 0 picks a queue round robin; one at or above ``queues`` is SYSTEM_ERROR.
      Sends to an unknown topic create it (Apache's ``autoCreateTopicEnable``, on by
      default; off: TOPIC_NOT_EXIST).
    * PULL_MESSAGE: SUCCESS with the stored messages in commit-log format (at most
      ``min(maxMsgNums, max_pull_messages)``), PULL_NOT_FOUND (queue empty, or offset at
      the end), PULL_OFFSET_MOVED (offset before the first kept message or past the end),
      PULL_RETRY_IMMEDIATELY (no message in the scanned range matches the subscription's
      tags); extFields nextBeginOffset, minOffset, maxOffset, suggestWhichBrokerId 0.
      With the suspend bit set a pull that finds nothing is held until a message arrives
      or ``min(suspendTimeoutMillis, max_suspend)`` passes (a short long-poll). The
      commit-offset bit stores ``commitOffset`` for the group. Unknown topic:
      TOPIC_NOT_EXIST.
    * QUERY_CONSUMER_OFFSET (Apache's rule: no committed offset → SUCCESS 0 when the queue
      has never held a message and setZeroIfNotFound is not false, else QUERY_NOT_FOUND),
      UPDATE_CONSUMER_OFFSET (also oneway), GET_MAX_OFFSET / GET_MIN_OFFSET.
    * HEART_BEAT (body = HeartbeatData JSON): registers the client id in its producer and
      consumer groups; a change in a consumer group's membership sends oneway
      NOTIFY_CONSUMER_IDS_CHANGED to the group's other members, as Apache does.
      UNREGISTER_CLIENT and a closed connection remove the client.
      GET_CONSUMER_LIST_BY_GROUP: ``{"consumerIdList":[...]}`` (SYSTEM_ERROR when empty).
    * Anything else: REQUEST_CODE_NOT_SUPPORTED.

``service_time`` (:mod:`loadgen.servicetime`) delays each response, measured from when
the request was read; responses may overtake each other (the opaque correlates them).
Each queue keeps at most ``retention_messages`` messages; older ones are dropped and the
queue's minimum offset moves on.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import socket
import sys
import time

from loadgen.servecli import address_arg, serve_main, service_time_arg
from loadgen.serverthread import ServerThread, new_event_loop
from loadgen.serverbase import ReferenceServer, ServerConnection, describe_exception
from loadgen.servicetime import ServiceTime
from proxy.protocols.rocketmq import constants as codes
from proxy.protocols.rocketmq.codec import (
    BrokerData,
    QueueData,
    RemotingCommand,
    RocketMQCodecError,
    StoredMessage,
    TopicRouteData,
    decode,
    decode_message_batch,
    decode_properties,
    dumps_java_json,
    encode,
    encode_stored_message,
    encode_topic_route,
    loads_java_json,
    send_header_from_v2,
)
from proxy.protocols.rocketmq.constants import (
    FLAG_ONEWAY,
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUSPEND,
    PULL_NOT_FOUND,
    PULL_OFFSET_MOVED,
    PULL_RETRY_IMMEDIATELY,
    QUERY_NOT_FOUND,
    REQUEST_CODE_NOT_SUPPORTED,
    SERVER_FRAME_MAX,
    SUCCESS,
    SYSTEM_ERROR,
    TOPIC_NOT_EXIST,
)

__all__ = ["RocketMQServer", "RocketMQServerThread", "main", "build_parser", "new_event_loop"]

log = logging.getLogger("frametap.rocketmq.server")

GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _parse_address(value, what: str) -> tuple[str, int]:
    if isinstance(value, tuple):
        return value[0], int(value[1])
    host, sep, port = str(value).rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{what} must be HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def _ip_for(host: str) -> str:
    """An IP literal for the store host in message ids (names resolved once)."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
            return host
        except OSError:
            pass
    try:
        return socket.gethostbyname(host)
    except OSError:
        return "127.0.0.1"


class _Queue:
    """One message queue: stored messages (pre-encoded) from ``min_offset`` on."""

    __slots__ = ("min_offset", "entries", "waiters")

    def __init__(self):
        self.min_offset = 0
        # (encoded bytes, tags) per message; entries[i] has offset min_offset + i.
        self.entries: list[tuple[bytes, str | None]] = []
        self.waiters: list[asyncio.Future] = []

    @property
    def max_offset(self) -> int:
        return self.min_offset + len(self.entries)

    def wake(self) -> None:
        waiters, self.waiters = self.waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)


class _Topic:
    __slots__ = ("name", "queues", "next_queue")

    def __init__(self, name: str, queues: int):
        self.name = name
        self.queues = [_Queue() for _ in range(queues)]
        self.next_queue = itertools.count()


class _Connection(ServerConnection):
    """One accepted socket on either listener (``role`` ``"broker"`` or ``"namesrv"``)."""

    def __init__(self, server, reader, writer, role=""):
        super().__init__(server, reader, writer, role)
        self.client_ids: set[str] = set()

    def split_frame(self, buf):
        return decode(buf, self.server.length_includes_self, max_frame_bytes=SERVER_FRAME_MAX)

    def frame_received(self, cmd: RemotingCommand, received: float) -> None:
        self.server._dispatch(self, cmd, received)

    def connection_lost(self) -> None:
        self.server._forget_connection(self)

    def send_command(self, cmd: RemotingCommand, received: float | None = None) -> None:
        """Write ``cmd`` now, or (an answer to a request read at ``received``) when its
        service time has passed."""
        frame = encode(cmd, self.server.length_includes_self)
        self.send(frame, None if received is None else self.reply_due(received))


class RocketMQServer(ReferenceServer):
    """In-memory RocketMQ name server and broker on two listeners (see the module docstring).

    ``advertised_broker`` (``"host:port"`` or a tuple) is the broker address the route
    data names; default the broker's listen address (host + bound port). ``host`` is the
    name server's listen host and, unless ``broker_host`` is given, the broker's too.
    ``service_time`` is a :class:`ServiceTime` or its text (``"2ms±1ms"``).
    """

    def __init__(self, host: str = "127.0.0.1", namesrv_port: int = 0, broker_port: int = 0,
                 advertised_broker=None, queues: int = 4,
                 service_time: ServiceTime | str | None = None,
                 cluster: str = "DefaultCluster", broker_name: str = "broker-a",
                 auto_create_topics: bool = True, max_pull_messages: int = 32,
                 max_suspend: float = 1.0, retention_messages: int = 1_000_000,
                 length_includes_self: bool = False, region: str = "DefaultRegion",
                 broker_host: str | None = None):
        if not 1 <= queues <= 1024:
            raise ValueError(f"queues must be 1..1024, got {queues}")
        if retention_messages < 1:
            raise ValueError(f"retention_messages must be >= 1, got {retention_messages}")
        super().__init__(service_time)
        self.host = host
        self.broker_host = host if broker_host is None else broker_host
        self.namesrv_port = namesrv_port
        self.broker_port = broker_port
        self.advertised_broker = (None if advertised_broker is None
                                  else _parse_address(advertised_broker, "advertised_broker"))
        self.queues = queues
        self.cluster = cluster
        self.broker_name = broker_name
        self.auto_create_topics = auto_create_topics
        self.max_pull_messages = max_pull_messages
        self.max_suspend = max_suspend
        self.retention_messages = retention_messages
        self.length_includes_self = length_includes_self
        self.region = region
        self.topics: dict[str, _Topic] = {}
        # (group, topic, queueId) -> committed offset
        self.consumer_offsets: dict[tuple[str, str, int], int] = {}
        # group -> {clientID: connection}
        self.consumer_groups: dict[str, dict[str, _Connection]] = {}
        self.producer_groups: dict[str, dict[str, _Connection]] = {}
        self.commit_log_offset = 0
        self.requests_served = 0
        self._store_host: tuple[str, int] = ("127.0.0.1", 0)
        self._broker_handlers = {
            codes.SEND_MESSAGE: self._on_send,
            codes.SEND_MESSAGE_V2: self._on_send,
            codes.SEND_BATCH_MESSAGE: self._on_send,
            codes.PULL_MESSAGE: self._on_pull,
            codes.QUERY_CONSUMER_OFFSET: self._on_query_consumer_offset,
            codes.UPDATE_CONSUMER_OFFSET: self._on_update_consumer_offset,
            codes.GET_MAX_OFFSET: self._on_get_max_offset,
            codes.GET_MIN_OFFSET: self._on_get_min_offset,
            codes.HEART_BEAT: self._on_heartbeat,
            codes.UNREGISTER_CLIENT: self._on_unregister_client,
            codes.GET_CONSUMER_LIST_BY_GROUP: self._on_get_consumer_list,
        }
        self._namesrv_handlers = {
            codes.GET_ROUTEINFO_BY_TOPIC: self._on_route,
            codes.GET_BROKER_CLUSTER_INFO: self._on_cluster_info,
            GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self._on_topic_list,
            codes.HEART_BEAT: self._on_namesrv_ok,
            codes.UNREGISTER_CLIENT: self._on_namesrv_ok,
        }

    what = "rocketmq"
    log = log  # the module logger
    connection_class = _Connection
    ordered_replies = False  # the opaque correlates: answers may overtake each other

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Bind both listeners; sets :attr:`namesrv_port` and :attr:`broker_port`."""
        self.broker_port = await self.listen(self.broker_host, self.broker_port, "broker")
        try:
            self.namesrv_port = await self.listen(self.host, self.namesrv_port, "namesrv")
        except BaseException:
            await super().close()
            raise
        adv_host, adv_port = self.broker_address()
        self._store_host = (_ip_for(adv_host), adv_port)
        log.info("rocketmq name server on %s:%d, broker on %s:%d (advertised %s:%d)",
                 self.host, self.namesrv_port, self.broker_host, self.broker_port, adv_host,
                 adv_port)

    async def close(self) -> None:
        """Stop listening, fail held pulls and close every connection."""
        for topic in self.topics.values():
            for queue in topic.queues:
                queue.wake()
        await super().close()

    def broker_address(self) -> tuple[str, int]:
        """The broker address route data names (advertised, else the listen address)."""
        if self.advertised_broker is not None:
            host, port = self.advertised_broker
            return host, port or self.broker_port
        host = self.broker_host
        if host in ("", "0.0.0.0", "::"):
            host = socket.gethostname()
        return host, self.broker_port

    # ------------------------------------------------------------------ requests

    def _dispatch(self, conn: _Connection, cmd: RemotingCommand, received: float) -> None:
        if cmd.is_response:
            return  # answers to our oneway notifications never come; ignore strays
        self.requests_served += 1
        handlers = self._broker_handlers if conn.role == "broker" else self._namesrv_handlers
        handler = handlers.get(cmd.code)
        if handler is None:
            resp = cmd.response(REQUEST_CODE_NOT_SUPPORTED,
                                f" request type {cmd.code} not supported")
        else:
            try:
                resp = handler(conn, cmd)
            except _BadRequest as exc:
                resp = cmd.response(exc.code, exc.remark)
            except Exception as exc:  # a handler bug must not kill the connection
                self.log_peer(logging.ERROR, "rocketmq %s: handling %s from %s failed: %s",
                              conn.role, codes.request_name(cmd.code), conn.peer,
                              describe_exception(exc))
                resp = cmd.response(SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
        if asyncio.iscoroutine(resp):
            conn.spawn(self._finish(conn, cmd, resp, received))
            return
        if resp is not None and not cmd.is_oneway:
            conn.send_command(resp, received)

    async def _finish(self, conn, cmd, coro, received) -> None:
        resp = await coro
        if resp is not None and not cmd.is_oneway and not conn.closed:
            conn.send_command(resp, received)

    # ------------------------------------------------------------------ helpers

    def topic(self, name: str, create: bool) -> _Topic | None:
        topic = self.topics.get(name)
        if topic is None and create:
            topic = self.topics[name] = _Topic(name, self.queues)
        return topic

    def _queue(self, cmd: RemotingCommand, topic: _Topic, queue_id: int) -> _Queue:
        if not 0 <= queue_id < len(topic.queues):
            raise _BadRequest(SYSTEM_ERROR,
                              f"queueId[{queue_id}] is illegal, topic:[{topic.name}] "
                              f"topicConfig.readQueueNums:[{len(topic.queues)}]")
        return topic.queues[queue_id]

    def append(self, topic: _Topic, queue_id: int, body: bytes, flag: int, properties: dict,
               sys_flag: int, born_timestamp: int, born_host: tuple,
               reconsume_times: int = 0) -> tuple[str, int]:
        """Store one message; returns ``(offset msgId, queueOffset)``."""
        queue = topic.queues[queue_id]
        queue_offset = queue.max_offset
        msg = StoredMessage(topic=topic.name, body=body, queue_id=queue_id,
                            queue_offset=queue_offset, physic_offset=self.commit_log_offset,
                            flag=flag, sys_flag=sys_flag, born_timestamp=born_timestamp,
                            born_host=born_host, store_timestamp=_now_ms(),
                            store_host=self._store_host, reconsume_times=reconsume_times,
                            properties=properties)
        encoded = encode_stored_message(msg)
        self.commit_log_offset += len(encoded)
        queue.entries.append((encoded, properties.get("TAGS")))
        if len(queue.entries) > self.retention_messages:
            drop = len(queue.entries) - self.retention_messages
            del queue.entries[:drop]
            queue.min_offset += drop
        if queue.waiters:
            queue.wake()
        return msg.msg_id, queue_offset

    # ------------------------------------------------------------------ name server

    def _route_data(self) -> TopicRouteData:
        host, port = self.broker_address()
        return TopicRouteData(
            queue_datas=[QueueData(self.broker_name, self.queues, self.queues)],
            broker_datas=[BrokerData(self.cluster, self.broker_name, {0: f"{host}:{port}"})])

    def _on_route(self, conn, cmd):
        name = cmd.ext_fields.get("topic")
        if not name:
            raise _BadRequest(SYSTEM_ERROR, "the custom field <topic> is null")
        if self.topic(name, self.auto_create_topics) is None:
            return cmd.response(TOPIC_NOT_EXIST,
                                f"No topic route info in name server for the topic: {name}")
        return cmd.response(SUCCESS, body=encode_topic_route(self._route_data()))

    def _on_cluster_info(self, conn, cmd):
        broker = self._route_data().broker_datas[0]
        body = dumps_java_json({"brokerAddrTable": {self.broker_name: broker.to_java()},
                                "clusterAddrTable": {self.cluster: [self.broker_name]}})
        return cmd.response(SUCCESS, body=body)

    def _on_topic_list(self, conn, cmd):
        return cmd.response(SUCCESS, body=dumps_java_json({"topicList": sorted(self.topics)}))

    def _on_namesrv_ok(self, conn, cmd):
        return cmd.response(SUCCESS)

    # ------------------------------------------------------------------ broker: send

    def _on_send(self, conn, cmd):
        h = send_header_from_v2(cmd.ext_fields)
        name = h.get("topic")
        if not name:
            raise _BadRequest(SYSTEM_ERROR, "the custom field <topic> is null")
        topic = self.topic(name, self.auto_create_topics)
        if topic is None:
            return cmd.response(TOPIC_NOT_EXIST,
                                f"topic[{name}] not exist, apply first please!")
        queue_id = _int(h, "queueId", -1)
        if queue_id < 0:
            queue_id = next(topic.next_queue) % len(topic.queues)
        self._queue(cmd, topic, queue_id)
        sys_flag = _int(h, "sysFlag", 0)
        born = _int(h, "bornTimestamp", _now_ms())
        reconsume = _int(h, "reconsumeTimes", 0)
        if cmd.code == codes.SEND_BATCH_MESSAGE:
            try:
                batch = decode_message_batch(cmd.body)
            except RocketMQCodecError as exc:
                raise _BadRequest(codes.MESSAGE_ILLEGAL, str(exc)) from None
            if not batch:
                raise _BadRequest(codes.MESSAGE_ILLEGAL, "the batch is empty")
            messages = [(m.body, m.flag, m.properties) for m in batch]
        else:
            messages = [(cmd.body, _int(h, "flag", 0), decode_properties(h.get("properties")))]
        ids = []
        first_offset = None
        uniq = []
        for body, flag, props in messages:
            msg_id, offset = self.append(topic, queue_id, body, flag, props, sys_flag, born,
                                         conn.peer_address, reconsume)
            ids.append(msg_id)
            if first_offset is None:
                first_offset = offset
            if "UNIQ_KEY" in props:
                uniq.append(props["UNIQ_KEY"])
        ext = {"msgId": ",".join(ids), "queueId": str(queue_id),
               "queueOffset": str(first_offset), "MSG_REGION": self.region,
               "TRACE_ON": "true"}
        if uniq:
            ext["transactionId"] = ",".join(uniq)
        return cmd.response(SUCCESS, ext_fields=ext)

    # ------------------------------------------------------------------ broker: pull

    def _pull_once(self, cmd, topic: _Topic, queue: _Queue, offset: int, max_nums: int,
                   tags: set | None):
        """One attempt; returns ``(code, body, next_offset)``."""
        lo, hi = queue.min_offset, queue.max_offset
        if hi == 0:
            return PULL_NOT_FOUND, b"", 0
        if offset < lo:
            return PULL_OFFSET_MOVED, b"", lo
        if offset == hi:
            return PULL_NOT_FOUND, b"", offset
        if offset > hi:
            return PULL_OFFSET_MOVED, b"", hi
        start = offset - lo
        picked = []
        scanned = 0
        for encoded, msg_tags in queue.entries[start:start + max(max_nums, 1) * 8]:
            scanned += 1
            if tags is None or (msg_tags is not None and msg_tags in tags):
                picked.append(encoded)
                if len(picked) >= max_nums:
                    break
        next_offset = offset + scanned
        if not picked:
            return PULL_RETRY_IMMEDIATELY, b"", next_offset
        return SUCCESS, b"".join(picked), next_offset

    def _on_pull(self, conn, cmd):
        h = cmd.ext_fields
        name = h.get("topic", "")
        group = h.get("consumerGroup", "")
        topic = self.topic(name, False)
        if topic is None:
            return cmd.response(TOPIC_NOT_EXIST,
                                f"topic[{name}] not exist, apply first please!")
        queue_id = _int(h, "queueId", 0)
        queue = self._queue(cmd, topic, queue_id)
        offset = _int(h, "queueOffset", 0)
        max_nums = max(1, min(_int(h, "maxMsgNums", 32), self.max_pull_messages))
        sys_flag = _int(h, "sysFlag", 0)
        if sys_flag & PULL_FLAG_COMMIT_OFFSET:
            commit = _int(h, "commitOffset", -1)
            if commit >= 0 and group:
                self.consumer_offsets[(group, name, queue_id)] = commit
        tags = _subscription_tags(h.get("subscription"), h.get("expressionType"))
        code, body, next_offset = self._pull_once(cmd, topic, queue, offset, max_nums, tags)
        suspend = _int(h, "suspendTimeoutMillis", 0) / 1000.0
        if (code == PULL_NOT_FOUND and sys_flag & PULL_FLAG_SUSPEND and suspend > 0
                and self.max_suspend > 0):
            return self._pull_held(cmd, topic, queue, offset, max_nums, tags,
                                   min(suspend, self.max_suspend))
        return self._pull_response(cmd, queue, code, body, next_offset)

    async def _pull_held(self, cmd, topic, queue, offset, max_nums, tags, timeout):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            remaining = deadline - loop.time()
            if remaining > 0:
                fut = loop.create_future()
                queue.waiters.append(fut)
                try:
                    await asyncio.wait_for(fut, remaining)
                except asyncio.TimeoutError:
                    pass
            code, body, next_offset = self._pull_once(cmd, topic, queue, offset, max_nums,
                                                      tags)
            if code != PULL_NOT_FOUND or loop.time() >= deadline:
                return self._pull_response(cmd, queue, code, body, next_offset)

    def _pull_response(self, cmd, queue, code, body, next_offset):
        ext = {"suggestWhichBrokerId": "0", "nextBeginOffset": str(next_offset),
               "minOffset": str(queue.min_offset), "maxOffset": str(queue.max_offset)}
        remark = None
        if code == PULL_OFFSET_MOVED:
            remark = "the requested offset is out of the queue's range"
        elif code == PULL_NOT_FOUND:
            remark = "no new message"
        return cmd.response(code, remark, ext_fields=ext, body=body)

    # ------------------------------------------------------------------ broker: offsets

    def _on_query_consumer_offset(self, conn, cmd):
        h = cmd.ext_fields
        key = (h.get("consumerGroup", ""), h.get("topic", ""), _int(h, "queueId", 0))
        offset = self.consumer_offsets.get(key)
        if offset is not None:
            return cmd.response(SUCCESS, ext_fields={"offset": str(offset)})
        topic = self.topic(key[1], False)
        queue = (topic.queues[key[2]] if topic is not None and 0 <= key[2] < len(topic.queues)
                 else None)
        if (h.get("setZeroIfNotFound", "true").lower() != "false" and queue is not None
                and queue.min_offset == 0 and queue.max_offset == 0):
            return cmd.response(SUCCESS, ext_fields={"offset": "0"})
        return cmd.response(QUERY_NOT_FOUND,
                            "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")

    def _on_update_consumer_offset(self, conn, cmd):
        h = cmd.ext_fields
        group, name = h.get("consumerGroup", ""), h.get("topic", "")
        if not group or not name:
            raise _BadRequest(SYSTEM_ERROR, "consumerGroup and topic are required")
        self.consumer_offsets[(group, name, _int(h, "queueId", 0))] = _int(h, "commitOffset", 0)
        return cmd.response(SUCCESS)

    def _offset_queue(self, cmd):
        topic = self.topic(cmd.ext_fields.get("topic", ""), False)
        if topic is None:
            return None
        return self._queue(cmd, topic, _int(cmd.ext_fields, "queueId", 0))

    def _on_get_max_offset(self, conn, cmd):
        queue = self._offset_queue(cmd)
        return cmd.response(SUCCESS, ext_fields={
            "offset": str(queue.max_offset if queue is not None else 0)})

    def _on_get_min_offset(self, conn, cmd):
        queue = self._offset_queue(cmd)
        return cmd.response(SUCCESS, ext_fields={
            "offset": str(queue.min_offset if queue is not None else 0)})

    # ------------------------------------------------------------------ broker: clients

    def _on_heartbeat(self, conn, cmd):
        try:
            data = loads_java_json(cmd.body, what="HeartbeatData") if cmd.body else {}
        except RocketMQCodecError as exc:
            raise _BadRequest(SYSTEM_ERROR, str(exc)) from None
        if not isinstance(data, dict):
            raise _BadRequest(SYSTEM_ERROR, "HeartbeatData must be a JSON object")
        host, port = conn.peer_address
        client_id = str(data.get("clientID") or f"{host}@{port}")
        conn.client_ids.add(client_id)
        for item in data.get("producerDataSet") or []:
            if isinstance(item, dict) and item.get("groupName"):
                self.producer_groups.setdefault(str(item["groupName"]), {})[client_id] = conn
        for item in data.get("consumerDataSet") or []:
            if isinstance(item, dict) and item.get("groupName"):
                group = str(item["groupName"])
                members = self.consumer_groups.setdefault(group, {})
                is_new = client_id not in members
                members[client_id] = conn
                if is_new:
                    self._notify_consumer_ids_changed(group, skip=client_id)
        return cmd.response(SUCCESS)

    def _on_unregister_client(self, conn, cmd):
        h = cmd.ext_fields
        client_id = h.get("clientID", "")
        group = h.get("producerGroup")
        if group and client_id in self.producer_groups.get(group, {}):
            del self.producer_groups[group][client_id]
        group = h.get("consumerGroup")
        if group and client_id in self.consumer_groups.get(group, {}):
            del self.consumer_groups[group][client_id]
            self._notify_consumer_ids_changed(group)
        return cmd.response(SUCCESS)

    def _on_get_consumer_list(self, conn, cmd):
        group = cmd.ext_fields.get("consumerGroup", "")
        members = self.consumer_groups.get(group)
        if not members:
            return cmd.response(SYSTEM_ERROR, f"no consumer for this group, {group}")
        return cmd.response(SUCCESS, body=dumps_java_json({"consumerIdList": list(members)}))

    def _notify_consumer_ids_changed(self, group: str, skip: str | None = None) -> None:
        for client_id, member in list(self.consumer_groups.get(group, {}).items()):
            if client_id == skip or member.closed:
                continue
            member.send_command(RemotingCommand(code=codes.NOTIFY_CONSUMER_IDS_CHANGED,
                                        opaque=_next_opaque(), flag=FLAG_ONEWAY,
                                        ext_fields={"consumerGroup": group}))

    def _forget_connection(self, conn: _Connection) -> None:
        for table, notify in ((self.producer_groups, False), (self.consumer_groups, True)):
            for group, members in table.items():
                gone = [cid for cid, c in members.items() if c is conn]
                for cid in gone:
                    del members[cid]
                if gone and notify:
                    self._notify_consumer_ids_changed(group)


_opaques = itertools.count(1)


def _next_opaque() -> int:
    return next(_opaques) & 0x7FFFFFFF


class _BadRequest(Exception):
    def __init__(self, code: int, remark: str):
        super().__init__(remark)
        self.code = code
        self.remark = remark


# Header fields the Java headers declare as long; every other integer field is a Java int.
_LONG_FIELDS = frozenset({"bornTimestamp", "commitOffset", "queueOffset",
                          "suspendTimeoutMillis"})


def _int(fields: dict, key: str, default: int) -> int:
    """An integer ext field, refused (SYSTEM_ERROR, as the broker's header decoding fails)
    when it is not a number or does not fit the Java type the header declares."""
    value = fields.get(key)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except (ValueError, TypeError):
        raise _BadRequest(SYSTEM_ERROR,
                          f"the custom field <{key}> is not an integer: {value!r}") from None
    bits = 64 if key in _LONG_FIELDS else 32
    if not -(1 << (bits - 1)) <= number < (1 << (bits - 1)):
        raise _BadRequest(SYSTEM_ERROR,
                          f"the custom field <{key}> = {number} does not fit a "
                          f"{'long' if bits == 64 else 'int'}")
    return number


def _subscription_tags(subscription: str | None, expression_type: str | None) -> set | None:
    """Tags of a TAG subscription (``"a || b"``); None = everything (``*``, SQL92...)."""
    if not subscription or (expression_type and expression_type.upper() != "TAG"):
        return None
    tags = {t.strip() for t in subscription.split("||") if t.strip()}
    if not tags or "*" in tags:
        return None
    return tags


class RocketMQServerThread(ServerThread):
    """Run a :class:`RocketMQServer` on its own event loop in a background thread::

        with RocketMQServerThread(queues=4) as srv:
            connect(srv.namesrv_address)
    """

    thread_name = "rocketmq-server"
    what = "rocketmq server"

    def __init__(self, **server_kwargs):
        super().__init__(RocketMQServer(**server_kwargs))

    @property
    def namesrv_port(self) -> int:
        return self.server.namesrv_port

    @property
    def broker_port(self) -> int:
        return self.server.broker_port

    @property
    def namesrv_address(self) -> str:
        return f"{self.server.host}:{self.server.namesrv_port}"

    @property
    def broker_address(self) -> str:
        """The broker's listen address (route data names :meth:`RocketMQServer.broker_address`)."""
        return f"{self.server.broker_host}:{self.server.broker_port}"


# ---------------------------------------------------------------------- command line

def _address_arg(text: str) -> tuple[str, int]:
    return address_arg(text, 9876)


def _queues_arg(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 1024:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer 1..1024")
    return int(text)


def build_parser(prog: str = "frametap serve rocketmq") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run the in-memory reference RocketMQ name server and broker (two "
                    "listeners, one process) until SIGINT/SIGTERM.")
    parser.add_argument("--namesrv", type=_address_arg,
                        default=("127.0.0.1", codes.DEFAULT_NAMESRV_PORT), metavar="HOST:PORT",
                        help="name server listen address (default 127.0.0.1:9876)")
    parser.add_argument("--broker", type=_address_arg,
                        default=("127.0.0.1", codes.DEFAULT_BROKER_PORT), metavar="HOST:PORT",
                        help="broker listen address (default 127.0.0.1:10911)")
    parser.add_argument("--advertise-broker", type=_address_arg, default=None,
                        metavar="HOST:PORT",
                        help="broker address that route data names (default: the broker "
                             "listen address)")
    parser.add_argument("--queues", type=_queues_arg, default=4, metavar="N",
                        help="read/write queues per topic (default 4)")
    parser.add_argument("--service-time", type=service_time_arg, default=None,
                        metavar="DIST",
                        help="delay every response: '500us', '2ms±1ms', 'exp:2ms' (default 0)")
    parser.add_argument("--log-level", default="INFO",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser


def _make_server(args: argparse.Namespace) -> tuple[RocketMQServer, str]:
    ns_host, ns_port = args.namesrv
    br_host, br_port = args.broker
    server = RocketMQServer(ns_host, ns_port, br_port, advertised_broker=args.advertise_broker,
                            queues=args.queues, service_time=args.service_time,
                            broker_host=br_host)
    return server, f"{ns_host}:{ns_port} / {br_host}:{br_port}"


def _banner(server: RocketMQServer) -> str:
    host, port = server.broker_address()
    return (f"rocketmq: name server on {server.host}:{server.namesrv_port}, broker on "
            f"{server.broker_host}:{server.broker_port} (advertised {host}:{port})")


def main(argv: list[str] | None = None) -> int:
    """``frametap serve rocketmq`` entry point; returns the exit status."""
    return serve_main(build_parser(), argv, _make_server, _banner)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
