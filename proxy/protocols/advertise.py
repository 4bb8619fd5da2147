"""The advertise hook: protocols whose servers tell clients where to connect next.

A RabbitMQ Stream Metadata response names the broker to dial, a RocketMQ name server's
route data names the brokers: left alone, those follow-on connections bypass the proxy.
A protocol that rewrites such addresses sets ``advertise=True`` in its descriptor
(``proxy.protocols.spec.ProtocolSpec``) and then, in both parser twins:

* takes the route option ``advertise = { "broker:port" = "proxyhost:port" }``, checked by
  :func:`validate` in its ``validate_options`` (``{(host, port): (host, port)}``, the same
  shape for every protocol);
* has the attributes ``local_address`` and ``upstream_address`` (``cdef public object``
  in the compiled parser): the relay sets them on every new connection, before its first
  byte, to :func:`local_address` of the address the client reached the proxy on and to
  the route's upstream ``(host, port)``.

Nothing here runs per frame: the relay reads the descriptor's flag once per connection.
"""

from proxy.addresses import format_address, parse_address
from proxy.errors import ConfigError


def validate(options, where):
    """The ``advertise`` route option of ``options``, checked: ``{(host, port): (host,
    port)}``, or None when absent. ConfigError (one line naming the key) otherwise."""
    adv = options.get("advertise")
    if adv is None:
        return None
    if not isinstance(adv, dict):
        raise ConfigError(f"{where}.options.advertise = {adv!r}: expected a table "
                          '{ "broker:port" = "proxyhost:port" }')
    return {parse_address(k, f"{where}.options.advertise key"):
            parse_address(v, f"{where}.options.advertise[{k!r}]") for k, v in adv.items()}


def as_text(table):
    """An advertise table as ``{"host:port": "host:port"}`` (``[v6]:port`` for IPv6), for
    protocols that find addresses written as text; entries already text stay as they are."""
    return {(k if isinstance(k, str) else format_address(k)):
            (v if isinstance(v, str) else format_address(v)) for k, v in table.items()}


def local_address(sockname):
    """What the relay hands a parser as ``local_address``: ``(host, port)`` of a TCP
    listener's accepted socket, None for a Unix socket (no address to advertise)."""
    return sockname[:2] if isinstance(sockname, tuple) else None
