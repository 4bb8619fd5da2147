"""TOML config (docs/design.md, "Config file"), validated into plain dataclasses.

Every problem raises ConfigError with one line naming the key, the value and what
was expected; the CLI prints it and exits 2. Every number must be finite and inside
its range in ``RANGES``; every table a table; strings strings.
"""

import math
import tomllib
from dataclasses import dataclass, field

from proxy import protocols
from proxy.addresses import parse_address  # noqa: F401  (also proxy.config's public API)
from proxy.addresses import UnixAddress, format_address
from proxy.errors import ConfigError, bad_value

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40


def _plain(x):
    """3600.0 -> '3600', 0.001 -> '0.001', 1048576 -> '1048576'."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _size(n):
    for unit, name in ((TiB, "TiB"), (GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {name}"
    return f"{n} bytes"


@dataclass(frozen=True)
class Range:
    """Accepted values of one numeric key, both ends included."""

    kind: type           # int, or float (which also takes a TOML integer)
    low: float
    high: float
    unit: str = ""       # "s" (seconds) or "bytes"
    note: str = ""       # what a special value means, e.g. "0 = never"

    def describe(self):
        if self.kind is int:
            text = f"an integer {self.low}..{self.high}"
            if self.unit == "bytes":
                text += f" bytes ({_size(self.low)}..{_size(self.high)})"
        else:
            text = f"a number {_plain(self.low)}..{_plain(self.high)}"
            if self.unit == "s":
                text += " seconds"
        return f"{text}, {self.note}" if self.note else text

    def check(self, value, name):
        """``value`` as ``kind`` if it is in range; ConfigError naming ``name`` otherwise."""
        if isinstance(value, bool):
            ok = False
        elif self.kind is int:
            ok = isinstance(value, int)
        else:
            ok = isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
        if not ok or not self.low <= value <= self.high:
            raise bad_value(name, value, f"expected {self.describe()}")
        return self.kind(value)


#: Every numeric key, by its TOML path ("routes." = each [[routes]] table). Listener
#: ports are 0..65535 (0: any free port), upstream ports 1..65535 (proxy.addresses).
RANGES = {
    "admin.max_connections": Range(int, 1, 100_000),
    "proxy.shutdown_timeout": Range(float, 0, 3600, "s"),
    "proxy.max_pending_bytes": Range(int, 1 * MiB, 64 * GiB, "bytes"),
    "proxy.seed": Range(int, 0, 2**64 - 1, "", "the fault rules' and toxics' random seed"),
    "framelog.rotate_bytes": Range(int, 1 * KiB, 1 * TiB, "bytes"),
    "framelog.rotate_seconds": Range(float, 1, 86400, "s"),
    "framelog.sample": Range(float, 0, 1, "", "fraction of connections logged"),
    "framelog.buffer_records": Range(int, 2048, 1 << 26, "records"),
    "routes.max_frame_bytes": Range(int, 1, 1 << 31, "bytes"),
    "routes.request_timeout": Range(float, 0.001, 3600, "s"),
    "routes.connect_timeout": Range(float, 0.001, 600, "s"),
    "routes.max_connections": Range(int, 1, 1_000_000),
    "routes.half_close_timeout": Range(float, 0.001, 86400, "s"),
    "routes.idle_timeout": Range(float, 0, 604800, "s", "0 = never"),
}

FRAMELOG_FORMATS = ("parquet", "jsonl")
MAX_NAME_CHARS = 200


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
    #: after one side half-closes (EOF), how long the other direction may still run
    half_close_timeout: float = 60.0
    #: close a connection with no bytes either way for this long; 0: never
    idle_timeout: float = 3600.0
    options: dict = field(default_factory=dict)
    #: fault rules and toxics (proxy.faultspec.FaultSet; [[routes.faults]], [[routes.toxics]])
    faults: object = None

    def __post_init__(self):
        if self.faults is None:                # a route made in code: no faults yet
            from proxy.faultspec import FaultSet
            self.faults = FaultSet(self.protocol)

    #: false: this route writes no frame log
    framelog: bool = True
    #: [routes.tls] (proxy.tls.TLSConfig), None: plain TCP on both sides
    tls: object = None


@dataclass
class FramelogConfig:
    dir: str = "framelogs"
    format: str = "parquet"
    rotate_bytes: int = 268435456
    rotate_seconds: float = 300.0
    #: fraction of connections logged (a sampled connection is logged whole)
    sample: float = 1.0
    #: None: one new run id per process
    run_id: str | None = None
    #: records buffered before the writer (beyond: dropped and counted)
    buffer_records: int = 262144


@dataclass
class Config:
    routes: list
    admin_listen: tuple | None = None
    #: admin connections open at once; more wait in the listen backlog
    admin_max_connections: int = 64
    framelog: FramelogConfig | None = None
    shutdown_timeout: float = 10.0
    #: bytes buffered towards slow readers, all connections together, before reads pause
    max_pending_bytes: int = 256 * MiB
    #: [proxy] seed of the fault draws; None: a random one (logged)
    seed: int | None = None
    #: [toxiproxy] listen: the Toxiproxy-compatible and fault HTTP API (proxy/api.py)
    toxiproxy_listen: tuple | None = None
    #: how errors name a key ("routes[0].listen" -> "--listen" for the CLI's one route)
    key_names: dict = field(default_factory=dict)
    #: [proxy] tls_keylog: TLS session keys appended there (NSS key log format); None: off
    tls_keylog: str | None = None

    def key_name(self, key):
        """The name the user gave ``key`` (a config path such as "routes[0].listen")."""
        return self.key_names.get(key, key)


class _Keys:
    """Names keys in error messages: their config path, or the flag the CLI mapped it to."""

    def __init__(self, names):
        self.names = names or {}

    def __call__(self, path):
        return self.names.get(path, path)


def _check_keys(table, allowed, where):
    for key in table:
        if key not in allowed:
            raise ConfigError(f"{where}: unknown key {key!r} "
                              f"(expected one of: {', '.join(sorted(allowed))})")


def _table(data, key, name, hint=""):
    """``data[key]`` ({} when absent), which must be a table."""
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise bad_value(name, value, "expected a table" + hint)
    return value


def _number(table, key, where, default, keys, range_key=None):
    if key not in table:
        return default
    rng = RANGES[range_key or f"{where}.{key}"]
    return rng.check(table[key], keys(f"{where}.{key}"))


def _string(value, name, what="a non-empty string"):
    if not isinstance(value, str) or not value:
        raise bad_value(name, value, f"expected {what}")
    return value


ROUTE_KEYS = {"name", "protocol", "listen", "upstream", "max_frame_bytes", "request_timeout",
              "connect_timeout", "max_connections", "half_close_timeout", "idle_timeout",
              "options", "framelog", "tls"}
_ROUTE_NUMBERS = {"max_frame_bytes": None, "request_timeout": 30.0, "connect_timeout": 5.0,
                  "max_connections": 10000, "half_close_timeout": 60.0, "idle_timeout": 3600.0}
ROUTE_KEYS |= {"faults", "toxics"}     # [[routes.faults]], [[routes.toxics]]: proxy/faultspec.py


def route_from_table(table, index, names=None):
    """One [[routes]] table -> RouteConfig; ``names`` renames keys in errors (the CLI's
    flags)."""
    keys = _Keys(names)
    where = f"routes[{index}]"
    if not isinstance(table, dict):
        raise bad_value(where, table, "expected a table ([[routes]])")
    _check_keys(table, ROUTE_KEYS, where)
    for key in ("protocol", "listen", "upstream"):
        if key not in table:
            raise ConfigError(f"{where}: missing required key {key!r}")
    protocol = table["protocol"]
    if not isinstance(protocol, str) or protocol not in protocols.accepted():
        raise bad_value(keys(f"{where}.protocol"), protocol,
                        f"expected one of {', '.join(protocols.accepted())}")
    if protocol not in protocols.names():
        raise bad_value(keys(f"{where}.protocol"), protocol,
                        f"not implemented in this build (available: "
                        f"{', '.join(protocols.names())})")
    name = table.get("name", f"{protocol}-{index}")
    if (not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS
            or not name.isprintable()):
        raise bad_value(keys(f"{where}.name"), name,
                        f"expected a non-empty string of at most {MAX_NAME_CHARS} printable "
                        "characters")
    options = _table(table, "options", keys(f"{where}.options"))
    spec = protocols.load(protocol)
    if spec.validate_options is not None:
        options = spec.validate_options(options, where)
    elif options:
        raise ConfigError(f"{where}.options: unknown key {next(iter(options))!r} "
                          f"({protocol} has no route options)")
    from proxy.faultspec import load_route_faults
    faults = load_route_faults(table, protocol, where)
    numbers = {key: _number(table, key, where, default, keys, f"routes.{key}")
               for key, default in _ROUTE_NUMBERS.items()}
    framelog = table.get("framelog", True)
    if not isinstance(framelog, bool):
        raise bad_value(keys(f"{where}.framelog"), framelog, "expected true or false")
    upstream = parse_address(table["upstream"], keys(f"{where}.upstream"), allow_unix=True)
    from proxy.tls import parse_tls          # docs/design.md, "Transports"
    tls = parse_tls(table.get("tls"), f"{where}.tls", isinstance(upstream, UnixAddress))
    return RouteConfig(
        framelog=framelog,
        faults=faults,
        name=name,
        protocol=protocol,
        listen=parse_address(table["listen"], keys(f"{where}.listen"), allow_port_zero=True,
                             allow_unix=True),
        upstream=upstream,
        options=options,
        tls=tls,
        **numbers,
    )


def config_from_dict(data, names=None):
    """A parsed TOML document (or the CLI's equivalent dict) -> Config.

    ``names`` maps config paths to what the user typed instead, e.g.
    ``{"routes[0].listen": "--listen"}``, so errors name the flag.
    """
    keys = _Keys(names)
    if not isinstance(data, dict):
        raise bad_value("config", data, "expected a table")
    _check_keys(data, {"admin", "framelog", "routes", "proxy", "toxiproxy"}, "config")
    admin = _table(data, "admin", "admin", " ([admin] with listen = \"host:port\")")
    _check_keys(admin, {"listen", "max_connections"}, "admin")
    admin_listen = (parse_address(admin["listen"], keys("admin.listen"), allow_port_zero=True)
                    if "listen" in admin else None)
    admin_max_connections = _number(admin, "max_connections", "admin", 64, keys)
    proxy = _table(data, "proxy", "proxy", " ([proxy] with shutdown_timeout, max_pending_bytes)")
    _check_keys(proxy, {"shutdown_timeout", "max_pending_bytes", "seed", "tls_keylog"}, "proxy")
    tls_keylog = proxy.get("tls_keylog")
    if tls_keylog is not None:
        tls_keylog = _string(tls_keylog, keys("proxy.tls_keylog"), "a file name")
        if "\0" in tls_keylog:
            raise bad_value(keys("proxy.tls_keylog"), tls_keylog, "a path cannot contain NUL")
    shutdown_timeout = _number(proxy, "shutdown_timeout", "proxy", 10.0, keys)
    max_pending_bytes = _number(proxy, "max_pending_bytes", "proxy", 256 * MiB, keys)
    seed = _number(proxy, "seed", "proxy", None, keys)
    toxiproxy = _table(data, "toxiproxy", "toxiproxy",
                       " ([toxiproxy] with listen = \"127.0.0.1:8474\")")
    _check_keys(toxiproxy, {"listen"}, "toxiproxy")
    toxiproxy_listen = (parse_address(toxiproxy["listen"], keys("toxiproxy.listen"),
                                      allow_port_zero=True)
                        if "listen" in toxiproxy else None)
    framelog = None
    if "framelog" in data:
        fl = _table(data, "framelog", "framelog", " ([framelog] with dir = \"...\")")
        _check_keys(fl, {"dir", "format", "rotate_bytes", "rotate_seconds", "sample",
                         "run_id", "buffer_records"}, "framelog")
        run_id = fl.get("run_id")
        if run_id is not None:
            run_id = _string(run_id, keys("framelog.run_id"))
            if len(run_id) > MAX_NAME_CHARS or not run_id.isprintable():
                raise bad_value(keys("framelog.run_id"), run_id,
                                f"expected at most {MAX_NAME_CHARS} printable characters")
        log_dir = _string(fl.get("dir", "framelogs"), keys("framelog.dir"),
                          "a directory name (a non-empty string)")
        if "\0" in log_dir:
            raise bad_value(keys("framelog.dir"), log_dir, "a path cannot contain NUL")
        fmt = fl.get("format", "parquet")
        if not isinstance(fmt, str) or fmt not in FRAMELOG_FORMATS:
            raise bad_value(keys("framelog.format"), fmt,
                            f"expected {' or '.join(map(repr, FRAMELOG_FORMATS))}")
        framelog = FramelogConfig(
            dir=log_dir, format=fmt,
            rotate_bytes=_number(fl, "rotate_bytes", "framelog", 268435456, keys),
            rotate_seconds=_number(fl, "rotate_seconds", "framelog", 300.0, keys),
            sample=_number(fl, "sample", "framelog", 1.0, keys),
            buffer_records=_number(fl, "buffer_records", "framelog", 262144, keys),
            run_id=run_id)
    routes_raw = data.get("routes")
    if routes_raw is None or routes_raw == [] or routes_raw == {}:
        raise ConfigError("routes: expected at least one [[routes]] table")
    if not isinstance(routes_raw, list):
        raise bad_value("routes", routes_raw, "expected an array of tables ([[routes]])")
    routes = [route_from_table(t, i, names) for i, t in enumerate(routes_raw)]
    for r in routes:
        if r.tls is not None:
            r.tls.set_keylog(tls_keylog)
    seen_names, seen_listen = set(), set()
    for i, r in enumerate(routes):
        if r.name in seen_names:
            raise bad_value(keys(f"routes[{i}].name"), r.name, "duplicate route name")
        seen_names.add(r.name)
        if (isinstance(r.listen, UnixAddress) or r.listen[1]) and r.listen in seen_listen:
            raise bad_value(keys(f"routes[{i}].listen"), format_address(r.listen),
                            "another route listens there")
        seen_listen.add(r.listen)
    return Config(routes=routes, admin_listen=admin_listen,
                  seed=seed, toxiproxy_listen=toxiproxy_listen,
                  admin_max_connections=admin_max_connections, framelog=framelog,
                  shutdown_timeout=shutdown_timeout, max_pending_bytes=max_pending_bytes,
                  key_names=dict(names or {}), tls_keylog=tls_keylog)


def load_config(path):
    """Read and validate a TOML config file; ConfigError (one line) for any problem."""
    where = f"config file {path!r}"
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{where}: not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{where}: is a directory (expected a TOML file)") from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at "
                          f"offset {exc.start}); TOML files are UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: invalid TOML: {exc}") from None
    except ValueError as exc:       # tomllib lets int() errors through (over 4300 digits)
        raise ConfigError(f"{where}: invalid TOML: {str(exc).split(';')[0]}") from None
    except RecursionError:
        raise ConfigError(f"{where}: invalid TOML: arrays or tables nested too deeply") from None
    return config_from_dict(data)
