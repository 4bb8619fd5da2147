"""bench/run_bench.py's paired figure: frametap against the pass-through repeat by repeat.

Each repeat runs the two back to back (ABBA order), so a machine that drifts between two
speeds for seconds at a time moves both rounds of a pair alike.  A ratio of medians can
set one side's fast round against the other's slow one; the paired median cannot.  The
figure is printed beside the gated ratio as information.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import run_bench  # noqa: E402


def _runs(rows):
    return [{"proxy": proxy, "repeat": k, "rps": rps, "p50_us": 100, "p99_us": 150,
             "client_cpu_pct": 50.0}
            for k, pair in enumerate(rows) for proxy, rps in pair.items()]


def test_pairs_follow_the_repeats_and_skip_a_missing_partner():
    runs = _runs([{"passthrough": 100.0, "frametap": 90.0},
                  {"passthrough": 200.0, "frametap": 190.0},
                  {"frametap": 50.0}])              # its pass-through round failed
    assert run_bench.paired(runs, "frametap", "passthrough") == [0.9, 0.95]


def test_a_drifting_machine_flatters_the_ratio_of_medians_not_the_pairs():
    # scenario a of a real run (2026-11-27, run 3 of five): the machine sped up from ~2.0 M
    # to ~2.6 M requests/s over the run. The medians set frametap's fast third repeat
    # against the pass-through's slower middle round: 1.009, a PASS; the pairs say 0.931.
    rows = [{"passthrough": 2051414.6, "frametap": 1969543.5},
            {"passthrough": 2178469.6, "frametap": 2006886.6},
            {"passthrough": 2170396.6, "frametap": 2197493.9},
            {"passthrough": 2625563.9, "frametap": 2329363.7},
            {"passthrough": 2694713.4, "frametap": 2509519.7}]
    runs = _runs(rows)
    sc = run_bench.Scenario("a", "64 B", 16, 32, 64, "throughput", 0.95)
    check = run_bench.summarize(sc, runs, ["passthrough", "frametap"])["checks"]["rps"]
    assert round(check["ratio"], 3) == 1.009 and check["pass"]
    assert [round(v, 3) for v in check["paired"]] == [0.960, 0.921, 1.012, 0.887, 0.931]
    assert run_bench.paired_text(check) == (
        "; paired by repeat 0.931 [0.887-1.012], 3 of 5 pairs past the target (information)")


def test_paired_text_counts_pairs_past_either_kind_of_target():
    assert run_bench.paired_text({"target": ">= 0.95", "paired": [0.94, 0.96, 0.90]}) == (
        "; paired by repeat 0.940 [0.900-0.960], 2 of 3 pairs past the target (information)")
    assert run_bench.paired_text({"target": "<= 1.1", "paired": [1.0, 1.2]}) == (
        "; paired by repeat 1.100 [1.000-1.200], 1 of 2 pairs past the target (information)")
    assert run_bench.paired_text({"target": ">= 0.95", "paired": [0.9]}) == ""
    assert run_bench.paired_text({"target": ">= 0.95"}) == ""
