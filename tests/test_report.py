"""`stabexp report`: a sweep as a group x depth markdown table."""

import json

from stabexp.report import main, sweep_table
from stabexp.train.trainer import train


def test_report_table_of_a_sweep(make_cfg, tmp_path, capsys):
    sweep = tmp_path / "sweep"
    train(make_cfg("group=admin", "depth=1"), sweep / "a1")
    train(make_cfg("group=admin", "depth=2"), sweep / "a2")
    train(make_cfg("group=admin", "depth=2", "seed=1"), sweep / "a2s1")
    train(make_cfg("group=postln", "depth=2", "train.lr=1000", "train.steps=50"), sweep / "p2")
    table = sweep_table(sweep)
    lines = table.splitlines()
    assert "| group | 1L-1L | 2L-2L |" in lines
    admin = next(line for line in lines if line.startswith("| admin |"))
    assert admin.count("(") == 2 and "n=2" in admin
    postln = next(line for line in lines if line.startswith("| postln |"))
    assert "diverged @ step" in postln and postln.rstrip().endswith("|")
    assert main([str(sweep)]) == 0 and "admin" in capsys.readouterr().out
    # The symbol task's rules, as the run recorded them, under the table.
    summary = json.loads((sweep / "a1" / "summary.json").read_text())["data"]
    assert (f'Rule "source counts at every position": {summary["source_counts_eval_loss"]:.3f} '
            f'({summary["source_counts_eval_acc"]:.3f})') in table
    assert f'Rule "each position\'s symbol frequencies": {summary["position_only_eval_loss"]:.3f}' in table


def test_report_on_a_missing_folder_is_one_line(tmp_path, capsys):
    assert main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope" in err[0]
