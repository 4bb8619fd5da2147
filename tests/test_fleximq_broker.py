"""The reference fleximq broker against the fleximq document, section by section, with
real sockets and the sync client (docs/design.md, "fleximq": where the document
contradicts itself or leaves a choice open, the broker's docstring says what it does)."""

import os
import socket
import struct
import subprocess
import sys
import time

import msgpack
import pytest

from loadgen.fleximq.client import FlexiMQClient, FlexiMQError
from loadgen.fleximq.server import FlexiMQBrokerThread
from proxy.protocols.fleximq import codec
from proxy.protocols.fleximq.codec import (JOIN, REQ, REP, NOTIF, BCAST, PUB, SUB, PING,
                                           PONG, encode)


@pytest.fixture
def broker():
    with FlexiMQBrokerThread(ping_interval=0) as b:
        yield b


def client(b, join=True, **kw):
    c = FlexiMQClient(b.address, timeout=5, **kw)
    if join:
        c.join()
    return c


def silent(c, seconds=0.2):
    """True when nothing arrives on c for `seconds`."""
    try:
        c.recv(timeout=seconds)
    except TimeoutError:
        return True
    return False


def closed(c, timeout=3):
    try:
        while True:
            c.recv(timeout=timeout)
    except ConnectionError:
        return True
    except TimeoutError:
        return False


# ---- §4: JOIN and ClientIDs ------------------------------------------------------------

def test_join_assigns_increasing_ids_from_1000_never_reused(broker):
    """§4.1.2: unique ids from the dynamic range, not reused at once; §4.2.1: the
    answer is a REP whose base-header ClientID is the id."""
    a = client(broker, join=False)
    a.send(codec.join(rid="j1"))
    rep = a.recv()
    assert (rep.type, rep.client_id, rep.status) == (REP, 1000, 200)
    assert rep.header["reqrep"] == {"type": "correlation", "id": "j1"}     # §4.2 step 4
    b = client(broker)
    assert b.client_id == 1001
    a.close()
    time.sleep(0.1)
    assert client(broker).client_id == 1002                                   # 1000 not reused


def test_messages_before_join_get_400_and_close(broker):
    """§4.2, §7.3.2: JOIN must come first."""
    c = client(broker, join=False)
    c.send(codec.sub(0, "t"))
    rep = c.recv()
    assert rep.type == REP and rep.status == 400 and rep.client_id == 1
    assert closed(c)


def test_second_join_and_wrong_client_id_get_400_connection_kept(broker):
    c = client(broker)
    c.send(codec.join())
    assert c.recv().status == 400
    c.send(codec.req(4242, c.client_id, "x"))                  # not this connection's id
    rep = c.recv()
    assert rep.status == 400 and rep.rid == "x"
    assert c.ping() >= 0                                        # still usable


def test_join_with_nonzero_client_id_is_refused(broker):
    """§3.2: ClientID must be 0 in a JOIN."""
    c = client(broker, join=False)
    c.send(encode(JOIN, 77, {}))
    assert c.recv().status == 400
    assert c.join() == 1000                                     # may try again


@pytest.mark.parametrize("auth,status", [
    (None, 401),
    ({"type": "token", "token": "wrong"}, 401),
    ({"type": "basic", "username": "alice", "password": "nope"}, 401),
    ({"type": "api_key", "api_key": "k0"}, 401),
    ({"type": "kerberos"}, 604),
    ({"type": "basic", "username": "alice"}, 604),
    ("token", 604),
])
def test_auth_failures_answer_and_close(auth, status):
    """§4.2 step 3, §5.1.2 (401), §5.1.4 (604)."""
    with FlexiMQBrokerThread(ping_interval=0, tokens=["t0k"], users={"alice": "pw"},
                             api_keys=["k1"]) as b:
        c = client(b, join=False)
        with pytest.raises(FlexiMQError) as e:
            c.join(auth=auth)
        assert e.value.status == status
        assert closed(c)
        for good in ({"type": "token", "token": "t0k"},
                     {"type": "basic", "username": "alice", "password": "pw"},
                     {"type": "api_key", "api_key": "k1"}):
            assert client(b, join=False).join(auth=good) >= 1000


def test_auth_ignored_when_none_configured(broker):
    assert client(broker, join=False).join(auth={"type": "token", "token": "x"}) == 1000


# ---- §3.3 REQ/REP ------------------------------------------------------------------------

def test_req_rep_routed_both_ways(broker):
    a, b = client(broker), client(broker)
    rid = a.send_request(b.client_id, "/api/users", {"id": 7})
    req = b.next_request()
    assert req.client_id == a.client_id                         # forwarded unchanged
    assert req.header["routing"] == [{"client_id": b.client_id, "path": "/api/users"}]
    assert req.body() == {"id": 7}
    b.reply(req, {"name": "x"}, status=201)
    rep = a.wait_reply(rid)
    assert rep.status == 201 and rep.body() == {"name": "x"} and rep.client_id == b.client_id


def test_req_to_unknown_or_departed_client_gets_600(broker):
    """§5.1.4: 600 Client Not Found."""
    a, b = client(broker), client(broker)
    with pytest.raises(FlexiMQError) as e:
        a.request(9999)
    assert e.value.status == 600
    gone = b.client_id
    b.close()
    deadline = time.monotonic() + 5
    while broker.call(lambda: gone in broker.server.clients) and time.monotonic() < deadline:
        time.sleep(0.01)                                        # the broker saw the close
    with pytest.raises(FlexiMQError) as e:
        a.request(gone)
    assert e.value.status == 600 and e.value.frame.client_id == 1


# ---- §3.4 NOTIF, §3.5 BCAST -----------------------------------------------------------------

def test_notif_to_every_target_and_unknowns_reported(broker):
    a, b, c = client(broker), client(broker), client(broker)
    a.notify([b.client_id, c.client_id, 5555, b.client_id], "/alerts", {"m": 1})
    assert b.recv().type == NOTIF and c.recv().type == NOTIF
    assert silent(b)                                            # once per distinct target
    back = a.recv()
    assert back.type == NOTIF and back.status == 600
    assert back.header["routing"] == [{"client_id": 5555, "path": "/alerts"}]


def test_bcast_to_all_other_joined_clients(broker):
    a, b, c = client(broker), client(broker), client(broker)
    unjoined = client(broker, join=False)
    a.broadcast({"hi": 1}, status=200)
    for x in (b, c):
        f = x.recv()
        assert f.type == BCAST and f.client_id == a.client_id and f.body() == {"hi": 1}
    assert silent(a) and silent(unjoined)


# ---- §3.6 PUB/SUB/UNSUB, §7.3.3 ---------------------------------------------------------

def test_pub_sub_unsub(broker):
    pub, s1, s2 = client(broker), client(broker), client(broker)
    s1.subscribe("news")
    s1.subscribe("news")                                        # idempotent
    s2.subscribe("news")
    s2.subscribe("News")                                        # case-sensitive
    s1.ping()                                                   # their SUBs are read
    s2.ping()                                                   # by now (in order)
    pub.publish("news", {"n": 1})
    assert s1.recv().body() == {"n": 1} and s2.recv().body() == {"n": 1}
    assert silent(s1)                                           # not twice
    pub.publish("news", {"n": 2}, routing=[{"client_id": s2.client_id}])
    assert s2.recv().body() == {"n": 2} and silent(s1)
    s1.unsubscribe("news")
    s1.ping()
    pub.publish("news", {"n": 3})
    assert s2.recv().body() == {"n": 3}
    assert silent(s1)                                           # none after UNSUB
    pub.publish("nobody-listens", {"n": 4})                     # dropped silently
    assert silent(pub)


# ---- §3.7 keepalive ------------------------------------------------------------------------

def test_ping_answered_with_same_timestamp(broker):
    c = client(broker)
    c.send(codec.ping(c.client_id, 1703123456789, 30))
    f = c.recv()
    assert f.type == PONG and f.client_id == 1
    assert f.header == {"keepalive": {"timestamp": 1703123456789}}


def test_broker_pings_idle_clients_and_drops_silent_ones():
    with FlexiMQBrokerThread(ping_interval=0.2, pong_timeout=0.4) as b:
        live = client(b)                                        # auto_pong answers
        mute = client(b, auto_pong=False)
        assert silent(live, 1.5)                                # reading: PINGs answered
        assert live.pongs_sent >= 2
        f = mute.recv(timeout=2)
        assert f.type == PING and f.client_id == 1
        assert f.header["keepalive"]["interval"] == 1 and f.header["keepalive"]["timestamp"] > 0
        assert closed(mute, timeout=3)
        assert live.ping() >= 0                                 # still connected


# ---- §7.3.1 validation ---------------------------------------------------------------------

@pytest.mark.parametrize("mtype,header,status", [
    (REQ, {"routing": [{"client_id": 1}, {"client_id": 2}],
           "reqrep": {"type": "request", "id": "v1"}}, 602),   # exactly one entry
    (REQ, {"routing": [{"path": "/x"}], "reqrep": {"type": "request", "id": "v2"}}, 602),
    (REQ, {"routing": "1001", "reqrep": {"type": "request", "id": "v3"}}, 602),
    (REQ, {"routing": [{"client_id": 1001}], "reqrep": {"type": "correlation",
                                                        "id": "v4"}}, 400),
    (REQ, {"routing": [{"client_id": 1001}]}, 400),            # no reqrep
    (REP, {"routing": [{"client_id": 1000}], "reqrep": {"type": "correlation",
                                                        "id": "v5"}, "topic": "t"}, 400),
    (NOTIF, {"routing": []}, 602),
    (NOTIF, {}, 602),
    (BCAST, {"routing": [{"client_id": 1000}]}, 602),
    (PUB, {}, 400),
    (SUB, {"topic": "t", "status": 200}, 400),
    (SUB, {"topic": 5}, 400),
    (PONG, {"keepalive": {"timestamp": "now"}}, 400),
])
def test_rule_violations_answered_and_connection_usable(broker, mtype, header, status):
    c = client(broker)
    c.send(encode(mtype, c.client_id, header))
    rep = c.recv()
    assert rep.type == REP and rep.status == status and rep.client_id == 1
    assert rep.header["routing"] == [{"client_id": c.client_id}]
    rid = (header.get("reqrep") or {}).get("id")
    assert rep.rid == rid
    assert c.ping() >= 0


def test_ping_breaking_a_rule_still_gets_pong(broker):
    c = client(broker)
    c.send(encode(PING, c.client_id, {"keepalive": {"timestamp": 5}, "topic": "x"}))
    assert c.recv().status == 400
    f = c.recv()
    assert f.type == PONG and f.header["keepalive"]["timestamp"] == 5


def test_bad_headers_version_and_types(broker):
    c = client(broker)
    for frame, status in [(encode(SUB, c.client_id, raw_header=b"\xc1"), 400),
                          (encode(SUB, c.client_id, raw_header=msgpack.packb([1])), 400),
                          (encode(SUB, c.client_id, {"topic": "t"}, version=2), 400),
                          (encode(42, c.client_id, {}), 501)]:
        c.send(frame)
        assert c.recv().status == status
    c.send(encode(SUB, c.client_id, {"topic": "t"}, reserved=b"\xff" * 16))   # ignored
    assert silent(c)


def test_limits_close_only_the_offender(broker):
    """§7.1: header over 64 KiB, frame over the limit: refused on the prefix."""
    good = client(broker)
    for prefix in (struct.pack(">BBI16sIQ", 1, SUB, 1000, b"\0" * 16, 65537, 0),
                   struct.pack(">BBI16sIQ", 1, SUB, 1000, b"\0" * 16, 0, 1 << 40)):
        bad = client(broker)
        bad.send(prefix)
        assert closed(bad)
    assert good.ping() >= 0


def test_garbage_never_crashes_the_broker(broker):
    for junk in (b"GET / HTTP/1.1\r\n\r\n" + b"x" * 40, os.urandom(4096), b"\x01" * 33):
        s = socket.create_connection(("127.0.0.1", broker.port))
        s.sendall(junk)
        s.close()
    assert client(broker).ping() >= 0


# ---- §6.3.1 Unix sockets ------------------------------------------------------------------

def test_unix_listener_rules(tmp_path):
    path = tmp_path / "run" / "broker.sock"                     # run/ is created
    with FlexiMQBrokerThread(listen=["unix:%s" % path, "127.0.0.1:0"], ping_interval=0) as b:
        assert path.is_socket()
        u = FlexiMQClient("unix:%s" % path)
        t = FlexiMQClient(b.addresses[1])
        uid, tid = u.join(), t.join()
        rid = t.send_request(uid, "/over-ipc")
        u.reply(u.next_request(), "pong")
        assert t.wait_reply(rid).body() == "pong"
    assert not path.exists()                                    # removed on shutdown
    deep = tmp_path / "a" / "b" / "broker.sock"
    out = subprocess.run([sys.executable, "-m", "loadgen.fleximq.server", "--listen",
                          "unix:%s" % deep], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "does not exist" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_cli_help_and_bad_arguments():
    run = [sys.executable, "-m", "proxy", "serve", "fleximq"]
    out = subprocess.run(run + ["--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "unix:/path" in out.stdout
    for bad in (["--listen", "nowhere"], ["--ping-interval", "-1"], ["--listen", "unix:"]):
        out = subprocess.run(run + bad, capture_output=True, text=True, timeout=30)
        assert out.returncode == 2 and "Traceback" not in out.stderr, bad


def test_a_responder_answers_every_req_that_arrived_together(broker):
    """Two REQs that reach a responder in one read: it answers the first, drops what it
    does not wait for (discard) and keeps the second REQ to answer next — the demo's
    FlexiMQResponder cleared its whole inbox and left a requester waiting 10 s."""
    requester, responder = client(broker), client(broker)
    rids = [requester.send_request(responder.client_id, "/a", b"x") for _ in range(2)]
    responder.ping()                       # a PONG in the inbox too: dropped, REQs kept
    first = responder.next_request(timeout=5)
    responder.reply(first, {"ok": True})
    responder.discard(keep=lambda f: f.type == REQ)
    second = responder.next_request(timeout=5)
    responder.reply(second, {"ok": True})
    assert sorted([first.rid, second.rid]) == sorted(rids)
    for rid in rids:
        assert requester.wait_reply(rid, timeout=5).rid == rid
    requester.close()
    responder.close()
