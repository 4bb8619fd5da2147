"""fleximq: message types, header summary, frame parser (compiled + pure-Python twin),
codec (docs/design.md, "fleximq")."""

from proxy.protocols.spec import ProtocolSpec

PROTOCOL = ProtocolSpec(
    name="fleximq",
    package=__name__,
    parser_class="FlexiMQParser",
    default_port=7890,                          # the document's tcp:// example
    max_frame_bytes=1 << 30,                    # §7.1
    server="loadgen.fleximq.server",
    demo=None,
)

NAME = PROTOCOL.name
DEFAULT_PORT = PROTOCOL.default_port
__getattr__ = PROTOCOL.module_getattr()       # Parser / FlexiMQParser, imported on first use
