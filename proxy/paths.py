"""Where frametap's packaged files are, found without importing them.

A leaf module: ``proxy.cli`` and ``loadgen.demo`` both use it, and neither imports
the other at module level.
"""

import importlib.util


def locustfile_path():
    """Path of the packaged locustfile, without importing it (importing Locust
    gevent-patches the whole process)."""
    return importlib.util.find_spec("loadgen.locustfile").origin
