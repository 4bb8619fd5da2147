"""Reference RocketMQ name server + broker over real sockets, with a raw codec client."""

import itertools
import json
import socket
import time

import pytest

from loadgen.rocketmq.server import RocketMQServerThread, main
from proxy.protocols.rocketmq import constants as codes
from tests._support.processes import server_process
from proxy.protocols.rocketmq.codec import (
    Message,
    RemotingCommand,
    decode,
    decode_message_id,
    decode_stored_messages,
    decode_topic_route,
    encode,
    encode_message_batch,
    encode_properties,
    loads_java_json,
)

JSON, BIN = codes.SERIALIZE_JSON, codes.SERIALIZE_ROCKETMQ


class RawClient:
    """A minimal blocking remoting client on the codec (requests, oneway, server pushes)."""

    _opaques = itertools.count(1)

    def __init__(self, address: str, serialize_type: int = JSON, timeout: float = 5.0):
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.serialize_type = serialize_type
        self.buf = bytearray()
        self.pushed: list[RemotingCommand] = []

    def close(self):
        self.sock.close()

    def send(self, code, ext=None, body=b"", oneway=False) -> int:
        opaque = next(self._opaques)
        cmd = RemotingCommand(code=code, language="PYTHON", opaque=opaque,
                              flag=codes.FLAG_ONEWAY if oneway else 0,
                              ext_fields={k: str(v) for k, v in (ext or {}).items()},
                              body=body, serialize_type=self.serialize_type)
        self.sock.sendall(encode(cmd))
        return opaque

    def read(self) -> RemotingCommand:
        while True:
            result = decode(self.buf)
            if result is not None:
                cmd, used = result
                del self.buf[:used]
                return cmd
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("server closed the connection")
            self.buf += data

    def request(self, code, ext=None, body=b"") -> RemotingCommand:
        opaque = self.send(code, ext, body)
        while True:
            cmd = self.read()
            if not cmd.is_response:
                self.pushed.append(cmd)
                continue
            assert cmd.opaque == opaque
            assert cmd.serialize_type == self.serialize_type
            return cmd


@pytest.fixture(scope="module")
def server():
    with RocketMQServerThread(queues=4, advertised_broker="10.9.8.7:10911") as srv:
        yield srv


@pytest.fixture(params=[JSON, BIN], ids=["json", "rocketmq"])
def stype(request):
    return request.param


@pytest.fixture
def broker(server, stype):
    c = RawClient(server.broker_address, stype)
    yield c
    c.close()


@pytest.fixture
def namesrv(server, stype):
    c = RawClient(server.namesrv_address, stype)
    yield c
    c.close()


_topics = itertools.count()


def new_topic(prefix="T"):
    return f"{prefix}{next(_topics)}_{time.monotonic_ns()}"


def send_v2(client, topic, body, queue_id=0, props=None):
    ext = {"a": "pg", "b": topic, "c": "TBW102", "d": 4, "e": queue_id, "f": 0,
           "g": int(time.time() * 1000), "h": 0,
           "i": encode_properties(props or {"UNIQ_KEY": f"U{body!r}"}), "j": 0, "k": "false"}
    return client.request(codes.SEND_MESSAGE_V2, ext, body)


def pull(client, topic, queue_id, offset, max_nums=32, group="cg", sys_flag=0, suspend=0):
    return client.request(codes.PULL_MESSAGE, {
        "consumerGroup": group, "topic": topic, "queueId": queue_id, "queueOffset": offset,
        "maxMsgNums": max_nums, "sysFlag": sys_flag, "commitOffset": 0,
        "suspendTimeoutMillis": suspend, "subscription": "*", "subVersion": 0,
        "expressionType": "TAG"})


# --------------------------------------------------------------------------- name server

def test_route_names_advertised_broker_and_queues(namesrv):
    topic = new_topic()
    resp = namesrv.request(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    assert resp.code == codes.SUCCESS and resp.flag == codes.FLAG_RESPONSE
    assert b'"brokerAddrs":{0:"10.9.8.7:10911"}' in resp.body  # fastjson's bare key
    route = decode_topic_route(resp.body)
    assert route.broker_datas[0].broker_addrs == {0: "10.9.8.7:10911"}
    assert route.broker_datas[0].cluster == "DefaultCluster"
    q = route.queue_datas[0]
    assert (q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm) == \
        ("broker-a", 4, 4, 6)


def test_namesrv_cluster_info_and_unknown_code(namesrv):
    resp = namesrv.request(codes.GET_BROKER_CLUSTER_INFO)
    assert resp.code == codes.SUCCESS
    info = loads_java_json(resp.body)
    assert info["clusterAddrTable"] == {"DefaultCluster": ["broker-a"]}
    resp = namesrv.request(4321)
    assert resp.code == codes.REQUEST_CODE_NOT_SUPPORTED == 3
    assert "4321" in resp.remark


def test_route_without_auto_create():
    with RocketMQServerThread(auto_create_topics=False) as srv:
        c = RawClient(srv.namesrv_address)
        try:
            resp = c.request(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "nope"})
            assert resp.code == codes.TOPIC_NOT_EXIST
            b = RawClient(srv.broker_address)
            assert send_v2(b, "nope", b"x").code == codes.TOPIC_NOT_EXIST
            b.close()
        finally:
            c.close()


# --------------------------------------------------------------------------- send / pull

def test_send_v2_offsets_and_msg_ids(broker):
    topic = new_topic()
    results = [send_v2(broker, topic, f"m{i}".encode(), queue_id=1) for i in range(3)]
    assert [r.code for r in results] == [codes.SUCCESS] * 3
    assert [int(r.ext_fields["queueOffset"]) for r in results] == [0, 1, 2]
    assert all(r.ext_fields["queueId"] == "1" for r in results)
    ids = [r.ext_fields["msgId"] for r in results]
    assert len(set(ids)) == 3 and all(len(i) == 32 for i in ids)
    decoded = [decode_message_id(i) for i in ids]
    assert all(host == "10.9.8.7" and port == 10911 for host, port, _ in decoded)
    assert decoded[0][2] < decoded[1][2] < decoded[2][2]  # commit-log offsets grow
    assert results[0].ext_fields["transactionId"] == "Ub'm0'"


def test_pull_returns_exactly_the_stored_messages(broker):
    topic = new_topic()
    sent = [send_v2(broker, topic, f"body-{i}".encode(), queue_id=2,
                    props={"UNIQ_KEY": f"K{i}", "TAGS": "tg"}) for i in range(4)]
    resp = pull(broker, topic, 2, 0)
    assert resp.code == codes.SUCCESS
    msgs = decode_stored_messages(resp.body)
    assert [m.body for m in msgs] == [f"body-{i}".encode() for i in range(4)]
    assert [m.queue_offset for m in msgs] == [0, 1, 2, 3]
    assert [m.msg_id for m in msgs] == [r.ext_fields["msgId"] for r in sent]
    assert all(m.topic == topic and m.queue_id == 2 for m in msgs)
    assert msgs[1].properties == {"UNIQ_KEY": "K1", "TAGS": "tg"}
    assert resp.ext_fields["nextBeginOffset"] == "4"
    assert (resp.ext_fields["minOffset"], resp.ext_fields["maxOffset"]) == ("0", "4")
    assert resp.ext_fields["suggestWhichBrokerId"] == "0"
    # partial pulls and the end of the queue
    part = pull(broker, topic, 2, 1, max_nums=2)
    assert [m.queue_offset for m in decode_stored_messages(part.body)] == [1, 2]
    assert part.ext_fields["nextBeginOffset"] == "3"
    end = pull(broker, topic, 2, 4)
    assert end.code == codes.PULL_NOT_FOUND and end.body == b""
    assert end.ext_fields["nextBeginOffset"] == "4"
    moved = pull(broker, topic, 2, 99)
    assert moved.code == codes.PULL_OFFSET_MOVED
    assert moved.ext_fields["nextBeginOffset"] == "4"
    empty = pull(broker, topic, 3, 0)
    assert empty.code == codes.PULL_NOT_FOUND


def test_pull_unknown_topic_and_bad_queue(broker):
    assert pull(broker, new_topic("missing"), 0, 0).code == codes.TOPIC_NOT_EXIST
    topic = new_topic()
    send_v2(broker, topic, b"x")
    assert pull(broker, topic, 9, 0).code == codes.SYSTEM_ERROR


def test_send_v1_header(broker):
    topic = new_topic()
    resp = broker.request(codes.SEND_MESSAGE, {
        "producerGroup": "pg", "topic": topic, "defaultTopic": "TBW102",
        "defaultTopicQueueNums": 4, "queueId": 0, "sysFlag": 0, "bornTimestamp": 1, "flag": 3,
        "properties": encode_properties({"KEYS": "k"})}, b"v1")
    assert resp.code == codes.SUCCESS and resp.ext_fields["queueOffset"] == "0"
    (msg,) = decode_stored_messages(pull(broker, topic, 0, 0).body)
    assert (msg.body, msg.flag, msg.born_timestamp, msg.properties) == (b"v1", 3, 1,
                                                                         {"KEYS": "k"})


def test_batch_send_then_pull(broker):
    topic = new_topic()
    batch = [Message(f"b{i}".encode(), 0, {"UNIQ_KEY": f"B{i}"}) for i in range(5)]
    resp = broker.request(codes.SEND_BATCH_MESSAGE, {
        "a": "pg", "b": topic, "c": "TBW102", "d": 4, "e": 1, "f": 0, "g": 1, "h": 0,
        "m": "true"}, encode_message_batch(batch))
    assert resp.code == codes.SUCCESS
    assert resp.ext_fields["queueOffset"] == "0"
    assert len(resp.ext_fields["msgId"].split(",")) == 5
    got = decode_stored_messages(pull(broker, topic, 1, 0).body)
    assert len(got) == 5
    assert [m.body for m in got] == [m.body for m in batch]
    assert [m.properties["UNIQ_KEY"] for m in got] == [f"B{i}" for i in range(5)]


def test_long_poll_wakes_on_send(server, broker):
    topic = new_topic()
    send_v2(broker, topic, b"first", queue_id=0)
    other = RawClient(server.broker_address, broker.serialize_type)
    try:
        opaque = other.send(codes.PULL_MESSAGE, {
            "consumerGroup": "cg", "topic": topic, "queueId": 0, "queueOffset": 1,
            "maxMsgNums": 32, "sysFlag": codes.PULL_FLAG_SUSPEND, "commitOffset": 0,
            "suspendTimeoutMillis": 5000, "subscription": "*", "subVersion": 0})
        time.sleep(0.1)
        started = time.monotonic()
        send_v2(broker, topic, b"second", queue_id=0)
        resp = other.read()
        assert resp.opaque == opaque and resp.code == codes.SUCCESS
        assert time.monotonic() - started < 0.9  # answered before the 1 s hold cap
        assert [m.body for m in decode_stored_messages(resp.body)] == [b"second"]
    finally:
        other.close()


# --------------------------------------------------------------------------- offsets

def test_consumer_offsets(broker):
    topic = new_topic()
    group = f"g_{topic}"
    q = {"consumerGroup": group, "topic": topic, "queueId": 0}
    # a queue that never held a message: SUCCESS 0 (Apache's setZeroIfNotFound rule)
    send_v2(broker, topic, b"x", queue_id=1)
    resp = broker.request(codes.QUERY_CONSUMER_OFFSET, q)
    assert resp.code == codes.SUCCESS and resp.ext_fields["offset"] == "0"
    # a queue with messages and nothing committed: QUERY_NOT_FOUND
    q1 = dict(q, queueId=1)
    assert broker.request(codes.QUERY_CONSUMER_OFFSET, q1).code == codes.QUERY_NOT_FOUND
    resp = broker.request(codes.UPDATE_CONSUMER_OFFSET, dict(q1, commitOffset=1))
    assert resp.code == codes.SUCCESS
    resp = broker.request(codes.QUERY_CONSUMER_OFFSET, q1)
    assert resp.code == codes.SUCCESS and resp.ext_fields["offset"] == "1"
    # oneway update: no response, but it takes effect
    broker.send(codes.UPDATE_CONSUMER_OFFSET, dict(q1, commitOffset=5), oneway=True)
    resp = broker.request(codes.QUERY_CONSUMER_OFFSET, q1)
    assert resp.ext_fields["offset"] == "5"
    # max / min offsets
    assert broker.request(codes.GET_MAX_OFFSET, {"topic": topic, "queueId": 1}) \
        .ext_fields["offset"] == "1"
    assert broker.request(codes.GET_MIN_OFFSET, {"topic": topic, "queueId": 1}) \
        .ext_fields["offset"] == "0"


def test_oneway_gets_no_response(broker):
    topic = new_topic()
    broker.send(codes.SEND_MESSAGE_V2, {"a": "pg", "b": topic, "e": 0, "f": 0, "g": 1,
                                        "h": 0}, b"oneway", oneway=True)
    # the next response on the wire belongs to the next request
    resp = broker.request(codes.GET_MAX_OFFSET, {"topic": topic, "queueId": 0})
    assert resp.ext_fields["offset"] == "1"
    broker.sock.settimeout(0.2)
    with pytest.raises(socket.timeout):
        broker.sock.recv(1)


def test_unknown_code_not_supported(broker):
    resp = broker.request(9999)
    assert resp.code == codes.REQUEST_CODE_NOT_SUPPORTED
    assert resp.remark == " request type 9999 not supported"


# --------------------------------------------------------------------------- clients

def _heartbeat(client_id, group):
    return json.dumps({"clientID": client_id, "producerDataSet": [{"groupName": "pg"}],
                       "consumerDataSet": [{"groupName": group, "consumeType": "CONSUME_PASSIVELY",
                                            "messageModel": "CLUSTERING",
                                            "subscriptionDataSet": []}]}).encode()


def test_heartbeat_consumer_list_and_notify(server, stype):
    group = new_topic("grp")
    a = RawClient(server.broker_address, stype)
    b = RawClient(server.broker_address, stype)
    try:
        assert a.request(codes.HEART_BEAT, body=_heartbeat("A@1", group)).code == codes.SUCCESS
        assert b.request(codes.HEART_BEAT, body=_heartbeat("B@2", group)).code == codes.SUCCESS
        resp = a.request(codes.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
        assert resp.code == codes.SUCCESS
        assert sorted(loads_java_json(resp.body)["consumerIdList"]) == ["A@1", "B@2"]
        # A was told that B joined: a oneway NOTIFY_CONSUMER_IDS_CHANGED request
        assert [(p.code, p.is_oneway, p.ext_fields) for p in a.pushed] == \
            [(codes.NOTIFY_CONSUMER_IDS_CHANGED, True, {"consumerGroup": group})]
        resp = b.request(codes.UNREGISTER_CLIENT, {"clientID": "B@2", "consumerGroup": group})
        assert resp.code == codes.SUCCESS
        resp = a.request(codes.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
        assert loads_java_json(resp.body)["consumerIdList"] == ["A@1"]
        a.close()
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            resp = b.request(codes.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
            if resp.code == codes.SYSTEM_ERROR:
                break
            time.sleep(0.02)
        assert resp.code == codes.SYSTEM_ERROR  # the closed connection's client is gone
    finally:
        a.close()
        b.close()


def test_service_time_delays_responses():
    with RocketMQServerThread(service_time="50ms") as srv:
        c = RawClient(srv.broker_address)
        try:
            started = time.monotonic()
            assert c.request(codes.GET_MAX_OFFSET, {"topic": "x", "queueId": 0}).code == 0
            assert time.monotonic() - started >= 0.045
        finally:
            c.close()


def test_garbage_closes_only_that_connection(server):
    s = socket.create_connection(("127.0.0.1", server.broker_port), timeout=5)
    s.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01")
    assert s.recv(10) == b""
    s.close()
    c = RawClient(server.broker_address)
    assert c.request(9999).code == codes.REQUEST_CODE_NOT_SUPPORTED
    c.close()


@pytest.mark.slow
def test_frame_over_apaches_limit_is_refused_from_its_length(server):
    """Like Apache's NettyDecoder (frameMaxLength 16 MiB): a length word over it closes
    the connection before any payload; one just under it is read."""
    import struct
    s = socket.create_connection(("127.0.0.1", server.broker_port), timeout=5)
    s.sendall(struct.pack(">I", codes.SERVER_FRAME_MAX) + b"\x00\x00\x00\x10")
    assert s.recv(10) == b""                     # refused from the header alone
    s.close()
    s = socket.create_connection(("127.0.0.1", server.broker_port), timeout=2)
    s.sendall(struct.pack(">I", codes.SERVER_FRAME_MAX - 4) + b"\x00\x00\x00\x10")
    with pytest.raises(socket.timeout):          # waiting for the rest of that frame
        s.recv(10)
    s.close()


# --------------------------------------------------------------------------- CLI

def test_cli_help(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--namesrv", "--broker", "--advertise-broker", "--queues", "--service-time",
                 "--log-level"):
        assert flag in out


def test_cli_bad_argument(capsys):
    assert main(["--queues", "zero"]) == 2
    assert "--queues" in capsys.readouterr().err


def test_cli_serves_until_sigterm(tmp_path):
    with server_process(tmp_path, "rocketmq", "--advertise-broker", "1.2.3.4:5",
                        "--queues", "2", "--log-level", "WARNING") as srv:
        assert "name server" in srv.log_text().splitlines()[0]
        c = RawClient(srv.role("namesrv"))
        route = decode_topic_route(c.request(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "t"}).body)
        c.close()
        assert route.broker_datas[0].broker_addrs == {0: "1.2.3.4:5"}
        assert route.queue_datas[0].write_queue_nums == 2
        b = RawClient(srv.role("broker"))
        assert send_v2(b, "t", b"x").code == codes.SUCCESS
        b.close()
    assert srv.proc.returncode == 0, srv.log_text()[-2000:]


# --------------------------------------------------------------------------- real client

@pytest.mark.slow
def test_real_cpp_client_produces_and_pulls():
    """Apache's C++ client (PyPI ``rocketmq`` 0.4.4) against the reference server, when
    installed: route data with fastjson's bare keys, SEND_MESSAGE, PULL_MESSAGE."""
    try:
        from tests.rocketmq_real_client import (real_client_skip_reason, run_producer,
                                                run_pull_consumer)
    except ImportError as exc:  # pragma: no cover - helper absent
        pytest.skip(f"real-client helper unavailable: {exc}")
    reason = real_client_skip_reason()
    if reason:
        pytest.skip(reason)
    with RocketMQServerThread(queues=4) as srv:
        produced = run_producer(srv.namesrv_address, "RealTopic", n=5, timeout=60)
        assert produced["errors"] == [] and produced["sent"] == 5, produced
        consumed = run_pull_consumer(srv.namesrv_address, "RealTopic", timeout=60)
        assert consumed["errors"] == [] and consumed["received"] == 5, consumed
        assert sorted(m["keys"] for m in consumed["messages"]) == \
            [f"key-{i}" for i in range(5)]
