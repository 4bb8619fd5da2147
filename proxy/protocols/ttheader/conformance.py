"""Thrift conversations (Kitex TTHeader, Apache THeader, framed, unframed), garbage and
random frames for the conformance suite (tests/test_conformance.py)."""

import struct

from hypothesis import strategies as st

from proxy.conformance import C2S, S2C, Conversation, Garbage
from proxy.protocols.ttheader.codec import (CALL, REPLY, EXCEPTION, ONEWAY, binary_message,
                                            compact_message, framed, tapp_exception, theader,
                                            ttheader)

# Result / argument structs, binary protocol: {0: string} success, {1: struct{}} a declared
# exception, {} void; compact: the same shapes.
OK_BIN = b"\x0b\x00\x00\x00\x00\x00\x02ok\x00"
DECLARED_BIN = b"\x0c\x00\x01\x0b\x00\x01\x00\x00\x00\x04nope\x00\x00"
VOID = b"\x00"
ARGS_BIN = b"\x0b\x00\x01\x00\x00\x00\x05hello\x08\x00\x02\x00\x00\x00\x07\x00"
OK_CPT = b"\x08\x00\x02ok\x00"                   # field id 0 is written long form (zigzag 0)
DECLARED_CPT = b"\x1c\x18\x04nope\x00\x00"
ARGS_CPT = b"\x18\x05hello\x15\x0e\x00"
# Unframed messages need a walk of their whole struct: lists, maps, sets and nesting
NESTED_BIN = (b"\x0f\x00\x01\x08\x00\x00\x00\x02\x00\x00\x00\x01\x00\x00\x00\x02"   # list<i32>
              b"\x0d\x00\x02\x0b\x0c\x00\x00\x00\x01\x00\x00\x00\x01k\x0a\x00\x01"    # map<str,
              b"\x00\x00\x00\x00\x00\x00\x00\x05\x00"                                   # struct>
              b"\x0e\x00\x03\x02\x00\x00\x00\x02\x01\x00"                              # set<bool>
              b"\x04\x00\x04" + b"\x00" * 8 + b"\x00")                                  # double

KITEX_INFO = {"strinfo": {"tenant": "blue", "trace-id": "4bf92f35"},
              "intinfo": {3: "demo.client", 6: "demo.echo", 9: "Echo", 2: "20261123-77"},
              "acl": "SECRET-ACL-TOKEN"}
KITEX_ATTRS = {"tenant": "blue", "trace-id": "4bf92f35", "FROM_SERVICE": "demo.client",
               "TO_SERVICE": "demo.echo", "TO_METHOD": "Echo", "LOG_ID": "20261123-77"}


def kitex_call(name, seq, body=ARGS_BIN, **kw):
    return ttheader(binary_message(name, CALL, seq, body), seq=seq, flags=0x01, **kw)


def kitex_reply(name, seq, body=OK_BIN, mtype=REPLY, **kw):
    return ttheader(binary_message(name, mtype, seq, body), seq=seq, flags=0x01, **kw)


def kitex():
    """A Kitex client with out-of-order replies (flag 0x01), every info block kind,
    padding ids, an ACL token, TTHeaderFramed, a declared exception, an application
    exception, a oneway call, and a server-initiated call (duplex) answered by the client."""
    steps = [
        (C2S, kitex_call("Echo", 1, **KITEX_INFO)),
        (C2S, kitex_call("Echo", 2, padding_ids=3)),
        (C2S, kitex_call("GetUser", 3, inner_framed=True)),
        (C2S, kitex_call("Missing", 4)),
        (C2S, ttheader(binary_message("Log", ONEWAY, 5, ARGS_BIN), seq=5)),
        (S2C, kitex_reply("Echo", 2)),                                 # out of order
        (S2C, kitex_reply("GetUser", 3, DECLARED_BIN, inner_framed=True)),
        (S2C, kitex_reply("Missing", 4, tapp_exception(1, "Invalid method name"),
                          mtype=EXCEPTION)),
        (S2C, kitex_reply("Echo", 1, strinfo={"biz-status": "0"})),
        (S2C, kitex_call("Notify", -7)),                               # duplex: s2c call
        (C2S, kitex_reply("Notify", -7, VOID)),
    ]
    return Conversation(
        "kitex-ttheader", steps,
        counters={
            "frames": {("c2s", "Echo"): 2, ("c2s", "GetUser"): 1, ("c2s", "Missing"): 1,
                       ("c2s", "Log"): 1, ("c2s", "Notify"): 1, ("s2c", "Echo"): 2,
                       ("s2c", "GetUser"): 1, ("s2c", "Missing"): 1, ("s2c", "Notify"): 1},
            "responses": {("Echo", "OK"): 2, ("GetUser", "EXCEPTION"): 1,
                          ("Missing", "UNKNOWN_METHOD"): 1, ("Notify", "OK"): 1},
            "hist": {("Echo", "ok"): 2, ("GetUser", "error"): 1, ("Missing", "error"): 1,
                     ("Notify", "ok"): 1},
            "unmatched": 0, "in_flight": 0, "errors": {}, "timeouts": {}},
        records=[
            {"direction": "c2s", "opcode_name": "Echo", "kind": "request",
             "correlation_id": "1", "resource": "Echo", "attrs": KITEX_ATTRS,
             "messages": 1},
            {"opcode_name": "Echo", "correlation_id": "2", "attrs": None},
            {"opcode_name": "GetUser", "correlation_id": "3", "header_bytes": 22},
            {"opcode_name": "Missing", "correlation_id": "4"},
            {"opcode_name": "Log", "kind": "oneway", "correlation_id": "5"},
            {"direction": "s2c", "kind": "response", "correlation_id": "2", "status": "OK",
             "outcome": "ok", "request_opcode_name": "Echo", "latency_ns": True},
            {"correlation_id": "3", "status": "EXCEPTION", "outcome": "error",
             "request_opcode_name": "GetUser"},
            {"correlation_id": "4", "status": "UNKNOWN_METHOD", "outcome": "error"},
            {"correlation_id": "1", "status": "OK", "attrs": {"biz-status": "0"}},
            {"direction": "s2c", "kind": "request", "opcode_name": "Notify",
             "correlation_id": "-7"},
            {"direction": "c2s", "kind": "response", "correlation_id": "-7", "status": "OK",
             "request_opcode_name": "Notify"},
        ])


def apache():
    """Apache THeader (varints) with binary and compact payloads, a zlib transform (the
    method is still read), key/value infos, a snappy payload (counted by the header's
    seq id as UNDECODED), and an application exception without its type (UNKNOWN)."""
    info = {"client": "py", "request-id": "r-1"}
    steps = [
        (C2S, theader(binary_message("add", CALL, 10, ARGS_BIN), seq=10, info=info)),
        (S2C, theader(binary_message("add", REPLY, 10, OK_BIN), seq=10)),
        (C2S, theader(compact_message("add", CALL, 11, ARGS_CPT), seq=11, proto=2)),
        (S2C, theader(compact_message("add", REPLY, 11, DECLARED_CPT), seq=11, proto=2)),
        (C2S, theader(compact_message("zip", CALL, 12, ARGS_CPT * 1), seq=12, proto=2,
                      transforms=[1], info={"z": "1"})),
        (S2C, theader(compact_message("zip", REPLY, 12, OK_CPT), seq=12, proto=2,
                      transforms=[1])),
        (C2S, theader(b"\x11snappy-bytes", seq=13, transforms=[3])),
        (S2C, theader(b"\x11snappy-reply", seq=13, transforms=[3])),
        (C2S, theader(binary_message("old", CALL, 14, ARGS_BIN), seq=0)),
        (S2C, theader(binary_message("old", EXCEPTION, 14,
                                     tapp_exception(0, "node", with_type=False)), seq=0)),
        (C2S, theader(compact_message("ce", CALL, 15), seq=15, proto=2)),
        (S2C, theader(compact_message("ce", EXCEPTION, 15,
                                      tapp_exception(6, "boom", compact=True)), proto=2)),
    ]
    return Conversation(
        "apache-theader", steps,
        counters={
            "frames": {("c2s", "add"): 2, ("s2c", "add"): 2, ("c2s", "zip"): 1,
                       ("s2c", "zip"): 1, ("c2s", "unknown"): 1, ("s2c", "unknown"): 1,
                       ("c2s", "old"): 1, ("s2c", "old"): 1, ("c2s", "ce"): 1,
                       ("s2c", "ce"): 1},
            "responses": {("add", "OK"): 1, ("add", "EXCEPTION"): 1, ("zip", "OK"): 1,
                          ("unknown", "UNDECODED"): 1, ("old", "UNKNOWN"): 1,
                          ("ce", "INTERNAL_ERROR"): 1},
            "unmatched": 0, "in_flight": 0, "errors": {}, "timeouts": {}},
        records=[
            {"opcode_name": "add", "kind": "request", "correlation_id": "10",
             "attrs": info, "resource": "add"},
            {"kind": "response", "status": "OK", "correlation_id": "10"},
            {"opcode_name": "add", "correlation_id": "11"},
            {"status": "EXCEPTION", "outcome": "error"},
            {"opcode_name": "zip", "resource": "zip", "attrs": {"z": "1"}},
            {"status": "OK", "request_opcode_name": "zip"},
            {"opcode_name": "unknown", "correlation_id": "13", "resource": None},
            {"status": "UNDECODED", "correlation_id": "13"},
            {"opcode_name": "old", "correlation_id": "14"},
            {"status": "UNKNOWN", "outcome": "error", "correlation_id": "14"},
            {"opcode_name": "ce"},
            {"status": "INTERNAL_ERROR"},
        ])


def plain():
    """Framed strict, non-strict and compact Thrift, unframed strict binary with nested
    containers, an unmatched reply, and a call left unanswered (a timeout at close)."""
    steps = [
        (C2S, framed(binary_message("ping", CALL, 1, VOID))),
        (C2S, framed(binary_message("legacy", CALL, 2, ARGS_BIN, strict=False))),
        (C2S, framed(compact_message("cpt", CALL, 3, ARGS_CPT))),
        (C2S, binary_message("raw", CALL, 4, NESTED_BIN)),
        (C2S, framed(binary_message("fire", ONEWAY, 5, ARGS_BIN, strict=False))),
        (S2C, framed(binary_message("legacy", REPLY, 2, OK_BIN, strict=False))),
        (S2C, framed(compact_message("cpt", REPLY, 3, VOID))),
        (S2C, binary_message("raw", REPLY, 4, b"\x0c\x00\x00" + NESTED_BIN + b"\x00")),
        (S2C, framed(binary_message("ghost", REPLY, 99, OK_BIN))),
    ]
    return Conversation(
        "framed-unframed", steps,
        counters={
            "frames": {("c2s", "ping"): 1, ("c2s", "legacy"): 1, ("c2s", "cpt"): 1,
                       ("c2s", "raw"): 1, ("c2s", "fire"): 1, ("s2c", "legacy"): 1,
                       ("s2c", "cpt"): 1, ("s2c", "raw"): 1, ("s2c", "ghost"): 1},
            "responses": {("legacy", "OK"): 1, ("cpt", "OK"): 1, ("raw", "OK"): 1},
            "unmatched": 1, "in_flight": 0, "errors": {}, "timeouts": {},
            "cutoffs": {"ping": 1}},
        records=[
            {"opcode_name": "ping", "header_bytes": 4, "correlation_id": "1"},
            {"opcode_name": "legacy", "correlation_id": "2"},
            {"opcode_name": "cpt", "correlation_id": "3"},
            {"opcode_name": "raw", "header_bytes": 0, "correlation_id": "4",
             "frame_bytes": len(binary_message("raw", CALL, 4, NESTED_BIN))},
            {"opcode_name": "fire", "kind": "oneway"},
            {"status": "OK", "correlation_id": "2"},
            {"status": "OK", "correlation_id": "3"},
            {"status": "OK", "correlation_id": "4"},
            {"opcode_name": "ghost", "kind": "response", "latency_ns": None,
             "correlation_id": "99", "request_opcode_name": None},
            {"kind": "event", "status": "closed", "correlation_id": "1",
             "opcode_name": "ping"},
        ])


def pb_meta(name, mtype, seq, body=b"\x0a\x02hi"):
    """Kitex protobuf payload: magic 0x9001 + message type, method name, seq id, message."""
    n = name.encode()
    return struct.pack(">HHi", 0x9001, mtype, len(n)) + n + struct.pack(">i", seq) + body


def protobuf():
    """Kitex protobuf over TTHeader (protocol id 3): TO_METHOD names the opcode; the
    meta's seq id correlates; without the meta, TO_METHOD or ``unknown`` and the header's
    seq id.  Kitex protobuf over plain framing: the meta's method name."""
    steps = [
        (C2S, ttheader(pb_meta("Echo", CALL, 21), seq=21, proto=3, intinfo={9: "EchoPB"})),
        (C2S, ttheader(pb_meta("Echo", CALL, 22), seq=22, proto=3)),
        (C2S, ttheader(b"\x0a\x02hi", seq=23, proto=3, intinfo={9: "RawPB"})),
        (C2S, ttheader(b"\x0a\x02hi", seq=24, proto=3)),
        (S2C, ttheader(pb_meta("Echo", REPLY, 22), seq=22, proto=3)),
        (S2C, ttheader(pb_meta("Echo", EXCEPTION, 21, b"\x08\x01\x12\x01x"), seq=21,
                       proto=3)),
        (S2C, ttheader(b"\x0a\x00", seq=23, proto=3)),
        (S2C, ttheader(b"\x0a\x00", seq=24, proto=3)),
        (C2S, framed(pb_meta("Framed", CALL, 25))),               # Kitex protobuf, framed
        (S2C, framed(pb_meta("Framed", REPLY, 25))),
    ]
    return Conversation(
        "kitex-protobuf", steps,
        counters={"frames": {("c2s", "EchoPB"): 1, ("c2s", "Echo"): 1, ("c2s", "RawPB"): 1,
                             ("c2s", "unknown"): 1, ("s2c", "EchoPB"): 1, ("s2c", "Echo"): 1,
                             ("s2c", "RawPB"): 1, ("s2c", "unknown"): 1,
                             ("c2s", "Framed"): 1, ("s2c", "Framed"): 1},
                  "responses": {("Echo", "OK"): 1, ("EchoPB", "UNKNOWN_METHOD"): 1,
                                ("RawPB", "UNDECODED"): 1, ("unknown", "UNDECODED"): 1,
                                ("Framed", "OK"): 1},
                  "unmatched": 0, "errors": {}, "timeouts": {}})


def conversations():
    return [kitex(), apache(), plain(), protobuf()]


def _tt_raw(header, payload=b"", seq=1, hsz=None, magic=0x1000):
    header = header + b"\x00" * (-len(header) % 4)
    words = len(header) // 4 if hsz is None else hsz
    return struct.pack(">IHHiH", 10 + len(header) + len(payload), magic, 0, seq, words) + \
        header + payload


CALL_PAYLOAD = binary_message("m", CALL, 1, VOID)


def garbage():
    long_name = binary_message("n" * 65536, CALL, 1, VOID)
    return [
        Garbage("header-size-past-frame", C2S, _tt_raw(b"\x00\x00", CALL_PAYLOAD, hsz=200),
                "bad_header"),
        Garbage("header-size-zero", C2S, _tt_raw(b"", CALL_PAYLOAD, hsz=0), "bad_header"),
        Garbage("theader-header-past-frame", C2S,
                _tt_raw(b"\x00\x00", b"", hsz=3, magic=0x0FFF), "bad_header"),
        Garbage("unknown-protocol-id", C2S, _tt_raw(b"\x07\x00", CALL_PAYLOAD), "bad_header",
                fatal=False),
        Garbage("truncated-varint", C2S, _tt_raw(b"\x00\x00\x01\x01\x01\x80\x80\x80",
                                                 CALL_PAYLOAD,
                                                 magic=0x0FFF), "bad_header", fatal=False),
        Garbage("info-overruns-header", C2S, _tt_raw(b"\x00\x00\x01\x00\x05\x00\x01k",
                                                     CALL_PAYLOAD), "bad_header", fatal=False),
        Garbage("string-past-header", C2S, _tt_raw(b"\x00\x00\x10\x00\x01\x00\x09\x00\x40ab",
                                                   CALL_PAYLOAD), "bad_header", fatal=False),
        Garbage("unknown-info-id", C2S, _tt_raw(b"\x00\x00\x42\x00", CALL_PAYLOAD),
                "bad_header", fatal=False),
        Garbage("unknown-transform", C2S, _tt_raw(b"\x00\x01\x07", CALL_PAYLOAD),
                "bad_header", fatal=False),
        Garbage("payload-not-a-message", C2S, ttheader(b"\x80\x02\x00\x01junkjunkjunk"),
                "bad_body", fatal=False),
        Garbage("message-type-9", S2C, framed(binary_message("m", 9, 1)), "bad_body",
                fatal=False),
        Garbage("zlib-garbage", C2S, _tt_raw(b"\x00\x01\x01", b"\x78\x9c\xff\xff\xff\xff"),
                "bad_body", fatal=False),
        Garbage("method-name-64k-framed", C2S, ttheader(long_name), "bad_body", fatal=False),
        Garbage("method-name-64k-unframed", C2S, long_name, "bad_body"),
        Garbage("unframed-negative-string", C2S,
                binary_message("m", CALL, 1, b"\x0b\x00\x01\xff\xff\xff\xff\x00"), "bad_body"),
        Garbage("frame-too-large", C2S, b"\x7f\xff\xff\xff\x10\x00\x00\x00", "frame_too_large"),
        Garbage("frame-too-small", C2S, b"\x00\x00\x00\x04\x10\x00\x00\x00", "frame_too_small"),
        Garbage("not-thrift", C2S, b"\x00\x00\x00\x20\xde\xad\xbe\xef" + b"\x00" * 32,
                "bad_magic"),
        Garbage("tls-hello", C2S, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\0" * 40,
                "frame_too_large"),
        Garbage("http", C2S, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "frame_too_large"),
    ]


def requests(n):
    return [kitex_call("Echo", i + 1) for i in range(n)]


# ---- random conversations for the twin-agreement fuzzer -----------------------------

_NAMES = ["Echo", "GetUser", "a", "", "x" * 300]
_BODIES = [VOID, OK_BIN, DECLARED_BIN, ARGS_BIN, tapp_exception(1), tapp_exception(6, "z"),
           tapp_exception(0, with_type=False), NESTED_BIN, b"\x0b\x00\x01\x00\x00"]
_CBODIES = [VOID, OK_CPT, DECLARED_CPT, ARGS_CPT, tapp_exception(1, compact=True),
            tapp_exception(0, compact=True, with_type=False), b"\x18\x7f"]


@st.composite
def _frame(draw):
    d = draw(st.sampled_from([C2S, S2C]))
    name = draw(st.sampled_from(_NAMES))
    mtype = draw(st.sampled_from([CALL, REPLY, EXCEPTION, ONEWAY, 0, 5]))
    seq = draw(st.sampled_from([0, 1, 2, 3, -1, 0x7FFFFFFF]))
    enc = draw(st.integers(0, 2))
    if enc == 2:
        msg = compact_message(name, mtype & 7, seq, draw(st.sampled_from(_CBODIES)))
    else:
        msg = binary_message(name, mtype, seq, draw(st.sampled_from(_BODIES)),
                             strict=enc == 0)
    framing = draw(st.integers(0, 4))
    if framing == 0:
        info = draw(st.sampled_from([{}, KITEX_INFO, {"strinfo": {"k": "v" * 40}},
                                     {"intinfo": {9: name or "m", 99: "x"}}]))
        proto = draw(st.sampled_from([0, 0, 2, 3]))
        return d, ttheader(msg, seq=seq, proto=proto, inner_framed=draw(st.booleans()),
                           padding_ids=draw(st.integers(0, 2)),
                           transforms=draw(st.sampled_from([(), (), (1,), (3,)])), **info)
    if framing == 1:
        return d, theader(msg, seq=seq, proto=2 if enc == 2 else 0,
                          transforms=draw(st.sampled_from([(), (1,), (3,)])),
                          info=draw(st.sampled_from([None, {"a": "b"}])))
    if framing == 2 or enc != 0:
        return d, framed(msg)
    return d, msg                                     # unframed strict binary


def frames():
    return st.lists(_frame(), max_size=16)


# A golden Kitex frame, byte for byte as Kitex's ttHeader.encode + writeKVInfo lay it
# out (pkg/remote/codec/header_codec.go): LENGTH, 0x1000 + flags, seq id, header size
# in words, protocol id 0, 0 transforms, INFO_KEYVALUE (u16 count, u16-length strings),
# INFO_INTKEYVALUE (u16 count, u16 key, u16-length value), zero padding to 4 bytes,
# then a strict-binary CALL "Echo" seq 5 with an empty argument struct.
KITEX_GOLDEN = bytes.fromhex(
    "0000003b" "1000" "0001" "00000005" "0008"
    "00" "00"
    "01" "0001" "0001" "61" "0001" "62"                  # {"a": "b"}
    "10" "0002" "0003" "0003" "637669" "0009" "0004" "4563686f"  # {3: "cvi", 9: "Echo"}
    "000000"                                             # padding: 29 -> 32 bytes
    "80010001" "00000004" "4563686f" "00000005" "00")
