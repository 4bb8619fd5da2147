"""An undecoded TCP route: what a Toxiproxy proxy created through the API without
``frametap_protocol`` is (docs/design.md, "Faults").

The relay asks a route's protocol for a parser; this one decodes nothing and forwards
every read whole, counting its bytes (``frametap_bytes_total``) and nothing per frame.
It belongs to no protocol folder and is not in the protocol registry: no config file,
CLI flag, Locust user or demo offers it, only the API.
"""

from proxy.faultspec import UNDECODED
from proxy.protocols.spec import ProtocolSpec

__all__ = ["NAME", "SPEC", "PassThroughParser"]

NAME = UNDECODED                      # "tcp": the route's protocol label in the metrics


class PassThroughParser:
    """The relay's parser interface (see proxy/framing_py.py ``FrameParser``) for bytes
    that are never decoded: ``feed`` takes every byte, holds none, finds no error."""

    output = None          # never rewrites or holds bytes
    error = None           # never finds a protocol error
    feed_frames = 0        # no frames: the relay's yield after big reads never triggers
    more = False           # ... and no read is ever cut at the frame cap
    recording = False      # no frame log (nothing to log per frame)

    def __init__(self, stats, max_frame_bytes=None, request_timeout=30.0, options=None):
        self.stats = stats
        self.conn_id = 0
        self.bytes_fed = 0                 # the relay's idle check reads this

    def feed(self, direction, data):
        n = len(data)
        self.bytes_fed += n
        self.stats.count_bytes(direction, n)
        return n

    def expire(self, now_ns, budget):
        return 0                           # no requests, no timeouts

    def abandon(self):
        pass

    def close(self):
        pass

    def attach_log(self, buffer, index):
        pass

    def set_hold(self, direction, on):
        pass

    # the fault engine (proxy/faults.py): an undecoded route has toxics only, which act
    # on bytes in the relay; there is no frame to arm a rule on
    fault_hook = None

    def set_faults(self, direction, mode, slots, record=True):
        return True                        # armed at once: nothing to wait for


class _PassThroughSpec(ProtocolSpec):
    """The descriptor the relay reads (``load_parser``, ``max_frame_bytes``)."""

    def load_parser(self, pure_python=None):
        return PassThroughParser


SPEC = _PassThroughSpec(name=NAME, package=__name__, parser_class="PassThroughParser",
                        default_port=0, max_frame_bytes=1 << 31)
