"""A minimal stand-in for proxy/faultspec.py (the "spec/API" part of issue 22, written
in parallel): only the attributes the fault engine reads, as that module's interface
promises them.  Delete this file when proxy/faultspec.py lands on main and construct
its Rule / Toxic / FaultSet instead.

Also a stand-in FlyMQ error reply (the "error replies" part: proxy/protocols/flymq/
faults.py), for the engine's FIFO-placement tests until that module lands."""

import ipaddress
import struct


class Rule:
    def __init__(self, name, action, directions=(0,), opcodes=None, resource=None,
                 peer=None, delay_ms=0, jitter_ms=0, rst=False, status=None, message="",
                 trigger="probability", probability=1.0, n=1):
        self.name = name
        self.directions = set(directions)
        self.opcodes = frozenset(opcodes) if opcodes is not None else None
        self.resource = resource
        self.peer = ipaddress.ip_network(peer) if peer is not None else None
        self.action = action
        self.delay_ms = delay_ms
        self.jitter_ms = jitter_ms
        self.rst = rst
        self.status = status
        self.message = message
        self.trigger = trigger
        self.probability = probability
        self.n = n


class Toxic:
    def __init__(self, name, type, stream="downstream", toxicity=1.0, **attributes):
        self.name = name
        self.type = type
        self.stream = stream
        self.toxicity = toxicity
        self.attributes = attributes


class FaultSet:
    def __init__(self, rules=(), toxics=()):
        self._rules = list(rules)
        self._toxics = list(toxics)
        self.version = 0
        self._subs = []

    def rules(self):
        return list(self._rules)

    def toxics(self):
        return list(self._toxics)

    def subscribe(self, callback):
        self._subs.append(callback)

    def _changed(self):
        self.version += 1
        for cb in self._subs:
            cb()

    def set(self, rules=None, toxics=None):
        if rules is not None:
            self._rules = list(rules)
        if toxics is not None:
            self._toxics = list(toxics)
        self._changed()


class FlyMQReplies:
    """proxy/protocols/flymq/faults.py's interface: the 0xFF error frame, text body."""

    DEFAULT_ERROR = "ERROR"

    @staticmethod
    def error_status(value):
        if value in ("ERROR", 1, "1"):
            return 1, "ERROR"
        raise ValueError("flymq: unknown error status %r" % (value,))

    @staticmethod
    def error_reply(request, code, label, message):
        body = (message or label).encode()
        return bytes([0xAF, 1, 0xFF, 0]) + struct.pack(">I", len(body)) + body
