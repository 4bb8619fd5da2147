"""RabbitMQ Stream parser specifics on both twins: publish->confirm latency per message,
rewriting, and bad input (unknown key, tiny/huge sizes, unmatched correlation ids).

The golden conversation, every split point, byte-at-a-time feeding and the
twin-agreement fuzzer are in tests/test_conformance.py (data: rabbitmq_stream/conformance.py).
"""


from hypothesis import given, settings, strategies as st

from tests.parsers import impl_fixture, make as make_parser
from proxy.protocols.rabbitmq_stream import constants as K
from proxy.protocols.rabbitmq_stream.codec import (decode_metadata_response, encode_command,
                                                   encode_frame, encode_metadata_response)
from proxy.protocols.rabbitmq_stream.conformance import publish, req, resp

C2S, S2C = 0, 1


impl, IMPLS = impl_fixture("rabbitmq-stream")


def make(impl, **kw):
    return make_parser(impl, "rabbitmq-stream", "rs", **kw)


def counters(stats):
    s = stats.snapshot()
    return {k: s[k] for k in ("frames", "messages", "responses", "timeouts", "unmatched",
                              "in_flight", "errors")} | {
        "hist": {k: sum(v[0]) for k, v in s["hist"].items()}}


def test_publish_confirm_latency_per_message(impl):
    import time
    stats, p = make(impl)
    p.feed(C2S, publish(1, range(10)))
    assert stats.snapshot()["in_flight"] == 10
    time.sleep(0.02)
    p.feed(S2C, req(K.PUBLISH_CONFIRM, publisher_id=1, publishing_ids=list(range(10))))
    counts, total = stats.snapshot()["hist"][("Publish", "ok")]
    assert sum(counts) == 10 and total > 10 * 0.015
    assert stats.snapshot()["in_flight"] == 0


def test_confirm_for_other_publisher_is_unmatched(impl):
    stats, p = make(impl)
    p.feed(C2S, publish(1, [1]))
    p.feed(S2C, req(K.PUBLISH_CONFIRM, publisher_id=2, publishing_ids=[1]))
    assert stats.snapshot()["unmatched"] == 1 and stats.snapshot()["in_flight"] == 1


def test_response_with_unknown_correlation_id(impl):
    stats, p = make(impl)
    assert p.feed(S2C, resp(K.OPEN, correlation_id=77, code=K.OK)) > 0
    assert stats.snapshot()["unmatched"] == 1 and p.error is None


def test_unknown_key_counted_and_forwarded(impl):
    stats, p = make(impl)
    f = encode_frame(0x0063, 1, b"\0\0\0\1")
    nxt = req(K.HEARTBEAT)
    assert p.feed(C2S, f + nxt) == len(f) + len(nxt) and p.error is None
    s = stats.snapshot()
    assert s["errors"] == {("c2s", "unknown_command"): 1}
    assert s["frames"][("c2s", "unknown_99")] == 1 and s["frames"][("c2s", "Heartbeat")] == 1


def test_size_below_minimum_skipped(impl):
    stats, p = make(impl)
    data = b"\0\0\0\2\xab\xcd" + req(K.HEARTBEAT)
    assert p.feed(C2S, data) == len(data)
    s = stats.snapshot()
    assert s["errors"] == {("c2s", "frame_too_small"): 1}
    assert s["frames"] == {("c2s", "Heartbeat"): 1}


def test_size_over_limit_is_fatal_before_payload(impl):
    stats, p = make(impl, max_frame_bytes=1000)
    assert p.feed(C2S, b"\0\0\x03\xe9\0\x02\0\x01") == 0
    assert p.error.reason == "frame_too_large" and "1001" in str(p.error)


def test_size_over_tuned_frame_max_counted(impl):
    stats, p = make(impl)
    p.feed(S2C, encode_command(K.TUNE, frame_max=512, heartbeat=0))
    p.feed(C2S, encode_command(K.TUNE, frame_max=512, heartbeat=0))
    big = publish(1, [1], size=600)
    assert p.feed(C2S, big) == len(big) and p.error is None   # the server closes, not us
    assert stats.snapshot()["errors"] == {("c2s", "frame_too_large"): 1}


def test_truncated_publish_body(impl):
    stats, p = make(impl)
    good = publish(1, [1, 2])
    bad = bytearray(good)
    bad[0:4] = (len(good) - 4 - 30).to_bytes(4, "big")            # frame ends mid-message
    p.feed(C2S, bytes(bad[:len(good) - 30]) + req(K.HEARTBEAT))
    s = stats.snapshot()
    assert s["errors"] == {("c2s", "bad_body"): 1}
    assert s["frames"][("c2s", "Heartbeat")] == 1                 # still in step


def test_timeouts_and_close(impl):
    from proxy.framing_py import now_ns
    stats, p = make(impl, request_timeout=0.1)
    p.feed(C2S, publish(1, [1, 2]) + req(K.OPEN, correlation_id=1, virtual_host="/"))
    assert p.expire(now_ns() + 200_000_000) == 3
    p.close()
    s = stats.snapshot()
    assert s["timeouts"] == {"Publish": 2, "Open": 1} and s["in_flight"] == 0


def metadata(brokers, corr=5):
    return encode_metadata_response(corr, brokers, [("s", K.OK, 0, [])])


def test_metadata_rewriting_default_rule(impl):
    stats, p = make(impl, options={})
    p.local_address = ("127.0.0.1", 15553)
    p.upstream_address = ("10.0.0.5", 5552)
    p.feed(C2S, req(K.METADATA, correlation_id=5, streams=["s"]))
    frame = metadata([(0, "rabbit-1", 5552)])
    before, after = req(K.HEARTBEAT), req(K.HEARTBEAT)
    assert p.feed(S2C, before + frame + after) == len(before + frame + after)
    out = b"".join(p.output)
    rewritten = out[len(before):len(out) - len(after)]
    assert out.startswith(before) and out.endswith(after)
    assert int.from_bytes(rewritten[:4], "big") == len(rewritten) - 4   # re-framed
    _, brokers, streams = decode_metadata_response(rewritten[8:])
    assert brokers == [(0, "127.0.0.1", 15553)] and streams == [("s", K.OK, 0, [])]
    assert stats.snapshot()["responses"] == {("Metadata", "OK"): 1}


def test_metadata_rewriting_split_everywhere(impl):
    stats, p = make(impl, options={"advertise": {("r1", 5552): ("proxy", 6001),
                                                 ("r2", 5552): ("proxy", 6002)}})
    frame = metadata([(0, "r1", 5552), (1, "r2", 5552), (2, "r3", 5552)])
    stream = req(K.HEARTBEAT) + frame + req(K.HEARTBEAT)
    expected = None
    for cut in [None] + list(range(1, len(stream))):
        stats, p = make(impl, options={"advertise": {("r1", 5552): ("proxy", 6001),
                                                     ("r2", 5552): ("proxy", 6002)}})
        out = []
        for a, b in ([(0, len(stream))] if cut is None else [(0, cut), (cut, len(stream))]):
            p.feed(S2C, stream[a:b])
            out.extend(p.output if p.output is not None else [stream[a:b]])   # None: forwarded as fed
        got = b"".join(out)
        if expected is None:
            expected = got
            _, brokers, _ = decode_metadata_response(got[8 + 8:8 + len(got) - 16])
            assert brokers == [(0, "proxy", 6001), (1, "proxy", 6002), (2, "r3", 5552)]
        assert got == expected, f"cut at {cut}"


def test_rewriting_off(impl):
    stats, p = make(impl, options={"rewrite_metadata": False})
    frame = metadata([(0, "rabbit-1", 5552)])
    assert p.feed(S2C, frame) == len(frame) and p.output is None


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300), cut=st.integers(0, 300))
def test_random_bytes_never_crash(data, cut):
    for RouteStats, Parser in IMPLS.values():
        stats = RouteStats("r", "rabbitmq-stream")
        p = Parser(stats, max_frame_bytes=4096, options={})
        for d in (C2S, S2C):
            p.feed(d, data[:cut])
            if p.error is None:
                p.feed(d, data[cut:])
        p.close()
        assert stats.snapshot()["in_flight"] == 0


def test_output_belongs_to_one_call_only(impl):
    """A rewritten s2c read must not leak into the next c2s read's output."""
    stats, p = make(impl, options={})
    p.local_address = ("127.0.0.1", 1)
    p.feed(S2C, metadata([(0, "r", 5552)]))
    assert p.output is not None
    hb = req(K.HEARTBEAT)
    assert p.feed(C2S, hb) == len(hb) and p.output is None


def test_create_answered_stream_already_exists_is_normal_flow(impl):
    """Issue 8: clients declare their streams on every start; STREAM_ALREADY_EXISTS
    answering Create is outcome ok (status label kept), any other error is not."""
    stats, p = make(impl)
    p.feed(C2S, req(K.CREATE, correlation_id=1, stream="s", arguments={}))
    p.feed(S2C, resp(K.CREATE, correlation_id=1, code=K.STREAM_ALREADY_EXISTS))
    p.feed(C2S, req(K.DELETE, correlation_id=2, stream="s"))
    p.feed(S2C, resp(K.DELETE, correlation_id=2, code=K.STREAM_ALREADY_EXISTS))
    s = stats.snapshot()
    assert s["responses"] == {("Create", "STREAM_ALREADY_EXISTS"): 1,
                              ("Delete", "STREAM_ALREADY_EXISTS"): 1}
    assert {k: sum(v[0]) for k, v in s["hist"].items()} == {("Create", "ok"): 1,
                                                          ("Delete", "error"): 1}


# ---- the frame log's resource: the stream ------------------------------------------

def _records(impl, frames, p=None):
    if p is None:
        _, p = make(impl)
    recs = []
    p.tracer = recs.append
    for d, f in frames:
        assert p.feed(d, f) == len(f)
    p.close()
    return recs


def test_sasl_secret_never_reaches_a_record(impl):
    from proxy.protocols.rabbitmq_stream.conformance import SASL_SECRET
    auth = req(K.SASL_AUTHENTICATE, correlation_id=2, mechanism="PLAIN", data=SASL_SECRET)
    ok = resp(K.SASL_AUTHENTICATE, correlation_id=2, code=K.OK)
    for cut in range(1, len(auth)):
        recs = _records(impl, [(C2S, auth[:cut]), (C2S, auth[cut:]), (S2C, ok)])
        assert [(r["resource"], r["attrs"]) for r in recs] == [(None, None), (None, None)]
        text = repr(recs)
        assert "s3cret" not in text and "app-user" not in text and "PLAIN" not in text


def test_ids_rebind_and_forget(impl):
    def declare(pid, stream):
        return req(K.DECLARE_PUBLISHER, correlation_id=pid, publisher_id=pid, reference=None,
                   stream=stream)
    frames = [(C2S, declare(0, "a")), (C2S, declare(255, "z")), (C2S, publish(0, [1])),
              (C2S, declare(0, "b")), (C2S, publish(0, [2])), (C2S, publish(255, [3])),
              (C2S, req(K.DELETE_PUBLISHER, correlation_id=9, publisher_id=0)),
              (C2S, publish(0, [4])), (C2S, declare(0, "c")), (C2S, publish(0, [5]))]
    recs = [r for r in _records(impl, frames) if r["opcode_name"] == "Publish"
            and r["kind"] == "request"]
    assert [(r["correlation_id"], r["resource"]) for r in recs] == [
        ("0:1", "a"), ("0:2", "b"), ("255:3", "z"), ("0:4", None), ("0:5", "c")]


def test_publisher_and_subscription_ids_are_separate(impl):
    frames = [(C2S, req(K.DECLARE_PUBLISHER, correlation_id=1, publisher_id=3,
                        reference=None, stream="pubs")),
              (C2S, req(K.SUBSCRIBE, correlation_id=2, subscription_id=3, stream="subs",
                        offset_type=1, credit=1, properties={})),
              (C2S, publish(3, [1])), (C2S, req(K.CREDIT, subscription_id=3, credit=1))]
    recs = _records(impl, frames)
    assert [r["resource"] for r in recs[:4]] == ["pubs", "subs", "pubs", "subs"]


def test_streams_remembered_only_while_recording(impl):
    stats, p = make(impl)
    p.feed(C2S, req(K.DECLARE_PUBLISHER, correlation_id=1, publisher_id=1, reference=None,
                    stream="quiet"))
    recs = _records(impl, [(C2S, publish(1, [1]))], p=p)
    assert recs[0]["resource"] is None          # declared while nothing was recording
    assert stats.snapshot()["frames"][("c2s", "Publish")] == 1


def test_every_id_declared_many_times(impl):
    """All 512 slots filled, rebound and dropped (the compiled table's malloc/free)."""
    frames = []
    for rnd in range(3):
        for i in range(256):
            frames.append((C2S, req(K.DECLARE_PUBLISHER, correlation_id=i, publisher_id=i,
                                    reference=None, stream="p%d-%d" % (rnd, i))))
            frames.append((C2S, req(K.SUBSCRIBE, correlation_id=i, subscription_id=i,
                                    stream="s" * (rnd * 200), offset_type=1, credit=1,
                                    properties={})))
    frames.append((C2S, publish(200, [1])))
    frames.append((C2S, req(K.UNSUBSCRIBE, correlation_id=1, subscription_id=17)))
    recs = _records(impl, frames)
    pub = [r for r in recs if r["opcode_name"] == "Publish" and r["kind"] == "request"]
    assert [(r["correlation_id"], r["resource"]) for r in pub] == [("200:1", "p2-200")]
    unsub = [r for r in recs if r["opcode_name"] == "Unsubscribe" and r["kind"] == "request"]
    assert unsub[0]["resource"] == "s" * 256


# ---- Publish sub-entry batches (rstream send_sub_entry; the golden conversation
# "sub-entries" in rabbitmq_stream/conformance.py is also fed at every split point) ----

def _sub_frame(size_field, data_len, version=1, count=3, pubid=1, pid=1):
    """Publish of one sub-entry batch whose Size field says size_field, carrying data_len
    bytes of data (the frame's Size is right for what is there)."""
    import struct
    body = struct.pack(">BIQ", pubid, 1, pid)
    if version >= 2:
        body += struct.pack(">h", -1)
    body += struct.pack(">BHII", 0x80, count, 4 * count, size_field) + b"d" * data_len
    return encode_frame(K.PUBLISH, version, body)


def test_sub_entry_is_one_id_and_count_messages(impl):
    from proxy.protocols.rabbitmq_stream.conformance import publish_mixed
    for version in (1, 2):
        stats, p = make(impl)
        f = publish_mixed(4, [(10, 7), (11, None), (12, 1)], version=version)
        assert p.feed(C2S, f) == len(f) and p.error is None
        s = stats.snapshot()
        assert s["messages"] == {("c2s", "Publish"): 9} and s["in_flight"] == 3
        assert s["errors"] == {}
        p.feed(S2C, req(K.PUBLISH_CONFIRM, publisher_id=4, publishing_ids=[10, 11, 12]))
        s = stats.snapshot()
        assert s["in_flight"] == 0 and s["responses"] == {("Publish", "OK"): 3}
        assert s["unmatched"] == 0


def test_sub_entry_of_no_messages(impl):
    stats, p = make(impl)
    f = _sub_frame(0, 0, count=0) + req(K.HEARTBEAT)
    assert p.feed(C2S, f) == len(f)
    s = stats.snapshot()
    assert s["messages"].get(("c2s", "Publish"), 0) == 0 and s["in_flight"] == 1
    assert s["errors"] == {} and s["frames"][("c2s", "Heartbeat")] == 1


def test_sub_entry_sizes_past_the_frame(impl):
    """A batch whose Size runs past the frame, or whose header the frame cuts: bad_body,
    its id still tracked, the next frame read in step; nothing is read past the frame."""
    import struct
    cases = [_sub_frame(50, 10), _sub_frame(0xFFFFFFFF, 3), _sub_frame(50, 10, version=2)]
    whole = _sub_frame(4, 4)
    for cut in range(1, 11):                   # frame ends inside the 11-byte header
        short = whole[:len(whole) - 4 - 11 + cut]
        cases.append(struct.pack(">I", len(short) - 4) + short[4:])
    for f in cases:
        for split in (len(f), 13, len(f) - 1):
            stats, p = make(impl)
            nxt = req(K.HEARTBEAT)
            data = f + nxt
            assert p.feed(C2S, data[:split]) + p.feed(C2S, data[split:]) == len(data)
            s = stats.snapshot()
            assert p.error is None
            assert s["errors"] == {("c2s", "bad_body"): 1}, (f.hex(), split)
            assert s["frames"] == {("c2s", "Publish"): 1, ("c2s", "Heartbeat"): 1}
            assert s["in_flight"] == 1


@settings(max_examples=150, deadline=None)
@given(entries=st.lists(st.tuples(st.integers(0, 2**64 - 1),
                                  st.one_of(st.none(), st.integers(0, 70000))),
                        max_size=6, unique_by=lambda e: e[0]),
       version=st.sampled_from([1, 2]), cuts=st.lists(st.integers(0, 400), max_size=6))
def test_sub_entry_mixes_any_split_both_twins(entries, version, cuts):
    """Random mixes of simple messages and batches (Count 0..65535), cut anywhere: both
    twins count every id once and exactly the messages the entries carry."""
    from proxy.protocols.rabbitmq_stream.conformance import publish_mixed
    entries = [(i, None if n is None else n % 65536) for i, n in entries]
    f = publish_mixed(2, entries, version=version)
    want = sum(1 if n is None else n for _, n in entries)
    results = []
    for impl in IMPLS.values():
        stats, p = make(impl)
        recs = []
        p.tracer = recs.append
        k = 0
        for c in sorted(cuts) + [len(f)]:
            c = min(c, len(f))
            assert p.feed(C2S, f[k:c]) == c - k
            k = max(k, c)
        s = stats.snapshot()
        assert s["errors"] == {} and s["in_flight"] == len(entries)
        assert s["messages"].get(("c2s", "Publish"), 0) == want
        p.feed(S2C, req(K.PUBLISH_CONFIRM, publisher_id=2,
                        publishing_ids=[i for i, _ in entries]))
        p.close()
        rows = [(r["correlation_id"], r["messages"]) for r in recs
                if r["opcode_name"] == "Publish"]
        assert rows == [("2:%d" % i, 1 if n is None else n) for i, n in entries] or \
            (not entries and rows == [(None, 0)])
        results.append((stats.snapshot()["responses"], rows))
    assert all(r == results[0] for r in results)
