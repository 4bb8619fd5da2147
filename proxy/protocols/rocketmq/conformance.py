"""RocketMQ remoting conversations, garbage and random frames for the conformance suite."""

import json
import struct

from hypothesis import strategies as st

from proxy.conformance import C2S, S2C, Conversation, Garbage, scheduled


def jframe(header, body=b"", includes_self=False):
    h = json.dumps(header).encode() if isinstance(header, dict) else header
    length = 4 + len(h) + len(body) + (4 if includes_self else 0)
    return struct.pack(">II", length, len(h)) + h + body


def bframe(code, opaque, flag, ext=None, body=b"", remark=b""):
    ext = ext or {}
    e = b"".join(struct.pack(">H", len(k)) + k + struct.pack(">i", len(v)) + v
                 for k, v in ext.items())
    h = struct.pack(">HBHii", code, 6, 1, opaque, flag) + struct.pack(">i", len(remark)) + \
        remark + struct.pack(">i", len(e)) + e
    return struct.pack(">II", 4 + len(h) + len(body), (1 << 24) | len(h)) + h + body


def req(code, opaque, flag=0, **ext):
    return jframe({"code": code, "language": "JAVA", "version": 433, "opaque": opaque,
                   "flag": flag, "extFields": {k: str(v) for k, v in ext.items()}})


def resp(code, opaque, body=b"", **ext):
    return jframe({"code": code, "language": "JAVA", "version": 433, "opaque": opaque,
                   "flag": 1, "remark": None, "extFields": ext, "serializeTypeCurrentRPC": "JSON"},
                  body)


def message(body):
    """A minimal message entry: totalSize (includes itself) then content."""
    return struct.pack(">i", 4 + 20 + len(body)) + b"\0" * 20 + body


# A producer talking to the name server then the broker: the route lookup, a V2 send with
# the short keys (nested extFields repeating "code"/"flag" names, escapes, odd key order,
# whitespace), a batch of 3, a pull answered with 2 messages, a oneway offset update, a
# broker->client request (NOTIFY_CONSUMER_IDS_CHANGED) answered by the client, a binary
# header send, and a failed send.
V2_HEADER = (b'{ "extFields" : {"a":"grp","b":"TopicTest","flag":"0","code":"7",'
             b'"i":"KEYS\\u0001k1\\u0002TAGS\\u0001t\\"a\\"g"} , "flag":0,'
             b'"opaque" : 3, "language":"CPP","code":310 ,"version":1}')
C2S_FRAMES = [
    req(105, 1, topic="TopicTest"),
    jframe(V2_HEADER, b"hello"),
    jframe({"code": 320, "opaque": 4, "flag": 0, "extFields": {"b": "TopicTest"}},
           message(b"one") + message(b"two") + message(b"three!")),
    req(11, 5, topic="TopicTest", queueId=0, queueOffset=0),
    req(15, 6, flag=2, topic="TopicTest"),                       # oneway (bit 1)
    resp(0, 900),                                                # answers the broker's request
    bframe(10, 7, 0, {b"topic": b"TopicTest"}, b"payload"),
    req(310, 8, b="TopicTest"),
]
S2C_FRAMES = [
    resp(0, 1, b'{"brokerDatas":[{"brokerAddrs":{0:"10.0.0.7:10911"}}]}'),
    resp(0, 3, msgId="AC11", queueId="1", queueOffset="0"),
    resp(0, 4),
    resp(0, 5, message(b"m1") + message(b"m2"), nextBeginOffset="2"),
    req(40, 900, consumerGroup="g"),                             # broker -> client request
    bframe(0, 7, 1),
    resp(17, 8),                                                 # TOPIC_NOT_EXIST
]
SCHEDULE = [(C2S, 0, 5), (S2C, 0, 5), (C2S, 5, 8), (S2C, 5, 7)]


def conversations():
    producer = Conversation(
        "producer", scheduled(SCHEDULE, C2S_FRAMES, S2C_FRAMES),
        counters={
            "frames": {
                ("c2s", "GET_ROUTEINFO_BY_TOPIC"): 1, ("c2s", "SEND_MESSAGE_V2"): 2,
                ("c2s", "SEND_BATCH_MESSAGE"): 1, ("c2s", "PULL_MESSAGE"): 1,
                ("c2s", "UPDATE_CONSUMER_OFFSET"): 1,
                ("c2s", "NOTIFY_CONSUMER_IDS_CHANGED"): 1, ("c2s", "SEND_MESSAGE"): 1,
                ("s2c", "GET_ROUTEINFO_BY_TOPIC"): 1, ("s2c", "SEND_MESSAGE_V2"): 2,
                ("s2c", "SEND_BATCH_MESSAGE"): 1, ("s2c", "PULL_MESSAGE"): 1,
                ("s2c", "NOTIFY_CONSUMER_IDS_CHANGED"): 1, ("s2c", "SEND_MESSAGE"): 1},
            "messages": {("c2s", "SEND_MESSAGE_V2"): 2, ("c2s", "SEND_BATCH_MESSAGE"): 3,
                         ("c2s", "SEND_MESSAGE"): 1, ("s2c", "PULL_MESSAGE"): 2},
            "responses": {
                ("GET_ROUTEINFO_BY_TOPIC", "SUCCESS"): 1, ("SEND_MESSAGE_V2", "SUCCESS"): 1,
                ("SEND_MESSAGE_V2", "TOPIC_NOT_EXIST"): 1, ("SEND_BATCH_MESSAGE", "SUCCESS"): 1,
                ("PULL_MESSAGE", "SUCCESS"): 1, ("NOTIFY_CONSUMER_IDS_CHANGED", "SUCCESS"): 1,
                ("SEND_MESSAGE", "SUCCESS"): 1},
            "unmatched": 0, "in_flight": 0, "errors": {}, "timeouts": {}},
        records=[{"direction": "c2s", "opcode_name": "GET_ROUTEINFO_BY_TOPIC",
                  "kind": "request", "correlation_id": "1"},
                 {"opcode_name": "SEND_MESSAGE_V2", "correlation_id": "3", "messages": 1},
                 {"opcode_name": "SEND_BATCH_MESSAGE", "correlation_id": "4", "messages": 3},
                 {"opcode_name": "PULL_MESSAGE", "correlation_id": "5"},
                 {"opcode_name": "UPDATE_CONSUMER_OFFSET", "kind": "oneway",
                  "correlation_id": "6"},
                 {"direction": "s2c", "kind": "response", "correlation_id": "1",
                  "request_opcode_name": "GET_ROUTEINFO_BY_TOPIC", "status": "SUCCESS"},
                 {"correlation_id": "3"}, {"correlation_id": "4"},
                 {"correlation_id": "5", "messages": 2},
                 {"direction": "s2c", "kind": "request", "correlation_id": "900",
                  "opcode_name": "NOTIFY_CONSUMER_IDS_CHANGED"},
                 {"direction": "c2s", "kind": "response", "correlation_id": "900"},
                 {"opcode_name": "SEND_MESSAGE", "correlation_id": "7"},
                 {"opcode_name": "SEND_MESSAGE_V2", "correlation_id": "8"},
                 {"correlation_id": "7", "outcome": "ok"},
                 {"correlation_id": "8", "status": "TOPIC_NOT_EXIST", "outcome": "error"}])
    go_oneway = Conversation(
        "go-oneway-and-unmatched",
        [(C2S, req(15, 40, flag=1, topic="t")), (S2C, resp(0, 41)), (C2S, req(11, 42))],
        counters={"unmatched": 1, "timeouts": {}, "cutoffs": {"PULL_MESSAGE": 1},
                  "frames": {("c2s", "UPDATE_CONSUMER_OFFSET"): 1,
                             ("s2c", "unmatched_response"): 1, ("c2s", "PULL_MESSAGE"): 1}},
        records=[{"kind": "oneway", "correlation_id": "40"},
                 {"kind": "response", "correlation_id": "41", "latency_ns": None},
                 {"kind": "request", "correlation_id": "42"},
                 {"kind": "event", "correlation_id": "42", "opcode_name": "PULL_MESSAGE",
                  "status": "closed"}])
    return [producer, go_oneway, resources()]


# Frame-log resources: the topic of every request, from extFields (full names, the V2
# short key "b", a binary header, JSON escapes, the json.loads fallback); responses and
# undecodable frames carry none, and ACL credentials in extFields never leave the header.
SECRET_VALUES = (b"AKIDsecretAccessKey42", b"c2VjcmV0U2lnbmF0dXJl", b"secTokenXYZ")
ESCAPED_TOPIC = (rb'{"code":11,"opaque":13,"flag":0,"extFields":{"consumerGroup":"g",'
                 rb'"topic":"T\u00e9st\/\"q\"\ud83d\ude00"}}')
FALLBACK_HEADER = rb'{"co\u0064e":11,"opaque":14,"flag":0,"extFields":{"topic":"Fallback"}}'
RESOURCE_C2S = [
    req(10, 10, producerGroup="pg", topic="OrderTopic", defaultTopic="TBW102", queueId=1),
    req(310, 11, a="pg", b="ShortKeyTopic", c="TBW102", d=4, e=1),
    jframe({"code": 320, "opaque": 12, "flag": 0, "extFields": {"a": "pg", "b": "BatchTopic"}},
           message(b"one") + message(b"two")),
    req(11, 15, consumerGroup="cg", topic="PullTopic", queueId=0, queueOffset=0),
    jframe(ESCAPED_TOPIC),
    jframe(FALLBACK_HEADER),
    req(10, 16, AccessKey=SECRET_VALUES[0].decode(), Signature=SECRET_VALUES[1].decode(),
        SecurityToken=SECRET_VALUES[2].decode(), producerGroup="pg", topic="AclTopic"),
    bframe(10, 17, 0, {b"producerGroup": b"pg", b"topic": b"BinaryTopic"}, b"payload"),
    req(34, 18),                                                 # HEART_BEAT: no topic
    jframe(b'{"code":11,"opaque":19,"flag":0,"extFields":{"topic":7}}'),  # not a string
]
RESOURCE_S2C = [resp(0, 10, topic="OrderTopic"), resp(0, 11), resp(0, 12), resp(19, 15)]


def resources():
    return Conversation(
        "resources", [(C2S, f) for f in RESOURCE_C2S] + [(S2C, f) for f in RESOURCE_S2C],
        counters={"messages": {("c2s", "SEND_MESSAGE"): 3, ("c2s", "SEND_MESSAGE_V2"): 1,
                               ("c2s", "SEND_BATCH_MESSAGE"): 2},
                  "errors": {}, "unmatched": 0},
        records=[{"opcode_name": "SEND_MESSAGE", "correlation_id": "10",
                  "resource": "OrderTopic", "attrs": None},
                 {"opcode_name": "SEND_MESSAGE_V2", "correlation_id": "11",
                  "resource": "ShortKeyTopic"},
                 {"opcode_name": "SEND_BATCH_MESSAGE", "resource": "BatchTopic",
                  "messages": 2},
                 {"opcode_name": "PULL_MESSAGE", "correlation_id": "15",
                  "resource": "PullTopic"},
                 {"opcode_name": "PULL_MESSAGE", "correlation_id": "13",
                  "resource": "T\u00e9st/\"q\"\U0001F600"},
                 {"opcode_name": "PULL_MESSAGE", "correlation_id": "14", "resource": "Fallback"},
                 {"opcode_name": "SEND_MESSAGE", "correlation_id": "16", "resource": "AclTopic",
                  "attrs": None},
                 {"opcode_name": "SEND_MESSAGE", "correlation_id": "17",
                  "resource": "BinaryTopic"},
                 {"opcode_name": "HEART_BEAT", "resource": None},
                 {"opcode_name": "PULL_MESSAGE", "correlation_id": "19", "resource": None},
                 {"kind": "response", "correlation_id": "10", "resource": None},
                 {"kind": "response", "correlation_id": "11", "resource": None},
                 {"kind": "response", "correlation_id": "12", "resource": None},
                 {"kind": "response", "correlation_id": "15", "status": "PULL_NOT_FOUND",
                  "resource": None},
                 {"kind": "event", "correlation_id": "13"},
                 {"kind": "event", "correlation_id": "14"},
                 {"kind": "event", "correlation_id": "16"},
                 {"kind": "event", "correlation_id": "17"},
                 {"kind": "event", "correlation_id": "18"},
                 {"kind": "event", "correlation_id": "19"}])


def garbage():
    return [Garbage("huge-length", C2S, b"\x7f\xff\xff\xff\0\0\0\x10", "frame_too_large"),
            Garbage("tiny-length", C2S, b"\0\0\0\x01\0\0\0\0", "frame_too_small"),
            Garbage("bad-serialization", C2S, b"\0\0\0\x10\x07\0\0\x02{}" + b"\0" * 10,
                    "bad_header"),
            Garbage("header-past-frame", C2S, b"\0\0\0\x08\0\0\0\x40abcd", "bad_header"),
            Garbage("not-json", C2S, jframe(b"{nope", b""), "bad_header", fatal=False),
            Garbage("int-past-64-bits", C2S, jframe(b'{"code":99999999999999999999}'),
                    "bad_header", fatal=False),
            Garbage("infinity", S2C, jframe(b'{"code":1e999,"flag":1}'), "bad_header",
                    fatal=False),
            Garbage("deep-nesting", C2S, jframe(b'{"k\\"":' + b"[" * 4000 + b"]" * 4000 + b"}"),
                    "bad_header", fatal=False),
            Garbage("http", C2S, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "frame_too_large")]


def requests(n):
    return [req(11, i + 1) for i in range(n)]


_TOPIC_VALUES = [b'"t"', b'"TopicTest"', b'""', rb'"a\u00e9\/b"', rb'"\ud83d\ude00x"',
                 rb'"\ud800"', rb'"\udc00\u0041"', rb'"\ud800\u0041"', rb'"bad\x"', rb'"\u12"',
                 rb'"\u12G4"', rb'"q\"\\"', b'7', b'null', b'{"topic":"nested"}',
                 b'"' + b"L" * 300 + b'"', rb'"\u00e9' + b"M" * 260 + b'"']
_EXT_KEYS = [b"topic", b"b", b"a", b"AccessKey", rb"top\u0069c"]


@st.composite
def _ext_fields(draw):
    """A JSON extFields object: topic-ish members in any order, duplicates included."""
    members = draw(st.lists(st.tuples(st.sampled_from(_EXT_KEYS),
                                      st.sampled_from(_TOPIC_VALUES)), max_size=4))
    return b"{" + b",".join(b'"%s":%s' % kv for kv in members) + b"}"


@st.composite
def _frame(draw):
    d = draw(st.sampled_from([C2S, S2C]))
    code = draw(st.sampled_from([0, 10, 11, 15, 17, 40, 105, 310, 320, 325]))
    opaque = draw(st.integers(0, 5))
    flag = draw(st.sampled_from([0, 1, 2, 3]))
    body = draw(st.sampled_from([b"", message(b"a"), message(b"b") + message(b"cc"),
                                 b"\0\0\0\x01"]))
    shape = draw(st.integers(0, 3))
    if shape == 0:
        key = draw(st.sampled_from([b"topic", b"b", b"x"]))
        value = draw(st.sampled_from([b"t", b"", b"T" * 300]))
        return d, bframe(code, opaque, flag, {key: value}, body)
    if shape == 1:
        return d, jframe({"code": code, "opaque": opaque, "flag": flag}, body)
    ext = draw(_ext_fields())
    head = b'"code":%d,"opaque":%d,"flag":%d' % (code, opaque, flag)
    if shape == 3:                                   # escaped key: the json.loads fallback
        head = b'"co\\u0064e":%d,"opaque":%d,"flag":%d' % (code, opaque, flag)
    parts = [head, b'"extFields":' + ext]
    if draw(st.booleans()):
        parts.reverse()
    if draw(st.booleans()):                          # a second extFields: the last wins
        parts.append(b'"extFields":' + draw(_ext_fields()))
    return d, jframe(b"{" + b",".join(parts) + b"}", body)


def frames():
    return st.lists(_frame(), max_size=24)
