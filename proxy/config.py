"""TOML config (DESIGN.md, "Config file"), validated into plain dataclasses.

Every problem raises ConfigError with one line naming the key, the value and what
was expected; the CLI prints it and exits 2.
"""

import tomllib
from dataclasses import dataclass, field

from proxy import protocols
from proxy.addresses import parse_address  # noqa: F401  (also proxy.config's public API)
from proxy.errors import ConfigError


@dataclass
class RouteConfig:
    name: str
    protocol: str
    listen: tuple
    upstream: tuple
    max_frame_bytes: int | None = None       # None: the protocol's default
    request_timeout: float = 30.0
    connect_timeout: float = 5.0
    max_connections: int = 10000
    options: dict = field(default_factory=dict)


@dataclass
class FramelogConfig:
    dir: str = "framelogs"
    format: str = "parquet"
    rotate_bytes: int = 268435456
    rotate_seconds: float = 300.0


@dataclass
class Config:
    routes: list
    admin_listen: tuple | None = None
    framelog: FramelogConfig | None = None
    shutdown_timeout: float = 10.0


def _check_keys(table, allowed, where):
    for key in table:
        if key not in allowed:
            raise ConfigError(
                f"{where}: unknown key {key!r} (expected one of: {', '.join(sorted(allowed))})")


def _number(table, key, where, kind, default, minimum=None, allow_zero=True):
    value = table.get(key, default)
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    if not ok or (minimum is not None and value < minimum) or (not allow_zero and value == 0):
        bound = f" >= {minimum}" if minimum is not None else ""
        if not allow_zero:
            bound = " > 0"
        noun = "an integer" if kind is int else "a number"
        raise ConfigError(f"{where}.{key} = {value!r}: expected {noun}{bound}")
    return kind(value)


ROUTE_KEYS = {"name", "protocol", "listen", "upstream", "max_frame_bytes", "request_timeout",
              "connect_timeout", "max_connections", "options"}


def route_from_table(table, index):
    where = f"routes[{index}]"
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table, got {table!r}")
    _check_keys(table, ROUTE_KEYS, where)
    for key in ("protocol", "listen", "upstream"):
        if key not in table:
            raise ConfigError(f"{where}: missing required key {key!r}")
    protocol = table["protocol"]
    if not isinstance(protocol, str) or protocol not in protocols.accepted():
        raise ConfigError(f"{where}.protocol = {protocol!r}: expected one of "
                          f"{', '.join(protocols.accepted())}")
    if protocol not in protocols.names():
        raise ConfigError(f"{where}.protocol = {protocol!r}: not implemented in this build "
                          f"(available: {', '.join(protocols.names())})")
    name = table.get("name", f"{protocol}-{index}")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}.name = {name!r}: expected a non-empty string")
    options = table.get("options", {})
    if not isinstance(options, dict):
        raise ConfigError(f"{where}.options = {options!r}: expected a table")
    spec = protocols.load(protocol)
    if spec.validate_options is not None:
        options = spec.validate_options(options, where)
    elif options:
        raise ConfigError(f"{where}.options: unknown key {next(iter(options))!r} "
                          f"({protocol} has no route options)")
    return RouteConfig(
        name=name,
        protocol=protocol,
        listen=parse_address(table["listen"], f"{where}.listen", allow_port_zero=True),
        upstream=parse_address(table["upstream"], f"{where}.upstream"),
        max_frame_bytes=_number(table, "max_frame_bytes", where, int, None, minimum=1),
        request_timeout=_number(table, "request_timeout", where, float, 30.0, allow_zero=False,
                                minimum=0),
        connect_timeout=_number(table, "connect_timeout", where, float, 5.0, allow_zero=False,
                                minimum=0),
        max_connections=_number(table, "max_connections", where, int, 10000, minimum=1),
        options=options,
    )


def config_from_dict(data):
    _check_keys(data, {"admin", "framelog", "routes", "proxy"}, "config")
    admin = data.get("admin", {})
    if not isinstance(admin, dict):
        raise ConfigError(f"admin = {admin!r}: expected a table")
    _check_keys(admin, {"listen"}, "admin")
    admin_listen = (parse_address(admin["listen"], "admin.listen", allow_port_zero=True)
                    if "listen" in admin else None)
    proxy = data.get("proxy", {})
    _check_keys(proxy, {"shutdown_timeout"}, "proxy")
    shutdown_timeout = _number(proxy, "shutdown_timeout", "proxy", float, 10.0, minimum=0)
    framelog = None
    if "framelog" in data:
        fl = data["framelog"]
        _check_keys(fl, {"dir", "format", "rotate_bytes", "rotate_seconds"}, "framelog")
        fmt = fl.get("format", "parquet")
        if fmt not in ("parquet", "jsonl"):
            raise ConfigError(f"framelog.format = {fmt!r}: expected 'parquet' or 'jsonl'")
        framelog = FramelogConfig(
            dir=str(fl.get("dir", "framelogs")), format=fmt,
            rotate_bytes=_number(fl, "rotate_bytes", "framelog", int, 268435456, minimum=1),
            rotate_seconds=_number(fl, "rotate_seconds", "framelog", float, 300.0,
                                   allow_zero=False, minimum=0))
    routes_raw = data.get("routes")
    if not routes_raw:
        raise ConfigError("routes: expected at least one [[routes]] table")
    if not isinstance(routes_raw, list):
        raise ConfigError("routes: expected an array of tables ([[routes]])")
    routes = [route_from_table(t, i) for i, t in enumerate(routes_raw)]
    seen_names, seen_listen = set(), set()
    for i, r in enumerate(routes):
        if r.name in seen_names:
            raise ConfigError(f"routes[{i}].name = {r.name!r}: duplicate route name")
        seen_names.add(r.name)
        if r.listen[1] and r.listen in seen_listen:
            raise ConfigError(f"routes[{i}].listen = '{r.listen[0]}:{r.listen[1]}': "
                              "another route listens there")
        seen_listen.add(r.listen)
    return Config(routes=routes, admin_listen=admin_listen, framelog=framelog,
                  shutdown_timeout=shutdown_timeout)


def load_config(path):
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path!r}: not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path!r}: invalid TOML: {exc}") from None
    return config_from_dict(data)
