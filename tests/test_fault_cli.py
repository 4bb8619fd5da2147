"""``frametap faults list|add|remove`` against a running proxy's fault API, and
``frametap load --frametap-fault`` arming a rule for a Locust run and removing it after."""

import json
import subprocess
import time
import urllib.request

import pytest

from tests._support.locust import FRAMETAP_LOAD, locust_cmd, locust_env
from tests._support.processes import FRAMETAP, ROOT, proxy_process


CONFIG = """
[toxiproxy]
listen = "127.0.0.1:0"

[[routes]]
name = "fly"
protocol = "flymq"
listen = "127.0.0.1:0"
upstream = "{upstream}"

[[routes]]
name = "mq"
protocol = "rocketmq"
listen = "127.0.0.1:0"
upstream = "127.0.0.1:9"
"""


def frametap(*args, timeout=60):
    return subprocess.run(FRAMETAP + list(args), capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def one_line(r, status=2):
    assert r.returncode == status, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


@pytest.fixture(scope="module")
def fly():
    from loadgen.flymq.server import FlyMQServerThread
    with FlyMQServerThread() as srv:
        yield srv


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, fly):
    tmp = tmp_path_factory.mktemp("faultcli")
    with proxy_process(tmp, config=CONFIG.format(upstream=f"127.0.0.1:{fly.port}"),
                       log_level="warning") as p:
        yield p


def rules(proxy, route):
    with urllib.request.urlopen(f"http://{proxy.ready['api']}/api/v1/routes/{route}/faults",
                                timeout=10) as resp:
        return json.loads(resp.read())


@pytest.mark.parametrize("args", [["faults"], ["faults", "list"], ["faults", "add"],
                                  ["faults", "remove"]])
def test_help(args):
    r = frametap(*args, "--help")
    assert r.returncode == 0 and "usage: frametap faults" in r.stdout, r.stderr


def test_load_help_lists_the_fault_options():
    r = frametap("load", "--help")
    assert r.returncode == 0, r.stderr
    assert "--frametap-fault ROUTE:SPEC" in r.stdout and "--frametap-fault-api" in r.stdout


@pytest.mark.slow
def test_add_list_remove(proxy):
    api = proxy.ready["api"]
    r = frametap("faults", "add", "--api", api, "--route", "mq",
                 "error status=SYSTEM_BUSY opcode=SEND_MESSAGE_V2 probability=0.05 name=busy")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == ("added rule 'busy' to route 'mq': error status=SYSTEM_BUSY "
                                "message=injected by frametap fault busy direction=c2s "
                                "opcode=SEND_MESSAGE_V2 probability=0.05")
    r = frametap("faults", "add", "--api", api, "--route", "mq", "latency", "latency=100")
    assert r.returncode == 0, r.stderr
    assert "added toxic 'latency_downstream'" in r.stdout
    r = frametap("faults", "add", "--api", api, "--route", "fly",
                 '{"name": "slow", "match": {"opcode": "PRODUCE"}, '
                 '"action": {"type": "delay", "ms": 10}}')
    assert r.returncode == 0, r.stderr
    assert [x["name"] for x in rules(proxy, "mq")] == ["busy"]
    assert rules(proxy, "fly")[0]["action"] == {"type": "delay", "ms": 10, "jitter_ms": 0}
    r = frametap("faults", "list", "--api", api)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].split() == ["ROUTE", "KIND", "NAME", "WHAT"]
    assert [line.split()[:3] for line in lines[1:]] == [
        ["fly", "rule", "slow"], ["mq", "rule", "busy"], ["mq", "toxic", "latency_downstream"]]
    r = frametap("faults", "list", "--api", api, "--route", "fly", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)[0]["faults"][0]["name"] == "slow"
    r = frametap("faults", "remove", "--api", api, "--route", "mq", "busy",
                 "latency_downstream")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["removed rule 'busy' from route 'mq'",
                                     "removed toxic 'latency_downstream' from route 'mq'"]
    assert frametap("faults", "remove", "--api", api, "--route", "fly", "--rule",
                    "slow").returncode == 0
    r = frametap("faults", "list", "--api", api)
    assert r.stdout.strip() == "no rules or toxics on 2 route(s): fly, mq"


@pytest.mark.slow
def test_errors_are_one_line(proxy):
    api = proxy.ready["api"]
    cases = [
        (["add", "--api", api, "--route", "mq", "explode"],
         "frametap: error: fault 'explode': 'explode' is neither an action (delay, drop, "
         "close, error) nor a toxic type (latency, bandwidth, slow_close, timeout, "
         "reset_peer, slicer, limit_data)"),
        (["add", "--api", api, "drop"],
         "frametap: error: --route is required: the proxy has 2 routes (fly, mq)"),
        (["add", "--api", api, "--route", "nope", "drop"],
         "frametap: error: --route 'nope': no such route (the proxy has: fly, mq)"),
        (["add", "--api", api, "--route", "mq", "drop opcode=PUSH"],
         "frametap: error: route 'mq': match.opcode = 'PUSH': not a rocketmq opcode name"),
        (["add", "--api", api, "--route", "mq", "delay ms=-1"],
         "frametap: error: route 'mq': action.ms = -1: expected a number of milliseconds "
         "0..600000"),
        (["remove", "--api", api, "--route", "mq", "ghost"],
         "frametap: error: 'ghost': route 'mq' has no rule or toxic of that name"),
        (["list", "--api", "127.0.0.1:x"],
         "frametap: error: --api: port 'x' is not a number (got '127.0.0.1:x')"),
    ]
    for args, expected in cases:
        line = one_line(frametap("faults", *args))
        assert line.startswith(expected), (args, line)


def test_unreachable_api_is_one_line_exit_1():
    import socket
    with socket.socket() as s:                  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        line = one_line(frametap("faults", "list", "--api", f"127.0.0.1:{port}"), status=1)
    assert line == (f"frametap: error: cannot reach the fault API at 127.0.0.1:{port}: "
                    "Connection refused (is the proxy running with --api or [toxiproxy] "
                    "listen?)")


@pytest.mark.slow
def test_locust_run_arms_and_removes_faults(proxy, tmp_path):
    """frametap load --frametap-fault: the rule exists while the run runs and is gone
    after; a toxic too."""
    api = proxy.ready["api"]
    cmd = locust_cmd("flymq://" + proxy.address("fly"), ["FlyMQProducer"], users=1,
                     duration="4s", entry=FRAMETAP_LOAD, json_out=False,
                     args=["--frametap-fault-api", api,
                           "--frametap-fault", "fly:delay ms=1 opcode=PRODUCE name=locust",
                           "--frametap-fault", "fly:latency latency=1 name=lat"])
    proc = subprocess.Popen(cmd, cwd=ROOT, env=locust_env("flymq"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen = set()
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://{api}/api/v1/routes/fly", timeout=10) as r:
                state = json.loads(r.read())
            seen |= {f["name"] for f in state["faults"]} | {t["name"] for t in state["toxics"]}
            time.sleep(0.2)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    assert seen == {"locust", "lat"}, err[-3000:]          # armed during the run
    with urllib.request.urlopen(f"http://{api}/api/v1/routes/fly", timeout=10) as r:
        state = json.loads(r.read())
    assert state["faults"] == [] and state["toxics"] == []  # and removed at its end


@pytest.mark.parametrize("fault, expected", [
    ("fly:explode", "frametap load: --frametap-fault: fault 'explode': 'explode' is neither"),
    ("nocolon", "frametap load: --frametap-fault: fault 'nocolon': expected ROUTE:SPEC"),
    ("ghost:drop", "frametap load: --frametap-fault 'ghost:drop': the proxy has no route "
                   "'ghost' (its routes: fly, mq)"),
])
def test_locust_bad_fault_is_one_line_exit_2(proxy, fault, expected):
    cmd = locust_cmd("flymq://" + proxy.address("fly"), ["FlyMQProducer"], users=1,
                     duration="2s", entry=FRAMETAP_LOAD, json_out=False,
                     args=["--frametap-fault-api", proxy.ready["api"],
                           "--frametap-fault", fault])
    r = subprocess.run(cmd, cwd=ROOT, env=locust_env("flymq"), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2, r.stderr[-3000:]
    assert expected in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert rules(proxy, "fly") == []


def test_api_address_in_use_exits_2_with_one_line():
    import socket
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        line = one_line(frametap("proxy", "--protocol", "flymq", "--listen", "127.0.0.1:0",
                                 "--upstream", "127.0.0.1:9", "--api", f"127.0.0.1:{port}",
                                 "--log-level", "warning"))     # no start-up info lines
    assert line == f"frametap: error: --api '127.0.0.1:{port}': address already in use"


def test_single_route_proxy_serves_the_api(tmp_path):
    with proxy_process(tmp_path, ["--protocol", "flymq", "--listen", "127.0.0.1:0",
                                  "--upstream", "127.0.0.1:9", "--api", "127.0.0.1:0"]) as p:
        with urllib.request.urlopen(f"http://{p.ready['api']}/proxies", timeout=10) as r:
            proxies = json.loads(r.read())
    assert proxies["flymq"]["listen"] == p.address("flymq")
    assert proxies["flymq"]["frametap_protocol"] == "flymq"
