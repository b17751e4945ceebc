"""The trackers (stabexp.tracking): TensorBoard, MLflow and W&B get the values the CSV files
hold, at the same steps, without changing a byte of the run folder; a resumed run logs no step
twice; a sweep is grouped the tracker's way; a failing tracker is a warning; old sweeps export
to TensorBoard. Nothing here reaches the network (W&B runs offline, MLflow on a sqlite file)."""

import glob
import logging
import math
from pathlib import Path

import pandas as pd
import pytest

from conftest import TINY, assert_same_files, fail_at_step
from stabexp.config import run_name
from stabexp.model.init import deepnorm_encoder_decoder
from stabexp.train.trainer import train

pytest.importorskip("tensorboard")


def events(folder: Path):
    """TensorBoard's own reader over a run's event files (every point kept)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return acc


def scalars(acc, tag: str) -> pd.Series:
    return pd.Series({e.step: e.value for e in acc.Scalars(tag)}, dtype=float)


def csv_column(path: Path, column: str, **where) -> pd.Series:
    rows = pd.read_csv(path)
    for key, value in where.items():
        rows = rows[rows[key] == value]
    rows = rows.dropna(subset=[column])
    return pd.Series(rows[column].values, index=rows.step.values, dtype=float)


def assert_same_points(logged: pd.Series, written: pd.Series, what: str) -> None:
    """The tracker holds each written step once, with its value (TensorBoard keeps float32)."""
    assert logged.index.is_unique, what
    assert list(logged.index) == list(written.index), what
    assert ((logged - written).abs() <= 1e-6 * written.abs() + 1e-30).all(), (what, logged, written)


def test_tensorboard_holds_the_csv_values_and_the_run_folder_is_unchanged(make_cfg, tmp_path):
    plain, watched = tmp_path / "sweep" / "plain", tmp_path / "sweep" / "watched"
    train(make_cfg(), plain)
    summary = train(make_cfg("logger=tensorboard"), watched)
    assert_same_files(plain, watched, "with and without logger=tensorboard")
    assert not any(p.name.startswith("events") for p in watched.iterdir())
    acc = events(tmp_path / "sweep" / "tensorboard" / "watched")  # beside the run folders
    for column in ("loss", "model_update", "grad_norm", "eval_loss", "lr"):
        assert_same_points(scalars(acc, column), csv_column(watched / "metrics.csv", column), column)
    for stack, layer, sublayer, column in (("decoder", 2, "ffn", "grad_norm"), ("encoder", 1, "self_attn", "ln_input_norm"),
                                           ("decoder", 1, "cross_attn", "max_attn_logit")):
        tag = f"{column}/{stack}/{layer}/{sublayer}"
        written = csv_column(watched / "layers.csv", column, stack=stack, layer=layer, sublayer=sublayer)
        assert_same_points(scalars(acc, tag), written, tag)
    assert scalars(acc, "summary/final_eval_loss").iloc[-1] == pytest.approx(summary["final_eval_loss"], rel=1e-6)
    assert set(acc.Tags()["images"]) == {"figures/model_update", "figures/grad_norm_by_layer"}
    assert "config/text_summary" in acc.Tags()["tensors"]


def test_a_resumed_run_continues_its_tracker_runs_without_a_step_twice(make_cfg, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = make_cfg("logger=[tensorboard,mlflow]", f"logger.mlflow.tracking_uri={uri}", "train.steps=12",
                   "train.checkpoint_every=4", "probe.every=1", "train.eval_every=4")
    out = tmp_path / "sweep" / "run"
    fail_at_step(monkeypatch, cfg, out, 7)  # steps 5 and 6 logged, the checkpoint at 4
    summary = train(cfg, out)
    assert summary["status"] == "completed" and summary["resumed_from"] == [4]
    written = csv_column(out / "metrics.csv", "loss")
    assert list(written.index) == list(range(1, 13))  # step 0 has no loss
    acc = events(tmp_path / "sweep" / "tensorboard" / "run")
    assert_same_points(scalars(acc, "loss"), written, "tensorboard loss")
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("sweep")
    (run,) = client.search_runs([experiment.experiment_id])  # the same MLflow run, continued
    assert run.info.status == "FINISHED" and run.data.tags["status"] == "completed"
    history = pd.Series({m.step: m.value for m in client.get_metric_history(run.info.run_id, "loss")})
    assert len(client.get_metric_history(run.info.run_id, "loss")) == len(written)
    assert_same_points(history.sort_index(), written, "mlflow loss")


def test_an_mlflow_sweep_is_one_experiment_with_a_run_per_job(stabexp_main, tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = stabexp_main("run", "-m", *TINY[1:], "depth=1,2", "group=deepnorm", "logger=mlflow",
                          f"logger.mlflow.tracking_uri={uri}", "hydra.sweep.dir=" + str(tmp_path / "outputs" / "sweep"))
    assert result.returncode == 0, result.stderr
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("sweep")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {p.name for p in (tmp_path / "outputs" / "sweep").iterdir() if (p / "summary.json").exists()}
    for name, run in runs.items():
        folder = tmp_path / "outputs" / "sweep" / name
        params, depth = run.data.params, int(name.split("__")[0].split("=")[1])
        assert params["group.name"] == "deepnorm" and params["depth"] == str(depth)
        alphas = deepnorm_encoder_decoder(depth, depth)  # DeepNorm's constants, resolved at init
        assert float(params["constants.alpha.encoder"]) == pytest.approx(alphas["encoder"]["alpha"], rel=1e-12)
        assert float(params["constants.alpha.decoder"]) == pytest.approx(alphas["decoder"]["alpha"], rel=1e-12)
        history = pd.Series({m.step: m.value for m in client.get_metric_history(run.info.run_id, "model_update")})
        assert_same_points(history.sort_index(), csv_column(folder / "metrics.csv", "model_update"), name)
        assert [a.path for a in client.list_artifacts(run.info.run_id, "figures")] == [
            "figures/grad_norm_by_layer.png", "figures/model_update.png"]


def wandb_records(run_file: Path):
    """The records of a W&B run file: a 7-byte header (":W&B", magic, version), then LevelDB's
    log format, 32 KiB blocks of records each behind a 7-byte header (crc32, length, type: 1 a
    whole record, 2-4 its first, middle and last pieces)."""
    data = Path(run_file).read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            yield pending
            pending = b""


def wandb_history(run_file: Path):
    """The history rows an offline W&B run file holds: {step: {key: value}}."""
    import json

    from wandb.proto import wandb_internal_pb2

    rows = {}
    for data in wandb_records(run_file):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            rows.setdefault(items["_step"], {}).update(items)
    return rows


def test_wandb_offline_writes_its_run_files(make_cfg, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "sweep" / "run"
    train(make_cfg("logger=wandb"), out)
    (run_file,) = glob.glob(str(tmp_path / "sweep" / "wandb" / "offline-run-*" / "run-*.wandb"))
    history = wandb_history(Path(run_file))
    for column in ("loss", "model_update"):
        written = csv_column(out / "metrics.csv", column)
        assert {step: history[step][column] for step in written.index} == written.to_dict(), column
    written = csv_column(out / "layers.csv", "grad_norm", stack="decoder", layer=2, sublayer="ffn")
    assert {step: history[step]["grad_norm/decoder/2/ffn"] for step in written.index} == written.to_dict()


def test_a_tracker_that_fails_is_a_warning_and_the_run_goes_on(make_cfg, tmp_path, monkeypatch, caplog):
    from stabexp.tracking import backends

    plain, watched = tmp_path / "plain", tmp_path / "watched"
    train(make_cfg(), plain)

    def unreachable(self, step, values):
        raise ConnectionError("tracking server unreachable")

    monkeypatch.setattr(backends.TensorBoard, "_log", unreachable)
    with caplog.at_level(logging.WARNING, logger="stabexp"):
        summary = train(make_cfg("logger=tensorboard"), watched)
    assert summary["status"] == "completed"
    warnings = [r.getMessage() for r in caplog.records if "logger tensorboard failed" in r.getMessage()]
    assert len(warnings) == 1 and "unreachable" in warnings[0]
    assert_same_files(plain, watched, "a failing tracker")


def test_a_logger_is_not_part_of_the_run(make_cfg):
    """Adding a tracker to a finished (or interrupted) sweep's command finds the same folders
    and resumes their checkpoints."""
    from stabexp.train.checkpoint import config_text

    assert run_name(["depth=2", "logger=[tensorboard,mlflow]", "logger.mlflow.experiment=x"]) == run_name(["depth=2"])
    assert config_text(make_cfg("logger=tensorboard")) == config_text(make_cfg())


def test_bad_logger_values_are_one_line(stabexp_main, monkeypatch):
    import importlib.util

    result = stabexp_main("run", "logger=tensorboard", "logger.tensorboard.logdir=x")
    assert result.returncode == 2 and "unknown key 'logger.tensorboard.logdir'" in result.stderr
    result = stabexp_main("run", "logger=wandb", "logger.wandb.mode=sometimes")
    assert result.returncode == 2 and "logger.wandb.mode=sometimes is not allowed" in result.stderr
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    result = stabexp_main("run", "logger=mlflow")
    assert result.returncode == 2 and 'EXTRAS=mlflow in a checkout, or pip install "mlflow>=' in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not stabexp_main.outputs.exists() or not any(stabexp_main.outputs.rglob("config.yaml"))


def test_export_tensorboard_gives_what_a_live_run_logs(make_cfg, stabexp_main, tmp_path):
    live, later = tmp_path / "live", tmp_path / "later"
    train(make_cfg("logger=tensorboard"), live / "run")
    train(make_cfg(), later / "run")
    for _ in range(2):  # a second export hides the first
        result = stabexp_main("export-tensorboard", str(later))
        assert result.returncode == 0, result.stderr
    a, b = events(live / "tensorboard" / "run"), events(later / "tensorboard" / "run")
    assert set(a.Tags()["scalars"]) == set(b.Tags()["scalars"])
    for tag in ("loss", "model_update", "grad_norm/decoder/2/ffn", "summary/final_eval_loss"):
        x, y = scalars(a, tag), scalars(b, tag)
        assert y.index.is_unique and list(x.index) == list(y.index), tag
        assert all(math.isclose(u, v, rel_tol=1e-6) for u, v in zip(x, y)), tag
    result = stabexp_main("export-tensorboard", str(tmp_path / "nothing_here"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1
