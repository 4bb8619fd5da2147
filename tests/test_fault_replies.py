"""The protocol-level error replies the fault engine injects (proxy/protocols/<pkg>/faults.py,
issue 22): statuses by name and number, each reply decoded by the protocol's own codec,
and both parser twins reading a reply as the answer to its request with the injected
status (what ``frametap_responses_total`` will count).  Hypothesis feeds random bytes,
random conversations' frames and mutations of them: ``error_reply`` raises nothing but
ValueError, and every reply it makes is one the parsers accept.

The real clients reading these replies (Apache Thrift, rstream, the loadgen/ clients)
are in tests/test_fault_replies_real.py.
"""

import struct

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from proxy import protocols
from proxy.conformance import C2S, S2C
from proxy.protocols.fault_replies import for_protocol
from tests.parsers import make, parser_impls

PROTOCOLS = ("rocketmq", "rabbitmq-stream", "ttheader", "flymq", "fleximq")
#: (status value, code, label) per protocol: a name, the default, a number.
STATUSES = {
    "rocketmq": [("SYSTEM_BUSY", 2, "SYSTEM_BUSY"), ("SYSTEM_ERROR", 1, "SYSTEM_ERROR"),
                 ("17", 17, "TOPIC_NOT_EXIST"), (999, 999, "unknown_999"),
                 ("system_busy", 2, "SYSTEM_BUSY")],
    "rabbitmq-stream": [("STREAM_NOT_AVAILABLE", 6, "STREAM_NOT_AVAILABLE"),
                        ("INTERNAL_ERROR", 15, "INTERNAL_ERROR"), (2, 2, "STREAM_DOES_NOT_EXIST"),
                        ("300", 300, "unknown_300")],
    "ttheader": [("INTERNAL_ERROR", 6, "INTERNAL_ERROR"), ("UNKNOWN", 0, "UNKNOWN"),
                 ("PROTOCOL_ERROR", 7, "PROTOCOL_ERROR"), (1, 1, "UNKNOWN_METHOD"),
                 ("42", 42, "TYPE_42")],
    "flymq": [("ERROR", 1, "ERROR"), ("error", 1, "ERROR")],
    "fleximq": [("503", 503, "503"), (600, 600, "600"), ("500", 500, "500"),
                ("SERVICE_UNAVAILABLE", 503, "503")],
}
BAD_STATUSES = {
    "rocketmq": ["SUCCESS", 0, -1000, "RPC_TIME_OUT", 40000, "BUSY", 2.0, None, True],
    "rabbitmq-stream": ["OK", 1, 70000, "-1", "NOPE", b"6"],
    "ttheader": [-1, "-2", 2 ** 31, "OK", "EXCEPTION", "nope"],
    "flymq": ["OK", 1, "255", "FAILURE"],
    "fleximq": [200, "204", 2 ** 32, -1, "OK", "teapot"],
}


def faults(protocol):
    return for_protocol(protocol)


def conformance(protocol):
    return protocols.load(protocol).load_conformance()


# --------------------------------------------------------------------------- statuses

@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_error_status_names_numbers_and_default(protocol):
    f = faults(protocol)
    for value, code, label in STATUSES[protocol]:
        assert f.error_status(value) == (code, label), value
    code, label = f.error_status(f.DEFAULT_ERROR)
    assert f.ERROR_NAMES.get(f.DEFAULT_ERROR, code) == code
    for name, c in f.ERROR_NAMES.items():            # the table is what error_status takes
        assert f.error_status(name)[0] == c


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_error_status_refuses_with_one_line_naming_the_names(protocol):
    f = faults(protocol)
    for value in BAD_STATUSES[protocol]:
        with pytest.raises(ValueError) as info:
            f.error_status(value)
        text = str(info.value)
        assert "\n" not in text and text.startswith(protocol + ":"), text
        if isinstance(value, str) and not value.lstrip("-").isdigit() and \
                value.upper() not in ("OK", "SUCCESS"):
            assert all(name in text for name in f.ERROR_NAMES), text   # names them all


def test_for_protocol_finds_every_protocols_module():
    assert sorted(protocols.names()) == sorted(PROTOCOLS)      # a new protocol needs one
    for name in protocols.names():
        f = for_protocol(name)
        assert f.__name__ == protocols.load(name).package + ".faults"
        assert {"DEFAULT_ERROR", "ERROR_NAMES", "error_status", "error_reply",
                "is_request"} <= set(vars(f))


def test_defaults_are_the_documented_ones():
    assert faults("rocketmq").error_status(faults("rocketmq").DEFAULT_ERROR) == (1, "SYSTEM_ERROR")
    assert faults("rabbitmq-stream").error_status("INTERNAL_ERROR") == (15, "INTERNAL_ERROR")
    assert faults("ttheader").error_status(faults("ttheader").DEFAULT_ERROR) == (6, "INTERNAL_ERROR")
    assert faults("flymq").DEFAULT_ERROR == "ERROR"
    assert faults("fleximq").error_status(faults("fleximq").DEFAULT_ERROR) == (500, "500")


# --------------------------------------------------------------------------- RocketMQ

def test_rocketmq_reply_in_both_serialisations_and_length_conventions():
    from proxy.protocols.rocketmq.codec import RemotingCommand, decode, encode
    f = faults("rocketmq")
    for stype in (0, 1):
        for includes_self in (False, True):
            req = RemotingCommand(code=310, language="GO", version=433, opaque=-7, flag=0,
                                  ext_fields={"a": "g", "b": "TopicTest"}, body=b"hello",
                                  serialize_type=stype)
            frame = encode(req, length_includes_self=includes_self)
            assert f.is_request(frame)
            reply = f.error_reply(frame, 2, "SYSTEM_BUSY", "[REJECTREQUEST]system busy")
            cmd, used = decode(reply, length_includes_self=includes_self)
            assert used == len(reply)
            assert (cmd.code, cmd.opaque, cmd.flag, cmd.serialize_type) == (2, -7, 1, stype)
            assert cmd.remark == "[REJECTREQUEST]system busy"
            assert (cmd.language, cmd.version) == ("JAVA", 433)
            assert cmd.ext_fields == {} and cmd.body == b""


def test_rocketmq_oneway_and_responses_get_no_reply():
    from proxy.protocols.rocketmq.codec import RemotingCommand, encode
    f = faults("rocketmq")
    for flag in (1, 2, 3):
        frame = encode(RemotingCommand(code=34, opaque=5, flag=flag))
        assert f.error_reply(frame, 1, "SYSTEM_ERROR", "x") is None
        assert not f.is_request(frame)


def test_rocketmq_empty_message_says_the_proxy_made_it():
    from proxy.protocols.rocketmq.codec import RemotingCommand, decode, encode
    reply = faults("rocketmq").error_reply(encode(RemotingCommand(code=11, opaque=1)), 1,
                                           "SYSTEM_ERROR", "")
    assert decode(reply)[0].remark == "frametap: injected SYSTEM_ERROR"


# --------------------------------------------------------------------------- Stream

def _stream():
    from proxy.protocols.rabbitmq_stream import codec
    from proxy.protocols.rabbitmq_stream import constants as K
    return codec, K


def test_stream_publish_v1_v2_and_sub_entries_get_one_publish_error():
    codec, K = _stream()
    f = faults("rabbitmq-stream")
    msgs = [codec.PublishedMessage(10, b"a" * 5), codec.PublishedMessage(11, b""),
            codec.PublishedMessage(12, codec.SubBatch.of([b"x", b"yy"]))]
    for version in (1, 2):
        if version == 2:
            msgs = [m._replace(filter_value=fv) for m, fv in zip(msgs, ("f", None, ""))]
        frame = codec.encode_command(K.PUBLISH, version=version, publisher_id=3,
                                     messages=msgs)
        assert f.is_request(frame)
        cmd = codec.decode_command(f.error_reply(frame, 6, "STREAM_NOT_AVAILABLE", "m"))
        assert (cmd.key, cmd.response, cmd.version) == (K.PUBLISH_ERROR, False, 1)
        assert cmd.publisher_id == 3
        assert cmd.errors == [(10, 6), (11, 6), (12, 6)]


def test_stream_correlated_requests_get_their_response_with_the_code():
    codec, K = _stream()
    f = faults("rabbitmq-stream")
    cases = {
        K.DECLARE_PUBLISHER: dict(publisher_id=1, reference=None, stream="s"),
        K.QUERY_PUBLISHER_SEQUENCE: dict(reference="r", stream="s"),
        K.DELETE_PUBLISHER: dict(publisher_id=1),
        K.SUBSCRIBE: dict(subscription_id=1, stream="s", offset_type=1, credit=1),
        K.QUERY_OFFSET: dict(reference="r", stream="s"),
        K.UNSUBSCRIBE: dict(subscription_id=1),
        K.CREATE: dict(stream="s", arguments={}),
        K.DELETE: dict(stream="s"),
        K.PEER_PROPERTIES: dict(properties={"product": "x"}),
        K.SASL_HANDSHAKE: dict(),
        K.SASL_AUTHENTICATE: dict(mechanism="PLAIN", data=b"\0u\0p"),
        K.OPEN: dict(virtual_host="/"),
        K.CLOSE: dict(code=1, reason="bye"),
        K.ROUTE: dict(routing_key="k", super_stream="ss"),
        K.PARTITIONS: dict(super_stream="ss"),
        K.EXCHANGE_COMMAND_VERSIONS: dict(commands=[]),
        K.STREAM_STATS: dict(stream="s"),
    }
    for key, fields in cases.items():
        frame = codec.encode_command(key, correlation_id=77, **fields)
        assert f.is_request(frame), key
        cmd = codec.decode_command(f.error_reply(frame, 15, "INTERNAL_ERROR", "m"))
        assert (cmd.key, cmd.response, cmd.correlation_id, cmd.code) == (key, True, 77, 15)


def test_stream_metadata_lists_each_stream_with_the_code_and_no_leader():
    codec, K = _stream()
    frame = codec.encode_command(K.METADATA, correlation_id=5, streams=["a", "orders"])
    cmd = codec.decode_command(faults("rabbitmq-stream").error_reply(frame, 6, "x", "m"))
    assert cmd.correlation_id == 5 and cmd.brokers == []
    assert cmd.streams == [("a", 6, 0xFFFF, []), ("orders", 6, 0xFFFF, [])]


def test_stream_commands_without_response_get_none():
    codec, K = _stream()
    f = faults("rabbitmq-stream")
    for frame in (codec.encode_command(K.CREDIT, subscription_id=1, credit=1),
                  codec.encode_command(K.STORE_OFFSET, reference="r", stream="s", offset=1),
                  codec.encode_command(K.HEARTBEAT),
                  codec.encode_command(K.TUNE, frame_max=0, heartbeat=0),
                  codec.encode_command(K.PUBLISH, publisher_id=1, messages=[]),
                  codec.encode_command(K.DECLARE_PUBLISHER, response=True, correlation_id=1,
                                       code=1)):
        assert f.error_reply(frame, 6, "x", "m") is None
        assert not f.is_request(frame)


def test_stream_malformed_publish_is_a_value_error():
    codec, K = _stream()
    f = faults("rabbitmq-stream")
    good = codec.encode_command(K.PUBLISH, publisher_id=1,
                                messages=[codec.PublishedMessage(1, b"abc")])
    for bad in (good[:-1], good + b"\0"):
        bad = struct.pack(">I", len(bad) - 4) + bad[4:]
        with pytest.raises(ValueError, match="rabbitmq-stream"):
            f.error_reply(bad, 6, "x", "m")


# --------------------------------------------------------------------------- Thrift

def _tt():
    from proxy.protocols.ttheader import codec
    return codec


def _expect_tapp(payload, name, seq, type_, message, compact=False):
    codec = _tt()
    assert codec.parse_message_header(payload) == (name, 3, seq)
    assert payload.endswith(codec.tapp_exception(type_, message, compact=compact))


@pytest.mark.parametrize("compact", [False, True])
def test_ttheader_kitex_and_apache_headers_echo_seq_flags_protocol(compact):
    codec = _tt()
    f = faults("ttheader")
    msg = (codec.compact_message if compact else codec.binary_message)("getUser", 1, 4242)
    for build, transport in ((codec.ttheader, "ttheader"), (codec.theader, "theader")):
        kw = dict(seq=99, flags=1, proto=2 if compact else 0)
        if build is codec.ttheader:
            kw.update(strinfo={"k": "v"}, intinfo={9: "getUser"})
        frame = build(msg, **kw)
        assert f.is_request(frame)
        reply = f.error_reply(frame, 6, "INTERNAL_ERROR", "boom")
        kind, fields, payload = codec.split(reply)
        assert kind == transport
        assert (fields["seq"], fields["flags"], fields["proto"]) == (99, 1, kw["proto"])
        assert fields["transforms"] == [] and fields["strinfo"] == {}
        _expect_tapp(payload, "getUser", 4242, 6, "boom", compact)


def test_ttheader_zlib_call_gets_a_zlib_reply_and_ttheader_framed_keeps_its_length():
    codec = _tt()
    f = faults("ttheader")
    msg = codec.binary_message("echo", 1, -3)
    reply = f.error_reply(codec.theader(msg, seq=5, transforms=[1]), 7, "PROTOCOL_ERROR", "z")
    kind, fields, payload = codec.split(reply)
    assert fields["transforms"] == [1]
    _expect_tapp(payload, "echo", -3, 7, "z")
    reply = f.error_reply(codec.ttheader(msg, seq=5, inner_framed=True), 6, "x", "y")
    kind, fields, payload = codec.split(reply)
    assert fields.get("inner_framed")
    _expect_tapp(payload, "echo", -3, 6, "y")


def test_ttheader_framed_unframed_strict_and_non_strict():
    codec = _tt()
    f = faults("ttheader")
    for strict in (True, False):
        msg = codec.binary_message("ping", 1, 7, strict=strict)
        reply = f.error_reply(codec.framed(msg), 6, "INTERNAL_ERROR", "m")
        payload = reply[4:]
        assert struct.unpack(">I", reply[:4])[0] == len(payload)
        assert (payload[:2] == b"\x80\x01") == strict
        _expect_tapp(payload, "ping", 7, 6, "m")
    msg = codec.binary_message("ping", 1, 8)
    _expect_tapp(f.error_reply(msg, 6, "INTERNAL_ERROR", "u"), "ping", 8, 6, "u")
    msg = codec.compact_message("ping", 1, 2 ** 31 + 5)          # seq id above i32: wraps
    _expect_tapp(f.error_reply(codec.framed(msg), 6, "x", "c")[4:], "ping", -(2 ** 31) + 5,
                 6, "c", compact=True)


def test_ttheader_theader_with_protobuf_is_refused():
    codec = _tt()
    frame = codec.theader(codec.binary_message("echo", 1, 1), proto=3)
    with pytest.raises(ValueError, match="protocol id 3"):
        faults("ttheader").error_reply(frame, 6, "INTERNAL_ERROR", "m")
    for impl in IMPLS["ttheader"]:                    # the parsers count it as an error
        stats, p = make(IMPLS["ttheader"][impl], "ttheader")
        p.feed(C2S, frame)
        assert stats.snapshot()["errors"] == {("c2s", "bad_header"): 1}


def test_ttheader_oneway_reply_and_exception_frames_get_none():
    codec = _tt()
    f = faults("ttheader")
    for mtype in (2, 3, 4):
        frame = codec.framed(codec.binary_message("log", mtype, 1))
        assert f.error_reply(frame, 6, "x", "m") is None
        assert not f.is_request(frame)


def test_ttheader_unreadable_payloads_use_to_method_and_the_header_seq():
    codec = _tt()
    f = faults("ttheader")
    frame = codec.ttheader(b"\x01\x02snappy?", seq=31, transforms=[3], intinfo={9: "Get"})
    kind, fields, payload = codec.split(f.error_reply(frame, 6, "INTERNAL_ERROR", "s"))
    assert fields["transforms"] == [] and fields["seq"] == 31
    _expect_tapp(payload, "Get", 31, 6, "s")
    conf = conformance("ttheader")
    frame = codec.ttheader(conf.pb_meta("Echo", 1, 21), seq=21, proto=3)
    kind, fields, payload = codec.split(f.error_reply(frame, 1, "UNKNOWN_METHOD", "pb"))
    assert fields["proto"] == 3
    assert payload == conf.pb_meta("Echo", 3, 21, b"\x08\x01\x12\x02pb")


# --------------------------------------------------------------------------- FlyMQ

def test_flymq_error_frame_is_the_real_servers():
    from proxy.protocols.flymq.codec import ErrorResponse, ProduceRequest, decode_frame
    f = faults("flymq")
    frame = ProduceRequest("orders", b"v").to_frame()
    assert f.is_request(frame)
    reply = f.error_reply(frame, 1, "ERROR", "topic not found: orders")
    assert reply[:4] == b"\xaf\x01\xff\x00"               # WriteError: flags 0
    got = decode_frame(reply)
    assert (got.version, got.opcode, got.flags, got.size) == (1, 0xFF, 0, len(reply))
    assert ErrorResponse.decode(got.payload) == ErrorResponse("topic not found: orders")
    with pytest.raises(ValueError, match="bad magic"):
        f.error_reply(b"\x16" + frame[1:], 1, "ERROR", "x")


# --------------------------------------------------------------------------- fleximq

def test_fleximq_rep_from_the_broker_echoes_the_id_and_routes_to_the_requester():
    from proxy.protocols.fleximq import codec
    f = faults("fleximq")
    frame = codec.req(1000, 1001, "01HZX-ID", path="/svc", payload={"q": 1})
    assert f.is_request(frame)
    got, used = codec.decode(f.error_reply(frame, 503, "503", "overloaded"))
    assert used == len(f.error_reply(frame, 503, "503", "overloaded"))
    assert (got.type, got.client_id, got.version) == (codec.REP, 1, 1)
    assert got.header == {"routing": [{"client_id": 1000}],
                          "reqrep": {"type": "correlation", "id": "01HZX-ID"}, "status": 503}
    assert got.body() == {"error": "overloaded"}
    for other in (codec.join(rid="j"), codec.ping(1000, 5), codec.pub(1000, "t", 1),
                  codec.rep(1000, 1001, "x"), codec.encode(codec.REQ, 1000, {"routing": [
                      {"client_id": 1}]})):
        assert f.error_reply(other, 503, "503", "m") is None
        assert not f.is_request(other)


# --------------------------------------------------------------------------- the parsers

IMPLS = {p: parser_impls(p) for p in PROTOCOLS}
IMPL_IDS = [(p, i) for p in PROTOCOLS for i in sorted(IMPLS[p])]
#: Requests a parser tracks that no error reply answers (fleximq: a JOIN is answered by
#: the broker's ClientID assignment, a PING by PONG).
NO_REPLY_REQUESTS = {"fleximq": {0, 8}}


def _kind(protocol, request):
    if protocol == "fleximq":
        return request[1]
    if protocol == "rabbitmq-stream":
        return struct.unpack_from(">H", request, 4)[0]
    return None


def check_reply(protocol, impl, request, status, options=None, strict=True):
    """Feed ``request`` then its error reply to a fresh parser: the reply answers every
    pending request with the injected status, adds no error, matches nothing else.
    Returns the number of requests answered (0: no reply, or not a request).

    ``strict``: the request is a whole, well-formed frame, so error_reply must answer
    whatever the parser tracks; otherwise (mutations) a ValueError is fine, but a reply
    it does make must still be read as the answer."""
    f = faults(protocol)
    code, label = f.error_status(status)
    stats, p = make(IMPLS[protocol][impl], protocol, **({"options": options} if options else {}))
    if p.feed(C2S, request) != len(request) or p.error is not None:
        return 0
    before = stats.snapshot()
    if sum(v for (d, _), v in before["frames"].items() if d == "c2s") != 1:
        return 0                                       # not one frame to the parser
    pending = before["in_flight"]
    try:
        reply = f.error_reply(request, code, label, "injected by the test")
    except ValueError:
        assert not strict or pending == 0 or before["errors"], (
            f"{protocol}: error_reply refused a request the parser tracks: {request!r}")
        return 0
    assert f.is_request(request) == (reply is not None)
    if reply is None:
        assert pending == 0 or _kind(protocol, request) in NO_REPLY_REQUESTS.get(protocol, ()), \
            f"{protocol}: no reply for a request the parser tracks: {request!r}"
        return 0
    assert pending > 0, f"{protocol}: a reply to a frame the parser sees as no request"
    assert p.feed(S2C, reply) == len(reply) and p.error is None, (request, reply, p.error)
    after = stats.snapshot()
    assert after["errors"] == before["errors"], (request, reply, after["errors"])
    if before["errors"]:
        return pending     # the parser found the request itself malformed: no more promise
    assert after["in_flight"] == 0, (request, reply)
    new = {k: v - before["responses"].get(k, 0) for k, v in after["responses"].items()
           if v != before["responses"].get(k, 0)}
    want = label
    if protocol == "rabbitmq-stream" and _kind(protocol, request) == 15:
        want = "OK"                                   # Metadata has no response code
    assert new and all(status == want for (_op, status) in new), (new, label)
    if protocol != "rabbitmq-stream":                 # a Publish may repeat an id
        assert sum(new.values()) == pending
        assert after["unmatched"] == before["unmatched"]
    return pending


def _c2s_frames(protocol):
    """Every c2s frame of the golden conversations, with the parser options they need."""
    out = []
    for conv in conformance(protocol).conversations():
        opts = conv.options or getattr(conformance(protocol), "PARSER_OPTIONS", None)
        out.extend((data, opts) for d, data in conv.steps if d == C2S)
    return out


@pytest.mark.parametrize("protocol,impl", IMPL_IDS)
def test_golden_requests_get_replies_both_parsers_read(protocol, impl):
    answered = 0
    for frame, opts in _c2s_frames(protocol):
        for value, _code, _label in STATUSES[protocol][:2]:
            answered += check_reply(protocol, impl, frame, value, opts)
    assert answered > 0


def test_rocketmq_length_includes_self_reply_on_both_parsers():
    from proxy.protocols.rocketmq.codec import RemotingCommand, encode
    for impl in IMPLS["rocketmq"]:
        for stype in (0, 1):
            frame = encode(RemotingCommand(code=310, opaque=9, serialize_type=stype),
                           length_includes_self=True)
            assert check_reply("rocketmq", impl, frame, "SYSTEM_BUSY",
                               {"length_includes_self": True}) == 1


def test_ttheader_special_framings_on_both_parsers():
    codec = _tt()
    conf = conformance("ttheader")
    msg = codec.binary_message("echo", 1, 12)
    cmsg = codec.compact_message("echo", 1, 13)
    frames = [codec.theader(msg, seq=5, transforms=[1]), codec.ttheader(msg, inner_framed=True),
              codec.ttheader(b"\x01\x02", seq=31, transforms=[3], intinfo={9: "Get"}),
              codec.ttheader(b"\x01\x02", seq=32, proto=2, transforms=[3]),
              codec.ttheader(conf.pb_meta("Echo", 1, 21), seq=21, proto=3),
              codec.ttheader(b"\x0a\x02hi", seq=24, proto=3, intinfo={9: "RawPB"}),
              codec.framed(conf.pb_meta("Framed", 1, 25)),
              codec.theader(cmsg, proto=2), codec.ttheader(cmsg, proto=7),
              codec.binary_message("echo", 1, 14),
              codec.framed(codec.binary_message("echo", 1, 15, strict=False))]
    for impl in IMPLS["ttheader"]:
        for frame in frames:
            assert check_reply("ttheader", impl, frame, "INTERNAL_ERROR") == 1, frame


def test_stream_sub_entry_publish_reply_is_a_publish_error_for_every_id():
    """The parsers walk Publish messages as ``u32 size + bytes`` only: a sub-entry batch
    (top bit set, what the real server and rstream's send_sub_entry use) is counted as
    bad_body there, so this checks the reply with the codec, not the parsers."""
    codec, K = _stream()
    frame = codec.encode_command(K.PUBLISH, publisher_id=0, messages=[
        codec.PublishedMessage(1, codec.SubBatch.of([b"a", b"b", b"c"])),
        codec.PublishedMessage(2, b"plain")])
    cmd = codec.decode_command(faults("rabbitmq-stream").error_reply(frame, 6, "x", "m"))
    assert cmd.errors == [(1, 6), (2, 6)]


# --------------------------------------------------------------------------- fuzz

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize("protocol", PROTOCOLS)
@SETTINGS
@given(data=st.binary(max_size=200), code_index=st.integers(0, 3))
def test_random_bytes_raise_only_value_error(protocol, data, code_index):
    f = faults(protocol)
    value, code, label = STATUSES[protocol][code_index % len(STATUSES[protocol])]
    for request in (data, struct.pack(">I", len(data)) + data):
        try:
            reply = f.error_reply(request, code, label, "m")
        except ValueError:
            continue
        assert reply is None or isinstance(reply, bytes)
        assert isinstance(f.is_request(request), bool)


def _mutate(frame, data):
    if not frame:
        return frame
    how = data.draw(st.integers(0, 3))
    i = data.draw(st.integers(0, len(frame) - 1))
    if how == 0:
        return frame[:i] + bytes([data.draw(st.integers(0, 255))]) + frame[i + 1:]
    if how == 1:
        return frame[:i]
    if how == 2:
        return frame[:i] + frame[i + 1:]
    return frame


@pytest.mark.slow
@pytest.mark.parametrize("protocol,impl", IMPL_IDS)
@SETTINGS
@given(data=st.data())
def test_random_conversation_frames_and_mutations(protocol, impl, data):
    conf = conformance(protocol)
    steps = data.draw(conf.frames())
    statuses = STATUSES[protocol]
    for d, frame in steps:
        value = statuses[data.draw(st.integers(0, len(statuses) - 1))][0]
        check_reply(protocol, impl, frame, value)
        mutated = _mutate(frame, data)
        try:
            faults(protocol).error_reply(mutated, *faults(protocol).error_status(value), "m")
        except ValueError:
            continue
        check_reply(protocol, impl, mutated, value, strict=False)


@st.composite
def _thrift_call(draw):
    """A Thrift message in any framing, protocol, header protocol id and transform."""
    codec = _tt()
    name = draw(st.sampled_from(["getUser", "e", "", "x" * 300, "日本"]))
    mtype = draw(st.integers(1, 4))
    seq = draw(st.integers(-2 ** 31, 2 ** 31 - 1))
    compact = draw(st.booleans())
    body = draw(st.sampled_from([b"\x00", b"\x0b\x00\x01\x00\x00\x00\x01a\x00"]))
    if compact:
        msg = codec.compact_message(name, mtype, seq, b"\x00")
    else:
        msg = codec.binary_message(name, mtype, seq, body, strict=draw(st.booleans()))
    framing = draw(st.sampled_from(["unframed", "framed", "ttheader", "theader"]))
    if framing == "unframed":
        return codec.binary_message(name, mtype, seq, body)
    if framing == "framed":
        return codec.framed(msg)
    kw = dict(seq=draw(st.integers(-2 ** 31, 2 ** 31 - 1)), flags=draw(st.integers(0, 0xFFFF)),
              proto=draw(st.sampled_from([0, 2, 7] + ([3] if framing == "ttheader" else []))),
              transforms=draw(st.sampled_from([(), (1,), (3,), (1, 1)])))
    if framing == "ttheader":
        return codec.ttheader(msg, intinfo=draw(st.sampled_from([None, {9: "Named"}])),
                              inner_framed=draw(st.booleans()) and not kw["transforms"],
                              **kw)
    return codec.theader(msg, info=draw(st.sampled_from([None, {"k": "v"}])), **kw)


@pytest.mark.parametrize("impl", sorted(IMPLS["ttheader"]))
@SETTINGS
@given(frame=_thrift_call())
def test_thrift_calls_in_every_framing_get_replies_the_parsers_read(impl, frame):
    check_reply("ttheader", impl, frame, "INTERNAL_ERROR")
