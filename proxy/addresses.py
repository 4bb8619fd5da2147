"""Address parsing shared by the config, the CLI and protocol route options.

A leaf module (it imports only ``proxy.errors``), so protocol option validators can
use it without importing ``proxy.config``, which imports the protocol registry.
"""

import ipaddress
import re

from proxy.errors import bad_value

# RFC 1123 host name labels (underscores tolerated: container and service names use them)
_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_PORT = re.compile(r"[0-9]{1,5}")
EXAMPLE = "expected 'host:port' or '[v6]:port' (e.g. 127.0.0.1:9092)"


def _check_host(host, key, text):
    """A host name or a bare IPv4 address (IPv6 addresses are bracketed, handled apart)."""
    if ":" in host:
        raise bad_value(key, text, "an IPv6 address needs brackets, e.g. '[::1]:9092'")
    labels = host[:-1].split(".") if host.endswith(".") else host.split(".")
    if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise bad_value(key, text, f"{host!r} is not a host name or address")
    if all(label.isdigit() for label in labels):       # looks numeric: must be IPv4
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise bad_value(key, text, f"{host!r} is not an IPv4 address") from None
    return host


def parse_address(text, key, allow_port_zero=False):
    """'host:port' or '[v6]:port' -> (host, port); ConfigError naming ``key`` otherwise.

    Ports are 1..65535, or 0..65535 with ``allow_port_zero`` (a listener on port 0
    takes a free port).
    """
    if not isinstance(text, str):
        raise bad_value(key, text, "expected a 'host:port' string")
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise bad_value(key, text, "unclosed '[': an IPv6 address is written '[::1]:9092'")
        host, port = text[1:close], text[close + 1:]
        if not port.startswith(":"):
            raise bad_value(key, text, "expected ':port' after ']', e.g. '[::1]:9092'")
        port = port[1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise bad_value(key, text, f"{host!r} is not an IPv6 address") from None
    else:
        host, sep, port = text.rpartition(":")
        if not sep or not host:
            raise bad_value(key, text, EXAMPLE)
        if "[" in host or "]" in host:
            raise bad_value(key, text, "misplaced bracket: an IPv6 address is written "
                                       "'[::1]:9092'")
        host = _check_host(host, key, text)
    if not _PORT.fullmatch(port):
        raise bad_value(key, text, f"port {port!r} is not a number")
    port_no = int(port)
    low = 0 if allow_port_zero else 1
    if not low <= port_no <= 65535:
        raise bad_value(key, text, f"port must be {low}..65535")
    return host, port_no
