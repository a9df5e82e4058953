"""tests/benchmarks/compare.py: which figures got worse between two benchmark result files."""

from __future__ import annotations

import json

from tests.benchmarks.compare import compare, main

BEFORE = {"machine": "x", "table": "| ... |",
          "scheduler": [{"p": 10000, "result_partition_type": "BLOCKING", "step": "schedule all", "median_ms": 800.0},
                        {"p": 10000, "result_partition_type": "BLOCKING", "step": "global failover", "median_ms": 1200.0}],
          "streaming": {"structured": {"sustained_rows_per_s": 1_000_000}, "funke": {"1": {"p50_ms": 400,
                                                                                      "batches": 30}}}}
AFTER = {"machine": "x", "table": "| ... |",
         "scheduler": [{"p": 10000, "result_partition_type": "BLOCKING", "step": "global failover", "median_ms": 300.0},
                       {"p": 10000, "result_partition_type": "BLOCKING", "step": "schedule all", "median_ms": 1100.0}],
         "streaming": {"structured": {"sustained_rows_per_s": 700_000}, "funke": {"1": {"p50_ms": 410,
                                                                                     "batches": 10}}}}


def test_slower_times_and_lower_rates_are_flagged_rows_matched_by_their_text_not_their_place():
    rows = {path: (verdict, round(factor, 3)) for path, _, _, factor, verdict in compare(BEFORE, AFTER, 1.2)}
    schedule = next(p for p in rows if "schedule all" in p)
    failover = next(p for p in rows if "global failover" in p)
    assert rows[schedule] == ("WORSE", 1.375) and rows[failover] == ("better", 0.25)
    assert rows["streaming/structured/sustained_rows_per_s"] == ("WORSE", round(1 / 0.7, 3))
    assert rows["streaming/funke/1/p50_ms"][0] == "same"
    assert not [p for p in rows if p.endswith("batches") or p.startswith("table")]  # counts are not judged


def test_the_exit_status_says_whether_anything_regressed(tmp_path, capsys):
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    before.write_text(json.dumps(BEFORE))
    after.write_text(json.dumps(AFTER))
    assert main([str(before), str(after)]) == 1
    out = capsys.readouterr().out
    assert "schedule all" in out and "global failover" not in out
    assert main([str(before), str(before)]) == 0
