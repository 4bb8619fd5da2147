"""RocketMQ route options, opcode/status naming and route-data rewriting.

Route options::

    [routes.options]
    length_includes_self = false   # true for peers whose length word counts itself
    max_header_bytes = 65536       # larger headers: counted, connection closed
    advertise = { "10.0.0.7:10911" = "proxyhost:20911" }   # broker -> frametap listener

With ``advertise``, GET_ROUTEINFO_BY_TOPIC responses (TopicRouteData JSON in the body,
``brokerDatas[].brokerAddrs``) are rewritten so that a proxy in front of the name
server also carries the broker traffic (each broker needs its own frametap route).
"""

import collections
import functools
import struct

from proxy.errors import ConfigError
from proxy.protocols import advertise

MAX_HEADER_BYTES = 64 * 1024
UNMATCHED_RESPONSE = 65535
UNDECODABLE = 65534
OPTION_KEYS = {"length_includes_self", "max_header_bytes", "advertise"}


def _codes():
    from proxy.protocols.rocketmq import constants
    return constants


def frame_opcode_name(code):
    """Label of a frame: its request code's Apache name (responses carry their request's)."""
    if code == UNMATCHED_RESPONSE:
        return "unmatched_response"
    if code == UNDECODABLE:
        return "undecodable"
    return _codes().request_name(code)


ROUTE_REQUESTS_MAX = 1024   # GET_ROUTEINFO requests awaiting an answer, per connection


def remember_route_request(opaques, opaque):
    """Note a GET_ROUTEINFO_BY_TOPIC opaque whose answer will be rewritten; keeps at most
    ROUTE_REQUESTS_MAX (oldest dropped first: an upstream that never answers cannot grow
    it).  Returns True when one was dropped.  ``opaques`` is an OrderedDict
    (new_route_requests()): dropping a plain dict's oldest key walks the holes earlier
    deletions left at its front, ~1 us a request when every request is a GET_ROUTEINFO
    to an upstream that never answers (the black-hole soak)."""
    opaques[opaque] = None
    if len(opaques) > ROUTE_REQUESTS_MAX:
        opaques.popitem(False)
        return True
    return False


def new_route_requests():
    """The per-connection memory of remember_route_request(), oldest first."""
    return collections.OrderedDict()


@functools.cache
def known_codes():
    """Every request code of Apache's table (and the legacy ones), plus the parser's two
    pseudo-opcodes: the codes that keep their own label (RouteStats.set_known)."""
    c = _codes()
    return (*c.REQUEST_CODES, *c.LEGACY_REQUEST_CODES, UNMATCHED_RESPONSE, UNDECODABLE)


def response_status_name(code):
    return _codes().response_name(code)


def validate_options(options, where):
    for key in options:
        if key not in OPTION_KEYS:
            raise ConfigError(f"{where}.options: unknown key {key!r} "
                              f"(expected one of: {', '.join(sorted(OPTION_KEYS))})")
    out = {}
    lis = options.get("length_includes_self", False)
    if not isinstance(lis, bool):
        raise ConfigError(f"{where}.options.length_includes_self = {lis!r}: expected true or "
                          "false")
    out["length_includes_self"] = lis
    mhb = options.get("max_header_bytes", MAX_HEADER_BYTES)
    if isinstance(mhb, bool) or not isinstance(mhb, int) or not 1 <= mhb <= 0xFFFFFF:
        raise ConfigError(f"{where}.options.max_header_bytes = {mhb!r}: expected an integer "
                          "1..16777215")
    out["max_header_bytes"] = mhb
    adv = advertise.validate(options, where)
    if adv is not None:
        out["advertise"] = adv
    return out


class RouteRewriter:
    """Replaces broker addresses in TopicRouteData bodies (shared by both parser twins).

    The name server's JSON is fastjson's (``"brokerAddrs":{0:"host:port"}`` — bare
    integer keys, not strict JSON), so addresses are replaced as quoted strings
    rather than by re-serialising a parsed document.
    """

    def __init__(self, table):
        self.replacements = [(('"%s"' % k).encode(), ('"%s"' % v).encode())
                             for k, v in advertise.as_text(table).items()]

    @classmethod
    def from_options(cls, options):
        adv = options.get("advertise")
        return cls(adv) if adv else None

    def rewrite(self, frame, route_opaques, includes_self, stats):
        hw = struct.unpack_from(">I", frame, 4)[0]
        hlen, stype = hw & 0xFFFFFF, hw >> 24
        header = frame[8:8 + hlen]
        try:
            if stype == 1:
                opaque, flag = struct.unpack_from(">iI", header, 5)
            else:
                from proxy.protocols.rocketmq.jsonscan import scan
                _, opaque, flag = scan(header)
        except (ValueError, struct.error):
            return frame
        opaque &= 0xFFFFFFFF
        if not flag & 1 or opaque not in route_opaques:
            return frame
        route_opaques.pop(opaque, None)
        body = frame[8 + hlen:]
        new_body = body
        for old, new in self.replacements:
            new_body = new_body.replace(old, new)
        if new_body == body:
            return frame
        length = 4 + hlen + len(new_body) + (4 if includes_self else 0)
        return struct.pack(">II", length, hw) + header + new_body

