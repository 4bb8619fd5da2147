"""``RequestReporter.timed``: the one timing helper of every protocol's Locust users.

Locust is not imported here (it would gevent-patch the pytest process); the request
event is a small recorder with Locust's ``fire(**kwargs)`` signature. Real Locust runs of
the users are in tests/test_locust_*.py.
"""

import time

import pytest

from loadgen.userbase import RequestReporter


class _RequestEvent:
    def __init__(self):
        self.fired = []

    def fire(self, **kwargs):
        self.fired.append(kwargs)


class _Events:
    def __init__(self):
        self.request = _RequestEvent()


class _Environment:
    def __init__(self):
        self.events = _Events()


class User(RequestReporter):
    request_type = "toy"

    def __init__(self):
        self.environment = _Environment()

    @property
    def fired(self):
        return self.environment.events.request.fired


def test_success_reports_unrounded_ms_and_what_the_block_set():
    user = User()
    with user.timed("PRODUCE", topic="t") as req:
        time.sleep(0.02)
        req["response_length"] = 42
    assert req["exception"] is None and user.last_exception is None
    (event,) = user.fired
    assert set(event) == {"request_type", "name", "response_time", "response_length",
                          "exception", "context", "start_time"}
    assert (event["request_type"], event["name"], event["response_length"]) == (
        "toy", "PRODUCE", 42)
    assert event["context"] == {"topic": "t"}
    assert isinstance(event["response_time"], float)
    assert 19.0 <= event["response_time"] < 1000.0
    assert event["response_time"] != round(event["response_time"])  # not rounded to ms
    assert abs(event["start_time"] - time.time()) < 5


def test_exception_is_the_failure_and_does_not_propagate():
    user = User()
    with user.timed("FETCH") as req:
        raise ConnectionResetError("gone")
    assert isinstance(req["exception"], ConnectionResetError)
    assert user.last_exception is req["exception"]
    assert user.fired[0]["exception"] is req["exception"]


def test_block_may_fail_without_raising_and_rename():
    user = User()
    with user.timed("PeerProperties") as req:
        req["name"] = "SaslAuthenticate"
        req["exception"] = ValueError("refused")
    assert user.fired[0]["name"] == "SaslAuthenticate"
    assert isinstance(user.fired[0]["exception"], ValueError)


def test_quiet_reports_only_failures():
    user = User()
    with user.timed("CONNECT", quiet=True):
        pass
    assert user.fired == []
    with user.timed("CONNECT", quiet=True):
        raise OSError("refused")
    assert [e["name"] for e in user.fired] == ["CONNECT"]


def test_interrupted_block_is_not_reported():
    class Stop(BaseException):  # like gevent's GreenletExit
        pass

    user = User()
    with pytest.raises(Stop):
        with user.timed("PULL_MESSAGE"):
            raise Stop()
    assert user.fired == []
