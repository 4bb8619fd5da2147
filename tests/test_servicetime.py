"""Service-time distribution parsing and sampling."""

import random
import statistics
import time

import pytest

from loadgen.servicetime import as_service_time, parse_duration, parse_service_time


@pytest.mark.parametrize("text,seconds", [
    ("0", 0.0), ("500us", 500e-6), ("500µs", 500e-6), ("2ms", 0.002), ("1.5s", 1.5),
    ("250ns", 250e-9), (" 3MS ", 0.003), ("0ms", 0.0),
])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["2", "ms", "2 parsecs", "-1ms", "2msx", "", "1e3ms"])
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_constant_and_zero():
    st = parse_service_time("500us")
    assert all(st.sample() == pytest.approx(500e-6) for _ in range(50))
    assert not st.is_zero
    zero = parse_service_time("0")
    assert zero.is_zero and zero.sample() == 0.0


@pytest.mark.parametrize("text", ["2ms±1ms", "2ms+-1ms", "2ms +- 1ms", "2ms+/-1ms"])
def test_uniform_range(text):
    st = parse_service_time(text, rng=random.Random(1))
    samples = [st.sample() for _ in range(5000)]
    assert min(samples) >= 0.001 and max(samples) <= 0.003
    assert min(samples) < 0.0011 and max(samples) > 0.0029  # really spread over the range
    assert statistics.mean(samples) == pytest.approx(0.002, rel=0.05)


def test_uniform_never_negative():
    st = parse_service_time("1ms±5ms", rng=random.Random(2))
    samples = [st.sample() for _ in range(5000)]
    assert min(samples) >= 0.0
    assert max(samples) <= 0.006 and max(samples) > 0.005


def test_exponential_mean():
    st = parse_service_time("exp:2ms", rng=random.Random(3))
    samples = [st.sample() for _ in range(20000)]
    assert min(samples) >= 0.0
    assert statistics.mean(samples) == pytest.approx(0.002, rel=0.05)
    assert max(samples) > 0.006  # has a tail, unlike a constant
    assert parse_service_time("exp:0").sample() == 0.0


@pytest.mark.parametrize("text", ["", "fast", "2ms±", "±1ms", "exp:", "exp:fast", "2ms±1",
                                  "3", "normal:2ms"])
def test_bad_text_raises_clear_value_error(text):
    with pytest.raises(ValueError, match="bad service time") as info:
        parse_service_time(text)
    assert "expected" in str(info.value)


def test_str_keeps_original_text():
    assert str(parse_service_time("2ms±1ms")) == "2ms±1ms"


# --------------------------------------------------------------------------- servers

def test_as_service_time():
    assert as_service_time(None) is None
    assert as_service_time("0") is None and as_service_time(parse_service_time("0ms")) is None
    assert as_service_time("2ms").mean == pytest.approx(0.002)
    with pytest.raises(ValueError, match="bad service time"):
        as_service_time("soon")
    with pytest.raises(ValueError, match="bad service time"):
        as_service_time(0.002)


def _flymq(service_time):
    from loadgen.flymq.client import FlyMQClient
    from loadgen.flymq.server import FlyMQServerThread
    srv = FlyMQServerThread(service_time=service_time).start()
    client = FlyMQClient("127.0.0.1", srv.port)
    return srv, client, client.list_topics


def _stream(service_time):
    from loadgen.rabbitmq_stream.client import StreamClient
    from loadgen.rabbitmq_stream.server import StreamBrokerThread
    srv = StreamBrokerThread(service_time=service_time).start()
    client = StreamClient("127.0.0.1", srv.port)
    return srv, client, lambda: client.metadata("no-such-stream")


def _stream_confirm(service_time):
    from loadgen.rabbitmq_stream.client import StreamClient
    from loadgen.rabbitmq_stream.server import StreamBrokerThread
    srv = StreamBrokerThread(service_time=service_time).start()
    client = StreamClient("127.0.0.1", srv.port)
    client.create("st")
    client.declare_publisher(1, "st")

    def publish_and_confirm():
        ids = client.publish_batch(1, [b"m1", b"m2"])
        assert client.wait_confirms(1, ids, timeout=5).complete
    return srv, client, publish_and_confirm


def _rocketmq(service_time):
    from loadgen.rocketmq.client import RocketMQClient
    from loadgen.rocketmq.server import RocketMQServerThread
    srv = RocketMQServerThread(service_time=service_time).start()
    client = RocketMQClient("127.0.0.1", srv.broker_port)
    return srv, client, lambda: client.get_max_offset("t", 0)


@pytest.mark.parametrize("setup", [_flymq, _stream, _stream_confirm, _rocketmq],
                         ids=["flymq", "rabbitmq-stream", "rabbitmq-stream-confirm",
                              "rocketmq"])
def test_every_reference_server_applies_its_service_time(setup):
    """``--service-time`` really delays the answers of every reference server (the Stream
    broker's answers and its PublishConfirms included)."""
    timings = {}
    for text in ("0", "60ms"):
        srv, client, request = setup(text)
        try:
            request()  # warm up
            started = time.perf_counter()
            for _ in range(3):
                request()
            timings[text] = (time.perf_counter() - started) / 3
        finally:
            client.close()
            srv.stop()
    assert timings["60ms"] >= 0.055
    assert timings["0"] < 0.03


def test_stream_broker_cli_takes_service_time():
    from loadgen.rabbitmq_stream.server import _make_broker, build_parser
    args = build_parser().parse_args(["--listen", "127.0.0.1:0", "--service-time", "2ms±1ms"])
    broker, _listen = _make_broker(args)
    assert broker.service_time is not None and broker.service_time.mean == pytest.approx(0.002)
    assert build_parser().parse_args([]).service_time is None
