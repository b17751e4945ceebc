"""train(cfg, out_dir) called directly on composed configs: files, probes, statuses."""

import json

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from stabexp.config import ConfigError
from stabexp.paths import conf_dir
from stabexp.model.placements import PLACEMENTS
from stabexp.probes import model_update
from stabexp.train.files import WALL_CLOCK
from stabexp.train.recording import LAYERS_COLUMNS, METRICS_COLUMNS
from stabexp.train.trainer import train


def _probe_steps(steps, first, every, eval_every):
    return [s for s in range(0, steps + 1)
            if s <= first or s % every == 0 or s % eval_every == 0 or s == steps]


# The groups an encoder-decoder runs: those of placements defined for one stack only (the
# decoder-only stabilisers of 2024-2025) are tested single-stack in tests/test_stabilisers_2025.py.
GROUPS = sorted(p.stem for p in (conf_dir() / "group").glob("*.yaml")
                if PLACEMENTS[OmegaConf.load(p).residual].encoder_decoder)
NO_NORM = {"rezero", "fixup", "t_fixup"}


@pytest.mark.parametrize("group", GROUPS)
def test_every_group_runs_and_writes_tidy_files(make_cfg, tmp_path, group):
    """Every probe, the ones at init included, means the same for every group of conf/group."""
    cfg = make_cfg(f"group={group}", "depth=2", "decoder_depth=3", "train.steps=7", "probe.at_init=true")
    summary = train(cfg, tmp_path)
    assert summary["status"] == "completed" and summary["steps_done"] == 7
    metrics = pd.read_csv(tmp_path / "metrics.csv")
    layers = pd.read_csv(tmp_path / "layers.csv")
    assert list(metrics.columns) == METRICS_COLUMNS
    assert list(layers.columns) == LAYERS_COLUMNS
    steps = _probe_steps(7, 2, 3, 3)
    assert metrics["step"].tolist() == steps
    # One row per (probe step, stack, layer, sublayer): 2 encoder layers x 2 + 3 decoder x 3.
    assert len(layers) == len(steps) * (2 * 2 + 3 * 3)
    first = layers[layers.step == steps[-1]]
    assert set(first.sublayer[first["stack"] == "encoder"]) == {"self_attn", "ffn"}
    assert set(first.sublayer[first["stack"] == "decoder"]) == {"self_attn", "cross_attn", "ffn"}
    assert sorted(set(first.layer[first["stack"] == "decoder"])) == [1, 2, 3]
    assert first.grad_norm.gt(0).all()
    # A group without a norm has an empty ln_input_norm column, never a made-up number.
    assert first.ln_input_norm.isna().all() if group in NO_NORM else first.ln_input_norm.gt(0).all()
    at_init = layers[layers.step == 0]
    # (Fixup's encoder gradient at init is exactly 0: every cross-attention's W_O is zero.)
    assert at_init.input_change.notna().all() and at_init.grad_norm.ge(0).all()
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["status"] == "completed" and written["group"] == group
    g = cfg.group
    placements = {s: g[f"{s}_residual"] or g.residual for s in ("encoder", "decoder")}
    assert written["constants"]["residual"] == (g.residual if len(set(placements.values())) == 1 else placements)
    assert (tmp_path / "config.yaml").exists()


def test_model_update_is_zero_before_the_first_step(make_cfg, tmp_path):
    train(make_cfg("group=postln"), tmp_path)
    metrics = pd.read_csv(tmp_path / "metrics.csv")
    assert metrics.loc[0, "step"] == 0 and metrics.loc[0, "model_update"] == 0.0
    assert (metrics.loc[1:, "model_update"] > 0).all()


def test_model_update_is_the_distance_from_a_kept_copy_of_the_initial_model(make_cfg, tmp_path):
    """The logged update after 3 steps against F(x, theta_0) of a deep copy taken before
    training and F(x, theta_3) of the trained model, both computed here."""
    import copy

    from stabexp.data import make_task
    from stabexp.train.trainer import Run

    cfg = make_cfg("group=admin", "probe.every=1")
    task = make_task(cfg, torch.device("cpu"))
    run = Run(cfg, tmp_path, {}, 0.0, task, show_progress=False)
    initial = copy.deepcopy(run.model)
    for step in (1, 2, 3):
        run.step(step)
    run.close()
    src, tgt_in, _ = task.probe_batch()
    with torch.no_grad():
        delta = run.model.eval().features(src, tgt_in) - initial.eval().features(src, tgt_in)
    expected = delta.norm(dim=-1).pow(2).mean().sqrt().item()
    logged = pd.read_csv(tmp_path / "metrics.csv").set_index("step").loc[3, "model_update"]
    assert expected > 0 and logged == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize("group, warmup, expected", [
    ("postln_warmup", 3, [1 / 3, 2 / 3, 1.0, (3 / 4) ** 0.5, (3 / 5) ** 0.5, (3 / 6) ** 0.5]),
    ("postln_warmup", 0, [1.0, 2 ** -0.5, 3 ** -0.5, 4 ** -0.5, 5 ** -0.5, 6 ** -0.5]),
    ("postln", 3, [1.0] * 6),
])
def test_the_lr_column_follows_the_schedule(make_cfg, tmp_path, group, warmup, expected):
    """Row i holds the lr of optimiser step i: linear warm-up to the peak at step `warmup`, then
    sqrt(warmup / i) (fairseq's inverse_sqrt); 1 / sqrt(i) without warm-up; constant for postln."""
    train(make_cfg(f"group={group}", f"train.warmup_steps={warmup}", "train.lr=0.01", "probe.every=1"), tmp_path)
    lr = pd.read_csv(tmp_path / "metrics.csv").set_index("step").lr
    assert lr.loc[1:].tolist() == pytest.approx([0.01 * f for f in expected], rel=1e-9)


def test_a_seed_fixes_every_file_and_another_seed_changes_them(make_cfg, tmp_path):
    def files(seed, name):
        train(make_cfg("group=admin", f"seed={seed}"), tmp_path / name)
        metrics = pd.read_csv(tmp_path / name / "metrics.csv").drop(columns="elapsed_s")
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        return metrics, (tmp_path / name / "layers.csv").read_bytes(), {k: v for k, v in summary.items()
                                                                        if k not in WALL_CLOCK}
    a, b, c = files(3, "a"), files(3, "b"), files(4, "c")
    pd.testing.assert_frame_equal(a[0], b[0], check_exact=True)
    assert a[1] == b[1] and a[2] == b[2]
    assert not a[0].loss.equals(c[0].loss) and a[1] != c[1]


@pytest.mark.parametrize("task", ["sort", "reverse", "teacher"])
@pytest.mark.parametrize("stream", ["train_batch", "init_batch", "eval_batch", "probe_batch"])
def test_every_batch_stream_follows_the_seed(make_cfg, task, stream):
    """The seed reaches the data, not only the init: each stream repeats under the same seed
    and changes under another."""
    from stabexp.data import make_task

    def draw(seed):
        return getattr(make_task(make_cfg(f"task={task}", f"seed={seed}"), torch.device("cpu")), stream)()[0]

    assert torch.equal(draw(3), draw(3))
    assert not torch.equal(draw(3), draw(4))


def test_model_update_does_not_depend_on_the_probe_batch_size():
    torch.manual_seed(0)
    f0, f1 = torch.randn(4, 5, 8), torch.randn(4, 5, 8)
    bigger = model_update(torch.cat([f1, f1, f1]), torch.cat([f0, f0, f0]))
    assert model_update(f1, f0).item() == pytest.approx(bigger.item(), rel=1e-6)
    # ... and it is the per-token RMS of the L2 change.
    per_token = (f1 - f0).norm(dim=-1)
    assert model_update(f1, f0).item() == pytest.approx(per_token.pow(2).mean().sqrt().item(), rel=1e-6)


def test_postln_first_step_moves_the_model_more_than_with_warmup(make_cfg, tmp_path):
    updates = {}
    for group in ("postln", "postln_warmup"):
        out = tmp_path / group
        train(make_cfg(f"group={group}", "train.steps=1", "train.warmup_steps=100"), out)
        updates[group] = pd.read_csv(out / "metrics.csv").set_index("step").loc[1, "model_update"]
    assert updates["postln"] > 10 * updates["postln_warmup"]


def test_forced_divergence_is_a_result(make_cfg, tmp_path):
    cfg = make_cfg("group=postln", "train.lr=1000", "train.steps=50")
    summary = train(cfg, tmp_path)
    assert summary["status"] == "diverged"
    k = summary["diverged_at_step"]
    assert 1 <= k <= 50 and summary["steps_done"] == k - 1
    metrics = pd.read_csv(tmp_path / "metrics.csv")
    assert metrics["step"].iloc[-1] == k  # the diverging loss is kept as the last row


def test_finished_run_is_not_overwritten(make_cfg, tmp_path):
    """Neither by the same config (left as is) nor by another (refused, tests/test_run_folders.py)."""
    cfg = make_cfg("group=postln")
    train(cfg, tmp_path)
    before = (tmp_path / "metrics.csv").read_bytes()
    assert train(make_cfg("group=postln"), tmp_path)["status"] == "completed"
    with pytest.raises(ConfigError, match=r"another config \(train.lr: 0.001 in the folder, 0.1 here\)"):
        train(make_cfg("group=postln", "train.lr=0.1"), tmp_path)
    assert (tmp_path / "metrics.csv").read_bytes() == before


def test_seed_fixes_the_run(make_cfg, tmp_path):
    a = train(make_cfg("group=admin", "seed=3"), tmp_path / "a")
    b = train(make_cfg("group=admin", "seed=3"), tmp_path / "b")
    assert a["last_loss"] == b["last_loss"]
    assert a["constants"]["admin_omega"] == b["constants"]["admin_omega"]


@pytest.mark.parametrize("group, extra", [("postln", []), ("admin", []),
                                          ("admin", ["probe.at_init=true", "probe.weights=true"]),
                                          # dropout: every probe leaves torch's generator as it found it
                                          ("preln", ["model.dropout=0.1", "probe.at_init=true", "probe.weights=true"])])
def test_probes_do_not_change_the_run(make_cfg, tmp_path, group, extra):
    """Probes at every step (with the at-init and weight probes too) and probes off give
    bit-identical losses and eval results."""
    common = [f"group={group}", "train.steps=8", "train.eval_every=4", *[e for e in extra if "dropout" in e]]
    on = train(make_cfg(*common, "probe.every=1", *extra), tmp_path / "on")
    off = train(make_cfg(*common, "probe.enabled=false"), tmp_path / "off")
    m_on = pd.read_csv(tmp_path / "on" / "metrics.csv").set_index("step")
    m_off = pd.read_csv(tmp_path / "off" / "metrics.csv").set_index("step")
    assert list(m_off.index) == [0, 4, 8] and m_off.model_update.isna().all()
    assert len(m_on) == 9 and m_on.model_update.notna().all()
    for col in ("loss", "eval_loss", "eval_acc"):
        pd.testing.assert_series_equal(m_on.loc[m_off.index, col], m_off[col], check_exact=True)
    for key in ("first_loss", "last_loss", "final_eval_loss", "final_eval_acc"):
        assert on[key] == off[key], key
    assert not (tmp_path / "off" / "layers.csv").read_text().strip().count("\n")


def test_layer_probe_grad_norms_match_a_direct_computation(make_cfg):
    from stabexp.data import ReverseTask
    from stabexp.model import build_model, initialise
    from stabexp.probes import LayerProbe

    cfg = make_cfg("group=admin", "depth=2")
    model = build_model(cfg, cfg.task.vocab_size)
    task = ReverseTask(cfg.task.vocab_size, cfg.task.seq_len, 0, torch.device("cpu"))
    initialise(model, "admin_profiled", lambda: task.init_batch(8))
    probe = LayerProbe(model)
    total, per_sublayer = probe.grad_norms()
    assert total.isnan() and per_sublayer.isnan().all()
    src, tgt_in, tgt_out = task.train_batch(8)
    torch.nn.functional.cross_entropy(model(src, tgt_in).flatten(0, 1), tgt_out.flatten()).backward()
    total, per_sublayer = probe.grad_norms()
    expected_total = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters()))
    assert total.item() == pytest.approx(expected_total.item(), rel=1e-5)
    for value, (*_, res) in zip(per_sublayer.tolist(), model.residuals()):
        direct = torch.sqrt(sum(p.grad.pow(2).sum() for p in res.parameters()))
        assert value == pytest.approx(direct.item(), rel=1e-5)


def test_a_step_of_two_batches_is_one_batch_of_their_rows(make_cfg, tmp_path):
    """train.update_freq=2 with batches of 4 rows against one batch of 8: the sort task's stream
    draws the same rows either way, so with no dropout every column of both files agrees to
    fp32 rounding (SGD with momentum, whose update does not amplify rounding as Adam's
    sign-like first steps do)."""
    common = ["group=preln", "model.dropout=0.0", "optim=sgdm", "train.lr=0.1", "train.steps=8",
              "probe.every=1", "train.eval_every=4"]
    train(make_cfg(*common, "train.batch_size=8"), tmp_path / "one")
    summary = train(make_cfg(*common, "train.batch_size=4", "train.update_freq=2"), tmp_path / "two")
    assert summary["status"] == "completed" and summary["steps_done"] == 8
    for name in ("metrics.csv", "layers.csv"):
        one, two = (pd.read_csv(tmp_path / run / name).drop(columns=list(WALL_CLOCK), errors="ignore")
                    for run in ("one", "two"))
        pd.testing.assert_frame_equal(one, two, check_exact=False, rtol=2e-5, atol=1e-6, obj=name)


def one_batch_of_their_rows(batches, pad_id):
    """(src, tgt_in, tgt_out) of all the batches' rows, each padded to the longest."""
    def padded(parts):
        width = max(t.shape[1] for t in parts)
        return torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1]), value=pad_id) for t in parts])
    return tuple(padded([b[k] for b in batches]) for k in range(3))


def test_the_batches_of_a_step_add_up_to_the_mean_over_all_their_tokens(make_cfg, corpus_dir):
    """Translation batches of different lengths and token counts: each one's summed loss over
    the count of the whole step's tokens adds up to the loss and gradient of one batch holding
    all their rows (padded to the longest), not to a mean of the batches' means."""
    from corpus import translation_overrides
    from stabexp.data import make_task, prepare
    from stabexp.model import build_model
    from stabexp.train.losses import training_loss, update_count

    cfg = make_cfg(*translation_overrides(corpus_dir), "train.label_smoothing=0.1", "train.max_tokens=60")
    prepare(cfg)
    task = make_task(cfg, torch.device("cpu"))
    torch.manual_seed(0)
    model = build_model(cfg, task.vocab_size, task.pad_id, task.max_positions)
    batches = [task.train_batch() for _ in range(3)]
    counts = [int(task.predicted(b[2]).sum()) for b in batches]
    assert len({b[2].shape for b in batches}) > 1 and len(set(counts)) > 1  # the test's premise

    def gradient(loss):
        model.zero_grad()
        loss.backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    whole = one_batch_of_their_rows(batches, task.pad_id)
    mean = task.loss(model(*whole[:2]), whole[2])
    expected = gradient(mean)
    count = update_count(task, batches)
    assert int(count) == sum(counts)
    model.zero_grad()
    total = 0.0
    for batch in batches:
        part = training_loss(model, task, batch, count=count)
        part.backward()
        total += part.item()
    assert total == pytest.approx(mean.item(), rel=1e-5)
    torch.testing.assert_close(torch.cat([p.grad.flatten() for p in model.parameters()]), expected,
                               rtol=1e-4, atol=1e-6)


def test_a_runs_step_of_several_batches_takes_the_gradient_of_their_token_mean(make_cfg, corpus_dir, tmp_path):
    """Run._gradient, what Run.step calls with train.update_freq > 1, on padded translation batches
    of different token counts, z-loss included: the loss it returns and the gradient it leaves
    are those of one batch of all their rows."""
    import time

    from corpus import translation_overrides
    from stabexp.data import make_task, prepare
    from stabexp.train.losses import z_loss
    from stabexp.train.run import Run

    cfg = make_cfg(*translation_overrides(corpus_dir), "train.label_smoothing=0.1", "train.max_tokens=60",
                   "train.z_loss=1e-4", "train.update_freq=3")
    prepare(cfg)
    task = make_task(cfg, torch.device("cpu"))
    run = Run(cfg, tmp_path, {}, time.perf_counter(), task, show_progress=False)
    batches = [task.train_batch() for _ in range(3)]
    assert len({int(task.predicted(b[2]).sum()) for b in batches}) > 1  # the test's premise

    src, tgt_in, tgt_out = one_batch_of_their_rows(batches, task.pad_id)
    model = run.model
    model.zero_grad()
    logits = model(src, tgt_in)
    mean = task.loss(logits, tgt_out) + 1e-4 * z_loss(logits, task.predicted(tgt_out))
    mean.backward()
    expected = torch.cat([p.grad.flatten() for p in model.parameters()])
    loss = run._gradient(batches)
    assert loss.item() == pytest.approx(mean.item(), rel=1e-5)
    torch.testing.assert_close(torch.cat([p.grad.flatten() for p in model.parameters()]), expected,
                               rtol=1e-4, atol=1e-6)
    run.close()
