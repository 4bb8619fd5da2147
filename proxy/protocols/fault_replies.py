"""What the five ``proxy/protocols/<pkg>/faults.py`` modules share: reading a fault
rule's ``status`` (a protocol's status name or a number) and the error type their
functions raise.

Each protocol's ``faults.py`` offers the same small interface, called by the fault
engine (``proxy/faults.py``) and by the rule validation (``proxy/faultspec.py``);
docs/adding-a-protocol.md, "Error replies", describes it:

``DEFAULT_ERROR``
    the status an ``error`` action uses when the rule names none.
``ERROR_NAMES``
    ``{name: code}``: the names ``error_status`` accepts (the protocol's own names, as
    in the ``status`` label of ``frametap_responses_total``).
``error_status(value) -> (code, label)``
    a name or a number (``int`` or a numeric string) to the code written on the wire
    and the status label the proxy's metrics will show for the reply; ValueError (one
    line, naming what is accepted) for anything else.
``error_reply(request, code, label, message) -> bytes | None``
    the whole reply frame for ONE whole c2s request frame, or None when the frame gets
    no reply (a oneway call, a response, a command without one).  Pure: no I/O, no
    state; ValueError for bytes that are not a well-formed frame of the protocol.
``is_request(request) -> bool``
    True when ``error_reply`` would answer the frame (never raises).

:func:`for_protocol` returns that module for a protocol name (``"rocketmq"``...).
"""

import importlib

from proxy.errors import show_value

__all__ = ["FaultReplyError", "resolve_status", "default_message", "for_protocol"]


class FaultReplyError(ValueError):
    """A status the protocol cannot send, or request bytes no reply can be made for."""


def _number(value):
    """The int a rule's status value spells, or None when it is a name."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    text = value.strip()
    body = text[1:] if text[:1] in "+-" else text
    if body.isascii() and body.isdigit() and len(body) <= 12:
        return int(text)
    return None


def resolve_status(protocol, value, names, label_of, lo, hi, success=(), hint=""):
    """``(code, label)`` of a rule's ``status``: a name from ``names`` (exact, or in
    upper case) or a number in ``lo..hi`` that is not one of the ``success`` codes.
    ``label_of(code)`` is the protocol's status namer (what the metrics show)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise FaultReplyError(
            f"{protocol}: an error status is a name or a number, not "
            f"{type(value).__name__} {show_value(value)}")
    numbers = f", or a number {lo}..{hi}" if hi >= lo else ""
    code = _number(value)
    if code is None:
        code = names.get(value)
        if code is None:
            code = names.get(value.strip().upper())
        if code is None:
            shown = value if len(value) <= 60 else value[:57] + "..."
            raise FaultReplyError(
                f"{protocol}: unknown error status {shown!r} (expected one of "
                f"{', '.join(names)}{numbers}{hint})")
    elif hi < lo:
        raise FaultReplyError(
            f"{protocol}: error status {show_value(code)} is a number, but this protocol's errors "
            f"carry no code (expected {', '.join(names)}{hint})")
    elif not lo <= code <= hi:
        raise FaultReplyError(
            f"{protocol}: error status {show_value(code)} is out of range (expected {lo}..{hi}, or one "
            f"of {', '.join(names)}{hint})")
    if code in success:
        raise FaultReplyError(
            f"{protocol}: status {value!r} means success ({label_of(code)}), not an error")
    return code, label_of(code)


def default_message(protocol, label, message):
    """The text an error reply carries: the rule's ``message``, else a line that says
    the proxy made it (a client's log then shows where the error came from)."""
    if message:
        # a lone surrogate cannot go on the wire: replaced, never an error
        return str(message).encode("utf-8", "replace").decode("utf-8")
    return f"frametap: injected {label}"


def for_protocol(name):
    """The ``faults`` module of protocol ``name`` (as in configs: ``rabbitmq-stream``...);
    imported on first use, like the rest of a protocol's folder."""
    from proxy import protocols
    return importlib.import_module(protocols.load(name).package + ".faults")
