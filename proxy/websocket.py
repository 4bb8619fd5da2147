"""fleximq over WebSocket (docs/design.md, "Transports"; fleximq §6.1-6.2; RFC 6455).

A fleximq route whose ``listen`` and ``upstream`` are ``ws://host:port/path`` URLs puts a
WebSocket layer between its sockets and its parser:

* The HTTP upgrade is relayed: the client's request head (at most ``MAX_HEAD`` bytes) is
  checked (RFC 6455 §4.2.1: ``GET``, HTTP/1.1, ``Upgrade: websocket``, ``Connection:
  upgrade``, a 16-byte ``Sec-WebSocket-Key``, version 13, the listen URL's path) and
  forwarded with its request target set to the upstream URL's path (the client's query
  kept), ``Host`` set to the upstream's host:port and ``Sec-WebSocket-Extensions``
  removed, so no extension (permessage-deflate) is negotiated and the frames stay
  readable.  A request that is not a WebSocket upgrade is answered by the proxy (400,
  404 for another path, 426 for another version) and counted ``ws_bad_upgrade``.  The
  upstream's answer is forwarded as it is: a ``101`` whose ``Upgrade``, ``Connection``
  or ``Sec-WebSocket-Accept`` is wrong, or that names an extension, is counted
  ``ws_bad_handshake`` and closes the connection; any other status is counted
  ``ws_upgrade_refused`` and the connection then relays undecoded (the client reads the
  server's own answer).
* Then RFC 6455 frames are decoded in both directions and the payload of binary
  messages is fed to the fleximq parser: **the parser sees the concatenation of the
  binary messages' payloads**, so a message may hold several fleximq frames and a
  fleximq frame may span messages (fleximq §6 says nothing about it; the reference
  broker and client send one frame per message).  Text messages are counted
  (``ws_text_message``) and not parsed; ping, pong and close frames are control frames
  and are not parsed either.  The bytes relayed are the original frames, unchanged:
  decoding never holds a byte back.
* WebSocket errors count under ``frametap_protocol_errors_total`` with ``ws_`` reasons
  (``WS_REASONS``).  Fatal ones close the connection after the frames before the
  offending one; the others are counted and the frames forwarded.

The deframer has two twins: ``proxy/_websocket.pyx`` (compiled, over a compiled parser)
and ``proxy/websocket_py.py`` (pure Python, over the pure-Python parser); the upgrade
is handled here, once, for both.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re

from proxy.addresses import parse_address
from proxy.errors import bad_value
from proxy.framing_common import REASONS

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"      # RFC 6455 §1.3
MAX_HEAD = 16384          # request / response head, bytes (aiohttp reads 8 KiB lines)

#: The ``reason`` labels of WebSocket errors, as framing_common.REASONS lists them:
#: ws_bad_upgrade (the client's request is not a WebSocket upgrade; fatal),
#: ws_upgrade_refused (the upstream answered other than 101; relayed undecoded),
#: ws_bad_handshake (a 101 with a wrong Upgrade/Connection/Accept or an extension, or a
#: head over MAX_HEAD; fatal), ws_reserved_bits (RSV1-3 set: no extension was
#: negotiated; fatal), ws_bad_opcode (3-7, 11-15; fatal), ws_unmasked_client_frame and
#: ws_masked_server_frame (RFC 6455 §5.1; fatal), ws_bad_control_frame (fragmented, or
#: over 125 bytes; fatal), ws_bad_continuation (a continuation outside a message, or a
#: new data frame inside one; fatal), ws_oversized (a frame or message over the route's
#: max_frame_bytes; fatal), ws_text_message (forwarded, not parsed), ws_bad_close (a
#: close frame of 1 byte or with a code §7.4 forbids; forwarded), ws_frame_after_close
#: (fatal), ws_truncated_frame (the connection ended inside a frame or an HTTP head).
WS_REASONS = tuple(r for r in REASONS if r.startswith("ws_"))

# Phases of a direction
PH_HEAD = 0               # reading the HTTP request (c2s) / response (s2c) head
PH_FRAMES = 1             # WebSocket frames
PH_PASS = 2               # the upgrade was refused: bytes relayed undecoded

SCHEMES = ("ws://", "wss://")


# ---- addresses -------------------------------------------------------------------------

class WsAddress(tuple):
    """A ``ws://host:port/path`` URL as the relay uses it: the ``(host, port)`` tuple
    (listen, connect, format_address), plus ``scheme`` and ``path``."""

    def __new__(cls, host, port, scheme="ws", path="/"):
        self = super().__new__(cls, (host, port))
        self.scheme = scheme
        self.path = path
        return self

    def __getnewargs__(self):
        return (self[0], self[1], self.scheme, self.path)

    @property
    def authority(self):
        host, port = self
        return "[%s]:%d" % (host, port) if ":" in host else "%s:%d" % (host, port)

    def url(self, port=None):
        host, bound = self[0], self[1] if port is None else port
        host = "[%s]" % host if ":" in host else host
        return "%s://%s:%d%s" % (self.scheme, host, bound, self.path)

    def __repr__(self):
        return "WsAddress(%r)" % self.url()


def is_url(text):
    return isinstance(text, str) and text.lower().startswith(SCHEMES)


def parse_url(text, key, listen=False):
    """``ws://host[:port][/path]`` -> WsAddress; ConfigError naming ``key`` otherwise.
    The port defaults to 80 (ws) / 443 (wss), the path to ``/``."""
    if not is_url(text):
        raise bad_value(key, text, "expected a ws:// URL, e.g. ws://127.0.0.1:8080/ws")
    scheme, _, rest = text.partition("://")
    scheme = scheme.lower()
    if "?" in rest or "#" in rest:
        raise bad_value(key, text, "a query or fragment has no meaning here")
    authority, slash, path = rest.partition("/")
    path = "/" + path
    if not authority:
        raise bad_value(key, text, "expected a host, e.g. ws://127.0.0.1:8080/ws")
    if not re.fullmatch(r"[\x21-\x7e]*", path):
        raise bad_value(key, text, "the path must be printable ASCII (percent-encode the rest)")
    if not (authority.rsplit("]", 1)[-1].count(":")):          # no port: the scheme's own
        authority += ":443" if scheme == "wss" else ":80"
    host, port = parse_address(authority, key, allow_port_zero=listen)
    return WsAddress(host, port, scheme, path)


def route_urls(protocol, listen, upstream, where, keys):
    """A route's ``listen`` and ``upstream`` when either is a ws:// URL: both must be,
    on a fleximq route (a WebSocket side facing a TCP side would need re-framing)."""
    lkey, ukey = keys(f"{where}.listen"), keys(f"{where}.upstream")
    if protocol != "fleximq":
        bad = lkey if is_url(listen) else ukey
        raise bad_value(bad, listen if is_url(listen) else upstream,
                        f"WebSocket is a fleximq transport ({protocol} routes are TCP or unix:)")
    for key, value, other in ((lkey, listen, ukey), (ukey, upstream, lkey)):
        if not is_url(value):
            raise bad_value(key, value, f"expected a ws:// URL like {other} (a WebSocket side "
                                        "facing a plain one would need re-framing)")
    return parse_url(listen, lkey, listen=True), parse_url(upstream, ukey)


def check_tls(listen, upstream, tls, where, keys):
    """``wss://`` is this layer over the route's TLS (proxy/tls.py): a ``wss://`` listen
    needs ``[routes.tls]`` to terminate (terminate, both; permissive takes ws:// and
    wss:// on one port), a ``wss://`` upstream needs it to originate (originate, both),
    and a ``ws://`` side must not be TLS; passthrough never decodes, so it has no
    WebSocket route.  ``tls``: proxy.tls.TLSConfig or None."""
    mode = tls.mode if tls is not None else None
    if mode == "passthrough":
        raise bad_value(f"{where}.tls.mode", mode, "a ws:// route decodes its frames; "
                                                   "passthrough never decodes")
    lkey, ukey = keys(f"{where}.listen"), keys(f"{where}.upstream")
    for key, url, on, need in ((lkey, listen, mode in ("terminate", "both", "permissive"),
                                "terminate, both or permissive"),
                               (ukey, upstream, mode in ("originate", "both"),
                                "originate or both")):
        if url.scheme == "wss" and not on:
            raise bad_value(key, url.url(), f"wss:// needs [{where}.tls] mode = {need} "
                                            f"(got {mode or 'no [tls] table'})")
        if url.scheme == "ws" and on and not (key == lkey and mode == "permissive"):
            raise bad_value(key, url.url(), f"[{where}.tls] mode = {mode!r} speaks TLS on "
                                            "this side: write wss://")


# ---- the upgrade (RFC 6455 §4) ----------------------------------------------------------

class UpgradeError(Exception):
    """A bad upgrade request (``status``: what the proxy answers) or response."""

    def __init__(self, message, status=400, headers=()):
        super().__init__(message)
        self.status = status
        self.headers = headers


_REASON_PHRASES = {400: "Bad Request", 404: "Not Found", 426: "Upgrade Required",
                   431: "Request Header Fields Too Large"}


def error_response(err):
    """The proxy's own answer to a bad upgrade request: a short text body saying why."""
    body = ("frametap: %s\n" % err).encode("utf-8", "replace")
    head = ["HTTP/1.1 %d %s" % (err.status, _REASON_PHRASES.get(err.status, "Error")),
            "Content-Type: text/plain; charset=utf-8", "Content-Length: %d" % len(body),
            "Connection: close", *err.headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def _split_head(head):
    """(start line, [(name lower, name, value)]) of an HTTP head (ends with CRLFCRLF)."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:          # pragma: no cover - latin-1 decodes every byte
        raise UpgradeError("the head is not text") from None
    lines = text[:-4].split("\r\n")
    fields = []
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip() or not name.isprintable():
            raise UpgradeError("malformed header line %r" % line[:60])
        fields.append((name.lower(), name, value.strip()))
    return lines[0], fields


def _get(fields, name):
    values = [v for low, _, v in fields if low == name]
    return ", ".join(values) if values else None


def _tokens(value):
    return {t.strip().lower() for t in (value or "").split(",")}


def accept_key(key):
    """Sec-WebSocket-Accept for a Sec-WebSocket-Key (RFC 6455 §4.2.2)."""
    return base64.b64encode(hashlib.sha1(key.encode("latin-1") + GUID).digest()).decode()


def check_request(head, listen, upstream):
    """The client's upgrade request -> (the head to send upstream, its key); UpgradeError
    (with the status the proxy answers) when it is not a WebSocket upgrade."""
    start, fields = _split_head(head)
    parts = start.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise UpgradeError("malformed request line %r" % start[:80])
    method, target, version = parts
    if method != "GET":
        raise UpgradeError("method %s: a WebSocket upgrade is a GET" % method[:20])
    if version not in ("HTTP/1.1",):
        raise UpgradeError("%s: a WebSocket upgrade needs HTTP/1.1" % version[:20])
    path, qmark, query = target.partition("?")
    if listen.path != "/" and path != listen.path:
        raise UpgradeError("no WebSocket endpoint at %r (this route's path is %r)"
                           % (path[:80], listen.path), 404)
    if _get(fields, "host") is None:
        raise UpgradeError("no Host header")
    if "websocket" not in _tokens(_get(fields, "upgrade")):
        raise UpgradeError("no 'Upgrade: websocket' header (is this a plain HTTP request?)",
                           426, ("Upgrade: websocket", "Connection: Upgrade"))
    if "upgrade" not in _tokens(_get(fields, "connection")):
        raise UpgradeError("no 'Connection: Upgrade' header")
    key = _get(fields, "sec-websocket-key")
    try:
        ok = key is not None and len(base64.b64decode(key, validate=True)) == 16
    except (binascii.Error, ValueError):
        ok = False
    if not ok:
        raise UpgradeError("Sec-WebSocket-Key %r is not 16 bytes in base64"
                           % (key or "")[:40])
    if _get(fields, "sec-websocket-version") != "13":
        raise UpgradeError("Sec-WebSocket-Version %r (expected 13)"
                           % (_get(fields, "sec-websocket-version") or "")[:20], 426,
                           ("Sec-WebSocket-Version: 13",))
    out = ["GET %s%s%s HTTP/1.1" % (upstream.path, qmark, query)]
    for low, name, value in fields:
        if low == "host":
            out.append("Host: " + upstream.authority)
        elif low != "sec-websocket-extensions":
            out.append("%s: %s" % (name, value))
    return ("\r\n".join(out) + "\r\n\r\n").encode("latin-1"), key


def check_response(head, key):
    """The upstream's answer: None for a good 101; ("refused", status line) for any
    other status; ("bad", why) for a 101 the client must reject (RFC 6455 §4.1)."""
    try:
        start, fields = _split_head(head)
    except UpgradeError as exc:
        return "bad", str(exc)
    parts = start.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        return "bad", "malformed status line %r" % start[:80]
    if parts[1] != "101":
        return "refused", start[:120]
    if "websocket" not in _tokens(_get(fields, "upgrade")):
        return "bad", "101 without 'Upgrade: websocket'"
    if "upgrade" not in _tokens(_get(fields, "connection")):
        return "bad", "101 without 'Connection: Upgrade'"
    if key is None or _get(fields, "sec-websocket-accept") != accept_key(key):
        return "bad", "Sec-WebSocket-Accept %r does not answer the request's key" % (
            (_get(fields, "sec-websocket-accept") or "")[:40])
    if _get(fields, "sec-websocket-extensions"):
        return "bad", "the server chose an extension the client did not offer (%r)" % (
            _get(fields, "sec-websocket-extensions")[:60])
    return None


class Upgrade:
    """One connection's upgrade: its route's URLs, the client's key, where to answer a
    bad request (the client transport's ``write``) and the route's rate-limited log."""

    __slots__ = ("listen", "upstream", "reply", "log", "route_name", "key", "heads")

    def __init__(self, listen, upstream, reply=None, log=None, route_name=""):
        self.listen = listen
        self.upstream = upstream
        self.reply = reply
        self.log = log
        self.route_name = route_name
        self.key = None
        self.heads = [bytearray(), bytearray()]

    def warn(self, msg, *args):
        if self.log is not None:
            self.log.warning("route %s: " + msg, self.route_name, *args)


def feed_head(layer, d, data):
    """A read of direction ``d`` while that direction is in its HTTP head (either twin's
    feed() calls this): holds the head until it is whole, then decides; the bytes after
    it are frames.  Returns what feed() returns (the bytes to forward are in
    ``layer.output``)."""
    up = layer.upgrade
    buf = up.heads[d]
    seen = len(buf)
    buf += data
    end = buf.find(b"\r\n\r\n", max(0, seen - 3))
    layer.output = []
    if end < 0 or end + 4 > MAX_HEAD:
        if len(buf) <= MAX_HEAD and end < 0:
            return 0                                   # hold: the head is not whole yet
        up.heads[d] = None
        if d == 0:
            err = UpgradeError("request head over %d bytes" % MAX_HEAD, 431)
            _refuse_request(layer, err)
        else:
            layer.ws_fail(1, "ws_bad_handshake", "upstream's response head is over %d bytes"
                          % MAX_HEAD)
        return 0
    end += 4
    head, rest = bytes(buf[:end]), bytes(buf[end:])
    up.heads[d] = None
    layer.count_bytes(d, len(head))
    if d == 0:
        try:
            out, up.key = check_request(head, up.listen, up.upstream)
        except UpgradeError as err:
            _refuse_request(layer, err)
            return 0
        layer.output.append(out)
        layer.set_phase(0, PH_FRAMES)
    else:
        verdict = check_response(head, up.key)
        if verdict is not None and verdict[0] == "refused":
            layer.ws_count(1, "ws_upgrade_refused")
            up.warn("upstream refused the WebSocket upgrade: %s (relayed to the client "
                    "undecoded)", verdict[1])
            layer.set_phase(0, PH_PASS)
            layer.set_phase(1, PH_PASS)
            layer.count_bytes(1, len(rest))
            layer.output.append(head + rest)
            return 0
        layer.output.append(head)
        if verdict is not None:
            layer.ws_fail(1, "ws_bad_handshake", "upstream's 101: %s" % verdict[1])
            return 0
        layer.set_phase(1, PH_FRAMES)
    if rest:
        ok = layer.feed_frames_of(d, rest)
        if ok:
            layer.output.append(rest[:ok] if ok < len(rest) else rest)
    return 0


def _refuse_request(layer, err):
    up = layer.upgrade
    layer.ws_fail(0, "ws_bad_upgrade", "not a WebSocket upgrade: %s" % err)
    if up.reply is not None:
        try:
            up.reply(error_response(err))
        except Exception:                 # pragma: no cover - a closing transport
            pass


def close_code_ok(code):
    """RFC 6455 §7.4: the codes an endpoint may send in a close frame."""
    return 1000 <= code <= 1003 or 1007 <= code <= 1014 or 3000 <= code <= 4999


# ---- the layer -------------------------------------------------------------------------

def wrap(parser, listen, upstream, reply=None, log=None, route_name=""):
    """The WebSocket layer over ``parser`` (compiled over a compiled parser, the twin
    over the pure-Python one): an object with the parser's interface for the relay."""
    upgrade = Upgrade(listen, upstream, reply, log, route_name)
    try:
        from proxy import _websocket
        from proxy._framing import FrameParser
    except ImportError:
        _websocket = None
    if _websocket is not None and isinstance(parser, FrameParser):
        return _websocket.WsLayer(parser, upgrade)
    from proxy.websocket_py import WsLayer
    return WsLayer(parser, upgrade)
