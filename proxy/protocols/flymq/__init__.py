"""FlyMQ: opcode table, frame parser (compiled + pure-Python twin) and codec."""

from proxy.protocols.flymq.constants import MAX_FRAME_BYTES, OPCODES, opcode_name  # noqa: F401
from proxy.protocols.spec import DemoSpec, ProtocolSpec

PROTOCOL = ProtocolSpec(
    name="flymq",
    package=__name__,
    parser_class="FlyMQParser",
    default_port=9092,
    max_frame_bytes=MAX_FRAME_BYTES,
    server="loadgen.flymq.server",
    users="loadgen.flymq.users",
    user_classes=("FlyMQProducer", "FlyMQConsumer"),
    demo=DemoSpec(server_args=("--listen", "{server_listen}",
                               "--service-time", "{service_time}")),
)

NAME = PROTOCOL.name
DEFAULT_PORT = PROTOCOL.default_port
__getattr__ = PROTOCOL.module_getattr()       # Parser / FlyMQParser, imported on first use
