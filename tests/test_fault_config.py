"""The fault model (proxy/faultspec.py) and its config keys: [[routes.faults]],
[[routes.toxics]], [toxiproxy] listen, [proxy] seed — every rule and toxic checked at
load, one line naming the key, the value and what was expected, exit status 2."""

import subprocess
import sys
import types

import pytest

from proxy import protocols
from proxy.config import config_from_dict
from proxy.errors import ConfigError
from proxy.faultspec import (TOXIC_TYPES, FaultConflict, FaultNotFound, FaultSet,
                             FaultSpecError, Rule, Toxic, opcode_names, parse_fault_arg,
                             parse_rule, parse_short_spec, parse_toxic)
from tests._support.processes import FRAMETAP, ROOT


# opcode names come from the parsers: this holds for the pure-Python twins too
pytestmark = pytest.mark.twins

BUSY = {"name": "busy", "match": {"opcode": ["SEND_MESSAGE_V2"]},
        "action": {"type": "error", "status": "SYSTEM_BUSY"},
        "trigger": {"probability": 0.05}}


def frametap(*args):
    return subprocess.run(FRAMETAP + list(args), capture_output=True, text=True, timeout=60)


# ---- rules -------------------------------------------------------------------------

def test_design_example_parses_into_the_engine_interface():
    rule = parse_rule(BUSY, "rocketmq")
    assert isinstance(rule, Rule)
    assert (rule.name, rule.directions, rule.opcodes) == ("busy", {0},
                                                          frozenset({"SEND_MESSAGE_V2"}))
    assert (rule.action, rule.status, rule.trigger, rule.probability) == \
        ("error", "SYSTEM_BUSY", "probability", 0.05)
    assert rule.resource is None and rule.peer is None
    assert rule.message == "injected by frametap fault busy"
    assert rule.to_json() == {
        "name": "busy", "match": {"direction": "c2s", "opcode": ["SEND_MESSAGE_V2"]},
        "action": {"type": "error", "status": "SYSTEM_BUSY",
                   "message": "injected by frametap fault busy"},
        "trigger": {"probability": 0.05}}
    assert parse_rule(rule.to_json(), "rocketmq").to_json() == rule.to_json()  # round trip


@pytest.mark.parametrize("data, fields", [
    ({"name": "d", "action": {"type": "delay", "ms": 50, "jitter_ms": 5}},
     {"action": "delay", "delay_ms": 50, "jitter_ms": 5, "trigger": "probability",
      "probability": 1.0, "directions": {0}}),
    ({"name": "d", "action": {"type": "delay", "ms": 12.5}}, {"delay_ms": 12.5,
                                                               "jitter_ms": 0}),
    ({"name": "x", "match": {"direction": "both"}, "action": {"type": "drop"},
      "trigger": {"once": True}}, {"directions": {0, 1}, "trigger": "once", "n": 1}),
    ({"name": "x", "match": {"direction": ["s2c"]}, "action": {"type": "close", "rst": True},
      "trigger": {"nth": 10}}, {"directions": {1}, "rst": True, "trigger": "nth", "n": 10}),
    ({"name": "x", "action": {"type": "close"}, "trigger": {"times": 3}},
     {"rst": False, "trigger": "times", "n": 3}),
    ({"name": "x", "match": {"resource": "orders-*", "peer": "10.1.2.3/8"},
      "action": {"type": "error", "status": 2, "message": "busy!"}},
     {"resource": "orders-*", "status": "2", "message": "busy!"}),
    ({"name": "x", "match": {"opcode": "SEND_MESSAGE"}, "action": {"type": "drop"}},
     {"opcodes": frozenset({"SEND_MESSAGE"}), "opcode_list": ("SEND_MESSAGE",)}),
])
def test_rule_shapes(data, fields):
    rule = parse_rule(data, "rocketmq")
    for key, value in fields.items():
        assert getattr(rule, key) == value, key
    assert parse_rule(rule.to_json(), "rocketmq").to_json() == rule.to_json()


def test_resource_glob_and_peer_network():
    rule = parse_rule({"name": "x", "match": {"resource": "orders-*", "peer": "10.1.2.3/8"},
                       "action": {"type": "drop"}}, "rocketmq")
    assert str(rule.peer) == "10.0.0.0/8"
    assert rule.matches_resource("orders-eu") and not rule.matches_resource("Orders-eu")
    assert not rule.matches_resource(None)
    assert rule.matches_peer("10.200.0.1") and not rule.matches_peer("11.0.0.1")
    assert rule.matches_peer("::ffff:10.0.0.9")         # a dual-stack listener's client
    assert not rule.matches_peer("unix:/tmp/x")
    any_peer = parse_rule({"name": "y", "action": {"type": "drop"}}, "rocketmq")
    assert any_peer.matches_peer("1.2.3.4") and any_peer.matches_resource(None)


@pytest.mark.parametrize("data, message", [
    ({"name": "b", "match": {"opcode": ["SEND_MESAGE_V2"]}, "action": {"type": "drop"}},
     "match.opcode = 'SEND_MESAGE_V2': not a rocketmq opcode name as the metrics name them "
     "(did you mean SEND_MESSAGE_V2"),
    ({"name": "b", "match": {"opcode": []}, "action": {"type": "drop"}},
     "match.opcode = []: expected an opcode name or a list of 1..1024 of them"),
    ({"name": "b", "match": {"resource": "x" * 201}, "action": {"type": "drop"}},
     "match.resource = 'xxx"),
    ({"name": "b", "match": {"direction": "up"}, "action": {"type": "drop"}},
     "match.direction = 'up': expected 'c2s', 's2c', 'both'"),
    ({"name": "b", "match": {"peer": "10.0.0.0/33"}, "action": {"type": "drop"}},
     "match.peer = '10.0.0.0/33': expected an address or a CIDR network"),
    ({"name": "b", "match": {"colour": 1}, "action": {"type": "drop"}},
     "match: unknown key 'colour' (expected one of: direction, opcode, resource, peer)"),
    ({"name": "b", "action": {"type": "delay", "ms": -5}},
     "action.ms = -5: expected a number of milliseconds 0..600000"),
    ({"name": "b", "action": {"type": "delay", "ms": float("nan")}}, "action.ms = nan"),
    ({"name": "b", "action": {"type": "delay"}}, "action.ms: missing"),
    ({"name": "b", "action": {"type": "delay", "ms": 10, "jitter_ms": 11}},
     "action.jitter_ms = 11: expected at most action.ms (10)"),
    ({"name": "b", "action": {"type": "drop", "ms": 5}},
     "action: unknown key 'ms' (expected one of: type)"),
    ({"name": "b", "action": {"type": "explode"}},
     "action.type = 'explode': expected one of: delay, drop, close, error"),
    ({"name": "b"}, "action: missing"),
    ({"name": "b", "action": {"type": "close", "rst": "yes"}}, "action.rst = 'yes'"),
    ({"name": "b", "action": {"type": "error", "status": True}}, "action.status = True"),
    ({"name": "b", "action": {"type": "drop"}, "trigger": {"probability": 1.5}},
     "trigger.probability = 1.5: expected a number 0..1"),
    ({"name": "b", "action": {"type": "drop"}, "trigger": {"nth": 0}},
     "trigger.nth = 0: expected an integer 1.."),
    ({"name": "b", "action": {"type": "drop"}, "trigger": {"times": 2.5}},
     "trigger.times = 2.5: expected an integer"),
    ({"name": "b", "action": {"type": "drop"}, "trigger": {"once": False}},
     "trigger.once = False: expected true"),
    ({"name": "b", "action": {"type": "drop"}, "trigger": {"once": True, "nth": 2}},
     "trigger = {'once': True, 'nth': 2}: expected exactly one of"),
    ({"name": "a/b", "action": {"type": "drop"}}, "name = 'a/b': expected a non-empty name"),
    ({"name": "", "action": {"type": "drop"}}, "name = '': expected a non-empty name"),
    ({"action": {"type": "drop"}}, "rule: missing required key 'name'"),
    ({"name": "b", "action": {"type": "drop"}, "when": 1},
     "rule: unknown key 'when' (expected one of: name, match, action, trigger)"),
    ("busy", "rule = 'busy': expected a table"),
])
def test_bad_rules_one_line(data, message):
    with pytest.raises(FaultSpecError) as info:
        parse_rule(data, "rocketmq")
    text = str(info.value)
    assert message in text and "\n" not in text, text
    assert isinstance(info.value, ValueError) and isinstance(info.value, ConfigError)


def test_an_undecoded_route_takes_no_rules():
    with pytest.raises(FaultSpecError, match="not decoded .* use toxics"):
        parse_rule({"name": "x", "action": {"type": "drop"}}, "tcp")


def test_opcode_names_are_the_metrics_names():
    """Each protocol's names come from what its parser tells the route's counters: the
    names frametap_frames_total carries. Thrift method names are free."""
    from proxy.framing import RouteStats
    expected = {"rocketmq": ("SEND_MESSAGE_V2", 310), "rabbitmq-stream": ("Publish", 2),
                "flymq": ("PRODUCE", 1), "fleximq": ("REQ", 1)}
    for protocol in protocols.names():
        names = opcode_names(protocol)
        if protocol == "ttheader":
            assert names is None
            continue
        name, code = expected[protocol]
        assert name in names and len(names) >= 10, names
        assert not any(n.startswith("unknown") for n in names)
        stats = RouteStats("r", protocol)           # a real parser names the slot so
        protocols.load(protocol).load_parser()(stats, None, 30.0, {})
        slot_of = getattr(stats, "opcode_slot", None) or stats.slot_for    # compiled, twin
        assert stats.slot_name(slot_of(code)) == name
    assert parse_rule({"name": "t", "match": {"opcode": ["AnyMethod"]},
                       "action": {"type": "drop"}}, "ttheader").opcodes == {"AnyMethod"}


# ---- statuses: proxy.protocols.<p>.faults.error_status --------------------------------
# A stand-in for the per-protocol modules another change adds (error_status(value) ->
# (code, label), ValueError with one line when unknown; DEFAULT_ERROR). Delete this and
# test the real ones when they land.

def _standin(names):
    def error_status(value):
        if value in names:
            return names[value], value
        if value.isdigit() and int(value) in names.values():
            return int(value), value
        raise ValueError(f"unknown status {value!r} (expected one of: {', '.join(names)})")
    return types.SimpleNamespace(error_status=error_status, DEFAULT_ERROR="SYSTEM_ERROR")


def test_status_checked_by_the_protocols_faults_module(monkeypatch):
    monkeypatch.setitem(sys.modules, "proxy.protocols.rocketmq.faults",
                        _standin({"SYSTEM_ERROR": 1, "SYSTEM_BUSY": 2}))
    assert parse_rule(BUSY, "rocketmq").status == "SYSTEM_BUSY"
    assert parse_rule(dict(BUSY, action={"type": "error", "status": 2}), "rocketmq").status \
        == "2"
    with pytest.raises(FaultSpecError) as info:
        parse_rule(dict(BUSY, action={"type": "error", "status": "BUSY"}), "rocketmq")
    assert str(info.value) == ("action.status = 'BUSY': unknown status 'BUSY' (expected one "
                               "of: SYSTEM_ERROR, SYSTEM_BUSY)")
    default = parse_rule(dict(BUSY, action={"type": "error"}), "rocketmq")
    assert default.status is None                  # the engine answers DEFAULT_ERROR


def test_without_a_faults_module_any_status_is_taken(monkeypatch):
    # None in sys.modules: importing the module fails as if the protocol had none
    monkeypatch.setitem(sys.modules, "proxy.protocols.flymq.faults", None)
    rule = parse_rule({"name": "e", "action": {"type": "error", "status": "WHATEVER"}},
                      "flymq")
    assert rule.status == "WHATEVER"


# ---- toxics ------------------------------------------------------------------------

def test_toxic_defaults_are_toxiproxys():
    t = parse_toxic({"type": "latency"})
    assert isinstance(t, Toxic)
    assert t.to_json() == {"attributes": {"latency": 0, "jitter": 0},
                           "name": "latency_downstream", "type": "latency",
                           "stream": "downstream", "toxicity": 1.0}
    assert t.direction == 1
    up = parse_toxic({"type": "bandwidth", "stream": "UPSTREAM", "toxicity": 0.5,
                      "attributes": {"rate": 100}})
    assert (up.name, up.stream, up.direction, up.toxicity, up.attributes) == \
        ("bandwidth_upstream", "upstream", 0, 0.5, {"rate": 100})
    for kind, table in TOXIC_TYPES.items():
        attrs = {"average_size": 10} if kind == "slicer" else {}
        toxic = parse_toxic({"type": kind, "attributes": attrs})
        assert set(toxic.attributes) == set(table)
        assert parse_toxic(toxic.to_json()).to_json() == toxic.to_json()


@pytest.mark.parametrize("data, message", [
    ({"type": "latncy"}, "type = 'latncy': invalid toxic type (expected one of: latency, "),
    ({}, "type = None: invalid toxic type"),
    ({"type": "latency", "stream": "up"}, "stream = 'up': stream was invalid, can be either "
                                          "upstream or downstream"),
    ({"type": "latency", "toxicity": 2}, "toxicity = 2: expected a probability 0..1"),
    ({"type": "latency", "attributes": {"latency": -1}},
     "attributes.latency = -1: expected an integer 0..3600000"),
    ({"type": "latency", "attributes": {"latency": 1.5}}, "attributes.latency = 1.5"),
    ({"type": "latency", "attributes": {"latency": "100"}}, "attributes.latency = '100'"),
    ({"type": "latency", "attributes": {"latecy": 100}},
     "attributes: unknown key 'latecy' for a latency toxic (expected one of: latency, "
     "jitter)"),
    ({"type": "latency", "attributes": [1]}, "attributes = [1]: expected a JSON object"),
    ({"type": "slicer"}, "attributes.average_size = 0: expected an integer 1.."),
    ({"type": "slicer", "attributes": {"average_size": 10, "size_variation": 10}},
     "attributes.size_variation = 10: expected less than attributes.average_size (10)"),
    ({"type": "latency", "enabled": True}, "toxic: unknown key 'enabled'"),
    ({"type": "latency", "name": "a/b"}, "name = 'a/b'"),
])
def test_bad_toxics_one_line(data, message):
    with pytest.raises(FaultSpecError) as info:
        parse_toxic(data)
    assert message in str(info.value), str(info.value)


# ---- the set of a route ----------------------------------------------------------------

def test_faultset_changes_versions_and_subscribers():
    fs = FaultSet("rocketmq")
    seen = []
    fs.subscribe(lambda: seen.append((fs.version, len(fs.rules()), len(fs.toxics()))))
    assert (fs.version, fs.rules(), fs.toxics(), bool(fs)) == (0, [], [], False)
    fs.add_rule(BUSY)
    fs.add_rule({"action": {"type": "drop"}})                  # named for it: drop_2
    fs.add_toxic({"type": "latency", "attributes": {"latency": 5}})
    fs.add_toxic({"type": "latency", "stream": "upstream"})
    assert [r.name for r in fs.rules()] == ["busy", "drop_2"]
    # Toxiproxy's listing: the upstream chain, then the downstream one
    assert [t.name for t in fs.toxics()] == ["latency_upstream", "latency_downstream"]
    assert seen == [(1, 1, 0), (2, 2, 0), (3, 2, 1), (4, 2, 2)] and fs.version == 4
    with pytest.raises(FaultConflict, match="rule already exists: 'busy'"):
        fs.add_rule(BUSY)
    with pytest.raises(FaultConflict, match="toxic already exists: 'latency_downstream'"):
        fs.add_toxic({"type": "latency"})
    with pytest.raises(FaultSpecError):
        fs.add_rule(dict(BUSY, name="other", trigger={"nth": -1}))
    assert fs.version == 4                                     # failures change nothing
    # update: the sections given replace the old ones; the rule keeps its place
    rule = fs.update_rule("busy", {"trigger": {"nth": 10}})
    assert (rule.trigger, rule.n, rule.action, rule.opcodes) == \
        ("nth", 10, "error", {"SEND_MESSAGE_V2"})
    assert [r.name for r in fs.rules()] == ["busy", "drop_2"]
    with pytest.raises(FaultSpecError, match="cannot be renamed"):
        fs.update_rule("busy", {"name": "x"})
    # Toxiproxy's update: attributes merged, toxicity kept unless given
    t = fs.update_toxic("latency_downstream", {"attributes": {"jitter": 2}})
    assert (t.attributes, t.toxicity) == ({"latency": 5, "jitter": 2}, 1.0)
    t = fs.update_toxic("latency_downstream", {"toxicity": 0.25, "type": "latency",
                                               "name": "latency_downstream"})
    assert (t.attributes, t.toxicity) == ({"latency": 5, "jitter": 2}, 0.25)
    with pytest.raises(FaultSpecError, match="a toxic's type cannot change"):
        fs.update_toxic("latency_downstream", {"type": "bandwidth"})
    with pytest.raises(FaultNotFound, match="toxic not found: 'nope'"):
        fs.update_toxic("nope", {})
    with pytest.raises(FaultNotFound, match="rule not found: 'nope'"):
        fs.remove_rule("nope")
    v = fs.version
    fs.remove_rule("drop_2")
    fs.remove_toxic("latency_upstream")
    assert fs.version == v + 2
    fs.reset(rules=False)                                      # Toxiproxy's POST /reset
    assert ([r.name for r in fs.rules()], fs.toxics()) == (["busy"], [])
    fs.reset()
    assert not fs and fs.version == v + 4
    fs.reset()                                                 # nothing to change
    assert fs.version == v + 4


# ---- the config file -------------------------------------------------------------------

GOOD = """
[proxy]
seed = 42

[toxiproxy]
listen = "127.0.0.1:0"

[[routes]]
name = "mq"
protocol = "rocketmq"
listen = "127.0.0.1:0"
upstream = "127.0.0.1:10911"

[[routes.faults]]
name = "busy"
match = {opcode = ["SEND_MESSAGE_V2"]}
action = {type = "error", status = "SYSTEM_BUSY"}
trigger = {probability = 0.05}

[[routes.faults]]
name = "slow-pull"
match = {opcode = ["PULL_MESSAGE"], direction = "c2s"}
action = {type = "delay", ms = 20, jitter_ms = 5}

[[routes.toxics]]
type = "latency"
attributes = {latency = 100, jitter = 10}

[[routes.toxics]]
name = "cut"
type = "limit_data"
stream = "upstream"
toxicity = 0.5
attributes = {bytes = 1000}
"""


def test_config_file_faults_toxics_seed_api(tmp_path):
    import tomllib
    cfg = config_from_dict(tomllib.loads(GOOD))
    assert (cfg.seed, cfg.toxiproxy_listen) == (42, ("127.0.0.1", 0))
    faults = cfg.routes[0].faults
    assert isinstance(faults, FaultSet) and faults.protocol == "rocketmq"
    assert faults.version == 0
    assert [r.name for r in faults.rules()] == ["busy", "slow-pull"]
    assert faults.rules()[1].delay_ms == 20
    assert [(t.name, t.stream, t.toxicity) for t in faults.toxics()] == \
        [("cut", "upstream", 0.5), ("latency_downstream", "downstream", 1.0)]
    # a route without any has an empty set of its own protocol, defaults off
    plain = config_from_dict({"routes": [{"protocol": "flymq", "listen": "127.0.0.1:0",
                                          "upstream": "127.0.0.1:9"}]})
    assert (plain.seed, plain.toxiproxy_listen) == (None, None)
    assert not plain.routes[0].faults and plain.routes[0].faults.protocol == "flymq"
    assert plain.routes[0].faults is not faults


ROUTE = """
[[routes]]
name = "mq"
protocol = "rocketmq"
listen = "127.0.0.1:0"
upstream = "127.0.0.1:10911"
"""


@pytest.mark.parametrize("text, needle", [
    (ROUTE + "[[routes.faults]]\nname = \"b\"\nmatch = {opcode = [\"SEND_MSG\"]}\n"
             "action = {type = \"drop\"}\n",
     "routes[0].faults[0].match.opcode = 'SEND_MSG': not a rocketmq opcode name"),
    (ROUTE + "[[routes.faults]]\nname = \"b\"\naction = {type = \"delay\", ms = -1}\n",
     "routes[0].faults[0].action.ms = -1: expected a number of milliseconds 0..600000"),
    (ROUTE + "[[routes.faults]]\nname = \"b\"\naction = {type = \"drop\"}\n"
             "[[routes.faults]]\nname = \"b\"\naction = {type = \"drop\"}\n",
     "routes[0].faults[1].name: rule already exists: 'b'"),
    (ROUTE + "[[routes.faults]]\naction = {type = \"drop\"}\ntrigger = {nth = 0}\n",
     "routes[0].faults[0].trigger.nth = 0: expected an integer 1.."),
    (ROUTE + "faults = 5\n", "routes[0].faults = 5: expected an array of tables"),
    (ROUTE + "[[routes.toxics]]\ntype = \"latency\"\nattributes = {latency = -5}\n",
     "routes[0].toxics[0].attributes.latency = -5: expected an integer 0..3600000"),
    (ROUTE + "[[routes.toxics]]\ntype = \"jam\"\n",
     "routes[0].toxics[0].type = 'jam': invalid toxic type"),
    (ROUTE + "[[routes.toxics]]\ntype = \"latency\"\nstream = \"sideways\"\n",
     "routes[0].toxics[0].stream = 'sideways': stream was invalid"),
    ("[toxiproxy]\nlisten = \"nowhere\"\n" + ROUTE, "toxiproxy.listen = 'nowhere'"),
    ("[toxiproxy]\nport = 8474\n" + ROUTE, "toxiproxy: unknown key 'port'"),
    ("toxiproxy = 1\n" + ROUTE, "toxiproxy = 1: expected a table"),
    ("[proxy]\nseed = -1\n" + ROUTE, "proxy.seed = -1: expected an integer 0..18446744073709551615"),
    ("[proxy]\nseed = \"x\"\n" + ROUTE, "proxy.seed = 'x'"),
])
def test_bad_fault_config_exits_2_with_one_line(tmp_path, text, needle):
    path = tmp_path / "frametap.toml"
    path.write_text(text)
    r = frametap("proxy", "-c", str(path))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_api_flag_errors_name_the_flag():
    r = frametap("proxy", "--protocol", "flymq", "--listen", "127.0.0.1:0", "--upstream",
                 "127.0.0.1:9", "--api", "127.0.0.1:x")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "frametap: error: --api: port 'x' is not a number (got '127.0.0.1:x')"], r.stderr


# ---- the short form (frametap faults add, frametap load --frametap-fault) ------------

@pytest.mark.parametrize("text, kind, data", [
    ("error status=SYSTEM_BUSY opcode=SEND_MESSAGE_V2 probability=0.05 name=busy", "rule",
     {"name": "busy", "action": {"type": "error", "status": "SYSTEM_BUSY"},
      "match": {"opcode": ["SEND_MESSAGE_V2"]}, "trigger": {"probability": 0.05}}),
    ("delay ms=50 jitter_ms=5 opcode=A,B direction=both", "rule",
     {"action": {"type": "delay", "ms": 50, "jitter_ms": 5},
      "match": {"opcode": ["A", "B"], "direction": "both"}}),
    ("close rst=true once", "rule", {"action": {"type": "close", "rst": True},
                                     "trigger": {"once": True}}),
    ("error message='server is busy' nth=3", "rule",
     {"action": {"type": "error", "message": "server is busy"}, "trigger": {"nth": 3}}),
    ("latency latency=100 jitter=10 stream=upstream toxicity=0.5", "toxic",
     {"type": "latency", "stream": "upstream", "toxicity": 0.5,
      "attributes": {"latency": 100, "jitter": 10}}),
    ('{"type": "timeout", "attributes": {"timeout": 0}}', "toxic",
     {"type": "timeout", "attributes": {"timeout": 0}}),
    (' {"name": "d", "action": {"type": "drop"}}', "rule",
     {"name": "d", "action": {"type": "drop"}}),
])
def test_short_spec(text, kind, data):
    assert parse_short_spec(text) == (kind, data)
    if kind == "toxic":
        parse_toxic(data)
    elif "status" not in data["action"]:            # statuses are the protocol's
        parse_rule(dict(data, name="n") if "name" not in data else data, "ttheader")


@pytest.mark.parametrize("text, needle", [
    ("", "empty; expected ACTION"),
    ("explode", "'explode' is neither an action (delay, drop, close, error) nor a toxic"),
    ("delay ms", "'ms' is not KEY=VALUE"),
    ("delay colour=red", "unknown key 'colour' for a rule"),
    ("delay ms=fast", "ms='fast': expected a number"),
    ("close rst=maybe", "rst='maybe': expected true or false"),
    ("latency rate=5", "unknown key 'rate' for a latency toxic"),
    ("{not json", "not valid JSON"),
    ("[1]", "'[1]' is neither"),
    ("error message='open", "No closing quotation"),
])
def test_bad_short_spec(text, needle):
    with pytest.raises(FaultSpecError) as info:
        parse_short_spec(text)
    assert needle in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_fault_arg_names_the_route():
    assert parse_fault_arg("mq:drop nth=2") == ("mq", "rule", {"action": {"type": "drop"},
                                                              "trigger": {"nth": 2}})
    for bad in ("drop", ":drop", "mq:", "mq: "):
        with pytest.raises(FaultSpecError, match="expected ROUTE:SPEC"):
            parse_fault_arg(bad)


def test_the_readme_example_loads():
    """The README's fault config is a config that loads, with what it says it has."""
    import re
    import tomllib
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### Faults: rules, Toxiproxy's toxics and its API"):]
    text = re.search(r"```toml\n(.*?)```", section, re.S).group(1)
    cfg = config_from_dict(tomllib.loads(text))
    faults = cfg.routes[0].faults
    assert [r.name for r in faults.rules()] == ["busy", "slow-pull"]
    assert [t.name for t in faults.toxics()] == ["latency_downstream"]
    assert (cfg.seed, cfg.toxiproxy_listen) == (42, ("127.0.0.1", 8474))


def test_real_status_modules_check_statuses():
    """Once proxy/protocols/<p>/faults.py exist: their DEFAULT_ERROR is a valid status and
    a made-up one is refused in the rule's words."""
    import importlib.util
    found = [p for p in protocols.names()
             if importlib.util.find_spec(protocols.load(p).package + ".faults") is not None]
    if not found:
        pytest.skip("no protocol has its faults.py (error replies) in this tree yet")
    for protocol in found:
        module = __import__(protocols.load(protocol).package + ".faults", fromlist=["x"])
        ok = parse_rule({"name": "e", "action": {"type": "error",
                                                 "status": module.DEFAULT_ERROR}}, protocol)
        assert ok.status == str(module.DEFAULT_ERROR)
        with pytest.raises(FaultSpecError) as info:
            parse_rule({"name": "e", "action": {"type": "error", "status": "NO_SUCH_XYZ"}},
                       protocol)
        assert str(info.value).startswith("action.status = 'NO_SUCH_XYZ': "), str(info.value)
