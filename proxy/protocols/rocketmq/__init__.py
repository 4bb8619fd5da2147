"""RocketMQ remoting: request/response codes, frame parser (compiled + twin), codec,
route-data rewriting."""

from proxy.protocols.rocketmq.constants import MAX_FRAME_BYTES
from proxy.protocols.rocketmq.options import validate_options
from proxy.protocols.spec import DemoRoute, DemoSpec, ProtocolSpec

PROTOCOL = ProtocolSpec(
    name="rocketmq",
    package=__name__,
    parser_class="RocketMQParser",
    default_port=9876,                          # the name server's
    max_frame_bytes=MAX_FRAME_BYTES,
    validate_options=validate_options,
    advertise=True,                             # route data names the brokers
    server="loadgen.rocketmq.server",
    users="loadgen.rocketmq.users",
    user_classes=("RocketMQProducer", "RocketMQConsumer"),
    # Name server + broker behind two routes; the name server's route data advertises
    # the broker's route, so the clients' broker traffic crosses the proxy too.
    demo=DemoSpec(
        server_args=("--namesrv", "{server_namesrv}", "--broker", "{server_broker}",
                     "--service-time", "{service_time}"),
        listeners=("namesrv", "broker"),
        routes=(DemoRoute("namesrv", "-namesrv",
                          options={"advertise": {"{server_broker}": "{proxy_broker}"}}),
                DemoRoute("broker", "-broker")),
        locust_listener="namesrv"),
)

NAME = PROTOCOL.name
DEFAULT_PORT = PROTOCOL.default_port
__getattr__ = PROTOCOL.module_getattr()       # Parser / RocketMQParser, imported on first use
