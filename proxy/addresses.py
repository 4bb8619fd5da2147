"""Address parsing shared by the config, the CLI and protocol route options.

A leaf module (it imports only ``proxy.errors``), so protocol option validators can
use it without importing ``proxy.config``, which imports the protocol registry.
"""

import ipaddress

from proxy.errors import ConfigError


def parse_address(text, key, allow_port_zero=False):
    """'host:port' or '[v6]:port' -> (host, port); ConfigError naming ``key`` otherwise."""
    if not isinstance(text, str):
        raise ConfigError(f"{key}: expected a 'host:port' string, got {text!r}")
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"{key} = {text!r}: expected 'host:port' (e.g. 127.0.0.1:9092)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ConfigError(f"{key} = {text!r}: {host!r} is not an IPv6 address") from None
    elif any(c.isspace() for c in host) or "/" in host:
        raise ConfigError(f"{key} = {text!r}: {host!r} is not a host name or address")
    try:
        port_no = int(port)
    except ValueError:
        raise ConfigError(f"{key} = {text!r}: port {port!r} is not a number") from None
    low = 0 if allow_port_zero else 1
    if not low <= port_no <= 65535:
        raise ConfigError(f"{key} = {text!r}: port must be {low}..65535")
    return host, port_no
