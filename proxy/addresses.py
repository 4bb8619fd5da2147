"""Address parsing shared by the config, the CLI and protocol route options.

A leaf module (it imports only ``proxy.errors``), so protocol option validators can
use it without importing ``proxy.config``, which imports the protocol registry.
"""

import errno
import ipaddress
import os
import re
import socket
import stat

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


def parse_address(text, key, allow_port_zero=False, allow_unix=False):
    """'host:port' or '[v6]:port' -> (host, port); ConfigError naming ``key`` otherwise.

    Ports are 1..65535, or 0..65535 with ``allow_port_zero`` (a listener on port 0
    takes a free port).  With ``allow_unix``, 'unix:/path' -> :class:`UnixAddress`
    (docs/design.md, "Command line").
    """
    if not isinstance(text, str):
        raise bad_value(key, text, "expected a 'host:port' string")
    if text.startswith(UNIX_PREFIX):
        if not allow_unix:
            raise bad_value(key, text, "a Unix socket is not allowed here; " + EXAMPLE)
        return parse_unix(text, key)
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


# ---- Unix stream sockets: ADDR = 'unix:/path/to.sock' (docs/design.md, "Command line") --

UNIX_PREFIX = "unix:"
UNIX_DEFAULT_DIR = "/tmp"        # where a relative path goes (fleximq §6.3.1's example)
SUN_PATH_MAX = 107               # bytes of a path a sockaddr_un holds (Linux), NUL aside


class UnixAddress(str):
    """A Unix stream socket's path, parsed from ``unix:/path``; ``str`` is the path."""

    def __repr__(self):
        return "UnixAddress(%s)" % str.__repr__(self)


def parse_unix(text, key):
    path = text[len(UNIX_PREFIX):]
    if not path:
        raise bad_value(key, text, "expected 'unix:/path/to.sock'")
    if "\0" in path:
        raise bad_value(key, text, "a socket path cannot contain NUL")
    if not path.startswith("/"):
        path = os.path.join(UNIX_DEFAULT_DIR, path)
    if len(os.fsencode(path)) > SUN_PATH_MAX:
        raise bad_value(key, text, f"a socket path is at most {SUN_PATH_MAX} bytes")
    if path.endswith("/"):
        raise bad_value(key, text, "expected a socket file's path, not a directory")
    return UnixAddress(path)


def format_address(addr):
    """An address as the user writes it: ``unix:/p``, ``host:port``, ``[v6]:port``."""
    if isinstance(addr, str):
        return UNIX_PREFIX + addr
    host, port = addr[:2]
    return "[%s]:%s" % (host, port) if ":" in host else "%s:%s" % (host, port)


def format_peer(addr, local=None):
    """A socket address as the frame log's ``peer``, the key that joins the client's rows
    to the proxy's (docs/design.md, "Frame log"): ``ip:port``, ``[ip6]:port``, an IPv4
    client of a dual-stack listener as plain ``ip:port``; a Unix socket client (unnamed)
    as ``unix:<the listener's path>`` (``local``).  The proxy (proxy/relay.py) and the
    load generator's clients and servers (loadgen/) all write a peer with this one."""
    if isinstance(addr, (str, bytes)) or (not addr and isinstance(local, (str, bytes))):
        path = os.fsdecode(addr or local or b"")
        return "unix:" + (path or "?")
    if not addr:
        return "?"
    host, port = addr[:2]
    if host.startswith("::ffff:") and "." in host:   # IPv4 client of a dual-stack listener
        host = host[7:]
    return "[%s]:%s" % (host, port) if ":" in host else "%s:%s" % (host, port)


def unix_listener(path, backlog=1024):
    """A listening Unix stream socket at ``path``.

    The socket's parent directory is created when it is missing, one level only (fleximq
    §6.3.1); when more is missing, OSError(ENOENT) says which.  A stale socket file (no
    one listening) is replaced; a live one, or any other file, is EADDRINUSE.
    """
    parent = os.path.dirname(path) or "/"
    if not os.path.isdir(parent):
        grand = os.path.dirname(parent) or "/"
        if not os.path.isdir(grand):
            raise OSError(errno.ENOENT, f"{grand} does not exist (only the socket's own "
                                        f"directory {parent} is created)")
        try:
            os.mkdir(parent, 0o755)
        except FileExistsError:
            pass
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise OSError(errno.EADDRINUSE, "the path exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError, socket.timeout):
            os.unlink(path)                  # stale: its listener is gone
        else:
            raise OSError(errno.EADDRINUSE, "another process listens there")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock, os.lstat(path).st_ino


def remove_unix_socket(path, inode):
    """Remove the socket file a listener created, unless something else replaced it."""
    try:
        st = os.lstat(path)
        if st.st_ino == inode and stat.S_ISSOCK(st.st_mode):
            os.unlink(path)
    except OSError:
        pass
