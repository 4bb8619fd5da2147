"""RocketMQ remoting: request/response codes, frame parser (compiled + twin), codec,
route-data rewriting."""

from proxy.framing import NO_EXTENSIONS
from proxy.protocols.rocketmq.options import MAX_FRAME_BYTES, validate_options  # noqa: F401

if NO_EXTENSIONS:
    from proxy.protocols.rocketmq.parser_py import RocketMQParser
else:
    from proxy.protocols.rocketmq._parser import RocketMQParser

Parser = RocketMQParser
NAME = "rocketmq"
DEFAULT_PORT = 9876
