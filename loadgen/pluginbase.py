"""The base every frametap Locust plugin imports: :func:`install_once` hooks a plugin
class into Locust's events once per process and :func:`installed` finds the instance.

A plugin module (:mod:`loadgen.clientlog`, :mod:`loadgen.locustmetrics`,
:mod:`loadgen.tlsopts`, :mod:`loadgen.faultplugin`) defines a class with a ``LISTENERS``
mapping (Locust event name -> method name) and an ``add_arguments(parser)`` function,
and its ``install(events=None)`` calls ``install_once(plugin_cls, add_arguments,
events)``. :mod:`loadgen.plugins` installs them all; this module imports none of them,
so the plugins and their installer import each other in one direction only.
"""

from __future__ import annotations

__all__ = ["install_once", "installed"]

#: plugin class -> its one instance in this process
_installed: dict[type, object] = {}


def install_once(plugin_cls, add_arguments, events=None):
    """Hook one plugin into Locust's ``events`` (default ``locust.events``), once per
    process: its command-line options via ``add_arguments`` and one listener per entry of
    ``plugin_cls.LISTENERS`` (event name -> method name). Returns the plugin instance."""
    plugin = _installed.get(plugin_cls)
    if plugin is not None:
        return plugin
    if events is None:
        from locust import events      # Locust (and gevent's patching) only when used
    plugin = _installed[plugin_cls] = plugin_cls()
    events.init_command_line_parser.add_listener(add_arguments)
    for event, method in plugin_cls.LISTENERS.items():
        getattr(events, event).add_listener(getattr(plugin, method))
    return plugin


def installed(plugin_cls):
    """The instance of ``plugin_cls`` installed in this process, or None."""
    return _installed.get(plugin_cls)
