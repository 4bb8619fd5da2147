"""RocketMQ remoting codec: headers (JSON and binary), frames, message encodings, route data."""

import json
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.protocols.rocketmq import constants as codes
from proxy.protocols.rocketmq.codec import (
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    BrokerData,
    Message,
    QueueData,
    RemotingCommand,
    RocketMQCodecError,
    StoredMessage,
    TopicRouteData,
    body_crc,
    create_message_id,
    decode,
    decode_header,
    decode_message_batch,
    decode_message_id,
    decode_properties,
    decode_stored_messages,
    decode_topic_route,
    encode,
    encode_header,
    encode_message_batch,
    encode_properties,
    encode_stored_message,
    encode_stored_messages,
    encode_topic_route,
    loads_java_json,
    send_header_from_v2,
    send_header_to_v2,
)

JSON, BIN = codes.SERIALIZE_JSON, codes.SERIALIZE_ROCKETMQ


def _frame(header: bytes, body: bytes = b"", stype: int = JSON) -> bytes:
    return struct.pack(">II", 4 + len(header) + len(body), (stype << 24) | len(header)) \
        + header + body


# --------------------------------------------------------------------------- code tables

def test_codes_match_apache():
    assert codes.SEND_MESSAGE == 10 and codes.PULL_MESSAGE == 11
    assert codes.QUERY_CONSUMER_OFFSET == 14 and codes.UPDATE_CONSUMER_OFFSET == 15
    assert codes.GET_MAX_OFFSET == 30 and codes.GET_MIN_OFFSET == 31
    assert codes.HEART_BEAT == 34 and codes.UNREGISTER_CLIENT == 35
    assert codes.GET_CONSUMER_LIST_BY_GROUP == 38 and codes.CHECK_TRANSACTION_STATE == 39
    assert codes.NOTIFY_CONSUMER_IDS_CHANGED == 40 and codes.GET_ROUTEINFO_BY_TOPIC == 105
    assert codes.SEND_MESSAGE_V2 == 310 and codes.SEND_BATCH_MESSAGE == 320
    for name in ("SEND_MESSAGE", "PULL_MESSAGE", "GET_ROUTEINFO_BY_TOPIC", "SEND_BATCH_MESSAGE",
                 "HEART_BEAT", "CHECK_TRANSACTION_STATE"):
        assert codes.REQUEST_CODES[getattr(codes, name)] == name
    assert codes.request_name(3442) == "POP_MESSAGE"
    assert codes.request_name(200050) == "POP_MESSAGE"  # pre-#8871 JSON clients
    assert codes.request_name(9999) == "unknown_9999"
    assert codes.response_name(0) == "SUCCESS"
    assert codes.response_name(3) == "REQUEST_CODE_NOT_SUPPORTED"
    assert codes.response_name(17) == "TOPIC_NOT_EXIST"
    assert codes.response_name(19) == "PULL_NOT_FOUND"
    assert codes.response_name(22) == "QUERY_NOT_FOUND"
    assert codes.response_name(-1006) == "RPC_TIME_OUT"
    assert codes.response_name(77) == "unknown_77"
    assert codes.LANGUAGE_CODES[3] == "PYTHON" and codes.language_code("GO") == 9
    assert (codes.FLAG_RESPONSE, codes.FLAG_ONEWAY) == (1, 2)
    assert all(-0x8000 <= c <= 0x7FFF for c in codes.REQUEST_CODES)  # fit the binary header


# --------------------------------------------------------------------------- headers

def test_json_header_is_what_java_writes():
    cmd = RemotingCommand(code=105, language="JAVA", version=453, opaque=3, flag=0,
                          ext_fields={"topic": "t"})
    header = encode_header(cmd)
    assert header == (b'{"code":105,"extFields":{"topic":"t"},"flag":0,"language":"JAVA",'
                      b'"opaque":3,"serializeTypeCurrentRPC":"JSON","version":453}')
    frame = encode(cmd)
    assert frame == _frame(header)


def test_binary_header_layout():
    cmd = RemotingCommand(code=310, language="PYTHON", version=7, opaque=0x01020304, flag=2,
                          remark="hé", ext_fields={"a": "g1"}, serialize_type=BIN)
    header = encode_header(cmd)
    ext = struct.pack(">H", 1) + b"a" + struct.pack(">i", 2) + b"g1"
    assert header == (struct.pack(">hBhii", 310, 3, 7, 0x01020304, 2)
                      + struct.pack(">i", 3) + "hé".encode() + struct.pack(">i", len(ext)) + ext)
    frame = encode(cmd, )
    assert frame[4] == 1  # serialize type in the header-length word's high byte
    got, used = decode(frame)
    assert used == len(frame)
    assert got == cmd


@pytest.mark.parametrize("stype", [JSON, BIN])
@pytest.mark.parametrize("includes_self", [False, True])
def test_round_trip(stype, includes_self):
    cmd = RemotingCommand(code=11, language="GO", version=1, opaque=-5, flag=1,
                          remark='quote " backslash \\ newline \n ünï',
                          ext_fields={"topic": "T", "queueId": "3", "x": ""}, body=b"\x00\x01body",
                          serialize_type=stype)
    frame = encode(cmd, length_includes_self=includes_self)
    (length,) = struct.unpack_from(">I", frame)
    assert length == len(frame) - (0 if includes_self else 4)
    got, used = decode(frame + b"extra", length_includes_self=includes_self)
    assert used == len(frame)
    assert got == cmd
    assert got.is_response and not got.is_oneway


@pytest.mark.parametrize("stype", [JSON, BIN])
def test_empty_remark_and_fields(stype):
    cmd = RemotingCommand(code=34, opaque=1, serialize_type=stype)
    got, _ = decode(encode(cmd))
    assert got.remark is None and got.ext_fields == {} and got.body == b""


def test_json_header_any_order_nested_and_escapes():
    header = json.dumps({
        "version": 1, "remark": "caf\u00e9 \"x\"", "opaque": 9, "language": "CPP",
        "flag": 2, "serializeTypeCurrentRPC": "JSON",
        "extFields": {"b": "t\u00f6pic", "e": 2, "g": 1700000000000, "k": False,
                      "nested": {"x": [1, 2], "y": "z"}, "nul": None},
        "code": 310,
    }, ensure_ascii=True).encode()
    assert b"\\u00e9" in header
    cmd, _ = decode(_frame(header, b"body"))
    assert (cmd.code, cmd.opaque, cmd.flag, cmd.version, cmd.language) == (310, 9, 2, 1, "CPP")
    assert cmd.remark == 'café "x"'
    assert cmd.is_oneway and not cmd.is_response
    assert cmd.ext_fields["b"] == "töpic"
    assert cmd.ext_fields["e"] == "2" and cmd.ext_fields["g"] == "1700000000000"
    assert cmd.ext_fields["k"] == "false"
    assert json.loads(cmd.ext_fields["nested"]) == {"x": [1, 2], "y": "z"}
    assert "nul" not in cmd.ext_fields
    assert cmd.body == b"body"


def test_json_header_bare_keys_and_numeric_language():
    cmd, _ = decode(_frame(b'{code:10,language:3,opaque:4,flag:0,extFields:{a:"x:1,b:2"}}'))
    assert (cmd.code, cmd.language, cmd.opaque) == (10, "PYTHON", 4)
    assert cmd.ext_fields == {"a": "x:1,b:2"}


def test_partial_input_needs_more_at_every_split():
    frame = encode(RemotingCommand(code=10, opaque=1, ext_fields={"a": "b"}, body=b"xyz"))
    for i in range(len(frame)):
        assert decode(frame[:i]) is None
    assert decode(frame)[1] == len(frame)


@pytest.mark.parametrize("data, reason", [
    (struct.pack(">I", 2) + b"\0\0", "short_frame"),
    (struct.pack(">I", 1 << 30), "too_large"),
    (struct.pack(">II", 8, (5 << 24) | 4) + b"abcd", "bad_serialize_type"),
    (struct.pack(">II", 8, 99) + b"abcd", "bad_header"),
    (_frame(b"{not json"), "bad_header"),
    (_frame(b"[1,2]"), "bad_header"),
    (_frame(b'{"code":"x"}'), "bad_header"),
    (_frame(b"\0" * 10, stype=BIN), "bad_header"),
])
def test_bad_frames(data, reason):
    with pytest.raises(RocketMQCodecError) as info:
        decode(data)
    assert info.value.reason == reason
    assert isinstance(info.value, ValueError)


def test_tls_hint():
    with pytest.raises(RocketMQCodecError, match="TLS"):
        decode(b"\x16\x03\x01\x02\x00\x01\x00\x01")


def test_truncated_binary_header_raises():
    header = encode_header(RemotingCommand(code=1, remark="remark", ext_fields={"k": "v"},
                                           serialize_type=BIN))
    for i in range(len(header)):
        with pytest.raises(RocketMQCodecError):
            decode_header(header[:i], BIN)
    assert decode_header(header, BIN).ext_fields == {"k": "v"}


def test_encode_refuses_out_of_range():
    with pytest.raises(RocketMQCodecError):
        encode(RemotingCommand(code=200050, serialize_type=BIN))
    with pytest.raises(RocketMQCodecError):
        encode(RemotingCommand(code=1, serialize_type=7))
    # JSON carries any int code (pre-#8871 POP clients)
    assert decode(encode(RemotingCommand(code=200050)))[0].code == 200050


# --------------------------------------------------------------------------- properties

def test_properties_java_semantics():
    props = {"UNIQ_KEY": "ABC", "TAGS": "tagA", "KEYS": "k1 k2"}
    text = encode_properties(props)
    assert text == "UNIQ_KEY\x01ABC\x02TAGS\x01tagA\x02KEYS\x01k1 k2\x02"
    assert decode_properties(text) == props
    # items that are not exactly name\x01value are skipped, as String.split does
    assert decode_properties("a\x01\x02b\x01c\x01d\x02e\x01f") == {"e": "f"}
    assert decode_properties("") == {}


# --------------------------------------------------------------------------- batch

def test_batch_round_trip_and_layout():
    msgs = [Message(body=f"m{i}".encode(), flag=i, properties={"TAGS": f"t{i}"} if i else {})
            for i in range(5)]
    data = encode_message_batch(msgs)
    assert decode_message_batch(data) == msgs
    # first entry: totalSize, magic 0, crc 0, flag, body, properties
    size, magic, crc, flag, blen = struct.unpack_from(">iiiii", data)
    assert (size, magic, crc, flag, blen) == (20 + 2 + 2, 0, 0, 0, 2)
    assert data[20:22] == b"m0" and data[22:24] == b"\0\0"


def test_batch_truncated_raises():
    data = encode_message_batch([Message(b"hello", 0, {"a": "b"})])
    for i in range(1, len(data)):
        with pytest.raises(RocketMQCodecError):
            decode_message_batch(data[:i])
    with pytest.raises(RocketMQCodecError):
        decode_message_batch(struct.pack(">i", 99) + data[4:])


# --------------------------------------------------------------------------- stored messages

def _stored(**kw):
    base = dict(topic="TopicTest", body=b"hello", queue_id=2, queue_offset=7,
                physic_offset=1234, flag=1, sys_flag=0, born_timestamp=1700000000000,
                born_host=("10.1.2.3", 50000), store_timestamp=1700000000001,
                store_host=("192.168.0.10", 10911), reconsume_times=0,
                prepared_transaction_offset=0,
                properties={"UNIQ_KEY": "X", "TAGS": "a"})
    base.update(kw)
    return StoredMessage(**base)


def test_stored_message_layout_and_msg_id():
    msg = _stored()
    data = encode_stored_message(msg)
    size, magic, crc, qid, flag, qoff, poff = struct.unpack_from(">iIiiiqq", data)
    assert size == len(data)
    assert magic == MESSAGE_MAGIC_CODE == (0xAABBCCDD ^ (1880681586 + 8))
    assert crc == body_crc(b"hello") and (qid, flag, qoff, poff) == (2, 1, 7, 1234)
    # msgId = store IP + port + commit-log offset, upper-case hex
    assert msg.msg_id == "C0A8000A00002A9F00000000000004D2"
    assert create_message_id("192.168.0.10", 10911, 1234) == msg.msg_id
    assert decode_message_id(msg.msg_id) == ("192.168.0.10", 10911, 1234)
    (got,) = decode_stored_messages(data)
    assert got == _stored(body_crc=crc)
    assert got.msg_id == msg.msg_id


def test_stored_messages_round_trip_v6_and_long_topic():
    msgs = [_stored(queue_offset=i, physic_offset=100 * i, body=bytes([i]) * i)
            for i in range(3)]
    msgs.append(_stored(born_host=("::1", 1), store_host=("fe80::1", 2)))
    msgs.append(_stored(topic="T" * 200))
    data = encode_stored_messages(msgs)
    got = decode_stored_messages(data)
    assert [(m.topic, m.body, m.queue_offset, m.born_host, m.store_host, m.properties)
            for m in got] == [(m.topic, m.body, m.queue_offset, m.born_host, m.store_host,
                               m.properties) for m in msgs]
    assert got[3].sys_flag & codes.MSG_FLAG_BORNHOST_V6
    assert got[3].sys_flag & codes.MSG_FLAG_STOREHOST_V6
    assert struct.unpack_from(">I", encode_stored_message(msgs[4]), 4)[0] == \
        MESSAGE_MAGIC_CODE_V2


def test_stored_truncated_raises():
    data = encode_stored_message(_stored())
    for i in range(1, len(data)):
        with pytest.raises(RocketMQCodecError):
            decode_stored_messages(data[:i])
    with pytest.raises(RocketMQCodecError, match="bad magic"):
        decode_stored_messages(data[:4] + b"\0\0\0\0" + data[8:])


# --------------------------------------------------------------------------- route data

JAVA_ROUTE = (b'{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:10911"},"brokerName":"broker-a",'
              b'"cluster":"DefaultCluster","enableActingMaster":false}],"filterServerTable":{},'
              b'"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,'
              b'"topicSysFlag":0,"writeQueueNums":4}]}')


def test_topic_route_is_what_the_name_server_writes():
    route = TopicRouteData(queue_datas=[QueueData("broker-a", 4, 4)],
                           broker_datas=[BrokerData("DefaultCluster", "broker-a",
                                                    {0: "127.0.0.1:10911"})])
    assert encode_topic_route(route) == JAVA_ROUTE
    assert decode_topic_route(JAVA_ROUTE) == route


def test_topic_route_lenient_decoding():
    text = ('{ "queueDatas" : [ {"writeQueueNums":8,"readQueueNums":8,"perm":6,'
            '"brokerName":"b"} ], "brokerDatas":[{"cluster":"c","brokerName":"b",'
            '"brokerAddrs":{ 0 : "10.0.0.1:10911", "1":"10.0.0.2:10911", 2:"x,3:y"}}],'
            '"orderTopicConf":"b:8"}')
    route = decode_topic_route(text.encode())
    assert route.broker_datas[0].broker_addrs == {0: "10.0.0.1:10911", 1: "10.0.0.2:10911",
                                                  2: "x,3:y"}
    assert route.queue_datas[0].read_queue_nums == 8
    assert route.order_topic_conf == "b:8"
    with pytest.raises(RocketMQCodecError):
        decode_topic_route(b'{"brokerDatas":[{"brokerAddrs":{"x":"a"}}]}')
    with pytest.raises(RocketMQCodecError):
        decode_topic_route(b"[]")


def test_loads_java_json_keeps_strings_intact():
    assert loads_java_json(b'{"a":"{0:\\"x\\"}",1:[{2:3}]}') == {"a": '{0:"x"}', "1": [{"2": 3}]}


def test_send_header_keys():
    v1 = {"producerGroup": "g", "topic": "t", "queueId": "1", "bname": "broker-a"}
    v2 = send_header_to_v2(v1)
    assert v2 == {"a": "g", "b": "t", "e": "1", "bname": "broker-a"}
    assert send_header_from_v2(v2) == v1


# --------------------------------------------------------------------------- properties-based

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
_commands = st.builds(
    RemotingCommand,
    code=st.integers(-0x8000, 0x7FFF),
    language=st.sampled_from(sorted(codes.LANGUAGE_BY_NAME)),
    version=st.integers(-0x8000, 0x7FFF),
    opaque=st.integers(-2**31, 2**31 - 1),
    flag=st.integers(-2**31, 2**31 - 1),
    remark=st.one_of(st.none(), _text.filter(bool)),
    ext_fields=st.dictionaries(_text, _text, max_size=5),
    body=st.binary(max_size=64),
    serialize_type=st.sampled_from([JSON, BIN]),
)


@given(_commands, st.booleans())
def test_property_round_trip(cmd, includes_self):
    frame = encode(cmd, length_includes_self=includes_self)
    got, used = decode(frame, length_includes_self=includes_self)
    assert used == len(frame)
    assert got == cmd


@given(st.lists(st.builds(Message, body=st.binary(max_size=32),
                          flag=st.integers(-2**31, 2**31 - 1),
                          properties=st.dictionaries(
                              st.text(st.characters(blacklist_categories=("Cs",),
                                                    blacklist_characters="\x01\x02"),
                                      max_size=8),
                              st.text(st.characters(blacklist_categories=("Cs",),
                                                    blacklist_characters="\x01\x02"),
                                      min_size=1, max_size=8),
                              max_size=3)),
                max_size=5))
def test_property_batch_round_trip(msgs):
    assert decode_message_batch(encode_message_batch(msgs)) == msgs


def _only_codec_errors(fn, *args, **kw):
    try:
        fn(*args, **kw)
    except RocketMQCodecError:
        pass


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=300)
@given(st.binary(max_size=200), st.booleans())
def test_garbage_never_raises_anything_else(data, includes_self):
    _only_codec_errors(decode, data, length_includes_self=includes_self)
    _only_codec_errors(decode_header, data, JSON)
    _only_codec_errors(decode_header, data, BIN)
    _only_codec_errors(decode_message_batch, data)
    _only_codec_errors(decode_stored_messages, data)
    _only_codec_errors(decode_topic_route, data)


@settings(max_examples=200)
@given(st.binary(max_size=120))
def test_garbage_inside_a_valid_frame(header):
    for stype in (JSON, BIN):
        _only_codec_errors(decode, _frame(header, b"", stype))
    # a plausible binary header with garbage after the fixed part
    _only_codec_errors(decode_header, struct.pack(">hBhii", 1, 0, 0, 1, 0) + header, BIN)


@settings(max_examples=200)
@given(st.text(alphabet='{}[]:,"\\ 0123abc-.truefalsn', max_size=60))
def test_json_garbage(text):
    _only_codec_errors(loads_java_json, text)
    _only_codec_errors(decode_topic_route, text.encode())
    _only_codec_errors(decode, _frame(text.encode()))
