"""Exception hierarchy shared by the proxy, the parsers and the codecs."""


class FrametapError(Exception):
    """Base of every error frametap raises on purpose."""


class ConfigError(FrametapError):
    """Bad command-line argument or config value: one line, exit status 2."""


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
