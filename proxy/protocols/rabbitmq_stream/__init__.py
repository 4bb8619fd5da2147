"""RabbitMQ Stream: constants, frame parser (compiled + pure-Python twin), codec, rewriting."""

from proxy.protocols.rabbitmq_stream.constants import (DEFAULT_PORT, MAX_FRAME_BYTES,  # noqa: F401
                                                       command_name)
from proxy.protocols.rabbitmq_stream.rewrite import validate_options
from proxy.protocols.spec import DemoSpec, ProtocolSpec

PROTOCOL = ProtocolSpec(
    name="rabbitmq-stream",
    package=__name__,
    parser_class="StreamParser",
    default_port=DEFAULT_PORT,
    max_frame_bytes=MAX_FRAME_BYTES,
    validate_options=validate_options,
    advertise=True,                             # Metadata / route data name brokers
    server="loadgen.rabbitmq_stream.server",
    users="loadgen.rabbitmq_stream.users",
    user_classes=("StreamPublisher", "StreamConsumer"),
    demo=DemoSpec(server_args=("--listen", "{server_listen}",
                               "--service-time", "{service_time}")),
)

NAME = PROTOCOL.name
__getattr__ = PROTOCOL.module_getattr()       # Parser / StreamParser, imported on first use
