"""fleximq: message types, header summary, frame parser (compiled + pure-Python twin),
codec (docs/design.md, "fleximq")."""

from proxy.protocols.fleximq.constants import MAX_FRAME_BYTES
from proxy.protocols.spec import DemoSpec, ProtocolSpec

PROTOCOL = ProtocolSpec(
    name="fleximq",
    package=__name__,
    parser_class="FlexiMQParser",
    default_port=7890,                          # the document's tcp:// example
    max_frame_bytes=MAX_FRAME_BYTES,
    server="loadgen.fleximq.server",
    users="loadgen.fleximq.users",
    user_classes=("FlexiMQRequester", "FlexiMQResponder", "FlexiMQPubSub"),
    demo=DemoSpec(server_args=("--listen", "{server_listen}",
                               "--service-time", "{service_time}")),
)

NAME = PROTOCOL.name
DEFAULT_PORT = PROTOCOL.default_port
__getattr__ = PROTOCOL.module_getattr()       # Parser / FlexiMQParser, imported on first use
