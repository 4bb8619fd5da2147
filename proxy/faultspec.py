"""The fault model of a route (docs/design.md, "Faults"): opcode-aware rules, Toxiproxy's
toxics, and the :class:`FaultSet` that holds both.

One parser per shape, used by every way in: the TOML loader (``[[routes.faults]]``,
``[[routes.toxics]]``), the Toxiproxy-compatible API and frametap's own
``/api/v1/routes/{route}/faults`` (proxy/api.py), the ``frametap faults`` CLI and
``frametap load --frametap-fault`` (both send the same JSON to the API). The runtime
engine in the relay reads a route's :class:`FaultSet` (``route.cfg.faults``) and
subscribes to its changes; nothing here runs per frame.

Rules (the same keys in TOML and JSON)::

    name = "busy"
    match = {direction = "c2s", opcode = ["SEND_MESSAGE_V2"], resource = "orders*",
             peer = "10.0.0.0/8"}
    action = {type = "error", status = "SYSTEM_BUSY", message = "..."}
           # | {type = "delay", ms = 50, jitter_ms = 5} | {type = "drop"}
           # | {type = "close", rst = false}
    trigger = {probability = 0.05}    # | {once = true} | {nth = 10} | {times = 3}

Toxics (Toxiproxy's JSON: the names, attributes and units of Toxiproxy 2.x)::

    {"name": "latency_downstream", "type": "latency", "stream": "downstream",
     "toxicity": 1.0, "attributes": {"latency": 100, "jitter": 10}}

Every problem raises :class:`FaultSpecError` with one line naming the key, the value and
what was expected, in proxy/config.py's style (``routes[0].faults[1].action.ms = -5:
expected ...``); it is a ``ConfigError`` too, so the CLI exits 2 on it.
"""

import difflib
import fnmatch
import functools
import importlib
import ipaddress
import math
import re
import shlex

from proxy import protocols
from proxy.errors import ConfigError, show_value

__all__ = ["FaultSpecError", "FaultConflict", "FaultNotFound", "Rule", "Toxic", "FaultSet",
           "parse_rule", "parse_toxic", "load_route_faults", "parse_short_spec",
           "parse_fault_arg", "opcode_names", "ACTIONS", "TRIGGERS", "TOXIC_TYPES",
           "MAX_DELAY_MS", "UNDECODED"]

#: protocol name of a route frametap relays without decoding (a Toxiproxy proxy created
#: through the API without ``frametap_protocol``): toxics only, no rules
UNDECODED = "tcp"

DIRECTION_NAMES = ("c2s", "s2c")
ACTIONS = ("delay", "drop", "close", "error")
TRIGGERS = ("probability", "once", "nth", "times")
MAX_DELAY_MS = 600_000          # a rule's delay (and jitter): at most ten minutes
MAX_NAME_CHARS = 200
MAX_COUNT = 1 << 62             # nth / times
MAX_RULES = 1024                # per route: the engine walks them in order per frame
MAX_OPCODES = 1024              # names in one rule's match.opcode
MAX_TOXICS = 256                # per route

#: Toxiproxy's toxics: type -> {attribute: (default, low, high, what)}. Every attribute is
#: an integer (Toxiproxy's Go fields are int64/int); the defaults are Toxiproxy's zero
#: values. ``stream``: upstream = client -> server, downstream = server -> client.
TOXIC_TYPES = {
    "latency": {"latency": (0, 0, 3_600_000, "milliseconds"),
                "jitter": (0, 0, 3_600_000, "milliseconds")},
    "bandwidth": {"rate": (0, 0, 1 << 40, "KB/s (1 KB = 1000 bytes), 0 = no limit")},
    "slow_close": {"delay": (0, 0, 3_600_000, "milliseconds")},
    "timeout": {"timeout": (0, 0, 3_600_000, "milliseconds, 0 = hold forever")},
    "reset_peer": {"timeout": (0, 0, 3_600_000, "milliseconds")},
    "slicer": {"average_size": (0, 1, 1 << 30, "bytes"),
               "size_variation": (0, 0, 1 << 30, "bytes"),
               "delay": (0, 0, 60_000_000, "microseconds")},
    "limit_data": {"bytes": (0, 0, 1 << 62, "bytes")},
}
STREAMS = ("upstream", "downstream")      # index = relay direction (0 = c2s, 1 = s2c)


class FaultSpecError(ConfigError, ValueError):
    """A rule or toxic that is not valid: one line naming the key, the value and what was
    expected. The API answers 400 with it; the config loader and the CLI exit 2."""

    status = 400


class FaultConflict(FaultSpecError):
    """A rule or toxic of that name exists already (the API's 409)."""

    status = 409


class FaultNotFound(FaultSpecError):
    """No rule or toxic of that name (the API's 404)."""

    status = 404


def _bad(where, key, value, problem):
    return FaultSpecError(f"{where}{key} = {show_value(value)}: {problem}")


def _check_name(value, where, key="name"):
    if (not isinstance(value, str) or not value or len(value) > MAX_NAME_CHARS
            or not value.isprintable() or "/" in value or value != value.strip()):
        raise _bad(where, key, value, f"expected a non-empty name of at most "
                                      f"{MAX_NAME_CHARS} printable characters, no '/' and "
                                      "no leading or trailing spaces")
    return value


def _check_table(value, where, key, allowed):
    if not isinstance(value, dict):
        raise _bad(where, key, value, "expected a table (a JSON object)")
    for k in value:
        if k not in allowed:
            raise FaultSpecError(f"{where}{key}: unknown key {k!r} (expected one of: "
                                 f"{', '.join(allowed)})")
    return value


def _number(value, where, key, low, high, what="a number", integer=False):
    """A finite number in low..high (an integer when ``integer``: 5.0 counts as 5)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and isinstance(value, float):
        ok = math.isfinite(value) and (not integer or value.is_integer())
    if not ok or not low <= value <= high:
        kind = "an integer" if integer else what
        raise _bad(where, key, value, f"expected {kind} {low}..{high}")
    return int(value) if integer else value


def _plain(x):
    """JSON/TOML output of a number: 50 rather than 50.0."""
    return int(x) if isinstance(x, float) and x.is_integer() else x


# ---- what a protocol names ---------------------------------------------------------

class _Described(Exception):
    def __init__(self, namer, known):
        self.namer, self.known = namer, known


class _DescribeProbe:
    """Stands in for a RouteStats: every parser's constructor first tells its route how
    it names opcodes (``stats.describe(opcode_namer, status_namer, known_codes)``, as
    proxy/metrics.py reads them); this catches that call and stops the constructor."""

    def describe(self, opcode_namer, status_namer, known_codes):
        raise _Described(opcode_namer, tuple(known_codes))


@functools.cache
def opcode_names(protocol):
    """The opcode names a rule of ``protocol`` may match, as the metrics label them
    (``frametap_frames_total{opcode=...}``): a frozenset, or None when the protocol's
    opcodes are open-ended (Thrift method names) and any name may be given."""
    spec = protocols.load(protocol)
    parser = spec.load_parser(pure_python=True)
    try:
        parser(_DescribeProbe(), None, 30.0, {})
    except _Described as d:
        names = frozenset(n for n in map(d.namer, d.known) if not n.startswith("unknown"))
        return names or None
    return None                      # a parser that describes nothing: names are free


def _status_module(protocol):
    """``proxy.protocols.<pkg>.faults`` (``error_status(value) -> (code, label)``,
    ``DEFAULT_ERROR``), or None while a protocol has none: then any status is taken."""
    name = protocols.load(protocol).package + ".faults"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        return None


# ---- rules ----------------------------------------------------------------------------

class Rule:
    """One opcode-aware fault rule of a route (immutable: an update makes a new Rule, so
    per-rule state keyed by the object, such as an nth counter, starts afresh; compared
    and hashed by identity).

    ``directions``: set of 0 (c2s) / 1 (s2c); ``opcodes``: frozenset of opcode names or
    None (any); ``resource``: a glob or None; ``peer``: an ``ipaddress`` network or None;
    ``action``: delay | drop | close | error with ``delay_ms``, ``jitter_ms``, ``rst``,
    ``status`` (the protocol's name or number as given; None: the protocol's default
    error), ``message``; ``trigger``: probability | once | nth | times with
    ``probability`` (float) and ``n`` (int: the N of nth / times, 1 for once).
    """

    def __init__(self, name, directions=frozenset((0,)), opcodes=None, resource=None,
                 peer=None, action="drop", delay_ms=0, jitter_ms=0, rst=False, status=None,
                 message="", trigger="probability", probability=1.0, n=1):
        self.name = name
        self.directions = frozenset(directions)
        self.opcode_list = tuple(opcodes) if opcodes is not None else None
        self.opcodes = frozenset(opcodes) if opcodes is not None else None
        self.resource = resource
        self._resource_re = (re.compile(fnmatch.translate(resource)).match
                             if resource is not None else None)
        self.peer = peer
        self.action = action
        self.delay_ms = delay_ms
        self.jitter_ms = jitter_ms
        self.rst = rst
        self.status = status
        self.message = message
        self.trigger = trigger
        self.probability = probability
        self.n = n

    def matches_resource(self, resource):
        """True when the rule names no resource, or ``resource`` (str) fits its glob
        (case-sensitive, ``*`` and ``?`` and ``[...]`` as in fnmatch)."""
        if self._resource_re is None:
            return True
        return resource is not None and self._resource_re(resource) is not None

    def matches_peer(self, address):
        """True when the rule names no peer, or ``address`` (an ``ipaddress`` address or
        a string) is inside its network."""
        if self.peer is None:
            return True
        try:
            ip = address if not isinstance(address, str) else ipaddress.ip_address(address)
        except ValueError:
            return False
        if ip.version != self.peer.version and ip.version == 6 and ip.ipv4_mapped:
            ip = ip.ipv4_mapped
        return ip in self.peer

    def to_json(self):
        """The rule in the TOML/JSON shape of docs/design.md ("Faults")."""
        d = sorted(self.directions)
        match = {"direction": "both" if d == [0, 1] else DIRECTION_NAMES[d[0]]}
        if self.opcode_list is not None:
            match["opcode"] = list(self.opcode_list)
        if self.resource is not None:
            match["resource"] = self.resource
        if self.peer is not None:
            match["peer"] = str(self.peer)
        action = {"type": self.action}
        if self.action == "delay":
            action.update(ms=_plain(self.delay_ms), jitter_ms=_plain(self.jitter_ms))
        elif self.action == "close":
            action["rst"] = self.rst
        elif self.action == "error":
            if self.status is not None:
                action["status"] = self.status
            action["message"] = self.message
        if self.trigger == "probability":
            trigger = {"probability": self.probability}
        elif self.trigger == "once":
            trigger = {"once": True}
        else:
            trigger = {self.trigger: self.n}
        return {"name": self.name, "match": match, "action": action, "trigger": trigger}

    def __repr__(self):
        return f"Rule({self.to_json()!r})"


RULE_KEYS = ("name", "match", "action", "trigger")
MATCH_KEYS = ("direction", "opcode", "resource", "peer")
ACTION_KEYS = {"delay": ("type", "ms", "jitter_ms"), "drop": ("type",),
               "close": ("type", "rst"), "error": ("type", "status", "message")}


def _directions(value, where):
    names = [value] if isinstance(value, str) else value
    if isinstance(value, str) and value == "both":
        return frozenset((0, 1))
    if not isinstance(names, list) or not names or not all(
            isinstance(n, str) and n in DIRECTION_NAMES for n in names):
        raise _bad(where, "match.direction", value,
                   "expected 'c2s', 's2c', 'both' or a list of 'c2s'/'s2c'")
    return frozenset(DIRECTION_NAMES.index(n) for n in names)


def _opcodes(value, where, protocol):
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or len(items) > MAX_OPCODES or not all(
            isinstance(o, str) and o and len(o) <= MAX_NAME_CHARS and o.isprintable()
            for o in items):
        raise _bad(where, "match.opcode", value,
                   f"expected an opcode name or a list of 1..{MAX_OPCODES} of them (as in "
                   "the metrics)")
    known = opcode_names(protocol)
    if known is not None:
        for op in items:
            if op not in known:
                # names holding what was typed (PULL -> PULL_MESSAGE), else look-alikes
                close = sorted((k for k in known if op.lower() in k.lower()),
                               key=lambda k: (len(k), k))[:3] or \
                    difflib.get_close_matches(op, sorted(known), n=3, cutoff=0.6)
                hint = (f"did you mean {', '.join(close)}?" if close else
                        f"e.g. {', '.join(sorted(known)[:4])}, ...")
                raise _bad(where, "match.opcode", op,
                           f"not a {protocol} opcode name as the metrics name them ({hint})")
    return list(dict.fromkeys(items))     # the order given, each once


def _peer(value, where):
    try:
        if not isinstance(value, str):
            raise ValueError
        return ipaddress.ip_network(value.strip(), strict=False)
    except ValueError:
        raise _bad(where, "match.peer", value,
                   "expected an address or a CIDR network, e.g. '10.0.0.0/8' or "
                   "'::1'") from None


def _status(value, where, protocol):
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        raise _bad(where, "action.status", value,
                   f"expected the name or number of a {protocol} error status")
    text = str(value)
    module = _status_module(protocol)
    if module is not None:
        try:
            module.error_status(text)
        except ValueError as exc:
            raise _bad(where, "action.status", value, str(exc)) from None
    return text


def parse_rule(data, protocol, where="", default_name=None):
    """A rule table/JSON object -> :class:`Rule`, checked against ``protocol``'s opcode
    table and error statuses; :class:`FaultSpecError` naming ``where`` + the key."""
    if not isinstance(data, dict):
        raise FaultSpecError(f"{where.rstrip('.') or 'rule'} = {show_value(data)}: expected "
                             "a table (a JSON object) with name, match, action, trigger")
    for k in data:
        if k not in RULE_KEYS:
            raise FaultSpecError(f"{where.rstrip('.') or 'rule'}: unknown key {k!r} "
                                 f"(expected one of: {', '.join(RULE_KEYS)})")
    if protocol is None or protocol == UNDECODED:
        raise FaultSpecError(f"{where.rstrip('.') or 'rule'}: this route is not decoded "
                             "(an undecoded TCP route): rules match frames and need a "
                             "protocol; use toxics here")
    if "name" in data:
        name = _check_name(data["name"], where)
    elif default_name is not None:
        name = default_name
    else:
        raise FaultSpecError(f"{where.rstrip('.') or 'rule'}: missing required key 'name'")
    match = _check_table(data.get("match", {}), where, "match", MATCH_KEYS)
    directions = _directions(match.get("direction", "c2s"), where)
    opcodes = _opcodes(match["opcode"], where, protocol) if "opcode" in match else None
    resource = match.get("resource")
    if resource is not None and (not isinstance(resource, str) or not resource
                                 or len(resource) > MAX_NAME_CHARS):
        raise _bad(where, "match.resource", resource,
                   f"expected a glob of topic / stream / method names of at most "
                   f"{MAX_NAME_CHARS} characters, e.g. 'orders-*'")
    peer = _peer(match["peer"], where) if "peer" in match else None

    if "action" not in data:
        raise FaultSpecError(f"{where}action: missing (expected a table with type = one of: "
                             f"{', '.join(ACTIONS)})")
    action = data["action"]
    if not isinstance(action, dict):
        raise _bad(where, "action", action, f"expected a table with type = one of: "
                                            f"{', '.join(ACTIONS)}")
    kind = action.get("type")
    if kind not in ACTIONS:
        raise _bad(where, "action.type", kind, f"expected one of: {', '.join(ACTIONS)}")
    _check_table(action, where, "action", ACTION_KEYS[kind])
    fields = {}
    if kind == "delay":
        if "ms" not in action:
            raise FaultSpecError(f"{where}action.ms: missing (a delay needs ms, the "
                                 "milliseconds to hold the frame)")
        fields["delay_ms"] = _number(action["ms"], where, "action.ms", 0, MAX_DELAY_MS,
                                     "a number of milliseconds")
        jitter = _number(action.get("jitter_ms", 0), where, "action.jitter_ms", 0,
                         MAX_DELAY_MS, "a number of milliseconds")
        if jitter > fields["delay_ms"]:
            raise _bad(where, "action.jitter_ms", action["jitter_ms"],
                       f"expected at most action.ms ({_plain(fields['delay_ms'])}): a frame "
                       "is held ms ± jitter_ms, never less than 0")
        fields["jitter_ms"] = jitter
    elif kind == "close":
        rst = action.get("rst", False)
        if not isinstance(rst, bool):
            raise _bad(where, "action.rst", rst, "expected true (RST, SO_LINGER 0) or false "
                                                 "(FIN)")
        fields["rst"] = rst
    elif kind == "error":
        if "status" in action:
            fields["status"] = _status(action["status"], where, protocol)
        message = action.get("message", f"injected by frametap fault {name}")
        if not isinstance(message, str) or len(message) > 4096:
            raise _bad(where, "action.message", message,
                       "expected a string of at most 4096 characters")
        fields["message"] = message

    trigger = data.get("trigger", {"probability": 1.0})
    if not isinstance(trigger, dict) or len(trigger) != 1 or next(iter(trigger)) not in \
            TRIGGERS:
        raise _bad(where, "trigger", trigger,
                   "expected exactly one of {probability = 0..1}, {once = true}, "
                   "{nth = N}, {times = N}")
    (how, value), = trigger.items()
    if how == "probability":
        fields["probability"] = float(_number(value, where, "trigger.probability", 0, 1))
    elif how == "once":
        if value is not True:
            raise _bad(where, "trigger.once", value,
                       "expected true (leave trigger out to fire on every frame)")
    else:
        fields["n"] = _number(value, where, f"trigger.{how}", 1, MAX_COUNT, integer=True)
    return Rule(name, directions, opcodes, resource, peer, kind, trigger=how, **fields)


# ---- toxics ---------------------------------------------------------------------------

class Toxic:
    """One Toxiproxy toxic of a route: ``type`` (a key of :data:`TOXIC_TYPES`),
    ``stream`` (upstream = client -> server, downstream = server -> client), ``toxicity``
    (0..1, the chance that a connection gets it, drawn once per connection and toxic)
    and ``attributes`` (Toxiproxy's names and units, every one present)."""

    def __init__(self, name, type, stream="downstream", toxicity=1.0, attributes=None):
        self.name = name
        self.type = type
        self.stream = stream
        self.toxicity = toxicity
        self.attributes = dict(attributes or {})

    @property
    def direction(self):
        """The relay's direction the toxic acts on: 0 (c2s, upstream) or 1 (s2c)."""
        return STREAMS.index(self.stream)

    def to_json(self):
        """Toxiproxy's JSON of a toxic (its field order)."""
        return {"attributes": dict(self.attributes), "name": self.name, "type": self.type,
                "stream": self.stream, "toxicity": self.toxicity}

    def __repr__(self):
        return f"Toxic({self.to_json()!r})"


TOXIC_KEYS = ("name", "type", "stream", "toxicity", "attributes")


def _attributes(kind, given, where, base=None):
    table = TOXIC_TYPES[kind]
    if not isinstance(given, dict):
        raise _bad(where, "attributes", given, f"expected a JSON object of {kind} attributes "
                                               f"({', '.join(table)})")
    out = dict(base) if base is not None else {k: v[0] for k, v in table.items()}
    for key, value in given.items():
        if key not in table:
            raise FaultSpecError(f"{where}attributes: unknown key {key!r} for a {kind} toxic "
                                 f"(expected one of: {', '.join(table)})")
        _, low, high, unit = table[key]
        out[key] = _number(value, where, f"attributes.{key}", low, high, integer=True)
    for key, (default, low, high, unit) in table.items():
        if not low <= out[key] <= high:        # e.g. slicer's average_size left at 0
            raise _bad(where, f"attributes.{key}", out[key],
                       f"expected an integer {low}..{high} ({unit})")
    if kind == "slicer" and out["size_variation"] >= out["average_size"]:
        raise _bad(where, "attributes.size_variation", out["size_variation"],
                   f"expected less than attributes.average_size ({out['average_size']})")
    return out


def _toxicity(value, where):
    return float(_number(value, where, "toxicity", 0, 1, "a probability"))


def parse_toxic(data, where=""):
    """A Toxiproxy toxic JSON object (or ``[[routes.toxics]]`` table) -> :class:`Toxic`,
    with Toxiproxy's defaults: stream ``downstream``, toxicity 1.0, name
    ``<type>_<stream>``, every attribute 0 unless given."""
    label = where.rstrip(".") or "toxic"
    if not isinstance(data, dict):
        raise FaultSpecError(f"{label} = {show_value(data)}: expected a JSON object (a table) "
                             "with type, and optionally name, stream, toxicity, attributes")
    for k in data:
        if k not in TOXIC_KEYS:
            raise FaultSpecError(f"{label}: unknown key {k!r} (expected one of: "
                                 f"{', '.join(TOXIC_KEYS)})")
    kind = data.get("type")
    if kind not in TOXIC_TYPES:
        raise _bad(where, "type", kind, f"invalid toxic type (expected one of: "
                                        f"{', '.join(TOXIC_TYPES)})")
    stream = data.get("stream", "downstream")
    if not isinstance(stream, str) or stream.lower() not in STREAMS:
        raise _bad(where, "stream", stream, "stream was invalid, can be either upstream or "
                                            "downstream")
    stream = stream.lower()
    name = data.get("name")
    name = f"{kind}_{stream}" if name in (None, "") else _check_name(name, where)
    toxicity = _toxicity(data.get("toxicity", 1.0), where)
    attributes = _attributes(kind, data.get("attributes", {}), where)
    return Toxic(name, kind, stream, toxicity, attributes)


# ---- the set of one route -------------------------------------------------------------

class FaultSet:
    """The rules and toxics of one route (``route.cfg.faults``), changed through the
    add/update/remove methods only. ``version`` goes up by one on every change and every
    subscriber is called after it as ``callback()``; rules keep their order (first
    match wins), toxics are listed as Toxiproxy lists them (upstream ones first, each
    stream in the order added)."""

    def __init__(self, protocol=None, rules=(), toxics=()):
        self.protocol = protocol
        self._rules = list(rules)
        self._toxics = list(toxics)
        self.version = 0
        self._subscribers = []

    # -- reading
    def rules(self):
        return list(self._rules)

    def toxics(self):
        return sorted(self._toxics, key=lambda t: t.direction)   # stable: order added

    def rule(self, name):
        """The rule called ``name``; FaultNotFound otherwise."""
        for r in self._rules:
            if r.name == name:
                return r
        raise FaultNotFound(f"rule not found: {name!r}")

    def toxic(self, name):
        """The toxic called ``name``; FaultNotFound ("toxic not found", Toxiproxy's words)."""
        for t in self._toxics:
            if t.name == name:
                return t
        raise FaultNotFound(f"toxic not found: {name!r}")

    def __bool__(self):
        return bool(self._rules or self._toxics)

    def to_json(self):
        return {"faults": [r.to_json() for r in self._rules],
                "toxics": [t.to_json() for t in self.toxics()]}

    # -- changes
    def subscribe(self, callback):
        """Call ``callback()`` (no arguments) after every change."""
        self._subscribers.append(callback)

    def unsubscribe(self, callback):
        if callback in self._subscribers:
            self._subscribers.remove(callback)

    def _changed(self):
        self.version += 1
        for callback in list(self._subscribers):
            callback()

    def _default_rule_name(self, data):
        action = data.get("action")
        kind = action.get("type") if isinstance(action, dict) else None
        base = kind if kind in ACTIONS else "rule"
        taken = {r.name for r in self._rules}
        n = len(self._rules) + 1
        while f"{base}_{n}" in taken:
            n += 1
        return f"{base}_{n}"

    def add_rule(self, data, where=""):
        """Parse ``data`` and append the rule (last in order); returns it."""
        rule = parse_rule(data, self.protocol, where, self._default_rule_name(data)
                          if isinstance(data, dict) else None)
        if any(r.name == rule.name for r in self._rules):
            raise FaultConflict(f"rule already exists: {rule.name!r}")
        if len(self._rules) >= MAX_RULES:
            raise FaultSpecError(f"{where}rule {rule.name!r}: a route holds at most "
                                 f"{MAX_RULES} rules")
        self._rules.append(rule)
        self._changed()
        return rule

    def update_rule(self, name, data):
        """Replace the sections ``data`` gives (``match``, ``action``, ``trigger``, each
        whole) of rule ``name``, keeping its place in the order; returns the new rule."""
        old = self.rule(name)
        if not isinstance(data, dict):
            raise FaultSpecError(f"rule = {show_value(data)}: expected a JSON object with "
                                 "match, action and/or trigger")
        if "name" in data and data["name"] != name:
            raise _bad("", "name", data["name"], f"expected {name!r} (a rule cannot be "
                                                 "renamed: remove it and add the new one)")
        merged = old.to_json()
        merged.update(data)
        rule = parse_rule(merged, self.protocol)
        self._rules[self._rules.index(old)] = rule
        self._changed()
        return rule

    def remove_rule(self, name):
        self._rules.remove(self.rule(name))
        self._changed()

    def add_toxic(self, data, where=""):
        toxic = parse_toxic(data, where)
        if any(t.name == toxic.name for t in self._toxics):
            raise FaultConflict(f"toxic already exists: {toxic.name!r}")
        if len(self._toxics) >= MAX_TOXICS:
            raise FaultSpecError(f"{where}toxic {toxic.name!r}: a route holds at most "
                                 f"{MAX_TOXICS} toxics")
        self._toxics.append(toxic)
        self._changed()
        return toxic

    def update_toxic(self, name, data):
        """Toxiproxy's update: ``attributes`` given are merged into the toxic's, and
        ``toxicity`` replaced when given; name, type and stream cannot change (a body
        that repeats them, as Toxiproxy's clients send, is fine)."""
        old = self.toxic(name)
        if not isinstance(data, dict):
            raise FaultSpecError(f"toxic = {show_value(data)}: expected a JSON object with "
                                 "attributes and/or toxicity")
        for k in data:
            if k not in TOXIC_KEYS:
                raise FaultSpecError(f"toxic: unknown key {k!r} (expected one of: "
                                     f"{', '.join(TOXIC_KEYS)})")
        for key in ("name", "type", "stream"):
            if key in data and data[key] != getattr(old, key) and not (
                    key == "stream" and isinstance(data[key], str)
                    and data[key].lower() == old.stream):
                raise _bad("", key, data[key], f"expected {getattr(old, key)!r} (a toxic's "
                                               f"{key} cannot change: remove it and add one)")
        attributes = _attributes(old.type, data.get("attributes", {}), "", old.attributes)
        toxicity = _toxicity(data["toxicity"], "") if "toxicity" in data else old.toxicity
        toxic = Toxic(old.name, old.type, old.stream, toxicity, attributes)
        self._toxics[self._toxics.index(old)] = toxic
        self._changed()
        return toxic

    def remove_toxic(self, name):
        self._toxics.remove(self.toxic(name))
        self._changed()

    def reset(self, rules=True, toxics=True):
        """Remove every rule and/or toxic (one change; Toxiproxy's POST /reset removes
        the toxics only)."""
        if (rules and self._rules) or (toxics and self._toxics):
            if rules:
                self._rules = []
            if toxics:
                self._toxics = []
            self._changed()


def load_route_faults(table, protocol, where):
    """``[[routes.faults]]`` and ``[[routes.toxics]]`` of one ``[[routes]]`` table ->
    its FaultSet (empty when it has neither); FaultSpecError naming the key."""
    faults = FaultSet(protocol)
    for key, add in (("faults", faults.add_rule), ("toxics", faults.add_toxic)):
        items = table.get(key, [])
        if not isinstance(items, list):
            raise FaultSpecError(f"{where}.{key} = {show_value(items)}: expected an array of "
                                 f"tables ([[routes.{key}]])")
        for i, item in enumerate(items):
            try:
                add(item, f"{where}.{key}[{i}].")
            except FaultConflict as exc:
                raise FaultSpecError(f"{where}.{key}[{i}].name: {exc}") from None
    faults.version = 0               # as loaded: no change yet
    return faults


# ---- the short form of the CLI and of `frametap load --frametap-fault` ---------------

_RULE_SHORT = {"name": ("name", str), "direction": ("match", str),
               "opcode": ("match", "list"), "resource": ("match", str),
               "peer": ("match", str), "ms": ("action", "number"),
               "jitter_ms": ("action", "number"), "rst": ("action", "bool"),
               "status": ("action", str), "message": ("action", str),
               "probability": ("trigger", "number"), "once": ("trigger", "bool"),
               "nth": ("trigger", "number"), "times": ("trigger", "number")}
SHORT_HELP = ("ACTION [KEY=VALUE ...] for a rule (ACTION: delay, drop, close, error; keys: "
              "name, direction, opcode=A,B, resource, peer, ms, jitter_ms, rst, status, "
              "message, probability, once, nth, times), or TOXIC_TYPE [KEY=VALUE ...] for a "
              "toxic (name, stream, toxicity and the type's attributes), or a JSON object")


def _short_value(text, kind, spec, key):
    if kind == "list":
        return [p for p in (s.strip() for s in text.split(",")) if p]
    if kind == "bool":
        if text.lower() in ("true", "1", "yes"):
            return True
        if text.lower() in ("false", "0", "no"):
            return False
        raise FaultSpecError(f"fault {spec!r}: {key}={text!r}: expected true or false")
    if kind == "number":
        try:
            return int(text)
        except ValueError:
            try:
                return float(text)
            except ValueError:
                raise FaultSpecError(f"fault {spec!r}: {key}={text!r}: expected a "
                                     "number") from None
    return text


def parse_short_spec(spec):
    """``"error status=SYSTEM_BUSY opcode=SEND_MESSAGE_V2 probability=0.05"`` or
    ``"latency latency=100 jitter=10 stream=upstream"`` or a JSON object -> ``(kind,
    dict)``, kind ``"rule"`` or ``"toxic"``: the JSON the API takes (not yet checked
    against a protocol: the API does that)."""
    import json
    text = spec.strip() if isinstance(spec, str) else ""
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise FaultSpecError(f"fault {spec!r}: not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise FaultSpecError(f"fault {spec!r}: expected a JSON object")
        return ("toxic" if "type" in data and "action" not in data else "rule"), data
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise FaultSpecError(f"fault {spec!r}: {exc}") from None
    if not words:
        raise FaultSpecError(f"fault {spec!r}: empty; expected {SHORT_HELP}")
    head, rest = words[0], words[1:]
    pairs = []
    for w in rest:
        key, sep, value = w.partition("=")
        if not sep:
            if key == "once":
                key, value = "once", "true"
            else:
                raise FaultSpecError(f"fault {spec!r}: {w!r} is not KEY=VALUE")
        pairs.append((key, value))
    if head in ACTIONS:
        data = {"action": {"type": head}}
        for key, value in pairs:
            if key not in _RULE_SHORT:
                raise FaultSpecError(f"fault {spec!r}: unknown key {key!r} for a rule "
                                     f"(expected one of: {', '.join(_RULE_SHORT)})")
            section, kind = _RULE_SHORT[key]
            value = _short_value(value, kind, spec, key)
            if section == "name":
                data["name"] = value
            else:
                data.setdefault(section, {})[key] = value
        return "rule", data
    if head in TOXIC_TYPES:
        data = {"type": head}
        for key, value in pairs:
            if key in ("name", "stream"):
                data[key] = value
            elif key == "toxicity":
                data[key] = _short_value(value, "number", spec, key)
            elif key in TOXIC_TYPES[head]:
                data.setdefault("attributes", {})[key] = _short_value(value, "number", spec,
                                                                      key)
            else:
                raise FaultSpecError(
                    f"fault {spec!r}: unknown key {key!r} for a {head} toxic (expected one "
                    f"of: name, stream, toxicity, {', '.join(TOXIC_TYPES[head])})")
        return "toxic", data
    raise FaultSpecError(f"fault {spec!r}: {head!r} is neither an action "
                         f"({', '.join(ACTIONS)}) nor a toxic type "
                         f"({', '.join(TOXIC_TYPES)})")


def parse_fault_arg(text):
    """``ROUTE:SPEC`` (``frametap load --frametap-fault``) -> ``(route, kind, dict)``."""
    route, sep, spec = text.partition(":") if isinstance(text, str) else ("", "", "")
    if not sep or not route.strip() or not spec.strip():
        raise FaultSpecError(f"fault {text!r}: expected ROUTE:SPEC, e.g. "
                             "'rocketmq:error status=SYSTEM_BUSY probability=0.05'")
    kind, data = parse_short_spec(spec)
    return route.strip(), kind, data
