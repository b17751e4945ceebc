"""The Python API (stabexp.api) reads what the run wrote, as the report and the figures do."""

import json

import pandas as pd
import pytest

from stabexp import api
from stabexp.model.init import deepnorm_constants
from stabexp.report import sweep_table
from stabexp.train.trainer import train


@pytest.fixture
def sweep(make_cfg, tmp_path):
    folder = tmp_path / "multirun" / "mine"
    for group in ("postln", "deepnorm"):
        for depth in (1, 2):
            train(make_cfg(f"group={group}", f"depth={depth}"), folder / f"depth={depth}__group={group}")
    return folder


def test_a_sweep_is_its_runs_files_as_tables(sweep):
    tables = api.load_sweep(sweep)
    assert tables.folder == sweep and tables.runs is tables["runs"]
    assert sorted(tables.runs.run) == ["depth=1__group=deepnorm", "depth=1__group=postln",
                                       "depth=2__group=deepnorm", "depth=2__group=postln"]
    assert set(tables.runs.status) == {"completed"}
    one = tables.metrics[tables.metrics.run == "depth=2__group=deepnorm"].reset_index(drop=True)
    on_disk = pd.read_csv(sweep / "depth=2__group=deepnorm" / "metrics.csv")
    pd.testing.assert_frame_equal(one[on_disk.columns], on_disk)
    assert {"group", "depth", "seed", "stack", "layer", "sublayer", "grad_norm"} <= set(tables.layers.columns)
    # The report is the same markdown `stabexp report` prints.
    assert api.report(sweep) == sweep_table(sweep)
    assert "| deepnorm |" in api.report(sweep)


def test_a_run_carries_its_summary_config_and_csvs(sweep):
    run = api.load_sweep(sweep).run("depth=2__group=deepnorm")
    assert run.status == "completed"
    assert run.summary == json.loads((run.folder / "summary.json").read_text())
    assert run.config["group"]["name"] == "deepnorm" and run.config["depth"] == 2
    pd.testing.assert_frame_equal(run.metrics, pd.read_csv(run.folder / "metrics.csv"))
    pd.testing.assert_frame_equal(run.layers, pd.read_csv(run.folder / "layers.csv"))
    assert list(run.tables.runs.run) == ["depth=2__group=deepnorm"]
    assert run.summary["constants"]["deepnorm"]["decoder"]["alpha"] == pytest.approx(deepnorm_constants(2, 2)["decoder"]["alpha"])


def test_a_folder_that_is_not_a_run_is_one_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no summary.json"):
        api.load_run(tmp_path)
    with pytest.raises(FileNotFoundError, match="no folder"):
        api.load_sweep(tmp_path / "missing")
