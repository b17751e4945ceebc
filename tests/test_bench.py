"""`stabexp bench` runs and reports every variant (it measures; this test times nothing)."""

import json

import pytest

from corpus import translation_overrides
from stabexp.bench import format_table, main, variant_names


def test_bench_reports_every_variant(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["--sizes", "tiny", "--depths", "1", "--repeats", "1", "--steps", "1",
                 "--batch-size", "4", "--no-memory", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [r["variant"] for r in report["rows"]] == variant_names()
    assert variant_names()[:2] == ["a", "b:postln"]
    rows = {r["variant"]: r for r in report["rows"]}
    # Each speed is a median of per-window ratios against a, each probe cost one against the
    # group's own probes-off variant: a against itself is exactly 1, a b variant exactly 0.
    assert rows["a"]["speed_vs_a"] == 1.0
    assert [rows[f"b:{g}"]["probe_cost"] for g in ("postln", "deepnorm", "admin")] == [0.0, 0.0, 0.0]
    assert all(r["tokens_per_s"] / r["steps_per_s"] == pytest.approx(4 * 10) for r in report["rows"])
    assert "| tiny | 1 | c:admin |" in capsys.readouterr().out
    assert "c:deepnorm" in format_table(report)
    # Model FLOPs: torch's count of one step; the plain loop and stabexp's Post-LN are the same
    # model, and a probing variant is given its probes-off variant's count.
    assert rows["a"]["flops_per_token"] == pytest.approx(rows["b:postln"]["flops_per_token"], rel=1e-9)
    assert rows["a"]["flops_per_token"] > 0
    assert rows["c:admin"]["flops_per_token"] == rows["d:admin"]["flops_per_token"] == rows["b:admin"]["flops_per_token"]
    assert all(r["mfu"] is None for r in report["rows"]) and report["peak_tflops"] is None  # a CPU has no peak


def test_bench_on_real_text_batches(tmp_path, corpus_dir, capsys):
    """--task multi30k, pointed at the toy corpus: every variant, the baseline included, draws
    the same padded batches, so their target tokens per step agree."""
    out = tmp_path / "bench.json"
    overrides = [x for o in translation_overrides(corpus_dir) if not o.startswith(("task=", "train.max_tokens"))
                 for x in ("--override", o)]
    assert main(["--task", "multi30k", "--max-tokens", "200", "--sizes", "tiny", "--depths", "1", "--repeats", "1",
                 "--steps", "2", "--no-memory", "--out", str(out), *overrides]) == 0
    rows = json.loads(out.read_text())["rows"]
    per_step = {r["variant"]: r["tokens_per_s"] / r["steps_per_s"] for r in rows if not r["variant"].startswith("c:")}
    assert len(set(round(v, 6) for v in per_step.values())) == 1, per_step
    assert "Multi30k De-En batches of at most 200" in capsys.readouterr().out


@pytest.mark.slow
def test_peak_memory_of_a_variant_is_measured():
    """A fresh process per variant: the small model's steps take more memory than the tiny
    one's, and more than nothing."""
    import json
    import subprocess
    import sys

    def peak(size):
        cmd = [sys.executable, "-m", "stabexp.bench", "--memory-child", "b:postln", size, "2",
               json.dumps(["task=reverse", "train.batch_size=32"]), "cpu", "2"]
        return float(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()[-1])
    tiny, small = peak("tiny"), peak("small")
    assert small > tiny and small > 5  # MiB: d=256 weights, Adam state and activations


def test_bad_bench_arguments_exit_2(capsys):
    for args in (["--sizes", "huge"], ["--depths", "0"], ["--depths", "x"], ["--task", "wmt"]):
        with pytest.raises(SystemExit) as err:
            main(args)
        assert err.value.code == 2
    assert "huge" in capsys.readouterr().err
