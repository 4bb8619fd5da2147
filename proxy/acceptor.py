"""Accepting connections at the file-descriptor limit (docs/design.md, "File descriptors").

uvloop's own listeners (libuv) handle ``EMFILE``/``ENFILE`` by accepting and closing every
pending connection with a spare descriptor: those clients are dropped and nothing counts
them, and at the limit the admin endpoint can no longer be reached either. So frametap
accepts by itself, on the event loop, and hands each socket to uvloop:

* before each accept a route takes one spare descriptor (opening ``/dev/null``) and keeps
  it until the connection's upstream socket is about to be created, so an accepted client
  always has a descriptor for its upstream side; when even that fails, or ``accept``
  itself fails with ``EMFILE``/``ENFILE``, the listener pauses for :data:`PAUSE` seconds
  and the failure is counted (``frametap_accept_errors_total{route,reason}``). Clients
  meanwhile wait in the kernel's listen backlog: served late, never dropped silently;
* a small :class:`FdReserve` of descriptors is held for the admin endpoint: the routes
  refill it before they accept, and the admin listener spends one when its own accept
  hits the limit, so ``/metrics`` keeps answering while every other descriptor is taken.
"""

import errno
import logging
import os
import socket

log = logging.getLogger("frametap.accept")

PAUSE = 0.1           # seconds a listener stops accepting after running out of descriptors
BATCH = 64            # connections accepted per readiness callback, at most
ADMIN_RESERVE = 4     # descriptors held back for the admin endpoint

_FD_ERRORS = {errno.EMFILE: "emfile", errno.ENFILE: "enfile", errno.ENOBUFS: "enobufs",
              errno.ENOMEM: "enomem"}


def _open_spare():
    """One descriptor (``/dev/null``), or None when the process or system is out."""
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in _FD_ERRORS:
            return None
        raise


class FdReserve:
    """Descriptors held back so that a scrape can be accepted at the fd limit."""

    def __init__(self, size=ADMIN_RESERVE):
        self.size = size
        self.fds = []

    def fill(self):
        """Top the reserve up; True when it is full."""
        while len(self.fds) < self.size:
            fd = _open_spare()
            if fd is None:
                return False
            self.fds.append(fd)
        return True

    def release(self):
        """Give one descriptor back to the process; False when none is held."""
        if not self.fds:
            return False
        os.close(self.fds.pop())
        return True

    def close(self):
        while self.release():
            pass


class Acceptor:
    """Accepts on a listening socket and calls ``on_socket(sock)`` for each connection.

    ``on_error(reason)`` is called once per accept that ran out of descriptors (reason
    ``emfile``, ``enfile``, ``enobufs``, ``enomem``) before the listener pauses. With
    ``spare=True`` (the routes) each accepted socket comes with one held descriptor:
    ``on_socket(sock, spare_fd)``; the callee closes it when its upstream socket is due.
    With a ``reserve`` and ``spare=False`` (the admin endpoint) an accept at the limit
    spends one reserved descriptor and tries again.
    """

    def __init__(self, loop, sock, on_socket, on_error=None, reserve=None, spare=False,
                 name="listener"):
        self.loop = loop
        self.sock = sock
        self.on_socket = on_socket
        self.on_error = on_error
        self.reserve = reserve
        self.spare = spare
        self.name = name
        self.sockets = [sock]
        self.paused = None             # TimerHandle while paused
        self.held = False              # hold(): the owner has enough connections in set-up
        self.closed = False
        self.errors = 0
        sock.setblocking(False)
        loop.add_reader(sock.fileno(), self._readable)

    def _readable(self):
        for _ in range(BATCH):
            spare = None
            if self.spare:
                # the admin reserve first, then the upstream side's descriptor
                if self.reserve is not None and not self.reserve.fill():
                    self._out_of_fds("emfile")
                    return
                spare = _open_spare()
                if spare is None:
                    self._out_of_fds("emfile")
                    return
            try:
                conn, _addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                self._close_fd(spare)
                return
            except OSError as exc:
                self._close_fd(spare)
                reason = _FD_ERRORS.get(exc.errno)
                if reason is None:
                    if exc.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                        continue          # the client gave up first: nothing to count
                    reason = errno.errorcode.get(exc.errno, "oserror").lower()
                if (reason in ("emfile", "enfile") and not self.spare
                        and self.reserve is not None and self.reserve.release()):
                    continue              # admin endpoint: spend a reserved descriptor
                self._out_of_fds(reason)
                return
            conn.setblocking(False)
            try:
                if self.spare:
                    self.on_socket(conn, spare)
                else:
                    self.on_socket(conn)
            except Exception:             # never let one connection stop the listener
                log.exception("%s: handling an accepted connection failed", self.name)
                self._close_fd(spare)
                conn.close()
            if self.held:
                return

    @staticmethod
    def _close_fd(fd):
        if fd is not None:
            os.close(fd)

    def _out_of_fds(self, reason):
        self.errors += 1
        if self.on_error is not None:
            self.on_error(reason)
        if self.closed or self.paused is not None:
            return
        self.loop.remove_reader(self.sock.fileno())
        self.paused = self.loop.call_later(PAUSE, self._resume)

    def _resume(self):
        self.paused = None
        if not self.closed and not self.held:
            self.loop.add_reader(self.sock.fileno(), self._readable)

    def hold(self):
        """Stop accepting until release(): clients wait in the kernel's listen backlog."""
        if self.held or self.closed:
            return
        self.held = True
        if self.paused is None:
            self.loop.remove_reader(self.sock.fileno())

    def release(self):
        if not self.held:
            return
        self.held = False
        if not self.closed and self.paused is None:
            self.loop.add_reader(self.sock.fileno(), self._readable)

    def close(self):
        if self.closed:
            return
        self.closed = True
        if self.paused is not None:
            self.paused.cancel()
            self.paused = None
        elif not self.held:
            self.loop.remove_reader(self.sock.fileno())
        self.sock.close()


def listen_sockets(host, port, backlog=1024):
    """Bound, listening TCP sockets for every address ``host`` resolves to (all
    interfaces for "" or None), as ``loop.create_server`` would bind them; SO_REUSEADDR,
    IPv6 sockets IPv6-only. With port 0 the later sockets take the first one's port."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)
    socks, seen = [], set()
    try:
        for family, kind, proto, _name, addr in infos:
            if (family, addr) in seen:
                continue
            seen.add((family, addr))
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(socks) > 1:
                addr = (addr[0], socks[0].getsockname()[1]) + tuple(addr[2:])
            sock.bind(addr)
            sock.listen(backlog)
    except OSError:
        for sock in socks:
            sock.close()
        raise
    if not socks:
        raise OSError(f"cannot resolve {host!r}")
    return socks


def _literal(host):
    """The address family of an IP literal, or None for a name."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
            return family
        except (OSError, ValueError):
            pass
    return None


async def connect_upstream(loop, protocol_factory, host, port, spare_fd=None, **tls):
    """``loop.create_connection`` for the upstream side of an accepted client that holds
    ``spare_fd`` (see :class:`Acceptor`): the spare is closed and the socket created in
    the same step, so nothing else on the loop can take that descriptor in between.
    ``tls``: create_connection's ``ssl``, ``server_hostname``, ``ssl_handshake_timeout``
    (proxy.tls)."""
    if spare_fd is None:
        return await loop.create_connection(protocol_factory, host, port, **tls)
    try:
        family = _literal(host)
        if family is not None:
            addrs = [(family, (host, port))]
        else:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            addrs = [(info[0], info[4]) for info in infos]
        last = None
        for family, addr in addrs:
            if spare_fd is not None:
                os.close(spare_fd)
                spare_fd = None
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                await loop.sock_connect(sock, addr)
                return await loop.create_connection(protocol_factory, sock=sock, **tls)
            except BaseException as exc:
                sock.close()
                if not isinstance(exc, OSError):
                    raise
                last = exc
        raise last if last is not None else OSError(f"cannot resolve {host!r}")
    finally:
        if spare_fd is not None:
            os.close(spare_fd)
