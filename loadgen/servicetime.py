"""Service-time distributions for the reference servers (``--service-time``).

Accepted text (whitespace ignored, case-insensitive units ``ns``, ``us``/``µs``, ``ms``,
``s``):

=================  ==========================================================
``0``              no delay
``500us``          constant 500 µs
``2ms±1ms``        uniform in [1 ms, 3 ms]; ``2ms+-1ms`` is the ASCII spelling
``exp:2ms``        exponential with a 2 ms mean
=================  ==========================================================

A uniform range whose lower end would be negative is cut at 0 (``1ms±5ms`` samples
uniformly in [0, 6 ms]): samples are never negative. A non-zero bare number without a unit
is refused, because "2" could mean seconds or milliseconds.
"""

from __future__ import annotations

import random
import re

__all__ = ["ServiceTime", "parse_service_time", "parse_duration", "as_service_time"]

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0}
_DURATION = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s)?$", re.IGNORECASE)


def parse_duration(text: str) -> float:
    """Parse ``"2ms"``, ``"1.5s"``, ``"500us"`` or ``"0"`` into seconds."""
    t = text.strip()
    m = _DURATION.match(t)
    if not m:
        raise ValueError(
            f"bad duration {text!r}: expected a number with a unit ns, us, ms or s "
            f"(e.g. '2ms', '500us')")
    value = float(m.group(1))
    unit = m.group(2)
    if unit is None:
        if value != 0:
            raise ValueError(
                f"bad duration {text!r}: missing unit (ns, us, ms or s), e.g. '{t}ms'")
        return 0.0
    return value * _UNITS[unit.lower()]


class ServiceTime:
    """A service-time distribution; :meth:`sample` returns seconds (never negative).

    ``kind`` is ``"constant"``, ``"uniform"`` or ``"exp"``; ``low``/``high`` bound the
    uniform range, ``mean`` is the distribution mean (before cutting at 0).
    """

    __slots__ = ("kind", "mean", "low", "high", "text", "_rng")

    def __init__(self, kind: str, mean: float, low: float = 0.0, high: float = 0.0,
                 text: str = "", rng: random.Random | None = None):
        if kind not in ("constant", "uniform", "exp"):
            raise ValueError(f"bad service-time kind {kind!r}: expected constant, uniform or exp")
        if mean < 0 or low < 0 or high < low:
            raise ValueError(f"bad service-time bounds mean={mean} low={low} high={high}")
        self.kind = kind
        self.mean = mean
        self.low = low
        self.high = high
        self.text = text
        self._rng = rng or random.Random()

    @property
    def is_zero(self) -> bool:
        """True when every sample is 0 (callers can skip the delay machinery)."""
        return self.mean == 0 and self.high == 0

    def sample(self) -> float:
        """One service time in seconds."""
        if self.kind == "constant":
            return self.mean
        if self.kind == "uniform":
            return self._rng.uniform(self.low, self.high)
        if self.mean == 0:
            return 0.0
        return self._rng.expovariate(1.0 / self.mean)

    def __repr__(self) -> str:
        return f"ServiceTime({self.text!r})"

    def __str__(self) -> str:
        return self.text


def parse_service_time(text: str, rng: random.Random | None = None) -> ServiceTime:
    """Parse a service-time spec (see the module docstring); ValueError on bad text."""
    if not isinstance(text, str):
        raise ValueError(f"bad service time {text!r}: expected text such as '2ms±1ms'")
    t = "".join(text.split())
    if not t:
        raise ValueError("bad service time '': expected e.g. '0', '500us', '2ms±1ms', 'exp:2ms'")
    try:
        if t.lower().startswith("exp:"):
            mean = parse_duration(t[4:])
            return ServiceTime("exp", mean, text=text.strip(), rng=rng)
        for sep in ("±", "+-", "+/-"):
            if sep in t:
                center_text, _, spread_text = t.partition(sep)
                center = parse_duration(center_text)
                spread = parse_duration(spread_text)
                return ServiceTime("uniform", center, max(0.0, center - spread),
                                   center + spread, text=text.strip(), rng=rng)
        value = parse_duration(t)
        return ServiceTime("constant", value, value, value, text=text.strip(), rng=rng)
    except ValueError:
        raise ValueError(
            f"bad service time {text!r}: expected e.g. '0', '500us', '2ms±1ms', "
            f"'2ms+-1ms' or 'exp:2ms' (durations need a unit: ns, us, ms or s)") from None


def as_service_time(value: "ServiceTime | str | None") -> ServiceTime | None:
    """A server's ``service_time`` argument as a distribution, or None when every sample
    would be 0 (or none was given): text is parsed (ValueError on bad text)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = parse_service_time(value)
    if not isinstance(value, ServiceTime):
        raise ValueError(f"bad service time {value!r}: expected a ServiceTime or text "
                         f"such as '2ms±1ms'")
    return None if value.is_zero else value
