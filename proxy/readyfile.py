"""The ``--ready-file PATH`` of ``frametap proxy`` and ``frametap serve``: a JSON document
naming every address the process listens on, written once all of them are bound.

A supervisor (or a test) starts the process with its listeners on port 0, waits for the
file to appear and reads the ports the kernel chose, instead of picking a "free" port
first and hoping nothing takes it before the process binds it. The file is written under
a temporary name in the same directory and renamed into place, so a reader never sees
half a document; it is removed when the process stops listening.

``frametap proxy`` writes::

    {"pid": 4242, "routes": {"stream": "127.0.0.1:40123"}, "admin": "127.0.0.1:40124",
     "api": "127.0.0.1:40125"}

(``admin`` is null without an admin endpoint, ``api`` without the fault API). ``frametap serve P`` writes::

    {"pid": 4243, "server": "rocketmq", "listen": ["127.0.0.1:40125", "127.0.0.1:40126"],
     "roles": {"broker": "127.0.0.1:40125", "namesrv": "127.0.0.1:40126"}}

(``listen`` in bind order; ``roles`` names the listeners of a server that has several
kinds). Addresses are written as the command line takes them: ``host:port``,
``[v6]:port``, ``unix:/path``, or for a WebSocket route its URL with the bound port
(``ws://127.0.0.1:40127/fleximq``).
"""

import json
import os

__all__ = ["write_ready_file", "remove_ready_file"]


def write_ready_file(path, data):
    """Write ``data`` as JSON to ``path`` atomically (temporary file, then rename)."""
    path = os.fspath(path)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def remove_ready_file(path):
    """Remove the ready file (the process no longer listens); a missing one is fine."""
    try:
        os.unlink(os.fspath(path))
    except FileNotFoundError:
        pass
