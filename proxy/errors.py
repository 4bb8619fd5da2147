"""Exception hierarchy shared by the proxy, the parsers and the codecs."""


class FrametapError(Exception):
    """Base of every error frametap raises on purpose."""


class ConfigError(FrametapError):
    """Bad command-line argument or config value: one line, exit status 2."""


def show_value(value, limit=80):
    """``repr(value)`` on one line, cut to about ``limit`` characters (a whole table
    pasted into an error line helps nobody)."""
    try:
        text = repr(value)
    except ValueError:                  # an int beyond sys.get_int_max_str_digits()
        text = f"<{type(value).__name__} too large to print>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def bad_value(name, value, problem):
    """ConfigError for one bad value, named as the user wrote it.

    Config keys read ``routes[0].listen = 'x': problem``; command-line flags read like
    argparse's own errors, ``--listen: problem (got 'x')``.
    """
    if name.startswith("-"):
        return ConfigError(f"{name}: {problem} (got {show_value(value)})")
    return ConfigError(f"{name} = {show_value(value)}: {problem}")


class FrameError(FrametapError):
    """A byte stream that is not a valid frame sequence of its protocol.

    ``reason`` is the bounded label used in ``frametap_protocol_errors_total``;
    ``offset`` is the stream offset (bytes from the connection's start, in the
    frame's direction) where the offending frame begins.
    """

    def __init__(self, message, reason="bad_frame", direction="c2s", offset=0):
        super().__init__(message)
        self.reason = reason
        self.direction = direction
        self.offset = offset


class FlyMQFrameError(FrameError):
    """FlyMQ framing violation."""


PROTOCOL_FRAME_ERRORS = {"flymq": FlyMQFrameError}


def frame_error_class(protocol):
    return PROTOCOL_FRAME_ERRORS.get(protocol, FrameError)
