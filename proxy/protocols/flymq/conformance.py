"""FlyMQ conversations, garbage and random frames for the conformance suite."""

import struct

from hypothesis import strategies as st

from proxy.conformance import C2S, S2C, Conversation, Garbage
from proxy.protocols.flymq import codec


def frame(op, payload=b"", version=1, flags=1, magic=0xAF):
    return bytes([magic, version, op, flags]) + struct.pack(">I", len(payload)) + payload


def produce(value=b"hello", topic=b"test"):
    payload = struct.pack(">H", len(topic)) + topic + struct.pack(">I", 0) \
        + struct.pack(">I", len(value)) + value + struct.pack(">i", -1)
    return frame(0x01, payload)


def fetch_response(n):
    # the real server's layout: count, next_offset, then offset, key, value per message
    body = struct.pack(">IQ", n, n)
    for i in range(n):
        body += struct.pack(">Q", i) + struct.pack(">I", 0) + struct.pack(">I", 3) + b"abc"
    return frame(0x07, body)


# PRODUCE, FETCH (3 messages), CONSUME, an unknown opcode answered by ERROR, and an
# empty-payload LIST_TOPICS: the requests pipelined, then the answers in order.
REQUESTS = [produce(), frame(0x07, b"\x00\x04test" + b"\0" * 16), frame(0x02, b"x" * 14),
            frame(0x99, b"?"), frame(0x08)]
RESPONSES = [frame(0x01, b"r" * 34), fetch_response(3), frame(0x02, b"k" * 12),
             frame(0xFF, b"unknown opcode: 153", flags=0), frame(0x08, b"\0\0\0\0")]


def conversations():
    pipelined = Conversation(
        "pipelined",
        [(C2S, f) for f in REQUESTS] + [(S2C, f) for f in RESPONSES],
        counters={
            "frames": {("c2s", "PRODUCE"): 1, ("c2s", "FETCH"): 1, ("c2s", "CONSUME"): 1,
                       ("c2s", "unknown_153"): 1, ("c2s", "LIST_TOPICS"): 1,
                       ("s2c", "PRODUCE"): 1, ("s2c", "FETCH"): 1, ("s2c", "CONSUME"): 1,
                       ("s2c", "ERROR"): 1, ("s2c", "LIST_TOPICS"): 1},
            "messages": {("c2s", "PRODUCE"): 1, ("s2c", "FETCH"): 3, ("s2c", "CONSUME"): 1},
            "responses": {("PRODUCE", "OK"): 1, ("FETCH", "OK"): 1, ("CONSUME", "OK"): 1,
                          ("unknown_153", "ERROR"): 1, ("LIST_TOPICS", "OK"): 1},
            "hist": {("PRODUCE", "ok"): 1, ("FETCH", "ok"): 1, ("CONSUME", "ok"): 1,
                     ("unknown_153", "error"): 1, ("LIST_TOPICS", "ok"): 1},
            "in_flight": 0, "unmatched": 0, "timeouts": {}, "errors": {}},
        records=[{"direction": "c2s", "opcode_name": n, "kind": "request",
                  "correlation_id": str(i + 1), "frame_bytes": len(REQUESTS[i]),
                  "header_bytes": 8}
                 for i, n in enumerate(["PRODUCE", "FETCH", "CONSUME", "unknown_153",
                                        "LIST_TOPICS"])]
        + [{"direction": "s2c", "opcode_name": n, "kind": "response",
            "correlation_id": str(i + 1), "request_opcode_name": r, "status": s,
            "outcome": o, "messages": m}
           for i, (n, r, s, o, m) in enumerate([
               ("PRODUCE", "PRODUCE", "OK", "ok", 0), ("FETCH", "FETCH", "OK", "ok", 3),
               ("CONSUME", "CONSUME", "OK", "ok", 1),
               ("ERROR", "unknown_153", "ERROR", "error", 0),
               ("LIST_TOPICS", "LIST_TOPICS", "OK", "ok", 0)])])
    unanswered = Conversation(
        "unanswered",
        [(C2S, REQUESTS[0]), (S2C, RESPONSES[0]), (C2S, REQUESTS[2]), (S2C, frame(0x01)),
         (S2C, frame(0x01)), (C2S, REQUESTS[4])],
        counters={"responses": {("PRODUCE", "OK"): 1, ("CONSUME", "OK"): 1},
                  "errors": {("s2c", "response_mismatch"): 1}, "unmatched": 1,
                  "timeouts": {}, "cutoffs": {"LIST_TOPICS": 1}, "in_flight": 0},
        records=[{"kind": "request", "correlation_id": "1"},
                 {"kind": "response", "correlation_id": "1"},
                 {"kind": "request", "correlation_id": "2"},
                 {"kind": "response", "correlation_id": "2",
                  "request_opcode_name": "CONSUME", "opcode_name": "PRODUCE"},
                 {"kind": "response", "correlation_id": None, "latency_ns": None},
                 {"kind": "request", "correlation_id": "3"},
                 {"kind": "event", "opcode_name": "LIST_TOPICS", "correlation_id": "3",
                  "request_opcode_name": "LIST_TOPICS", "status": "closed"}])
    # The real server answers AUTH with AUTH_RESPONSE (0x71): the answer, not a mismatch.
    auth_frames = [codec.AuthRequest("alice", "pw").to_frame(),
                   codec.AuthResponse(True, "", "alice", ["admin"]).to_frame()]
    auth = Conversation(
        "auth",
        [(C2S, auth_frames[0]), (S2C, auth_frames[1])],
        counters={"frames": {("c2s", "AUTH"): 1, ("s2c", "AUTH_RESPONSE"): 1},
                  "responses": {("AUTH", "OK"): 1}, "hist": {("AUTH", "ok"): 1},
                  "errors": {}, "unmatched": 0, "in_flight": 0},
        records=[{"kind": "request", "opcode_name": "AUTH", "correlation_id": "1"},
                 {"kind": "response", "opcode_name": "AUTH_RESPONSE", "correlation_id": "1",
                  "request_opcode_name": "AUTH", "status": "OK", "outcome": "ok"}])
    return [pipelined, unanswered, resources(), auth]


# Frame-log resources: the topic of every topic-naming request (first field, or after
# TXN_PRODUCE's transaction id); none on responses, on AUTH (whose password is never
# read), on a compressed payload, or when the topic runs past the payload.
AUTH_PASSWORD = b"s3cr3t-Passw0rd"
TOPIC_REQUESTS = [
    (codec.ProduceRequest("orders", b"v1").to_frame(), "orders"),
    (codec.FetchRequest("orders", 0, 0, 10).to_frame(), "orders"),
    (codec.ConsumeRequest("audit.log", 1, 7).to_frame(), "audit.log"),
    (codec.CreateTopicRequest("t\u00e9l\u00e9", 3).to_frame(), "t\u00e9l\u00e9"),
    (codec.SubscribeRequest("orders", "grp").to_frame(), "orders"),
    (codec.CommitRequest("orders", "grp", 0, 5).to_frame(), "orders"),
    (codec.DeleteTopicRequest("old").to_frame(), "old"),
    (codec.AuthRequest("alice", AUTH_PASSWORD.decode()).to_frame(), None),
    (frame(0x43, b"\x00\x05txn-1\x00\x03txt" + b"\0\0\0\x01d"), "txt"),   # TXN_PRODUCE
    (frame(0x01, produce(topic=b"zipped")[8:], flags=0x03), None),          # gzip flag
    (frame(0x01, b"\x00\x09short"), None),                                  # topic cut short
    (frame(0x04, b"\x00\x00"), ""),                                          # empty topic
    (codec.MetadataRequest("L" * 300).to_frame(), "L" * 256),
    (codec.ListTopicsRequest().to_frame(), None),
]


def resources():
    n = len(TOPIC_REQUESTS)
    return Conversation(
        "resources",
        [(C2S, f) for f, _ in TOPIC_REQUESTS] + [(S2C, frame(0xFF, b"\0\0\0"))] * n,
        counters={"unmatched": 0, "in_flight": 0, "errors": {}},
        records=[{"kind": "request", "correlation_id": str(i + 1), "resource": r,
                  "attrs": None} for i, (_, r) in enumerate(TOPIC_REQUESTS)]
        + [{"kind": "response", "correlation_id": str(i + 1), "resource": None}
           for i in range(n)])


def garbage():
    return [Garbage("tls-hello", C2S, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
                    "bad_magic"),
            Garbage("http", C2S, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "bad_magic"),
            Garbage("huge-length", C2S, frame(0x01)[:4] + b"\xff\xff\xff\xff",
                    "frame_too_large"),
            Garbage("bad-version", C2S, frame(0x01, b"abc", version=9), "bad_version",
                    fatal=False)]


def requests(n):
    return [frame(0x01, b"%08d" % i) for i in range(n)]


_OPS = [0x01, 0x02, 0x03, 0x04, 0x07, 0x08, 0x09, 0x10, 0x30, 0x43, 0x70, 0x71, 0x99]


@st.composite
def _string(draw):
    """A u16-length string, its length sometimes a lie."""
    data = draw(st.sampled_from([b"", b"t", b"orders", b"\xc3\xa9t\xe9", b"N" * 300]))
    n = draw(st.sampled_from([len(data), len(data), len(data) + 3, 0, 0xFFFF]))
    return struct.pack(">H", n & 0xFFFF) + data


@st.composite
def _frame(draw):
    d = draw(st.sampled_from([C2S, S2C]))
    op = draw(st.sampled_from(_OPS + ([0xFF] if d == S2C else [])))
    if d == S2C and op == 0x07 and draw(st.booleans()):
        return d, fetch_response(draw(st.integers(0, 4)))
    flags = draw(st.sampled_from([1, 1, 0, 3, 9]))
    if draw(st.booleans()):                          # strings first: a topic (or txn id)
        payload = b"".join(draw(st.lists(_string(), min_size=1, max_size=2)))
        payload += draw(st.binary(max_size=12))
    else:
        payload = draw(st.binary(max_size=40))
    return d, frame(op, payload, version=draw(st.sampled_from([1, 1, 2])), flags=flags)


def frames():
    return st.lists(_frame(), max_size=24)
