"""`stabexp report`: a sweep as a group x depth markdown table."""

import json

import pytest

from stabexp.report import main, sweep_table
from stabexp.train.trainer import train


def test_report_table_of_a_sweep(make_cfg, tmp_path, capsys):
    sweep = tmp_path / "sweep"
    train(make_cfg("group=admin", "depth=1"), sweep / "a1")
    train(make_cfg("group=admin", "depth=2"), sweep / "a2")
    train(make_cfg("group=admin", "depth=2", "seed=1"), sweep / "a2s1")
    train(make_cfg("group=postln", "depth=2", "train.lr=1000", "train.steps=50"), sweep / "p2")
    train(make_cfg("group=admin", "depth=3", "decoder_depth=1", "train.steps=2"), sweep / "a3")
    table = sweep_table(sweep)
    lines = table.splitlines()
    assert "| group | 1L-1L | 2L-2L | 3L-1L |" in lines  # each column names its decoder's depth
    admin = next(line for line in lines if line.startswith("| admin |"))
    assert admin.count("(") == 3 and "n=2" in admin
    postln = next(line for line in lines if line.startswith("| postln |"))
    assert "diverged @ step" in postln and postln.rstrip().endswith("|")
    assert main([str(sweep)]) == 0 and "admin" in capsys.readouterr().out
    # The symbol task's rules, as the run recorded them, under the table.
    summary = json.loads((sweep / "a1" / "summary.json").read_text())["data"]
    assert (f'Rule "source counts at every position": {summary["source_counts_eval_loss"]:.3f} '
            f'({summary["source_counts_eval_acc"]:.3f})') in table
    assert f'Rule "each position\'s symbol frequencies": {summary["position_only_eval_loss"]:.3f}' in table


def test_runs_of_other_recipes_in_one_cell_are_rows_of_their_own(make_cfg, tmp_path):
    """Two sweeps of other train.steps into one sweep folder: each setting's seeds are a row of
    their own, never one mean over both recipes; a group whose cells each hold one setting keeps
    one row."""
    sweep = tmp_path / "sweep"
    for steps, seeds in ((2, (0, 1)), (4, (2, 3))):
        for seed in seeds:
            train(make_cfg("group=postln", "depth=2", f"seed={seed}", f"train.steps={steps}"),
                  sweep / f"depth=2__group=postln__seed={seed}__train.steps={steps}")
    train(make_cfg("group=admin", "depth=2"), sweep / "depth=2__group=admin")
    text = sweep_table(sweep)
    lines = text[text.index("| group |"):].split("\n\n")[0].splitlines()  # the main table
    rows = [line for line in lines if line.startswith("| postln")]
    assert [r.split(" | ")[0] for r in rows] == ["| postln (train.steps=2)", "| postln (train.steps=4)"]
    assert all("n=2" in r for r in rows)
    assert any(line.startswith("| admin | ") for line in lines)


def test_report_on_a_missing_folder_is_one_line(tmp_path, capsys):
    assert main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope" in err[0]


def test_settings_of_one_cell_are_a_table_with_their_spread():
    import pandas as pd

    from stabexp.analysis import setting_table
    from stabexp.report import settings_section

    overrides = ["experiment=x__group=deepnorm__robustness=base", "experiment=x__group=deepnorm__robustness=lr_x0.5",
                 "experiment=x__group=deepnorm__robustness=lr_x0.5__seed=1", "experiment=x__group=postln__robustness=base",
                 "experiment=x__group=postln__robustness=lr_x0.5"]
    runs = pd.DataFrame({"run": [f"r{i}" for i in range(5)], "group": ["deepnorm"] * 3 + ["postln"] * 2,
                         "depth": 18, "status": ["completed"] * 4 + ["diverged"], "overrides": overrides,
                         "final_eval_loss": [3.5, 4.0, 4.2, 3.4, None], "test_bleu": [15.0, 9.0, 8.0, 16.0, None]})
    table = setting_table(runs).set_index(["group", "setting"])
    assert table.loc[("deepnorm", "robustness=lr_x0.5"), "runs"] == 2  # the seeds of a setting are one cell
    assert table.loc[("deepnorm", "robustness=lr_x0.5"), "final_eval_loss"] == pytest.approx(4.1)
    assert table.loc[("deepnorm", "robustness=base"), "spread"] == pytest.approx(0.6)
    assert ("postln", "robustness=lr_x0.5") not in table.index  # a diverged run has no final loss
    lines = settings_section(runs)
    assert "| group | depth | robustness=base | robustness=lr_x0.5 | spread |" in lines
    assert "| deepnorm | 18 | 3.500 (15.00) | 4.100 (8.50) | 0.600 |" in lines
    assert "| postln | 18 | 3.400 (16.00) | - | 0.000 |" in lines
    assert settings_section(runs[runs.group == "postln"]) == []  # one setting per cell: nothing to compare
