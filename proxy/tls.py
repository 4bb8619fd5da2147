"""TLS on either side of a route (docs/design.md, "Transports").

The transport sits between a route's sockets and its parser: the parser sees the same
plain byte stream it sees without TLS, and the relay's forwarding path is unchanged
(uvloop's SSL transport hands ``data_received`` the decrypted bytes).

Modes (``[routes.tls] mode``):

``terminate``    clients speak TLS to frametap (uvloop's SSL on the accepted socket)
``originate``    frametap speaks TLS to the upstream (CA or the system store, verified,
                 SNI = the upstream host name, none for an IP literal, optional client
                 certificate)
``both``         both of the above
``passthrough``  never decoded: bytes are relayed and counted, the ClientHello's SNI is
                 read (a bounded parser of the first record) and logged, never a label
``permissive``   one listener for both: a first byte of 0x16 (a TLS handshake record)
                 takes the TLS path, anything else the plain one (RocketMQ's own
                 ``tls.server.mode = permissive``); the first byte is peeked, not read

The reusable parts, for any transport that needs TLS (the WebSocket transport's
``wss://`` too):

* :func:`parse_tls` — a ``[routes.tls]`` table -> :class:`TLSConfig` (ConfigError, one
  line, for any bad key, unreadable file, wrong key, expired certificate);
* :meth:`TLSConfig.server_context` / :meth:`TLSConfig.client_context` — the
  ``ssl.SSLContext`` of each side, built once and cached; :meth:`TLSConfig.server_name`
  — what to verify the upstream against (None: no SNI, an IP literal);
* :func:`classify` — a failed handshake's exception -> ``timeout``, ``verify_failed`` or
  ``protocol_error``;
* :class:`TLSStats` — ``frametap_tls_handshakes_total{route,side,outcome}`` and
  ``frametap_tls_handshake_duration_seconds{route,side}``: :meth:`TLSStats.record`;
* :func:`connection_attrs` — the frame log's per-connection ``attrs`` of a TLS
  transport (``tls_version``, ``tls_cipher``, ``tls_alpn``, ``tls_sni``).

uvloop's SSL transport cannot half-close (``write_eof`` is not supported and a
close_notify ends the connection): a FIN or close_notify on one side of a TLS
connection closes the connection once the bytes already received are written.
"""

import asyncio
import errno
import ipaddress
import logging
import os
import socket
import ssl
import time
from dataclasses import dataclass, field

from proxy.errors import ConfigError, bad_value
from proxy.framing_common import BUCKETS

log = logging.getLogger("frametap.tls")

MODES = ("terminate", "originate", "both", "passthrough", "permissive")
SIDES = ("listen", "upstream")        # the ``side`` label: the client's side, the server's
OUTCOMES = ("ok", "timeout", "verify_failed", "protocol_error")
VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
HANDSHAKE_TIMEOUT = (0.001, 600.0)    # seconds, both ends included
LISTEN_KEYS = {"cert", "key", "client_ca", "require_client_cert", "min_version", "alpn",
               "handshake_timeout"}
UPSTREAM_KEYS = {"ca", "verify", "server_name", "cert", "key", "min_version", "alpn",
                 "handshake_timeout"}
#: a TLS record is at most 2^14 bytes of plaintext (+ 2048 of expansion): the most a
#: passthrough connection buffers to read its ClientHello
MAX_RECORD = 5 + 16384 + 2048
HANDSHAKE_RECORD = 0x16
SNI_LINES = 10                         # passthrough ClientHello log lines per second


# ---- configuration ----------------------------------------------------------------------

@dataclass
class ListenTLS:
    """``[routes.tls.listen]``: what frametap presents to its clients."""
    cert: str
    key: str
    client_ca: str | None = None
    require_client_cert: bool = False
    min_version: str = "TLSv1.2"
    alpn: tuple = ()
    handshake_timeout: float = 10.0


@dataclass
class UpstreamTLS:
    """``[routes.tls.upstream]``: how frametap speaks TLS to the upstream."""
    ca: str | None = None             # None: the system's trust store
    verify: bool = True
    server_name: str | None = None    # None: the upstream's host (no SNI for an IP literal)
    cert: str | None = None
    key: str | None = None
    min_version: str = "TLSv1.2"
    alpn: tuple = ()
    handshake_timeout: float = 10.0


@dataclass
class TLSConfig:
    """One route's ``[routes.tls]`` table, checked; contexts are built on first use."""
    mode: str
    listen: ListenTLS | None = None
    upstream: UpstreamTLS | None = None
    keylog: str | None = None         # [proxy] tls_keylog
    _server: ssl.SSLContext | None = field(default=None, repr=False, compare=False)
    _client: ssl.SSLContext | None = field(default=None, repr=False, compare=False)

    def set_keylog(self, path):
        """[proxy] tls_keylog: the contexts are built again (on first use) with it."""
        if path != self.keylog:
            self.keylog, self._server, self._client = path, None, None

    @property
    def terminates(self):
        """Clients' TLS ends here (terminate, both, and permissive's TLS path)."""
        return self.mode in ("terminate", "both", "permissive")

    @property
    def originates(self):
        return self.mode in ("originate", "both")

    def server_context(self, where="routes.tls.listen"):
        """The listening side's SSLContext (ConfigError naming ``where`` if it cannot be
        built)."""
        if self._server is None and self.listen is not None:
            self._server = _server_context(self.listen, where, self.keylog)
        return self._server

    def client_context(self, where="routes.tls.upstream"):
        if self._client is None and self.upstream is not None:
            self._client = _client_context(self.upstream, where, self.keylog)
        return self._client

    def server_name(self, host):
        """What the upstream's certificate is checked against and sent as SNI: the
        configured ``server_name``, else ``host``; an IP literal is verified against the
        certificate's IP addresses and never sent as SNI (Python's ssl module sends no SNI
        for an address)."""
        up = self.upstream
        return up.server_name if up is not None and up.server_name else host


def _bool(table, key, where, default):
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise bad_value(f"{where}.{key}", value, "expected true or false")
    return value


def _file(table, key, where, required=False):
    if key not in table:
        if required:
            raise ConfigError(f"{where}: missing required key {key!r} (a PEM file)")
        return None
    value = table[key]
    if not isinstance(value, str) or not value or "\0" in value:
        raise bad_value(f"{where}.{key}", value, "expected the path of a PEM file")
    if not os.path.isfile(value):
        raise bad_value(f"{where}.{key}", value, "no such file")
    if not os.access(value, os.R_OK):
        raise bad_value(f"{where}.{key}", value, "cannot read it (permissions)")
    return value


def _timeout(table, where):
    value = table.get("handshake_timeout", 10.0)
    low, high = HANDSHAKE_TIMEOUT
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not value == value or not low <= value <= high:
        raise bad_value(f"{where}.handshake_timeout", value,
                        f"expected a number {low:g}..{high:g} seconds")
    return float(value)


def _version(table, where):
    value = table.get("min_version", "TLSv1.2")
    if value not in VERSIONS:
        raise bad_value(f"{where}.min_version", value,
                        f"expected one of {', '.join(map(repr, VERSIONS))}")
    return value


def _alpn(table, where):
    value = table.get("alpn", [])
    if not isinstance(value, list) or not all(
            isinstance(v, str) and 0 < len(v.encode()) < 256 for v in value):
        raise bad_value(f"{where}.alpn", value,
                        'expected a list of protocol names, e.g. ["h2", "http/1.1"]')
    return tuple(value)


def _check_cert_dates(path, name):
    """An expired (or not yet valid) certificate is a start-up error, not a run of
    failed handshakes."""
    try:
        info = ssl._ssl._test_decode_cert(path)   # the stdlib's own PEM reader
    except (AttributeError, ssl.SSLError, OSError, ValueError):
        return                                     # load_cert_chain says what is wrong
    now = time.time()
    try:
        not_after = ssl.cert_time_to_seconds(info["notAfter"])
        not_before = ssl.cert_time_to_seconds(info["notBefore"])
    except (KeyError, ValueError):
        return
    if not_after < now:
        raise bad_value(name, path, f"the certificate expired on {info['notAfter']}")
    if not_before > now:
        raise bad_value(name, path, f"the certificate is not valid before "
                                    f"{info['notBefore']}")


def _load_chain(ctx, cert, key, where):
    _check_cert_dates(cert, f"{where}.cert")
    try:
        ctx.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        why = exc.reason or exc.strerror or str(exc)
        if "KEY_VALUES_MISMATCH" in str(why).upper():
            why = "the key does not belong to the certificate"
        raise ConfigError(f"{where}.cert = {cert!r}, {where}.key = {key!r}: cannot load "
                          f"them: {why}") from None
    except OSError as exc:
        raise ConfigError(f"{where}.cert = {cert!r}: cannot read it: "
                          f"{exc.strerror or exc}") from None


def _load_ca(ctx, path, name):
    try:
        ctx.load_verify_locations(cafile=path)
    except (ssl.SSLError, OSError) as exc:
        raise bad_value(name, path, f"not a PEM CA bundle ({getattr(exc, 'reason', None) or exc})")


_keylog_warned = set()


def _keylog(ctx, path):
    if not path:
        return
    try:
        ctx.keylog_filename = path
    except OSError as exc:
        raise bad_value("proxy.tls_keylog", path, f"cannot open it: {exc.strerror or exc}")
    if path not in _keylog_warned:
        _keylog_warned.add(path)
        log.warning("[proxy] tls_keylog = %r: the TLS session keys of every connection are "
                    "written there; anyone with that file can decrypt captured traffic", path)


def _server_context(cfg, where, keylog=None):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = VERSIONS[cfg.min_version]
    _load_chain(ctx, cfg.cert, cfg.key, where)
    if cfg.client_ca:
        _load_ca(ctx, cfg.client_ca, f"{where}.client_ca")
        ctx.verify_mode = ssl.CERT_REQUIRED if cfg.require_client_cert else ssl.CERT_OPTIONAL
    if cfg.alpn:
        ctx.set_alpn_protocols(list(cfg.alpn))
    ctx.sni_callback = _note_sni
    _keylog(ctx, keylog)
    return ctx


def _note_sni(obj, name, _ctx):
    """The name a client asked for (its SNI), kept for the frame log's ``tls_sni``."""
    if name:
        try:
            obj.frametap_sni = name[:255]
        except AttributeError:
            pass
    return None


def _client_context(cfg, where, keylog=None):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = VERSIONS[cfg.min_version]
    if cfg.verify:
        if cfg.ca:
            _load_ca(ctx, cfg.ca, f"{where}.ca")
        else:
            ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    else:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cfg.cert:
        _load_chain(ctx, cfg.cert, cfg.key, where)
    if cfg.alpn:
        ctx.set_alpn_protocols(list(cfg.alpn))
    _keylog(ctx, keylog)
    return ctx


def _check_server_name(value, name):
    if not isinstance(value, str) or not value or len(value) > 253 or not all(
            part and all(c.isalnum() or c in "-_*" for c in part)
            for part in value.rstrip(".").split(".")):
        try:
            ipaddress.ip_address(value)
            return value
        except (ValueError, TypeError):
            pass
        raise bad_value(name, value, "expected a host name (e.g. rabbit.staging)")
    return value


def parse_tls(table, where, upstream_is_unix=False):
    """A route's ``[routes.tls]`` table (``where`` = ``routes[0].tls``) -> TLSConfig, or
    None when ``table`` is None. Every problem is a ConfigError of one line; the contexts
    are built here too, so a wrong key or an unreadable CA fails at start-up."""
    if table is None:
        return None
    if not isinstance(table, dict):
        raise bad_value(where, table, 'expected a table ([routes.tls] with mode = "...")')
    allowed = {"mode", "listen", "upstream"}
    for key in table:
        if key not in allowed:
            raise ConfigError(f"{where}: unknown key {key!r} "
                              f"(expected one of: {', '.join(sorted(allowed))})")
    mode = table.get("mode")
    if mode not in MODES:
        raise bad_value(f"{where}.mode", mode, f"expected one of {', '.join(MODES)}")
    wants_listen = mode in ("terminate", "both", "permissive")
    wants_upstream = mode in ("originate", "both")
    for side, wanted in (("listen", wants_listen), ("upstream", wants_upstream)):
        if side in table and not isinstance(table[side], dict):
            raise bad_value(f"{where}.{side}", table[side], "expected a table")
        if side in table and not wanted:
            why = "nothing is decoded" if mode == "passthrough" else "that side is plain TCP"
            raise ConfigError(f"{where}.{side}: not used with mode = {mode!r} ({why}; "
                              "remove the table or change the mode)")
    cfg = TLSConfig(mode=mode)
    if wants_listen:
        w = f"{where}.listen"
        t = table.get("listen")
        if t is None:
            raise ConfigError(f"{where}: mode = {mode!r} needs a [{where}.listen] table with "
                              "cert and key (PEM files)")
        for key in t:
            if key not in LISTEN_KEYS:
                raise ConfigError(f"{w}: unknown key {key!r} "
                                  f"(expected one of: {', '.join(sorted(LISTEN_KEYS))})")
        cfg.listen = ListenTLS(
            cert=_file(t, "cert", w, True), key=_file(t, "key", w, True),
            client_ca=_file(t, "client_ca", w),
            require_client_cert=_bool(t, "require_client_cert", w, False),
            min_version=_version(t, w), alpn=_alpn(t, w), handshake_timeout=_timeout(t, w))
        if cfg.listen.require_client_cert and not cfg.listen.client_ca:
            raise ConfigError(f"{w}.require_client_cert = true: needs client_ca (the CA that "
                              "signs the clients' certificates)")
        cfg.server_context(w)
    if wants_upstream:
        w = f"{where}.upstream"
        if upstream_is_unix:
            raise ConfigError(f"{where}: mode = {mode!r}: TLS to a unix: upstream is not "
                              "supported")
        t = table.get("upstream", {})
        for key in t:
            if key not in UPSTREAM_KEYS:
                raise ConfigError(f"{w}: unknown key {key!r} "
                                  f"(expected one of: {', '.join(sorted(UPSTREAM_KEYS))})")
        ca = t.get("ca")
        if ca == "":
            ca = None                               # empty: the system store
        cert, key = _file(t, "cert", w), _file(t, "key", w)
        if (cert is None) != (key is None):
            raise ConfigError(f"{w}: a client certificate needs both cert and key")
        server_name = t.get("server_name")
        if server_name is not None:
            server_name = _check_server_name(server_name, f"{w}.server_name")
        cfg.upstream = UpstreamTLS(
            ca=_file({"ca": ca}, "ca", w) if ca is not None else None,
            verify=_bool(t, "verify", w, True), server_name=server_name, cert=cert, key=key,
            min_version=_version(t, w), alpn=_alpn(t, w), handshake_timeout=_timeout(t, w))
        cfg.client_context(w)
    return cfg


# ---- handshake outcomes and their metrics -------------------------------------------------

#: OpenSSL reasons that mean a certificate was refused (by us, or by the peer's alert)
_VERIFY_REASONS = ("CERTIFICATE_VERIFY_FAILED", "UNKNOWN_CA", "BAD_CERTIFICATE",
                   "CERTIFICATE_EXPIRED", "CERTIFICATE_REVOKED", "CERTIFICATE_UNKNOWN",
                   "UNSUPPORTED_CERTIFICATE", "PEER_DID_NOT_RETURN_A_CERTIFICATE",
                   "CERTIFICATE_REQUIRED", "ACCESS_DENIED", "HOSTNAME_MISMATCH")


def classify(exc):
    """The ``outcome`` of a failed handshake: ``timeout`` (asyncio's or uvloop's
    handshake timeout), ``verify_failed`` (a certificate refused by either side: our
    verification, or the peer's alert), ``protocol_error`` (anything else: not TLS, no
    common version or cipher, the peer hung up)."""
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return "timeout"
    if isinstance(exc, ConnectionAbortedError) and "handshake is taking longer" in str(exc):
        return "timeout"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return "verify_failed"
    if isinstance(exc, ssl.SSLError):
        reason = (exc.reason or "").upper()
        if any(r in reason for r in _VERIFY_REASONS):
            return "verify_failed"
    return "protocol_error"


def describe(exc):
    """One line for a log: the OpenSSL reason when there is one."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate refused: {exc.verify_message or exc.reason}"
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class TLSStats:
    """Handshake counters of one route (bumped once per connection, from Python)."""

    def __init__(self, route, sides=SIDES):
        self.route = route
        self.sides = tuple(sides)
        self.counts = {(s, o): 0 for s in self.sides for o in OUTCOMES}
        self.hist = {s: [0] * (len(BUCKETS) + 1) for s in self.sides}
        self.hist_sum = {s: 0.0 for s in self.sides}
        self.client_hellos = {}      # passthrough: outcome -> ClientHellos read

    def record(self, side, outcome, seconds):
        """One handshake on ``side`` ("listen" or "upstream") that ended with ``outcome``
        after ``seconds``."""
        key = (side, outcome)
        self.counts[key] = self.counts.get(key, 0) + 1
        hist = self.hist.setdefault(side, [0] * (len(BUCKETS) + 1))
        i = 0
        while i < len(BUCKETS) and seconds > BUCKETS[i]:
            i += 1
        hist[i] += 1
        self.hist_sum[side] = self.hist_sum.get(side, 0.0) + seconds

    def snapshot(self):
        return {"handshakes": dict(self.counts),
                "hist": {s: (tuple(h), self.hist_sum.get(s, 0.0)) for s, h in self.hist.items()},
                "client_hellos": dict(self.client_hellos)}


def metric_rows_handshakes(sc):
    """Rows of frametap_tls_handshakes_total (proxy.metrics.FAMILIES)."""
    for s in sc.snaps:
        tls = s.get("tls")
        if tls:
            for (side, outcome), v in tls["handshakes"].items():
                yield (s["route"], side, outcome), v


def metric_rows_durations(sc):
    for s in sc.snaps:
        tls = s.get("tls")
        if tls:
            for side, value in tls["hist"].items():
                yield (s["route"], side), value


def metric_rows_client_hellos(sc):
    for s in sc.snaps:
        tls = s.get("tls")
        if tls:
            for outcome, v in tls["client_hellos"].items():
                yield (s["route"], outcome), v


def connection_attrs(transport, prefix=""):
    """The frame log's per-connection ``attrs`` of a TLS transport: ``tls_version``,
    ``tls_cipher`` (and ``tls_alpn``, ``tls_sni`` when negotiated), each name after
    ``prefix`` (``upstream_`` for the upstream side); None for a plain transport. Never
    key material."""
    obj = transport.get_extra_info("ssl_object") if transport is not None else None
    if obj is None:
        return None
    attrs = {prefix + "tls_version": obj.version() or "",
             prefix + "tls_cipher": (obj.cipher() or ("",))[0]}
    alpn = obj.selected_alpn_protocol()
    if alpn:
        attrs[prefix + "tls_alpn"] = alpn
    sni = getattr(obj, "frametap_sni", None) or (obj.server_hostname if not obj.server_side
                                                   else None)
    if sni and not _is_ip(sni):           # an address is verified but never sent as SNI
        attrs[prefix + "tls_sni"] = sni
    return attrs


def _is_ip(text):
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


# ---- the ClientHello's SNI (passthrough) ---------------------------------------------------

def client_hello_sni(data):
    """``(state, sni)`` from the first bytes a client sent: state ``"more"`` (the first
    record is not complete yet), ``"not_tls"``, ``"no_sni"``, ``"sni"``, or ``"bad"``
    (a ClientHello that does not parse). Reads the first record only (at most
    MAX_RECORD bytes); SNI is RFC 6066 §3's host_name entry."""
    n = len(data)
    if n < 1:
        return "more", None
    if data[0] != HANDSHAKE_RECORD:
        return "not_tls", None
    if n < 5:
        return "more", None
    rec_len = int.from_bytes(data[3:5], "big")
    if data[1] != 3 or rec_len > MAX_RECORD - 5:
        return "not_tls", None
    if n < 5 + rec_len:
        return "more", None
    p, end = 5, 5 + rec_len
    try:
        if data[p] != 1:                         # handshake type ClientHello
            return "bad", None
        hs_end = min(end, p + 4 + int.from_bytes(data[p + 1:p + 4], "big"))
        p += 4 + 2 + 32                          # type, length, client_version, random
        p += 1 + data[p]                         # session_id
        p += 2 + int.from_bytes(data[p:p + 2], "big")   # cipher_suites
        p += 1 + data[p]                         # compression_methods
        if p + 2 > hs_end:
            return "no_sni", None
        ext_end = min(hs_end, p + 2 + int.from_bytes(data[p:p + 2], "big"))
        p += 2
        while p + 4 <= ext_end:
            etype = int.from_bytes(data[p:p + 2], "big")
            elen = int.from_bytes(data[p + 2:p + 4], "big")
            p += 4
            if etype == 0:                       # server_name
                q, qend = p + 2, min(p + elen, ext_end)
                while q + 3 <= qend:
                    kind, length = data[q], int.from_bytes(data[q + 1:q + 3], "big")
                    q += 3
                    if kind == 0 and q + length <= qend:
                        name = bytes(data[q:q + length]).decode("ascii", "replace")
                        return "sni", name[:255]
                    q += length
                return "no_sni", None
            p += elen
    except IndexError:
        return "bad", None
    return "no_sni", None


class PassthroughParser:
    """The "parser" of a passthrough route: never decodes, counts the bytes relayed and
    reads the ClientHello's SNI from the first client record (bounded). Same interface
    as the framing parsers, as the relay uses it; forwards every byte as it arrives."""

    route_tls = None                 # the RouteTLS, set on the per-route subclass

    def __init__(self, stats, max_frame_bytes=None, request_timeout=30.0, options=None):
        self.stats = stats
        self.conn_id = 0
        self.output = None
        self.error = None
        self.feed_frames = 0
        self.more = False            # never cut at the frame cap: no frames
        self.recording = False
        self.bytes_fed = 0
        self.peer = "?"
        self._hello = bytearray()    # None once the ClientHello was read (or given up)

    def feed(self, direction, data):
        n = len(data)
        self.bytes_fed += n
        self.stats.count_bytes(direction, n)
        if direction == 0 and self._hello is not None:
            self._hello += data[:MAX_RECORD - len(self._hello)]
            state, sni = client_hello_sni(self._hello)
            if state != "more" or len(self._hello) >= MAX_RECORD:
                self._hello = None
                self.route_tls.client_hello(self, "bad" if state == "more" else state, sni)
        return n

    def expire(self, now=0, limit=0):
        return 0

    def attach_log(self, buffer, index):
        pass                         # nothing is decoded: no frame rows

    def close(self):
        pass

    def abandon(self):
        pass


# ---- a route's TLS: accepting and connecting -----------------------------------------------

_UNREACHABLE = (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ECONNREFUSED, errno.ETIMEDOUT)


class _UpstreamHandshake:
    """Times and counts one upstream handshake; ``factory`` wraps the relay's protocol
    factory (uvloop calls it when the TCP connection is up, i.e. when the handshake
    starts)."""

    __slots__ = ("rt", "inner", "started", "kwargs", "timeout")

    def __init__(self, rt, inner, host):
        self.rt = rt
        self.inner = inner
        self.started = None
        cfg = rt.cfg
        self.timeout = cfg.upstream.handshake_timeout
        self.kwargs = {"ssl": cfg.client_context(), "server_hostname": cfg.server_name(host),
                       "ssl_handshake_timeout": self.timeout}

    def factory(self):
        self.started = time.perf_counter()
        return self.inner()

    def done(self):
        self.rt.stats.record("upstream", "ok", time.perf_counter() - self.started)

    def failed(self, exc, peer):
        """The connect failed: a handshake failure when TCP had connected (counted),
        else nothing here (the relay counts the connect failure)."""
        if self.started is None or isinstance(exc, (ConnectionRefusedError, socket.gaierror)) \
                or (type(exc) is OSError and exc.errno in _UNREACHABLE):
            return                    # (uvloop may call the factory before connecting)
        outcome = classify(exc)
        self.rt.stats.record("upstream", outcome, time.perf_counter() - self.started)
        self.rt.warn("route %s: TLS handshake with upstream failed (%s) for client %s: %s",
                     self.rt.name, outcome, peer, describe(exc))


class RouteTLS:
    """A route's TLS: its config, its counters, and the accept/connect steps the relay
    calls (proxy.relay.Route._attach and ClientSide._connect)."""

    def __init__(self, cfg, route_name, warn=None):
        self.cfg = cfg
        self.name = route_name
        sides = [s for s, on in (("listen", cfg.terminates), ("upstream", cfg.originates)) if on]
        self.stats = TLSStats(route_name, sides)
        self.warn = warn or log.warning
        self.server_ctx = cfg.server_context() if cfg.terminates else None
        self.terminates = cfg.terminates
        self.originates = cfg.originates
        self.passthrough = cfg.mode == "passthrough"
        self.permissive = cfg.mode == "permissive"
        self._sni_window = 0          # second of the last ClientHello lines ...
        self._sni_lines = 0           # ... and how many it had (at most SNI_LINES)

    def snapshot(self):
        return self.stats.snapshot()

    def parser_class(self):
        """The passthrough route's parser class (bound to this route)."""
        return type("PassthroughParser", (PassthroughParser,), {"route_tls": self})

    def client_hello(self, parser, state, sni):
        """A passthrough connection's first record was read: counted; one info line
        (at most SNI_LINES a second: the counter has them all)."""
        self.stats.client_hellos[state] = self.stats.client_hellos.get(state, 0) + 1
        now = int(time.monotonic())
        if now != self._sni_window:
            self._sni_window, self._sni_lines = now, 0
        if self._sni_lines < SNI_LINES and log.isEnabledFor(logging.INFO):
            self._sni_lines += 1
            log.info("route %s: passthrough connection %d: ClientHello %s%s", self.name,
                     parser.conn_id, state, f" (SNI {sni!r})" if sni else "")

    async def accept(self, loop, factory, sock):
        """``loop.connect_accepted_socket`` with the route's TLS: the handshake is timed
        and counted; a failure is raised after it was counted (the relay closes that
        connection only). The first byte is peeked first: permissive takes anything but
        a TLS handshake record to the plain path; the other modes refuse it at once
        (``protocol_error``: a plain client on a TLS port) instead of letting OpenSSL wait
        for a record that never comes."""
        cfg = self.cfg.listen
        try:                          # (the socket is the transport's once it fails)
            peer = "%s:%s" % sock.getpeername()[:2]
        except (OSError, TypeError):
            peer = "?"
        started = time.perf_counter()
        first = await peek_first_byte(loop, sock, cfg.handshake_timeout)
        if first != HANDSHAKE_RECORD:
            if self.permissive:
                return await loop.connect_accepted_socket(factory, sock)
            outcome = "timeout" if first is None else "protocol_error"
            self.stats.record("listen", outcome, time.perf_counter() - started)
            why = ("no ClientHello within %gs" % cfg.handshake_timeout if first is None else
                   "closed before its ClientHello" if first < 0 else
                   "not TLS (first byte 0x%02x; a plain client on a TLS port?)" % first)
            self.warn("route %s: TLS handshake with client %s failed (%s): %s", self.name,
                      peer, outcome, why)
            raise ConnectionError(why)
        left = max(0.001, cfg.handshake_timeout - (time.perf_counter() - started))
        try:
            result = await loop.connect_accepted_socket(
                factory, sock, ssl=self.server_ctx, ssl_handshake_timeout=left)
        except Exception as exc:
            outcome = classify(exc)
            self.stats.record("listen", outcome, time.perf_counter() - started)
            self.warn("route %s: TLS handshake with client %s failed (%s): %s", self.name,
                      peer, outcome, describe(exc))
            raise
        self.stats.record("listen", "ok", time.perf_counter() - started)
        return result

    def upstream_handshake(self, factory, host):
        return _UpstreamHandshake(self, factory, host)


def route_tls(cfg, route_name, warn=None):
    """The RouteTLS of a RouteConfig (None without ``[routes.tls]``)."""
    tls = getattr(cfg, "tls", None)
    return None if tls is None else RouteTLS(tls, route_name, warn)


async def peek_first_byte(loop, sock, timeout):
    """The first byte the client sent, without reading it (MSG_PEEK), waiting up to
    ``timeout`` seconds; None when none came in time, -1 at EOF or on an error."""
    deadline = loop.time() + timeout
    fd = sock.fileno()
    while True:
        try:
            b = sock.recv(1, socket.MSG_PEEK)
            return b[0] if b else -1
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            return -1
        left = deadline - loop.time()
        if left <= 0:
            return None
        ready = loop.create_future()
        loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
        try:
            await asyncio.wait_for(ready, left)
        except asyncio.TimeoutError:
            return None
        finally:
            loop.remove_reader(fd)
