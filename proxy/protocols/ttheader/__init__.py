"""Thrift over Kitex TTHeader, Apache THeader, framed and unframed transports: frame
parser (compiled + pure-Python twin), codec, constants."""

from proxy.protocols.spec import DemoSpec, ProtocolSpec
from proxy.protocols.ttheader.constants import MAX_FRAME_BYTES

PROTOCOL = ProtocolSpec(
    name="ttheader",
    package=__name__,
    parser_class="TTHeaderParser",
    default_port=8888,                          # Kitex's default service port
    max_frame_bytes=MAX_FRAME_BYTES,
    server="loadgen.ttheader.server",
    users="loadgen.ttheader.users",
    user_classes=("ThriftUser",),
    # no `needs`: the service loads its IDL at run time (thriftpy2), no compiler
    demo=DemoSpec(server_args=("--listen", "{server_listen}",
                               "--service-time", "{service_time}")),
)

NAME = PROTOCOL.name
DEFAULT_PORT = PROTOCOL.default_port
__getattr__ = PROTOCOL.module_getattr()       # Parser / TTHeaderParser, imported on first use
