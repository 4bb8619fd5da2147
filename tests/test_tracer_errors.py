"""A tracer that asserts fails its test (issue 21): both parser twins used to swallow
whatever the test-only tracer raised, so a tracer's check could never fail.  Now the
first exception is kept and raised when feed(), expire() or close() returns, after the
parser finished the call in a consistent state."""

import pytest

from tests.parsers import impl_fixture, make as make_parser
from tests.test_parser_flymq import produce

impl, IMPLS = impl_fixture("flymq")


class Boom(AssertionError):
    pass


def _raise(_row):
    raise Boom("the tracer's check failed")


def test_an_exception_in_the_tracer_reaches_the_caller_of_feed(impl):
    stats, p = make_parser(impl, "flymq", "fly")
    p.tracer = _raise
    with pytest.raises(Boom):
        p.feed(0, produce())
    p.tracer = None
    assert p.feed(0, produce()) == len(produce())    # the parser carries on
    assert stats.snapshot()["frames"][("c2s", "PRODUCE")] == 2


def test_an_exception_in_the_tracer_reaches_the_caller_of_close(impl):
    stats, p = make_parser(impl, "flymq", "fly")
    p.feed(0, produce())                            # pending: close() emits its row
    p.tracer = _raise
    with pytest.raises(Boom):
        p.close()
    assert stats.snapshot()["cutoffs"] == {"PRODUCE": 1}
