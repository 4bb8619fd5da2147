"""The short CI version of bench/fuzz_twins.py (issue 8: mutated frames through both
twins of every protocol's parser, 0 escaping exceptions, 0 disagreements; issue 19: no
case over the time budget, adversarial inputs and floods of colliding ids included);
`make soak` runs the long one (10 M frames per protocol, bigger adversarial inputs)."""

import io
import sys
from pathlib import Path

import pytest

import proxy.protocols
from proxy.framing import HAVE_EXTENSIONS

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from fuzz_twins import adversarial, fuzz  # noqa: E402

NAMES = sorted(s.name for s in proxy.protocols.specs())


@pytest.mark.skipif(not HAVE_EXTENSIONS, reason="comparing twins needs the compiled parsers")
@pytest.mark.parametrize("name", NAMES)
def test_mutated_frames_never_raise_and_the_twins_agree(name):
    out = io.StringIO()
    r = fuzz(name, 5000, seed=7, out=out)
    assert r["frames"] >= 5000
    assert (r["raised"], r["differ"], r["slow"]) == (0, 0, 0), out.getvalue()


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_EXTENSIONS, reason="comparing twins needs the compiled parsers")
@pytest.mark.parametrize("name", NAMES)
def test_adversarial_inputs_stay_within_the_time_budget(name):
    out = io.StringIO()
    r = adversarial(name, size=20_000, flood=20_000, bytes_max=3_000, out=out)
    assert r["attacks"] >= 2
    assert (r["raised"], r["differ"], r["slow"], r["flood_slow"]) == (0, 0, 0, []), \
        out.getvalue()
