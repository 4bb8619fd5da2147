"""Real headless Locust runs of the packaged locustfile against the reference RocketMQ servers."""

import socket
import subprocess
import uuid

import pytest

from loadgen.rocketmq.client import RocketMQClient, parse_host
from loadgen.rocketmq.server import RocketMQServerThread
from tests._support.locust import LOCUST, locust_env, run_locust
from tests._support.processes import ROOT

# Locust is only ever imported in subprocesses: importing it here would gevent-patch the
# pytest process (and every test after this one).

pytestmark = pytest.mark.slow


@pytest.fixture
def rocketmq_servers():
    with RocketMQServerThread(queues=4) as srv:
        yield srv


def _run_locust(host, extra_env=None, users=4, duration="4s"):
    return run_locust("rocketmq", host, ["RocketMQProducer", "RocketMQConsumer"],
                      users=users, duration=duration, env=extra_env)


def _stats(run):
    """{name: entry} from Locust's --json summary (final, unlike the lagging CSV)."""
    stats = run.stats
    assert {e["method"] for e in stats.values()} <= {"rocketmq"}
    return stats


@pytest.mark.parametrize("serialize", ["json", "rocketmq"])
def test_headless_run_sends_and_pulls_without_failures(rocketmq_servers, serialize):
    srv = rocketmq_servers
    topic = f"locust-{uuid.uuid4().hex[:8]}"
    group = f"locust-cg-{uuid.uuid4().hex[:6]}"
    proc = _run_locust(f"rocketmq://{srv.namesrv_address}", {
        "FRAMETAP_ROCKETMQ_TOPIC": topic,
        "FRAMETAP_ROCKETMQ_CONSUMER_GROUP": group,
        "FRAMETAP_ROCKETMQ_MESSAGE_SIZE": "200",
        "FRAMETAP_ROCKETMQ_START": "first",
        "FRAMETAP_ROCKETMQ_COMMIT_EVERY": "1",
        "FRAMETAP_ROCKETMQ_SERIALIZE": serialize,
    })
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = _stats(proc)
    failures = {name: e["num_failures"] for name, e in stats.items() if e["num_failures"]}
    assert failures == {}, proc.stderr[-3000:]
    send = stats["SEND_MESSAGE_V2"]
    assert send["num_requests"] > 0
    assert send["total_content_length"] == send["num_requests"] * 200
    pull = stats["PULL_MESSAGE"]
    assert pull["num_requests"] > 0
    assert pull["total_content_length"] > 0  # the consumers got message bodies
    for name in ("GET_ROUTEINFO_BY_TOPIC", "HEART_BEAT", "QUERY_CONSUMER_OFFSET",
                 "UPDATE_CONSUMER_OFFSET", "UNREGISTER_CLIENT"):
        assert stats[name]["num_requests"] > 0, name

    # What the producers sent is on the broker, with their keys/tags; the group's
    # committed offsets say the consumers read it.
    with RocketMQClient(*parse_host(srv.namesrv_address)) as ns:
        route = ns.get_route(topic)
    queues = route.read_queues()
    assert len(queues) == 4
    total = 0
    committed = 0
    with RocketMQClient(*parse_host(queues[0][1])) as broker:
        for _name, _addr, qid in queues:
            total += broker.get_max_offset(topic, qid)
            committed += broker.query_offset(group, topic, qid) or 0
            status, _next, messages = broker.pull(topic, "checker", qid, 0, max_nums=4)
            for m in messages:
                assert len(m.body) == 200 and m.body.startswith(b'{"seq":')
                assert m.properties["KEYS"].startswith("order-")
                assert m.properties["TAGS"] in ("TagA", "TagB", "TagC")
    assert total >= send["num_requests"]
    assert committed > 0


def test_batch_and_v1_sends(rocketmq_servers):
    srv = rocketmq_servers
    proc = _run_locust(srv.namesrv_address, {
        "FRAMETAP_ROCKETMQ_TOPIC": f"locust-{uuid.uuid4().hex[:8]}",
        "FRAMETAP_ROCKETMQ_BATCH": "3", "FRAMETAP_ROCKETMQ_MESSAGE_SIZE": "50",
    }, users=2, duration="2s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = _stats(proc)
    batch = stats["SEND_BATCH_MESSAGE"]
    assert batch["num_requests"] > 0 and batch["num_failures"] == 0
    assert batch["total_content_length"] == batch["num_requests"] * 150
    proc = _run_locust(srv.namesrv_address, {
        "FRAMETAP_ROCKETMQ_TOPIC": f"locust-{uuid.uuid4().hex[:8]}",
        "FRAMETAP_ROCKETMQ_SEND_V2": "0"}, users=2, duration="2s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = _stats(proc)
    assert stats["SEND_MESSAGE"]["num_requests"] > 0
    assert "SEND_MESSAGE_V2" not in stats


def test_unreachable_name_server_is_reported_under_route_lookup():
    with socket.socket() as s:  # a port nobody listens on: bound (held) but not listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        proc = _run_locust(f"127.0.0.1:{port}", users=2, duration="2s")
    assert proc.returncode != 0  # Locust exits 1 when there were failures
    stats = _stats(proc)
    assert stats["GET_ROUTEINFO_BY_TOPIC"]["num_failures"] > 0
    assert sum(e["num_requests"] - e["num_failures"] for e in stats.values()) == 0


def test_unknown_topic_without_auto_create_is_reported():
    with RocketMQServerThread(queues=2, auto_create_topics=False) as srv:
        # 4 s: on a loaded machine the users of a 2 s run may not get to their first
        # request (then there is no failure to report and Locust exits 0)
        proc = _run_locust(srv.namesrv_address, {"FRAMETAP_ROCKETMQ_TOPIC": "missing"},
                           users=2, duration="4s")
    assert proc.returncode != 0, (proc.stdout[-1000:], proc.stderr[-2000:])
    stats = _stats(proc)
    route = stats["GET_ROUTEINFO_BY_TOPIC"]
    assert route["num_failures"] > 0
    assert "SEND_MESSAGE_V2" not in stats and "PULL_MESSAGE" not in stats


def test_locustfile_offers_the_rocketmq_users():
    proc = subprocess.run(LOCUST + ["--list"], cwd=ROOT, env=locust_env("rocketmq"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "RocketMQProducer" in proc.stdout and "RocketMQConsumer" in proc.stdout
    assert "RocketMQUser" not in proc.stdout


@pytest.mark.parametrize("serialize", ["json", "rocketmq"])
def test_client_round_trip_against_reference_servers(serialize):
    """The load client on its own: route, V2/V1/batch sends, pull, offsets, heartbeat and
    the consumer list (GET_CONSUMER_LIST_BY_GROUP), in both header serializations."""
    from loadgen.rocketmq.client import RocketMQServerError
    from proxy.protocols.rocketmq.constants import NOTIFY_CONSUMER_IDS_CHANGED, TOPIC_NOT_EXIST
    with RocketMQServerThread(queues=2) as srv:
        with RocketMQClient(*parse_host(srv.namesrv_address), serialize=serialize) as ns:
            route = ns.get_route("rt")
        assert [q[2] for q in route.write_queues()] == [0, 1]
        addr = route.write_queues()[0][1]
        assert addr == srv.broker_address
        a = RocketMQClient(*parse_host(addr), serialize=serialize)
        b = RocketMQClient(*parse_host(addr), serialize=serialize)
        with a, b:
            r1 = a.send("rt", b"one", 1, keys="k1", tags="TagA")
            r2 = a.send("rt", b"two", 1, keys="k2", tags="TagB", v2=False)
            r3 = a.send_batch("rt", [b"three", b"four"], 1, keys=["k3", "k4"], tags="TagC")
            assert (r1.status, r1.queue_id, r1.queue_offset) == ("SEND_OK", 1, 0)
            assert r2.queue_offset == 1 and r3.queue_offset == 2
            assert len(r3.msg_id.split(",")) == 2
            status, nxt, msgs = a.pull("rt", "g", 1, 0)
            assert status == "FOUND" and nxt == 4
            assert [m.body for m in msgs] == [b"one", b"two", b"three", b"four"]
            assert [m.properties["KEYS"] for m in msgs] == ["k1", "k2", "k3", "k4"]
            assert msgs[0].properties["UNIQ_KEY"] == r1.msg_id
            assert a.pull("rt", "g", 1, 4).status == "NO_NEW_MSG"
            assert a.get_max_offset("rt", 1) == 4
            assert a.query_offset("g", "rt", 1) is None  # queue has messages, no commit
            a.update_offset("g", "rt", 1, 3)
            assert a.query_offset("g", "rt", 1) == 3
            a.update_offset("g", "rt", 1, 4, oneway=True)
            assert a.query_offset("g", "rt", 1) == 4  # same connection: in order
            a.heartbeat("cid-a", consumer_groups={"g": ["rt"]})
            b.heartbeat("cid-b", consumer_groups={"g": ["rt"]})
            assert sorted(b.consumer_ids("g")) == ["cid-a", "cid-b"]
            a.get_max_offset("rt", 0)  # reads the NOTIFY the broker sent when b joined
            assert any(r.code == NOTIFY_CONSUMER_IDS_CHANGED for r in a.server_requests)
            with pytest.raises(RocketMQServerError) as err:
                a.pull("no-such-topic", "g", 0, 0)
            assert err.value.code == TOPIC_NOT_EXIST
            assert not a.closed  # a server error leaves the connection usable
            a.unregister("cid-a", consumer_group="g")
            assert b.consumer_ids("g") == ["cid-b"]
