"""Ports for tests: bind port 0 and ask the process which port it got.

Every listener the tests start binds port 0 and reports the port the kernel chose
(``frametap proxy/serve --ready-file``, Locust's ``--frametap-ready-file``, Prometheus'
"Listening on" log line, ``server.sockets`` in-process). :func:`free_port` remains only
for the few programs that cannot do that — a RabbitMQ node, Spark's standalone master
and worker, Locust's ``--processes`` master port (its workers are forked before the master
binds) — and those callers retry on a collision (:func:`retry_on_collision`): a port
found free can be taken by another process before the program binds it.
"""

import socket
import warnings

__all__ = ["free_port", "PortCollision", "retry_on_collision", "COLLISION_MARKERS"]

#: Text a program prints when its port was taken between the pick and its bind.
COLLISION_MARKERS = ("address already in use", "eaddrinuse", "socket bind failure",
                     "bind address already in use")


def free_port(host="127.0.0.1"):
    """A port nothing listens on right now (the kernel's pick for port 0). Only for
    programs that cannot bind port 0 and report it; see the module docstring."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class PortCollision(Exception):
    """The program could not bind the port picked for it: pick another and retry."""


def collided(text):
    """True when ``text`` (a program's output) says its port was taken."""
    low = (text or "").lower()
    return any(marker in low for marker in COLLISION_MARKERS)


def retry_on_collision(start, attempts=5):
    """``start(port)`` with a fresh :func:`free_port` until it does not raise
    :class:`PortCollision` (at most ``attempts`` times)."""
    for attempt in range(attempts):
        port = free_port()
        try:
            return start(port)
        except PortCollision as exc:
            if attempt == attempts - 1:
                raise
            # visible in pytest's warnings summary: how often the race is actually lost
            warnings.warn(f"port {port} was taken before the program bound it; retrying on "
                          f"another ({str(exc).strip().splitlines()[-1][:200]})")
