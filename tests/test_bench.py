"""`stabexp bench` runs and reports every variant (it measures; this test times nothing)."""

import json

from stabexp.bench import _peak_memory_child, format_table, main, variant_names


def test_bench_reports_every_variant(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["--sizes", "tiny", "--depths", "1", "--repeats", "1", "--steps", "1",
                 "--batch-size", "4", "--no-memory", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [r["variant"] for r in report["rows"]] == variant_names()
    assert variant_names()[:2] == ["a", "b:postln"]
    assert all(r["steps_per_s"] > 0 and r["speed_vs_a"] > 0 for r in report["rows"])
    assert "| tiny | 1 | c:admin |" in capsys.readouterr().out
    assert "c:deepnorm" in format_table(report)


def test_peak_memory_of_a_variant_is_measured():
    assert _peak_memory_child("c:admin", "tiny", 1, 4, "cpu", 2) >= 0


def test_bad_bench_arguments_exit_2(capsys):
    import pytest

    for args in (["--sizes", "huge"], ["--depths", "0"], ["--depths", "x"]):
        with pytest.raises(SystemExit) as err:
            main(args)
        assert err.value.code == 2
    assert "huge" in capsys.readouterr().err
