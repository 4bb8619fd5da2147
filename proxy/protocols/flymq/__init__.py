"""FlyMQ: opcode table, frame parser (compiled + pure-Python twin) and codec."""

from proxy.framing import NO_EXTENSIONS
from proxy.protocols.flymq.opcodes import MAX_FRAME_BYTES, OPCODES, opcode_name  # noqa: F401

if NO_EXTENSIONS:
    from proxy.protocols.flymq.parser_py import FlyMQParser
else:
    from proxy.protocols.flymq._parser import FlyMQParser

Parser = FlyMQParser
NAME = "flymq"
DEFAULT_PORT = 9092
