"""The WebSocket layer of fleximq routes (proxy/websocket.py) on both twins, fed
hand-built RFC 6455 byte streams: the upgrade (relayed, rewritten, refused), masking,
7/16/64-bit lengths, fragmentation with control frames in between, several fleximq
frames in one message and one fleximq frame across messages, every split point and
byte at a time, every ws_ error reason and where a fatal one cuts the stream."""

import base64
import hashlib
import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from proxy import websocket
from proxy.protocols.fleximq import codec
from proxy.protocols.fleximq.codec import BCAST, encode
from tests.parsers import impl_fixture, make as make_parser

pytestmark = pytest.mark.twins
C2S, S2C = 0, 1
impl, IMPLS = impl_fixture("fleximq")

LISTEN = websocket.parse_url("ws://127.0.0.1:0/fx", "listen", listen=True)
UPSTREAM = websocket.parse_url("ws://10.0.0.7:9000/mq", "upstream")
KEY = base64.b64encode(b"0123456789abcdef").decode()
ACCEPT = base64.b64encode(hashlib.sha1(KEY.encode() + websocket.GUID).digest()).decode()

REQUEST = ("GET /fx?x=1 HTTP/1.1\r\nHost: 127.0.0.1:5555\r\nUpgrade: websocket\r\n"
           "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n"
           "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
           "\r\n" % KEY).encode()
RESPONSE = ("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Accept: %s\r\n\r\n" % ACCEPT).encode()


def frame(payload, op=2, fin=True, mask=b"\x11\x22\x33\x44", rsv=0, length=None):
    """One RFC 6455 frame, by hand (``mask=None``: unmasked, a server's)."""
    n = len(payload) if length is None else length
    b0 = (0x80 if fin else 0) | rsv | op
    m = 0x80 if mask else 0
    if n < 126:
        head = struct.pack(">BB", b0, m | n)
    elif n < 65536:
        head = struct.pack(">BBH", b0, m | 126, n)
    else:
        head = struct.pack(">BBQ", b0, m | 127, n)
    if not mask:
        return head + payload
    body = bytes(c ^ mask[i & 3] for i, c in enumerate(payload))
    return head + mask + body


def srv(payload, **kw):
    return frame(payload, mask=None, **kw)


def make(impl, **kw):
    stats, p = make_parser(impl, "fleximq", "fx", **kw)
    replies = []
    layer = websocket.wrap(p, LISTEN, UPSTREAM, replies.append)
    return stats, layer, replies


def opened(impl, **kw):
    """A layer past a good upgrade."""
    stats, layer, replies = make(impl, **kw)
    layer.feed(C2S, REQUEST)
    layer.feed(S2C, RESPONSE)
    assert layer.error is None and layer.phases() == (websocket.PH_FRAMES,) * 2
    return stats, layer


def test_the_compiled_layer_wraps_the_compiled_parser(impl):
    stats, layer, _ = make(impl)
    compiled = type(layer.parser).__module__.endswith("_parser")
    assert type(layer).__module__ == ("proxy._websocket" if compiled else "proxy.websocket_py")


# ---- the upgrade ---------------------------------------------------------------------------

def test_upgrade_is_relayed_rewritten_and_held_until_whole(impl):
    stats, layer, replies = make(impl)
    assert layer.feed(C2S, REQUEST[:30]) == 0 and layer.output == []      # held
    layer.feed(C2S, REQUEST[30:])
    out = b"".join(layer.output)
    assert out.startswith(b"GET /mq?x=1 HTTP/1.1\r\n")       # upstream path, query kept
    assert b"Host: 10.0.0.7:9000\r\n" in out
    assert b"Sec-WebSocket-Extensions" not in out            # nothing negotiated
    assert b"Sec-WebSocket-Key: %s\r\n" % KEY.encode() in out and out.endswith(b"\r\n\r\n")
    first = frame(codec.join(None, "j1"))
    layer.feed(S2C, RESPONSE + srv(codec.rep(1000, 1000, "j1")))   # a frame right behind
    assert b"".join(layer.output) == RESPONSE + srv(codec.rep(1000, 1000, "j1"))
    assert layer.feed(C2S, first) == len(first) and layer.output is None
    s = stats.snapshot()
    assert s["frames"] == {("c2s", "JOIN"): 1, ("s2c", "REP"): 1} and s["errors"] == {}
    assert s["bytes"] == {"c2s": len(REQUEST) + len(first),
                          "s2c": len(RESPONSE) + len(srv(codec.rep(1000, 1000, "j1")))}
    assert not replies


@pytest.mark.parametrize("bad,status,why", [
    (REQUEST.replace(b"GET /fx", b"GET /other"), 404, "no WebSocket endpoint"),
    (REQUEST.replace(b"Upgrade: websocket\r\n", b""), 426, "Upgrade: websocket"),
    (REQUEST.replace(b"Version: 13", b"Version: 8"), 426, "Sec-WebSocket-Version"),
    (REQUEST.replace(KEY.encode(), b"c2hvcnQ="), 400, "Sec-WebSocket-Key"),
    (REQUEST.replace(b"GET", b"POST"), 400, "method POST"),
    (REQUEST.replace(b"Connection: Upgrade", b"Connection: keep-alive"), 400, "Connection"),
    (b"GET /fx HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n", 431, "over 16384"),
])
def test_bad_upgrade_requests_are_answered_and_counted(impl, bad, status, why):
    stats, layer, replies = make(impl)
    layer.feed(C2S, bad)
    assert layer.output == []                       # nothing goes upstream
    assert layer.error.reason == "ws_bad_upgrade" and why in str(layer.error)
    assert stats.snapshot()["errors"] == {("c2s", "ws_bad_upgrade"): 1}
    assert replies and replies[0].startswith(b"HTTP/1.1 %d " % status)
    assert why.encode() in replies[0]


def test_a_refused_upgrade_is_relayed_undecoded(impl):
    stats, layer, _ = make(impl)
    layer.feed(C2S, REQUEST)
    answer = b"HTTP/1.1 403 Forbidden\r\nContent-Length: 4\r\n\r\nnope"
    layer.feed(S2C, answer[:20])
    layer.feed(S2C, answer[20:])
    assert b"".join(layer.output) == answer
    assert layer.error is None and layer.phases() == (websocket.PH_PASS,) * 2
    assert layer.feed(S2C, b"\x00\x01garbage") == 9 and layer.feed(C2S, b"\xff") == 1
    assert stats.snapshot()["errors"] == {("s2c", "ws_upgrade_refused"): 1}


@pytest.mark.parametrize("bad,why", [
    (RESPONSE.replace(ACCEPT.encode(), base64.b64encode(b"x" * 20)), "Sec-WebSocket-Accept"),
    (RESPONSE.replace(b"Upgrade: websocket\r\n", b""), "Upgrade: websocket"),
    (RESPONSE.replace(b"\r\n\r\n", b"\r\nSec-WebSocket-Extensions: permessage-deflate\r\n\r\n"),
     "extension"),
    (b"HTTP/1.1 101 OK\r\nX: " + b"a" * 20000, "over 16384"),
])
def test_bad_switching_answers_are_fatal(impl, bad, why):
    stats, layer, _ = make(impl)
    layer.feed(C2S, REQUEST)
    layer.feed(S2C, bad)
    assert layer.error.reason == "ws_bad_handshake" and why in str(layer.error)
    assert stats.snapshot()["errors"] == {("s2c", "ws_bad_handshake"): 1}


# ---- frames ---------------------------------------------------------------------------------

def conversation():
    """(c2s bytes, s2c bytes, expected frame counts): every way fleximq frames can sit in
    WebSocket messages."""
    reqs = [codec.req(1000, 1001, "r%d" % i, "/p", {"i": i}) for i in range(6)]
    big = encode(BCAST, 1000, raw_payload=os.urandom(70000))      # 64-bit length
    mid = encode(BCAST, 1000, raw_payload=b"m" * 1000)             # 16-bit length
    split = codec.req(1000, 1001, "split", "/p", {"x": "y" * 300})
    c2s = (frame(codec.join(None, "j")) +
           frame(reqs[0] + reqs[1] + reqs[2]) +                    # three in one message
           frame(split[:10], fin=False) +                          # one across fragments,
           frame(b"", op=9) +                                      # a ping in between
           frame(split[10:200], op=0, fin=False) +
           frame(split[200:], op=0) +
           frame(reqs[3][:20]) + frame(reqs[3][20:] + reqs[4]) +   # one across messages
           frame(big) + frame(mid) + frame(b"", op=10) +
           frame(reqs[5], mask=b"\0\0\0\0"))                       # a zero mask is a mask
    reps = [codec.rep(1001, 1000, rid) for rid in ["r%d" % i for i in range(6)] + ["split"]]
    s2c = (srv(codec.rep(1000, 1000, "j")) + srv(b"".join(reps[:4])) +
           srv(reps[4][:5], fin=False) + srv(b"pong", op=10) + srv(reps[4][5:], op=0) +
           srv(reps[5] + reps[6]) + srv(struct.pack(">H", 1000) + b"bye", op=8))
    frames = {("c2s", "JOIN"): 1, ("c2s", "REQ"): 7, ("c2s", "BCAST"): 2,
              ("s2c", "REP"): 8}
    return c2s, s2c, frames


def test_every_arrangement_counts_exactly_at_every_split_point(impl):
    c2s, s2c, frames = conversation()
    for cut in list(range(0, 60)) + list(range(60, len(c2s), 997)) + [len(c2s) - 1]:
        stats, layer = opened(impl)
        assert layer.feed(C2S, c2s[:cut]) == cut
        assert layer.feed(C2S, c2s[cut:]) == len(c2s) - cut
        for k in range(0, len(s2c), 7):
            layer.feed(S2C, s2c[k:k + 7])
        s = stats.snapshot()
        assert s["frames"] == frames, cut
        assert s["errors"] == {} and s["responses"] == {("JOIN", "200"): 1, ("REQ", "200"): 7}
        assert s["bytes"]["c2s"] == len(REQUEST) + len(c2s)
        layer.close()
        assert stats.snapshot()["errors"] == {}


def test_byte_at_a_time(impl):
    c2s, s2c, frames = conversation()
    stats, layer = opened(impl)
    c2s = c2s[:-70200]                                  # leave out the big ones: slow
    for i in range(len(c2s)):
        assert layer.feed(C2S, c2s[i:i + 1]) == 1
    for i in range(len(s2c)):
        assert layer.feed(S2C, memoryview(s2c)[i:i + 1]) == 1
    s = stats.snapshot()
    assert s["frames"][("c2s", "REQ")] == 6 and s["frames"][("s2c", "REP")] == 8
    assert s["errors"] == {}


# ---- errors -----------------------------------------------------------------------------

GOOD = frame(codec.join(None, "j"))

FATAL = [   # (direction, good frames, the offending frame, reason), after a good frame
    (C2S, b"", frame(b"x", rsv=0x40), "ws_reserved_bits"),
    (C2S, b"", frame(b"x", op=3), "ws_bad_opcode"),
    (S2C, b"", srv(b"x", op=0x0B), "ws_bad_opcode"),
    (C2S, b"", frame(b"x", mask=None), "ws_unmasked_client_frame"),
    (S2C, b"", frame(b"x"), "ws_masked_server_frame"),
    (C2S, b"", frame(b"x", op=9, fin=False), "ws_bad_control_frame"),
    (C2S, b"", frame(b"x" * 126, op=9), "ws_bad_control_frame"),
    (C2S, b"", frame(b"x", op=0), "ws_bad_continuation"),
    (C2S, frame(b"x", fin=False), frame(b"y"), "ws_bad_continuation"),
    (C2S, b"", frame(b"", length=1 << 63), "ws_oversized"),
    (C2S, b"", frame(b"", length=2049), "ws_oversized"),
    (C2S, frame(encode(BCAST, 1000, raw_payload=b"m" * 1466), fin=False),   # 1500 bytes
     frame(b"", op=0, length=600), "ws_oversized"),
    (C2S, frame(struct.pack(">H", 1000), op=8), frame(b"x"), "ws_frame_after_close"),
    (S2C, srv(b"", op=8), srv(b"", op=9), "ws_frame_after_close"),
]


def good_frame(d):
    return GOOD if d == C2S else srv(codec.rep(1000, 1000, "j"))


@pytest.mark.parametrize("d,fine,bad,reason", FATAL, ids=[f[3] for f in FATAL])
def test_fatal_errors_cut_before_the_offending_frame(impl, d, fine, bad, reason):
    stats, layer = opened(impl, max_frame_bytes=2048)
    good = good_frame(d)
    data = good + fine + bad + good
    assert layer.feed(d, data) == len(good) + len(fine)   # the frames before it go on
    assert layer.error is not None and layer.error.reason == reason
    assert str(layer.error).startswith("fleximq: ")
    errors = stats.snapshot()["errors"]
    assert errors == {(("c2s", "s2c")[d], reason): 1}
    assert layer.feed(d, good) == 0                     # nothing after a fatal error
    layer.close()
    assert stats.snapshot()["errors"] == errors         # no truncation counted on top


def test_oversized_is_checked_on_the_header_before_any_payload(impl):
    stats, layer = opened(impl, max_frame_bytes=2048)
    head = frame(b"x" * 3000)[:8]                        # header + mask only
    assert layer.feed(C2S, head) == 0 and layer.error.reason == "ws_oversized"


def test_fatal_error_at_a_split_header_cuts_at_zero(impl):
    stats, layer = opened(impl)
    bad = frame(b"x", op=5)
    assert layer.feed(C2S, GOOD + bad[:1]) == len(GOOD) + 1
    assert layer.feed(C2S, bad[1:]) == 0
    assert layer.error.reason == "ws_bad_opcode"


def test_counted_errors_forward_the_frames(impl):
    stats, layer = opened(impl)
    data = (frame(b"text", op=1, fin=False) + frame(b" more", op=0) + GOOD +
            frame(b"\x03", op=8))
    assert layer.feed(C2S, data) == len(data) and layer.error is None
    stats2, layer2 = opened(impl)
    closing = srv(struct.pack(">H", 1005), op=8)          # 1005 must not be sent
    assert layer2.feed(S2C, closing) == len(closing)
    assert stats.snapshot()["errors"] == {("c2s", "ws_text_message"): 1,
                                          ("c2s", "ws_bad_close"): 1}
    assert stats.snapshot()["frames"] == {("c2s", "JOIN"): 1}
    assert stats2.snapshot()["errors"] == {("s2c", "ws_bad_close"): 1}


def test_truncated_frames_and_heads(impl):
    stats, layer = opened(impl)
    layer.feed(C2S, GOOD + frame(b"abcdef")[:5])
    layer.feed(S2C, srv(b"abc")[:1])
    layer.close()
    assert stats.snapshot()["errors"] == {("c2s", "ws_truncated_frame"): 1,
                                          ("s2c", "ws_truncated_frame"): 1}
    stats, layer, _ = make(impl)
    layer.feed(C2S, REQUEST[:40])
    layer.close()
    assert stats.snapshot()["errors"] == {("c2s", "ws_truncated_frame"): 1}


def test_a_fatal_fleximq_error_cuts_at_its_websocket_frame(impl):
    stats, layer = opened(impl)
    bad = struct.pack(">BBI16sIQ", 1, BCAST, 1000, b"\0" * 16, 65537, 0)  # header > 64 KiB
    before = frame(codec.join(None, "a")) + frame(codec.join(None, "b"))
    data = before + frame(bad) + GOOD
    assert layer.feed(C2S, data) == len(before)
    assert layer.error.reason == "header_too_large"
    assert stats.snapshot()["frames"] == {("c2s", "JOIN"): 2}
    # inside a message that began with good frames: the whole message is held back
    stats, layer = opened(impl)
    data = GOOD + frame(codec.join(None, "c") + bad)
    assert layer.feed(C2S, data) == len(GOOD)


def test_twins_agree_on_errors_and_cuts():
    """Every fatal case, fed at every split, gives the same cut, counts and message."""
    if len(IMPLS) < 2:
        pytest.skip("FRAMETAP_NO_EXTENSIONS=1: one twin only")
    for d, fine, bad, reason in FATAL:
        data = good_frame(d) + fine + bad
        for cut in range(0, len(data), 3):
            seen = []
            for name, im in sorted(IMPLS.items()):
                stats, layer = opened(im, max_frame_bytes=2048)
                r = (layer.feed(d, data[:cut]), layer.feed(d, data[cut:]))
                seen.append((r, str(layer.error), stats.snapshot()["errors"]))
            assert seen[0] == seen[1], (reason, cut)


def test_twins_flush_at_the_same_points():
    from proxy import websocket_py
    if len(IMPLS) < 2:
        pytest.skip("FRAMETAP_NO_EXTENSIONS=1: one twin only")
    from proxy import _websocket
    assert (_websocket.GATHER_BYTES, _websocket.GATHER_SEGMENTS,
            _websocket.GATHER_SPLIT) == (websocket_py.GATHER_BYTES,
                                         websocket_py.GATHER_SEGMENTS,
                                         websocket_py.GATHER_SPLIT)


def test_many_small_messages_in_one_read_cross_the_gather_limits(impl):
    """More than GATHER_SEGMENTS messages and GATHER_BYTES bytes in one read, with a
    fatal fleximq error in the last one: the cut is that message's start."""
    stats, layer = opened(impl)
    msgs = [frame(codec.ping(1000, i)) for i in range(100)]
    bad = frame(struct.pack(">BBI16sIQ", 1, BCAST, 1000, b"\0" * 16, 65537, 0))
    data = b"".join(msgs) + bad
    assert layer.feed(C2S, data) == len(data) - len(bad)
    assert stats.snapshot()["frames"] == {("c2s", "PING"): 100}
    assert layer.error.reason == "header_too_large"


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_twins_agree_on_mutated_streams(data):
    """Any mutation of a real conversation, split anywhere: both twins return the same
    prefixes, the same error and the same counts (and neither raises)."""
    if len(IMPLS) < 2:
        pytest.skip("FRAMETAP_NO_EXTENSIONS=1: one twin only")
    c2s, s2c, _ = conversation()
    d = data.draw(st.sampled_from([C2S, S2C]))
    stream = bytearray((c2s if d == C2S else s2c)[:3000])
    for _ in range(data.draw(st.integers(0, 4))):
        stream[data.draw(st.integers(0, len(stream) - 1))] = data.draw(st.integers(0, 255))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=4)))
    pieces = [bytes(stream[a:b]) for a, b in zip([0] + cuts, cuts + [len(stream)])]
    seen = []
    for name, im in sorted(IMPLS.items()):
        stats, layer = opened(im, max_frame_bytes=4096)
        r = [layer.feed(d, p) for p in pieces]
        layer.close()
        s = stats.snapshot()
        seen.append((r, str(layer.error), s["errors"], s["frames"]))
    assert seen[0] == seen[1]
