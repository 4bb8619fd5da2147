"""Address rewriting for RabbitMQ Stream Metadata responses (docs/design.md, "RabbitMQ Stream").

Clients (rstream, unless ``load_balancer_mode``) connect to the leader address that
Metadata advertises; without rewriting, those follow-on connections bypass the proxy.

Route options::

    [routes.options]
    advertise = { "rabbit-1:5552" = "proxyhost:5553", "rabbit-2:5552" = "proxyhost:5554" }
    rewrite_metadata = true     # default; false leaves Metadata untouched

Without ``advertise``, the route maps its own upstream to the address the client used
to reach the proxy, and a response naming a single broker is taken to be that
upstream (a one-node server often advertises a host name the proxy does not dial).
"""

from proxy.errors import ConfigError
from proxy.protocols import advertise
from proxy.framing_common import DIRECTIONS, R_BAD_BODY, REASONS
from proxy.protocols.rabbitmq_stream.codec import (StreamCodecError, decode_metadata_response,
                                                   encode_metadata_response)

OPTION_KEYS = {"advertise", "rewrite_metadata"}


def validate_options(options, where):
    """Check a route's [routes.options]; returns the normalised dict (ConfigError on error)."""
    for key in options:
        if key not in OPTION_KEYS:
            raise ConfigError(f"{where}.options: unknown key {key!r} "
                              f"(expected one of: {', '.join(sorted(OPTION_KEYS))})")
    out = {}
    rw = options.get("rewrite_metadata", True)
    if not isinstance(rw, bool):
        raise ConfigError(f"{where}.options.rewrite_metadata = {rw!r}: expected true or false")
    out["rewrite_metadata"] = rw
    adv = advertise.validate(options, where)
    if adv is not None:
        out["advertise"] = adv
    return out


class MetadataRewriter:
    """Maps the broker entries of a Metadata response; shared by both parser twins."""

    def __init__(self, advertise=None):
        self.advertise = advertise or {}

    @classmethod
    def from_options(cls, options):
        if not options.get("rewrite_metadata", True):
            return None
        return cls(options.get("advertise"))

    def target(self, host, port, n_brokers, local, upstream):
        if self.advertise:
            return self.advertise.get((host, port))
        if local is None:
            return None
        if n_brokers == 1 or (upstream is not None and (host, port) == tuple(upstream)):
            return local[0], local[1]
        return None

    def rewrite(self, frame, local, upstream, stats):
        """A whole Metadata response frame -> the frame to forward (re-framed if changed)."""
        try:
            corr, brokers, streams = decode_metadata_response(frame[8:])
        except StreamCodecError:
            stats.count_error(DIRECTIONS[1], REASONS[R_BAD_BODY])
            return frame
        changed = False
        mapped = []
        for ref, host, port in brokers:
            t = self.target(host, port, len(brokers), local, upstream)
            if t is not None and (t[0], t[1]) != (host, port):
                host, port = t
                changed = True
            mapped.append((ref, host, port))
        if not changed:
            return frame
        return encode_metadata_response(corr, mapped, streams)
