"""Hash flooding of the pending map (issue 19): a client that picks its correlation ids
must not make the proxy's pending map probe a long chain on every request.

Before the fix the compiled map hashed (tag, key) with the bare splitmix64 finalizer,
an invertible function: ids whose hashes share their low bits were computed offline
(60,000 fleximq PINGs cost 2.7 s against 8.6 ms for random timestamps).  Now the hash
is keyed with a secret seed per map, and an insert that probes MAP_PROBE_LIMIT slots
rehashes under a new seed.  The pure-Python twin keeps its requests in a dict; it runs
the same check.
"""

import random
import sys
import time
from pathlib import Path

import pytest

from proxy.protocols.fleximq import codec
from tests.parsers import impl_fixture, make as make_parser

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from fuzz_twins import FLOOD_RATIO, FLOOD_SLACK, collector_off  # noqa: E402

impl, IMPLS = impl_fixture("fleximq")

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
TAG_PING = 4                     # proxy/protocols/fleximq/_parser.pyx: PING c2s, first use


def _unxorshift(y, s):
    x = y
    for _ in range(64 // s + 1):
        x = y ^ (x >> s)
    return x & M64


def _unmix(out):
    """The key that the old, unkeyed hash sent to ``out`` (splitmix64 finalizer inverted)."""
    z = _unxorshift(out, 31)
    z = z * pow(0x94D049BB133111EB, -1, 1 << 64) & M64
    z = _unxorshift(z, 27)
    z = z * pow(0xBF58476D1CE4E5B9, -1, 1 << 64) & M64
    z = _unxorshift(z, 30)
    return (z - (TAG_PING << 56) - GOLDEN) & M64


def _old_mix(key):
    z = (key + (TAG_PING << 56) + GOLDEN) & M64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & M64
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB & M64
    return z ^ (z >> 31)


def colliding_timestamps(n):
    """n PING timestamps whose old hashes all end in 32 zero bits: one home slot in any
    table of up to 2**32 entries.  Kept below 2**63 (msgpack writes them as uint64)."""
    out, i = [], 1
    while len(out) < n:
        key = _unmix(i << 32)
        if key < 1 << 63:
            out.append(key)
        i += 1
    return out


def _pings(timestamps):
    return b"".join(codec.ping(1000, ts) for ts in timestamps)


def _cost(impl, data, n):
    stats, parser = make_parser(impl, "fleximq", "fx")
    parser.map_limit = max(parser.map_limit, 2 * n)
    with collector_off():                     # as bench/fuzz_twins.py times its floods
        start = time.thread_time()
        assert parser.feed(0, data) == len(data)
        spent = time.thread_time() - start
    assert stats.in_flight == n, "every PING is pending: the map tracked them all"
    return spent


def test_the_generator_really_collides_under_the_old_hash():
    keys = colliding_timestamps(50)
    assert len(set(keys)) == 50
    assert {_old_mix(k) & 0xFFFFFFFF for k in keys} == {0}


@pytest.mark.slow
def test_chosen_ids_cost_what_random_ids_cost(impl):
    n = 20_000
    rng = random.Random(7)
    chosen = _pings(colliding_timestamps(n))
    randoms = _pings(rng.randrange(1, 1 << 62) for _ in range(n))
    chosen_s, random_s = [], []

    def within():
        return min(chosen_s) <= FLOOD_RATIO * min(random_s) + FLOOD_SLACK

    # interleaved, the fastest of three each (noise only adds time); over the bound, three
    # more of each before failing: a flood on an unkeyed map is x100 and more, not x2.1
    while len(chosen_s) < 3 or (len(chosen_s) < 6 and not within()):
        chosen_s.append(_cost(impl, chosen, n))
        random_s.append(_cost(impl, randoms, n))
    ratio = min(chosen_s) / max(min(random_s), 1e-9)
    # unkeyed: ~10,000 probes per insert, 100x and more; keyed: the same cost. Issue 19's
    # bound, x2, plus 2 ms for a random run that takes a millisecond or two
    assert within(), (
        "%d chosen PING ids took %.1f ms, random ones %.1f ms (x%.1f)"
        % (n, min(chosen_s) * 1e3, min(random_s) * 1e3, ratio))


@pytest.mark.skipif("c-parser" not in IMPLS, reason="no compiled parser (FRAMETAP_NO_EXTENSIONS)")
def test_a_long_probe_rehashes_under_a_new_seed():
    """Even with the seed known (here set to 0, which makes the keyed hash the old
    unkeyed one) a chain is broken: an insert that probes MAP_PROBE_LIMIT slots rehashes
    the map under a new seed, counted in map_reseeds; random ids never need one."""
    n = 5000
    stats, parser = make_parser(IMPLS["c-parser"], "fleximq", "fx")
    rng = random.Random(3)
    parser.feed(0, _pings(rng.randrange(1, 1 << 62) for _ in range(n)))
    assert parser.map_reseeds == 0
    assert stats.in_flight == n
    stats, parser = make_parser(IMPLS["c-parser"], "fleximq", "fx")
    parser.set_map_seed(0)
    parser.feed(0, _pings(colliding_timestamps(n)))
    assert 1 <= parser.map_reseeds <= 3, parser.map_reseeds
    assert stats.in_flight == n
