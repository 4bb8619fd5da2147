"""Property tests for the config loader (issue 8): whatever TOML a user writes, loading it
either gives a Config whose every number is inside its stated range, or raises
ConfigError with one line — never any other exception, never a traceback."""

import datetime
import math
import os
import tempfile
import tomllib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy import protocols
from proxy.config import RANGES, Config, load_config
from proxy.errors import ConfigError

# ---- a TOML writer (the standard library only reads TOML) --------------------------

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f",
            "\r": "\\r"}


def toml_string(text):
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_key(key):
    bare = key and all(c.isascii() and (c.isalnum() or c in "_-") for c in key)
    return key if bare else toml_string(key)


def toml_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def toml_document(doc):
    """Every top-level key as ``key = value`` (inline tables and arrays: one line each)."""
    return "".join(f"{toml_key(k)} = {toml_value(v)}\n" for k, v in doc.items())


# ---- strategies: real keys, wrong types, values at and beyond the edges ---------------

def _edges():
    out = set()
    for rng in RANGES.values():
        for x in (rng.low, rng.high):
            out.update({x, x - 1, x + 1, x / 2, -x, x * 1000})
    return sorted(out)


EDGES = _edges()
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
ADDRESSES = st.sampled_from([
    "127.0.0.1:0", "127.0.0.1:9092", "[::1]:9092", "[::1:9092", "::1:9092", "h:99999",
    "h:-1", "h:", ":1", "a b:1", "[1.2.3.4]:1", "unix:/tmp/x.sock", "999.1.1.1:1",
    "localhost:65535", "x]:1", "[::1]", "h:\u0668",
]) | TEXT
NUMBERS = (st.integers(-(1 << 63), (1 << 63) - 1) | st.floats() | st.sampled_from(EDGES)
           | st.sampled_from([x for x in EDGES if x == int(x)]).map(int))
SCALARS = (NUMBERS | st.booleans() | TEXT | ADDRESSES
           | st.datetimes(timezones=st.none() | st.just(datetime.timezone.utc))
           | st.dates() | st.times())
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8)

ROUTE_KEYS = ["name", "protocol", "listen", "upstream", "max_frame_bytes", "request_timeout",
              "connect_timeout", "max_connections", "half_close_timeout", "idle_timeout",
              "options"]
OPTION_KEYS = ["length_includes_self", "max_header_bytes", "advertise", "rewrite_metadata"]


def table_of(keys_and_values, junk_keys=TEXT):
    """A table drawing some of the given keys (each with its strategy) and maybe junk."""
    return st.fixed_dictionaries({}, optional=keys_and_values).flatmap(
        lambda d: st.dictionaries(junk_keys, VALUES, max_size=1).map(
            lambda junk: {**junk, **d}) | st.just(d))


def near(path):
    """Values for a numeric key: mostly in or near its range, sometimes anything."""
    rng = RANGES[path]
    inside = (st.integers(int(math.ceil(rng.low)), int(rng.high)) if rng.kind is int
              else st.floats(rng.low, rng.high))
    return inside | NUMBERS | VALUES


OPTIONS = table_of({
    "length_includes_self": st.booleans() | VALUES,
    "max_header_bytes": st.integers(-1, 1 << 25) | VALUES,
    "advertise": st.dictionaries(ADDRESSES, ADDRESSES, max_size=2) | VALUES,
    "rewrite_metadata": st.booleans() | VALUES,
}, junk_keys=st.sampled_from(OPTION_KEYS) | TEXT)

ROUTE = table_of({
    "name": TEXT | VALUES,
    "protocol": st.sampled_from(protocols.accepted() + ["kafka"]) | VALUES,
    "listen": ADDRESSES | VALUES,
    "upstream": ADDRESSES | VALUES,
    "options": OPTIONS | VALUES,
    **{key: near(f"routes.{key}") for key in ROUTE_KEYS if f"routes.{key}" in RANGES},
}, junk_keys=st.sampled_from(ROUTE_KEYS) | TEXT)

# a route that gets past protocol, listen and upstream, so the number checks are reached
LIKELY_ROUTE = st.builds(
    lambda protocol, extra: {"protocol": protocol, "listen": "127.0.0.1:0",
                             "upstream": "127.0.0.1:9", **extra},
    st.sampled_from(protocols.names()),
    table_of({key: near(f"routes.{key}") for key in ROUTE_KEYS
              if f"routes.{key}" in RANGES}))

DOCUMENT = table_of({
    "admin": table_of({"listen": ADDRESSES | VALUES}, st.just("listen") | TEXT) | VALUES,
    "proxy": table_of({"shutdown_timeout": near("proxy.shutdown_timeout"),
                       "max_pending_bytes": near("proxy.max_pending_bytes")}) | VALUES,
    "framelog": table_of({"dir": TEXT | VALUES,
                          "format": st.sampled_from(["parquet", "jsonl", "csv"]) | VALUES,
                          "rotate_bytes": near("framelog.rotate_bytes"),
                          "rotate_seconds": near("framelog.rotate_seconds")}) | VALUES,
    "routes": st.lists(LIKELY_ROUTE | ROUTE | VALUES, max_size=3) | VALUES,
}, junk_keys=st.sampled_from(["admin", "proxy", "framelog", "routes"]) | TEXT)

_DIR = tempfile.mkdtemp(prefix="frametap-config-fuzz-")
PATH = os.path.join(_DIR, "frametap.toml")


def load_bytes(data):
    with open(PATH, "wb") as f:
        f.write(data)
    return load_config(PATH)


def check_outcome(data):
    """load_config either returns a sane Config or raises a one-line ConfigError."""
    try:
        cfg = load_bytes(data)
    except ConfigError as exc:
        message = str(exc)
        assert message and len(message.splitlines()) == 1 and "\n" not in message, message
        assert len(message) < 600, message
        return None
    assert isinstance(cfg, Config) and cfg.routes
    numbers = [("proxy.shutdown_timeout", cfg.shutdown_timeout),
               ("proxy.max_pending_bytes", cfg.max_pending_bytes)]
    if cfg.framelog is not None:
        numbers += [("framelog.rotate_bytes", cfg.framelog.rotate_bytes),
                    ("framelog.rotate_seconds", cfg.framelog.rotate_seconds)]
    for r in cfg.routes:
        numbers += [(f"routes.{k}", getattr(r, k)) for k in ROUTE_KEYS
                    if f"routes.{k}" in RANGES and getattr(r, k) is not None]
        assert 0 <= r.listen[1] <= 65535 and 1 <= r.upstream[1] <= 65535
        assert isinstance(r.name, str) and r.name
    for path, value in numbers:
        rng = RANGES[path]
        assert type(value) is rng.kind and rng.low <= value <= rng.high, (path, value)
    return cfg


FUZZ = settings(max_examples=400, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.slow
@FUZZ
@given(DOCUMENT)
def test_generated_config_loads_or_fails_in_one_line(doc):
    text = toml_document(doc)
    assert tomllib.loads(text) is not None        # the writer above makes valid TOML
    check_outcome(text.encode("utf-8"))


@pytest.mark.slow
@FUZZ
@given(st.lists(LIKELY_ROUTE, min_size=1, max_size=3))
def test_generated_routes_load_or_fail_in_one_line(routes):
    check_outcome(toml_document({"routes": routes}).encode("utf-8"))


GOOD = b'[proxy]\nshutdown_timeout = 1\n[[routes]]\nprotocol = "flymq"\n' \
       b'listen = "127.0.0.1:0"\nupstream = "127.0.0.1:9"\n'


@FUZZ
@given(st.integers(0, len(GOOD)), st.integers(0, 8), st.binary(max_size=8))
def test_damaged_file_loads_or_fails_in_one_line(at, cut, insert):
    check_outcome(GOOD[:at] + insert + GOOD[at + cut:])


def test_the_good_file_loads():
    cfg = check_outcome(GOOD)
    assert cfg is not None and cfg.routes[0].upstream == ("127.0.0.1", 9)
