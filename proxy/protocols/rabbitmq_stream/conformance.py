"""RabbitMQ Stream conversations, garbage and random frames for the conformance suite."""

import gzip

from hypothesis import strategies as st

from proxy.conformance import C2S, S2C, Conversation, Garbage, scheduled
from proxy.protocols.rabbitmq_stream import constants as K
from proxy.protocols.rabbitmq_stream.codec import (PublishedMessage, PublishingError,
                                                   SubBatch, build_chunk, encode_command,
                                                   encode_frame)


def req(key, **f):
    return encode_command(key, **f)


def resp(key, **f):
    return encode_command(key, response=True, **f)


def publish(pubid, ids, size=100, version=1):
    msgs = [PublishedMessage(i, b"m" * size, "f" if version >= 2 else None) for i in ids]
    return encode_command(K.PUBLISH, version=version, publisher_id=pubid, messages=msgs)


def sub_batch(n, size=10, gzipped=False):
    """A sub-entry batch of n records of size bytes (rstream send_sub_entry's layout)."""
    sb = SubBatch.of([b"s" * size] * n)
    if gzipped:
        sb = SubBatch(1, n, sb.uncompressed_length, gzip.compress(sb.data, mtime=0))
    return sb


def publish_mixed(pubid, entries, version=1):
    """Publish of entries: (publishing id, n): n = None a simple 100-byte message, else a
    sub-entry batch of n records (gzip when n is odd)."""
    msgs = [PublishedMessage(i, b"m" * 100 if n is None else sub_batch(n, gzipped=n % 2 == 1),
                             "f" if version >= 2 else None) for i, n in entries]
    return encode_command(K.PUBLISH, version=version, publisher_id=pubid, messages=msgs)


def deliver(n_records, version=1):
    chunk = build_chunk([b"r%d" % i for i in range(n_records)], first_offset=0,
                        timestamp=1700000000000)
    fields = {"subscription_id": 1, "chunk": chunk}
    if version >= 2:
        fields["committed_chunk_id"] = 0
    return encode_command(K.DELIVER, version=version, **fields)


# A client that connects, publishes 3 + 2 messages (one rejected), consumes 5 and answers
# the server's Close; requests in both directions, Tune proposed by the server.
C2S_FRAMES = [
    req(K.PEER_PROPERTIES, correlation_id=1, properties={"product": "test"}),
    req(K.SASL_HANDSHAKE, correlation_id=2),
    req(K.SASL_AUTHENTICATE, correlation_id=3, mechanism="PLAIN", data=b"\0guest\0guest"),
    encode_command(K.TUNE, frame_max=1048576, heartbeat=60),          # client's answer
    req(K.OPEN, correlation_id=4, virtual_host="/"),
    req(K.DECLARE_PUBLISHER, correlation_id=5, publisher_id=7, reference=None, stream="s"),
    publish(7, [1, 2, 3]),
    publish(7, [4, 5], version=2),
    req(K.SUBSCRIBE, correlation_id=6, subscription_id=1, stream="s", offset_type=1,
        credit=10, properties={}),
    req(K.CREDIT, subscription_id=1, credit=1),
    req(K.STORE_OFFSET, reference="app", stream="s", offset=4),
    req(K.HEARTBEAT),
    resp(K.CLOSE, correlation_id=9, code=K.OK),                       # answers server Close
]
S2C_FRAMES = [
    resp(K.PEER_PROPERTIES, correlation_id=1, code=K.OK, properties={}),
    resp(K.SASL_HANDSHAKE, correlation_id=2, code=K.OK, mechanisms=["PLAIN"]),
    resp(K.SASL_AUTHENTICATE, correlation_id=3, code=K.OK),
    encode_command(K.TUNE, frame_max=1048576, heartbeat=60),          # server proposes
    resp(K.OPEN, correlation_id=4, code=K.OK, properties={}),
    resp(K.DECLARE_PUBLISHER, correlation_id=5, code=K.OK),
    req(K.PUBLISH_CONFIRM, publisher_id=7, publishing_ids=[1, 2]),
    req(K.PUBLISH_ERROR, publisher_id=7, errors=[PublishingError(3, K.PUBLISHER_DOES_NOT_EXIST)]),
    req(K.PUBLISH_CONFIRM, publisher_id=7, publishing_ids=[4, 5]),
    resp(K.SUBSCRIBE, correlation_id=6, code=K.OK),
    deliver(3),
    deliver(2, version=2),
    resp(K.CREDIT, code=K.SUBSCRIPTION_ID_DOES_NOT_EXIST, subscription_id=9),
    req(K.CLOSE, correlation_id=9, code=K.OK, reason="bye"),            # server-initiated
]
# Causal order: every request is fed before the response that answers it.
SCHEDULE = [(C2S, 0, 3), (S2C, 0, 4), (C2S, 3, 9), (S2C, 4, 14), (C2S, 9, 13)]


def conversations():
    full = Conversation(
        "client-session", scheduled(SCHEDULE, C2S_FRAMES, S2C_FRAMES),
        counters={
            "messages": {("c2s", "Publish"): 5, ("s2c", "Deliver"): 5},
            "responses": {
                ("PeerProperties", "OK"): 1, ("SaslHandshake", "OK"): 1,
                ("SaslAuthenticate", "OK"): 1, ("Tune", "OK"): 1, ("Open", "OK"): 1,
                ("DeclarePublisher", "OK"): 1, ("Publish", "OK"): 4,
                ("Publish", "PUBLISHER_DOES_NOT_EXIST"): 1, ("Subscribe", "OK"): 1,
                ("Credit", "SUBSCRIPTION_ID_DOES_NOT_EXIST"): 1, ("Close", "OK"): 1},
            "unmatched": 0, "in_flight": 0, "errors": {}, "timeouts": {}})
    # one row per publishing id; the frame's bytes on its first row only
    p1, p2 = publish(7, [1, 2, 3]), publish(7, [4, 5], version=2)
    rows = Conversation(
        "publish-rows",
        [(C2S, p1), (C2S, p2),
         (S2C, req(K.PUBLISH_CONFIRM, publisher_id=7, publishing_ids=[1, 2])),
         (S2C, req(K.PUBLISH_ERROR, publisher_id=7,
                   errors=[PublishingError(3, K.PUBLISHER_DOES_NOT_EXIST)])),
         (S2C, deliver(3))],
        counters={"timeouts": {}, "cutoffs": {"Publish": 2}, "in_flight": 0},
        records=[{"opcode_name": "Publish", "kind": "request", "correlation_id": "7:1",
                  "frame_bytes": len(p1), "messages": 1},
                 {"opcode_name": "Publish", "correlation_id": "7:2", "frame_bytes": 0},
                 {"opcode_name": "Publish", "correlation_id": "7:3", "frame_bytes": 0},
                 {"opcode_name": "Publish", "correlation_id": "7:4", "frame_bytes": len(p2)},
                 {"opcode_name": "Publish", "correlation_id": "7:5", "frame_bytes": 0},
                 {"opcode_name": "PublishConfirm", "kind": "response", "status": "OK",
                  "correlation_id": "7:1", "request_opcode_name": "Publish"},
                 {"opcode_name": "PublishConfirm", "correlation_id": "7:2", "frame_bytes": 0},
                 {"opcode_name": "PublishError", "correlation_id": "7:3", "outcome": "error",
                  "status": "PUBLISHER_DOES_NOT_EXIST", "request_opcode_name": "Publish"},
                 {"opcode_name": "Deliver", "kind": "oneway", "messages": 3},
                 {"kind": "event", "opcode_name": "Publish", "correlation_id": "7:4"},
                 {"kind": "event", "opcode_name": "Publish", "correlation_id": "7:5"}])
    return [full, rows, streams(), sub_entries()]


# Publish v1 and v2 mixing simple messages and sub-entry batches (one publishing id and
# one confirm per entry, Count messages), the confirms, and a chunk of batches.
SUB_V1 = publish_mixed(7, [(1, None), (2, 3), (3, None), (4, 2), (5, 0)])
SUB_V2 = publish_mixed(7, [(6, None), (7, 5)], version=2)
SUB_ONLY = publish_mixed(9, [(1, 65535)])


def sub_entries():
    chunk = build_chunk([b"a", sub_batch(4), b"b", sub_batch(3, gzipped=True)],
                        first_offset=0, timestamp=1700000000000)
    pub_rows = [(1, 1, len(SUB_V1)), (2, 3, 0), (3, 1, 0), (4, 2, 0), (5, 0, 0),
                (6, 1, len(SUB_V2)), (7, 5, 0)]
    return Conversation(
        "sub-entries",
        [(C2S, SUB_V1), (C2S, SUB_V2), (C2S, SUB_ONLY),
         (S2C, req(K.PUBLISH_CONFIRM, publisher_id=7, publishing_ids=[1, 2, 3, 4, 5])),
         (S2C, req(K.PUBLISH_ERROR, publisher_id=7,
                   errors=[PublishingError(6, K.PRECONDITION_FAILED)])),
         (S2C, req(K.PUBLISH_CONFIRM, publisher_id=7, publishing_ids=[7])),
         (S2C, req(K.PUBLISH_CONFIRM, publisher_id=9, publishing_ids=[1])),
         (S2C, encode_command(K.DELIVER, subscription_id=1, chunk=chunk))],
        counters={"frames": {("c2s", "Publish"): 3, ("s2c", "PublishConfirm"): 3,
                             ("s2c", "PublishError"): 1, ("s2c", "Deliver"): 1},
                  "messages": {("c2s", "Publish"): 1 + 3 + 1 + 2 + 0 + 1 + 5 + 65535,
                               ("s2c", "Deliver"): 9},
                  "responses": {("Publish", "OK"): 7, ("Publish", "PRECONDITION_FAILED"): 1},
                  "unmatched": 0, "in_flight": 0, "errors": {}, "timeouts": {}},
        records=[{"opcode_name": "Publish", "kind": "request", "correlation_id": "7:%d" % i,
                  "messages": m, "frame_bytes": fb} for i, m, fb in pub_rows]
        + [{"opcode_name": "Publish", "correlation_id": "9:1", "messages": 65535,
            "frame_bytes": len(SUB_ONLY)}]
        + [{"opcode_name": "PublishConfirm", "correlation_id": "7:%d" % i, "status": "OK",
            "request_opcode_name": "Publish", "messages": 1} for i in range(1, 6)]
        + [{"opcode_name": "PublishError", "correlation_id": "7:6",
            "status": "PRECONDITION_FAILED", "outcome": "error"},
           {"opcode_name": "PublishConfirm", "correlation_id": "7:7", "outcome": "ok"},
           {"opcode_name": "PublishConfirm", "correlation_id": "9:1", "outcome": "ok"},
           {"opcode_name": "Deliver", "kind": "oneway", "messages": 9}])


# Frame-log resources: the stream each request names; DeclarePublisher / Subscribe bind it
# to their id so every Publish / PublishConfirm / PublishError row and every Deliver
# carries it, until DeletePublisher / Unsubscribe forget the id.  SASL is never read.
SASL_SECRET = b"\0app-user\0s3cret-Pa55word"
LONG_STREAM = "S" * 300
STREAM_STEPS = [
    (C2S, req(K.SASL_HANDSHAKE, correlation_id=1)),
    (S2C, resp(K.SASL_HANDSHAKE, correlation_id=1, code=K.OK, mechanisms=["PLAIN"])),
    (C2S, req(K.SASL_AUTHENTICATE, correlation_id=2, mechanism="PLAIN", data=SASL_SECRET)),
    (S2C, resp(K.SASL_AUTHENTICATE, correlation_id=2, code=K.OK)),
    (C2S, req(K.CREATE, correlation_id=3, stream="orders", arguments={"max-age": "1h"})),
    (S2C, resp(K.CREATE, correlation_id=3, code=K.OK)),
    (C2S, req(K.DECLARE_PUBLISHER, correlation_id=4, publisher_id=7, reference="ref-" * 30,
              stream="orders")),
    (C2S, req(K.DECLARE_PUBLISHER, correlation_id=5, publisher_id=8, reference=None,
              stream="audit")),
    (S2C, resp(K.DECLARE_PUBLISHER, correlation_id=4, code=K.OK)),
    (C2S, publish(7, [1, 2, 3])),
    (C2S, publish(8, [1], version=2)),
    (S2C, req(K.PUBLISH_CONFIRM, publisher_id=7, publishing_ids=[1, 2])),
    (S2C, req(K.PUBLISH_ERROR, publisher_id=7,
              errors=[PublishingError(3, K.PUBLISHER_DOES_NOT_EXIST)])),
    (C2S, req(K.QUERY_PUBLISHER_SEQUENCE, correlation_id=6, reference="ref1", stream="orders")),
    (C2S, req(K.SUBSCRIBE, correlation_id=7, subscription_id=1, stream="events",
              offset_type=1, credit=10, properties={})),
    (S2C, deliver(2)),
    (C2S, req(K.CREDIT, subscription_id=1, credit=5)),
    (S2C, req(K.CONSUMER_UPDATE, correlation_id=100, subscription_id=1, active=1)),
    (C2S, req(K.STORE_OFFSET, reference="app", stream="events", offset=2)),
    (C2S, req(K.QUERY_OFFSET, correlation_id=8, reference="app", stream="events")),
    (C2S, req(K.METADATA, correlation_id=9, streams=["orders"])),
    (C2S, req(K.METADATA, correlation_id=10, streams=["orders", "events"])),
    (C2S, req(K.ROUTE, correlation_id=11, routing_key="eu", super_stream="invoices")),
    (C2S, req(K.PARTITIONS, correlation_id=12, super_stream="invoices")),
    (C2S, req(K.STREAM_STATS, correlation_id=13, stream=LONG_STREAM)),
    (S2C, req(K.METADATA_UPDATE, code=K.STREAM_NOT_AVAILABLE, stream="audit")),
    (C2S, req(K.DELETE_PUBLISHER, correlation_id=14, publisher_id=7)),
    (C2S, publish(7, [4])),                         # the id is forgotten: no stream
    (C2S, req(K.UNSUBSCRIBE, correlation_id=15, subscription_id=1)),
    (S2C, deliver(1)),
    (C2S, req(K.DELETE, correlation_id=16, stream="orders")),
    (C2S, req(K.PEER_PROPERTIES, correlation_id=17, properties={"product": "x"})),
]


def streams():
    def r(**kw):
        return kw
    return Conversation(
        "streams", STREAM_STEPS,
        counters={"errors": {}, "unmatched": 0},
        records=[
            r(opcode_name="SaslHandshake", resource=None, attrs=None),
            r(opcode_name="SaslHandshake", kind="response", resource=None),
            r(opcode_name="SaslAuthenticate", resource=None, attrs=None),
            r(opcode_name="SaslAuthenticate", kind="response", resource=None),
            r(opcode_name="Create", resource="orders"),
            r(opcode_name="Create", kind="response", resource=None),
            r(opcode_name="DeclarePublisher", correlation_id="4", resource="orders"),
            r(opcode_name="DeclarePublisher", correlation_id="5", resource="audit"),
            r(opcode_name="DeclarePublisher", kind="response", resource=None),
            r(opcode_name="Publish", correlation_id="7:1", resource="orders"),
            r(opcode_name="Publish", correlation_id="7:2", resource="orders", frame_bytes=0),
            r(opcode_name="Publish", correlation_id="7:3", resource="orders", frame_bytes=0),
            r(opcode_name="Publish", correlation_id="8:1", resource="audit"),
            r(opcode_name="PublishConfirm", correlation_id="7:1", resource="orders"),
            r(opcode_name="PublishConfirm", correlation_id="7:2", resource="orders"),
            r(opcode_name="PublishError", correlation_id="7:3", resource="orders"),
            r(opcode_name="QueryPublisherSequence", resource="orders"),
            r(opcode_name="Subscribe", resource="events"),
            r(opcode_name="Deliver", resource="events", messages=2),
            r(opcode_name="Credit", resource="events"),
            r(opcode_name="ConsumerUpdate", direction="s2c", resource="events"),
            r(opcode_name="StoreOffset", resource="events"),
            r(opcode_name="QueryOffset", resource="events"),
            r(opcode_name="Metadata", correlation_id="9", resource="orders"),
            r(opcode_name="Metadata", correlation_id="10", resource=None),
            r(opcode_name="Route", resource="invoices"),
            r(opcode_name="Partitions", resource="invoices"),
            r(opcode_name="StreamStats", resource=LONG_STREAM[:256]),
            r(opcode_name="MetadataUpdate", resource="audit"),
            r(opcode_name="DeletePublisher", resource="orders"),
            r(opcode_name="Publish", correlation_id="7:4", resource=None),
            r(opcode_name="Unsubscribe", resource="events"),
            r(opcode_name="Deliver", resource=None, messages=1),
            r(opcode_name="Delete", resource="orders"),
            r(opcode_name="PeerProperties", resource=None),
        ] + [r(kind="event")] * 16)


def garbage():
    return [Garbage("huge-size", C2S, b"\x7f\xff\xff\xff" + b"\0" * 8, "frame_too_large"),
            Garbage("tiny-size", C2S, b"\0\0\0\x02\0\x11" + req(K.HEARTBEAT), "frame_too_small",
                    fatal=False),
            Garbage("unknown-key", C2S, encode_frame(0x0063, 1, b"\0\0\0\1"), "unknown_command",
                    fatal=False),
            Garbage("short-fields", S2C, encode_frame(0x8004, 1, b"\0"), "bad_header",
                    fatal=False)]


def requests(n):
    return [req(K.QUERY_OFFSET, correlation_id=i + 1, reference="r", stream="s")
            for i in range(n)]


_KEYS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 15, 16, 19, 20, 23, 24, 26, 0x8001,
         0x8007, 0x800F, 0x8009]
_NAMES = [None, "", "s", "orders", "x" * 300]


@st.composite
def _naming(draw):
    """A request that names a stream or binds / unbinds an id (ids 0..3)."""
    ident = draw(st.integers(0, 3))
    name = draw(st.sampled_from(_NAMES))
    which = draw(st.integers(0, 6))
    if which == 0:
        return req(K.DECLARE_PUBLISHER, correlation_id=ident, publisher_id=ident,
                   reference=draw(st.sampled_from([None, "r", "q" * 40])), stream=name)
    if which == 1:
        return req(K.SUBSCRIBE, correlation_id=ident, subscription_id=ident, stream=name,
                   offset_type=1, credit=1, properties={})
    if which == 2:
        return req(K.DELETE_PUBLISHER, correlation_id=ident, publisher_id=ident)
    if which == 3:
        return req(K.UNSUBSCRIBE, correlation_id=ident, subscription_id=ident)
    if which == 4:
        return req(K.METADATA, correlation_id=ident,
                   streams=draw(st.lists(st.sampled_from(["a", "orders"]), max_size=2)))
    if which == 5:
        return req(K.QUERY_OFFSET, correlation_id=ident, reference="app", stream=name)
    return req(K.CREDIT, subscription_id=ident, credit=1)


@st.composite
def _frame(draw):
    d = draw(st.sampled_from([C2S, S2C]))
    kind = draw(st.integers(0, 6))
    if kind == 6:
        return d, draw(_naming())
    if kind == 0:
        if draw(st.booleans()):                # simple messages and sub-entry batches
            entries = draw(st.lists(st.tuples(st.integers(0, 9),
                                              st.one_of(st.none(), st.integers(0, 4))),
                                    max_size=4))
            return d, publish_mixed(draw(st.integers(0, 3)), entries,
                                    version=draw(st.sampled_from([1, 2])))
        return d, publish(draw(st.integers(0, 3)), draw(st.lists(st.integers(0, 9), max_size=4)),
                          size=draw(st.integers(0, 20)), version=draw(st.sampled_from([1, 2])))
    if kind == 1:
        return d, req(K.PUBLISH_CONFIRM, publisher_id=draw(st.integers(0, 3)),
                      publishing_ids=draw(st.lists(st.integers(0, 9), max_size=4)))
    if kind == 2:
        return d, deliver(draw(st.integers(0, 3)), version=draw(st.sampled_from([1, 2])))
    key = draw(st.sampled_from(_KEYS))
    body = draw(st.binary(max_size=24))
    if kind == 3:     # a correlation id the other side may answer
        body = draw(st.integers(0, 3)).to_bytes(4, "big") + body
    return d, encode_frame(key, draw(st.sampled_from([1, 2])), body)


def frames():
    return st.lists(_frame(), max_size=24)
