"""RabbitMQ Stream: constants, frame parser (compiled + pure-Python twin), codec, rewriting."""

from proxy.framing import NO_EXTENSIONS
from proxy.protocols.rabbitmq_stream.constants import (DEFAULT_PORT, MAX_FRAME_BYTES,  # noqa: F401
                                                       command_name)
from proxy.protocols.rabbitmq_stream.rewrite import validate_options  # noqa: F401

if NO_EXTENSIONS:
    from proxy.protocols.rabbitmq_stream.parser_py import StreamParser
else:
    from proxy.protocols.rabbitmq_stream._parser import StreamParser

Parser = StreamParser
NAME = "rabbitmq-stream"
