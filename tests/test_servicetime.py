"""Service-time distribution parsing and sampling."""

import random
import statistics

import pytest

from loadgen.servicetime import parse_duration, parse_service_time


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
