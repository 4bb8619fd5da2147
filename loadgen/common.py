"""Compatibility names for locustfiles written against the old ``loadgen.common``.

It held four jobs, each now in its own module; import from those:

* :mod:`loadgen.serverthread`: ``new_event_loop``, ``ServerThread``;
* :mod:`loadgen.servecli`: the ``frametap serve`` command line (``address_arg``,
  ``user_arg``, ``service_time_arg``, ``CommandLineError``, ``serve_main``);
* :mod:`loadgen.clientbase`: the sync clients' base (``parse_host``, ``connect_tcp``,
  ``SocketClient``, ``SentRequest``); ``format_address`` is :func:`proxy.addresses.format_peer`;
* :mod:`loadgen.userbase`: the Locust users' base (``env_int``, ``env_float``,
  ``env_bool``, ``env_choice``, ``Backoff``, ``RequestReporter``).
"""

from loadgen.clientbase import DEFAULT_TLS, SentRequest, SocketClient, connect_tcp, parse_host
from loadgen.servecli import (READY_FILE_HELP, CommandLineError, address_arg, serve_main,
                              service_time_arg, user_arg)
from loadgen.serverthread import ServerThread, new_event_loop
from loadgen.userbase import Backoff, RequestReporter, env_bool, env_choice, env_float, env_int
from proxy.addresses import format_peer as format_address

__all__ = [
    "new_event_loop", "ServerThread", "address_arg", "user_arg", "service_time_arg",
    "CommandLineError", "serve_main", "READY_FILE_HELP", "parse_host", "connect_tcp",
    "DEFAULT_TLS", "SocketClient", "SentRequest", "format_address",
    "env_int", "env_float", "env_bool", "env_choice", "Backoff", "RequestReporter",
]
