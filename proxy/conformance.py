"""What every protocol package hands the conformance suite (tests/test_conformance.py).

A protocol's ``conformance.py`` module defines:

``conversations()``
    a list of :class:`Conversation`: golden exchanges in causal order (every request
    is fed before the response that answers it) with the counters and frame-log
    records they must produce.
``garbage()``
    a list of :class:`Garbage`: byte strings that are not this protocol, with the
    error reason they must be counted under.
``requests(n)``
    ``n`` distinct c2s requests that each expect an answer (for the pending-request
    limits: nothing answers them).
``frames()``
    a hypothesis strategy of random conversations: lists of ``(direction, bytes)``
    that the fuzzer cuts, mutates and feeds to both twins.
``PARSER_OPTIONS``
    keyword arguments for the parser (a route's defaults), optional.

Only tests import these modules (they use hypothesis, a test dependency).
"""

from dataclasses import dataclass, field

C2S, S2C = 0, 1


@dataclass
class Conversation:
    name: str
    steps: list                           # [(direction, frame bytes)], causal order
    counters: dict = field(default_factory=dict)   # subset of counters(stats) to match
    records: list = None                  # per record: a dict of fields to match, in order
    options: dict = field(default_factory=dict)    # parser options for this conversation
    close: bool = True                    # close() at the end (unanswered -> cutoffs)

    def bursts(self):
        """Consecutive same-direction steps joined: [(direction, bytes)]."""
        out = []
        for d, data in self.steps:
            if out and out[-1][0] == d:
                out[-1] = (d, out[-1][1] + data)
            else:
                out.append((d, data))
        return out


@dataclass
class Garbage:
    name: str
    direction: int
    data: bytes
    reason: str                           # frametap_protocol_errors_total reason
    fatal: bool = True                    # the connection must be closed (feed stops early)


def scheduled(schedule, c2s_frames, s2c_frames):
    """Steps from a schedule of (direction, first, end) slices of the two frame lists."""
    out = []
    for d, i, j in schedule:
        out.extend((d, f) for f in (c2s_frames if d == C2S else s2c_frames)[i:j])
    return out
