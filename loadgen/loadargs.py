"""``frametap load``'s arguments, checked before Locust starts any user.

:func:`choose_protocols` decides which protocols' users a run uses and checks ``--host``
against them (the rules: loadgen/locustfile.py's docstring); :func:`precheck` runs it on
a ``frametap load`` command line before Locust starts (so a mistake is one line and exit
status 2, not a traceback per user class), and the packaged locustfile runs it again
from Locust's ``init`` event (for ``locust -f loadgen/locustfile.py``, and to narrow the
user classes).  Importing this module imports no Locust; checking a host imports the
chosen protocols' user modules (which do).
"""

import importlib
import os

from proxy import protocols

#: protocol name -> its ProtocolSpec, for every protocol that offers Locust users
PROTOCOLS = {spec.name: spec for spec in protocols.specs() if spec.users}


class LoadArgumentError(Exception):
    """A ``frametap load`` mistake: one line on stderr, exit status 2."""


def _host_problem(protocol, host):
    """Why ``protocol``'s users cannot use ``host`` (their own parse_host's message),
    or None."""
    module = importlib.import_module(PROTOCOLS[protocol].users)
    try:
        module.parse_host(host)
    except ValueError as exc:
        return str(exc)
    return None


def _split_host(host):
    """(scheme or None, port or None) of a Locust ``--host``."""
    text = host.strip()
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = None, text
    rest = rest.split("/", 1)[0]
    port = rest.rpartition(":")[2] if ":" in rest and not rest.endswith("]") else ""
    return scheme, int(port) if port.isdigit() else None


def choose_protocols(host, named_classes=(), env=None, headless=True):
    """``(protocols, why)``: which protocols' users a run uses, and how that was decided
    (None when FRAMETAP_PROTOCOLS said so).  LoadArgumentError for a run that cannot
    start: see the module docstring."""
    env = os.environ if env is None else env
    text = env.get("FRAMETAP_PROTOCOLS", "")
    given = [n.strip().lower() for n in text.split(",") if n.strip()]
    everything = ", ".join(PROTOCOLS)
    unknown = [n for n in given if n not in PROTOCOLS]
    if unknown:
        raise LoadArgumentError(f"FRAMETAP_PROTOCOLS={text!r}: unknown protocol "
                                f"{unknown[0]!r} (expected a comma list of: {everything})")
    if not host:
        if headless:
            raise LoadArgumentError(
                "--host is required: the address of the proxy route (or server) to load, "
                "e.g. --host 127.0.0.1:19092" + ("" if given else
                                                  f"; FRAMETAP_PROTOCOLS picks the users "
                                                  f"({everything})"))
        return (given or list(PROTOCOLS)), None      # the web UI's form may give the host
    if given:
        chosen, why = given, None
    elif named_classes:
        owners = {cls: name for name, spec in PROTOCOLS.items() for cls in spec.user_classes}
        chosen = sorted({owners[c] for c in named_classes if c in owners})
        why = "the user classes named"
        if not chosen:
            return list(PROTOCOLS), None      # Locust itself names the unknown class
    else:
        scheme, port = _split_host(host)
        if scheme is not None:
            chosen = [p for p in PROTOCOLS if _host_problem(p, host) is None]
            if not chosen:
                raise LoadArgumentError(
                    f"--host {host!r}: no protocol's users take the scheme {scheme}:// "
                    f"(give HOST:PORT, or a protocol's scheme: "
                    f"{', '.join(p + '://' for p in PROTOCOLS)})")
            why = f"the host's scheme {scheme}://"
            if len(chosen) > 1:
                raise LoadArgumentError(
                    f"--host {host!r}: the scheme {scheme}:// fits the users of "
                    f"{', '.join(chosen)}; set FRAMETAP_PROTOCOLS to one of them")
        else:
            chosen = [p for p, spec in PROTOCOLS.items() if port and spec.default_port == port]
            why = f"port {port} is {chosen[0]}'s usual port" if len(chosen) == 1 else None
            if len(chosen) != 1:
                raise LoadArgumentError(
                    f"--host {host}: which protocol does it speak? Set FRAMETAP_PROTOCOLS "
                    f"(one or more of {everything}), write the host as SCHEME://HOST:PORT "
                    f"(e.g. flymq://{host}), or name the user classes to run")
    for name in chosen:
        problem = _host_problem(name, host)
        if problem:
            raise LoadArgumentError(f"--host {host!r}: {name} users: {problem}")
    return chosen, why


def precheck(argv, env=None):
    """The one-line problem with a ``frametap load`` command line (Locust's arguments),
    or None.  Parsed with Locust's own parser (its config files and LOCUST_* variables
    included); anything that parser refuses, and ``--help``, is left to Locust."""
    import contextlib
    import io

    from locust.argument_parser import get_parser
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            opts = get_parser().parse_args(list(argv))
    except SystemExit:
        return None                       # Locust says it again, in its own words
    if getattr(opts, "worker", False) or getattr(opts, "list_commands", False) or \
            getattr(opts, "show_task_ratio", False) or \
            getattr(opts, "show_task_ratio_json", False):
        return None                        # a worker's host and users come from its master
    headless = bool(getattr(opts, "headless", False) or getattr(opts, "autostart", False))
    try:
        choose_protocols(opts.host, tuple(getattr(opts, "user_classes", None) or ()), env,
                         headless)
    except LoadArgumentError as exc:
        return str(exc)
    return None
