"""The presets (conf/experiment) end to end: real quick runs through the CLI, the collector's
table, every figure script, and the report's fits."""

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from omegaconf import open_dict

from conftest import run_cli
from stabexp.compose import compose
from stabexp.config import validate
from stabexp.paths import conf_dir
from stabexp.plotting.collect import RUN_COLUMNS
from stabexp.plotting.table import FIGURES, draw

ROOT = Path(__file__).resolve().parents[1]
PRESETS = sorted(p.stem for p in (conf_dir() / "experiment").glob("*.yaml"))
# Fewer steps than scale=quick itself, to keep the suite fast; the at-init presets train 0 steps.
SHORT = ["train.steps=12", "probe.first_steps=4", "probe.every=4", "train.eval_every=6"]
# Narrower than their quick sweeps, to keep the suite fast: still several groups, depths and
# seeds for every table, fit and figure they feed (every group runs in test_reference_numbers).
NARROWER = {"depth_table": ["group=postln,postln_warmup,preln,deepnorm,admin,rezero", "depth=2,3"],
            "grad_at_init": ["seed=0,1"], "admin_output_change": ["seed=0,1"], "admin_grad_vanishing": ["seed=0"],
            "deepnet_depth": ["depth=2,4"], "multi30k_table": ["depth=2,4"],
            "admin_hybrid": ["depth=3"], "admin_grid": ["optim.betas=[0.9,0.999]"],
            "admin_rezero": ["group=rezero,admin"], "deepnet_bleu_depth": ["group=deepnorm,postln,t_fixup", "depth=2"],
            "deepnet_depth_law": ["depth=2,4"], "deepnet_lm_depth": ["group=postln,admin,fixup,deepnorm", "depth=2"],
            "deepnet_robustness": ["group=deepnorm"], "curse_of_depth": ["group=preln,peri_ln,mix_ln", "depth=4"],
            "lr_sensitivity_2025": ["group=preln,peri_ln"], "deepnet_bound_encdec": ["depth=2"]}


@pytest.fixture(scope="module")
def quick_outputs(tmp_path_factory, corpus_dir):
    """Every preset at scale=quick (the training ones cut to 12 steps), then `make plots`.
    Multi30k is replaced by the toy corpus in its layout (tests reach no network)."""
    from corpus import translation_overrides

    outputs = tmp_path_factory.mktemp("reproduce") / "outputs"
    commands, trains = {}, set()
    for preset in PRESETS:
        cfg = compose([f"experiment={preset}", "scale=quick"])
        # The presets that train get fewer steps; those on Multi30k the toy corpus in its place.
        trains |= {preset} if cfg.train.steps > 0 else set()
        extra = (list(SHORT) if preset in trains else []) + NARROWER.get(preset, [])
        if cfg.task.name == "multi30k":
            extra += [o for o in translation_overrides(corpus_dir) if not o.startswith("task=")]
        commands[preset] = ["run", f"experiment={preset}", "scale=quick", *extra]

    # Through the CLI's own entry (stabexp.cli.main), in this process and one job after another
    # (hydra/launcher=basic): a new interpreter per preset and a process per packed job would cost
    # more than the jobs themselves. The packed launcher has its own tests (test_sweeps.py).
    from stabexp.cli import main

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STABEXP_OUTPUTS", str(outputs))
        patch.chdir(outputs.parent)
        for preset in PRESETS:
            patch.setattr(sys, "argv", ["stabexp"])  # `stabexp run` hands its arguments to Hydra there
            try:
                code = main([*commands[preset], "hydra/launcher=basic"])
            except SystemExit as exit:
                code = exit.code
            assert code in (0, None), preset
    env = dict(os.environ, STABEXP_OUTPUTS=str(outputs))
    plots = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_plots.py")], env=env,
                           capture_output=True, text=True)
    assert plots.returncode == 0, plots.stderr
    return SimpleNamespace(outputs=outputs, plots_stdout=plots.stdout, trains=trains)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("scale", ["default", "quick"])
def test_every_preset_composes_to_a_valid_multirun(preset, scale):
    cfg = compose([f"experiment={preset}", f"scale={scale}"], return_hydra_config=True)
    assert str(cfg.hydra.mode).endswith("MULTIRUN")
    assert cfg.experiment == preset and cfg.scale == scale
    params = dict(cfg.hydra.sweeper.params)
    assert set(params) <= {"group", "depth", "seed", "model", "optim", "train.lr", "optim.weight_decay",
                           "model.qk_norm", "train.z_loss", "optim.betas", "robustness", "train.qk_clip_tau"}
    if scale == "quick":
        assert cfg.model.d_model == 16 and all(int(d) <= 4 for d in str(params.get("depth", "2")).split(","))
        assert cfg.depth <= 4 or "depth" in params
    with open_dict(cfg):
        del cfg["hydra"]
    validate(cfg)


def test_preset_is_listed_with_its_description(stabexp_cli):
    result = stabexp_cli("list")
    assert result.returncode == 0
    for preset in PRESETS:
        assert preset in result.stdout


def test_a_bad_value_against_a_preset_is_one_line_and_runs_nothing(stabexp_cli):
    result = stabexp_cli("run", "experiment=deepnet_depth", "depth=0")
    assert result.returncode == 2
    assert result.stderr.strip() == "stabexp: error: depth=0 is not allowed: must be an integer >= 1"
    assert not (stabexp_cli.outputs / "multirun").exists()
    result = stabexp_cli("run", "experiment=deepnet_deep")
    assert result.returncode == 2 and "choose one of" in result.stderr and "deepnet_depth" in result.stderr


def test_collected_table_has_one_row_per_run_and_step(quick_outputs):
    runs = pd.read_csv(quick_outputs.outputs / "collected" / "runs.csv")
    metrics = pd.read_csv(quick_outputs.outputs / "collected" / "metrics.csv")
    layers = pd.read_csv(quick_outputs.outputs / "collected" / "layers.csv")
    assert set(RUN_COLUMNS) <= set(runs.columns) and set(RUN_COLUMNS) <= set(metrics.columns)
    assert runs.run.is_unique and set(runs.experiment) == set(PRESETS)
    assert set(runs.scale) == {"quick"} and set(runs.status) <= {"completed", "diverged"}
    assert not metrics.duplicated(["run", "step"]).any()
    assert not layers.fillna({"param": ""}).duplicated(["run", "step", "stack", "layer", "sublayer", "param"]).any()
    # Sweep sizes: groups x depths (x seeds), as the preset files say, or NARROWER where it narrows them.
    counts = runs.groupby("experiment").size()
    assert counts["deepnet_early"] == 6 and counts["deepnet_depth"] == 6 * 2
    assert counts["admin_output_change"] == 3 * 3 * 2 and counts["smd"] == 3
    assert counts["multi30k_table"] == 6 * 2
    assert counts["admin_clinic"] == 3 * 5 and counts["deepnet_early_paper"] == 3
    assert counts["deepnet_depth_paper"] == 2 * 3 and counts["grad_at_init"] == 3 * 3 * 2
    assert counts["depth_table"] == 6 * 2
    assert counts["lm_depth"] == 4 * 3 and counts["lr_sensitivity"] == 2 * 2 * 2
    assert counts["admin_grad_vanishing"] == 4 * 2 and counts["admin_hybrid"] == 4
    assert counts["admin_grid"] == 3 * 2 and counts["admin_dependency"] == 3 and counts["admin_rezero"] == 2
    assert counts["deepnet_bleu_depth"] == 3 and counts["deepnet_depth_law"] == 2 * 2
    assert counts["deepnet_bound"] == 3 * 2 and counts["deepnet_1000_layers"] == 3 and counts["lm_1000_layers"] == 3
    assert counts["deepnet_lm_depth"] == 4 and counts["deepnet_robustness"] == 3
    assert counts["curse_of_depth"] == 3 and counts["lr_sensitivity_2025"] == 2 * 2
    assert counts["lr_sensitivity_muon"] == 2 * 2 and counts["deepnet_bound_encdec"] == 3
    lm = runs[runs.experiment.isin(["lm_depth", "lr_sensitivity"])]
    assert lm.task.eq("lm").all() and lm.decoder_depth.isna().all()
    paper_recipe = runs[runs.experiment.str.endswith("_paper")]
    assert paper_recipe.test_bleu.isna().all() and paper_recipe.task.eq("multi30k").all()
    first = metrics[metrics.experiment.str.endswith("_paper") & (metrics.step == 1)]
    warm = first.group != "postln"  # fairseq's warm-up from 1e-7; postln: the peak lr from update 1
    assert len(first) == 3 + 6 and first[warm].lr.eq(1e-7).all() and first[~warm].lr.eq(5e-4).all()
    translated = runs[runs.experiment == "multi30k_table"]
    assert translated.test_bleu.between(0, 100).all() and (translated.task == "multi30k").all()
    trained = runs[runs.experiment.isin(quick_outputs.trains) & (runs.status == "completed")]
    assert (trained.steps_done == 12).all()
    at_init = metrics[metrics.experiment == "admin_output_change"]
    assert (at_init.step == 0).all() and at_init.output_change.gt(0).all()
    vanishing = layers[layers.experiment == "admin_grad_vanishing"]
    assert vanishing.output_grad_norm.gt(0).all()
    dependency = pd.read_csv(quick_outputs.outputs / "collected" / "dependency.csv")
    assert set(dependency.experiment) == {"admin_dependency"} and set(dependency.step) == {0, 12}
    w2 = layers[(layers.experiment == "grad_at_init")]
    assert w2[w2.sublayer == "ffn"].w2_grad_norm.gt(0).all()
    assert w2[w2.sublayer != "ffn"].w2_grad_norm.isna().all()


def test_every_figure_is_built_and_byte_reproducible(quick_outputs):
    figures = quick_outputs.outputs / "figures"
    first = {}
    for name in FIGURES:
        assert f"wrote {figures / name}.png" in quick_outputs.plots_stdout
        for ext in ("png", "pdf"):
            first[f"{name}.{ext}"] = (figures / f"{name}.{ext}").read_bytes()
            assert len(first[f"{name}.{ext}"]) > 1000
    env = dict(os.environ, STABEXP_OUTPUTS=str(quick_outputs.outputs))
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_plots.py")], env=env, check=True,
                   capture_output=True)
    for key, data in first.items():
        assert (figures / key).read_bytes() == data, key


def test_report_gives_the_lr_sensitivity_of_each_setting(quick_outputs):
    (sweep,) = (quick_outputs.outputs / "multirun").glob("experiment=lr_sensitivity__*")
    result = run_cli(quick_outputs.outputs, "report", str(sweep))
    assert result.returncode == 0, result.stderr
    losses = result.stdout.split("Largest attention logit")[0]  # the loss table, not the logit table below
    rows = [line for line in losses.splitlines() if line.startswith("| model.qk_norm=")]
    assert len(rows) == 4 and "| lr 0.001 | lr 0.1 | LR sensitivity |" in result.stdout
    # Each setting's LR sensitivity, by hand from the printed losses: the mean over the lr grid of
    # min(loss, loss_0) - loss*, loss_0 the mean eval loss at init of the setting's runs, a run
    # that did not complete counted as loss_0.
    runs = pd.read_csv(quick_outputs.outputs / "collected" / "runs.csv").query("experiment == 'lr_sensitivity'")
    metrics = pd.read_csv(quick_outputs.outputs / "collected" / "metrics.csv", low_memory=False)
    at_init = metrics[metrics.step == 0].set_index("run").eval_loss
    setting = runs.overrides.map(lambda o: " ".join(p for p in o.split("__")
                                                    if not p.startswith(("train.lr=", "experiment=", "scale="))))
    loss_0 = runs.assign(setting=setting, loss_0=runs.run.map(at_init)).groupby("setting").loss_0.mean()
    for row in rows:
        name, *losses, printed = [cell.strip() for cell in row.strip(" |").split("|")]
        values = [min(float(v), loss_0[name]) if v[0].isdigit() else loss_0[name] for v in losses]
        assert float(printed) == pytest.approx(sum(values) / len(values) - min(values), abs=2e-3), row


def test_report_prints_the_fits(quick_outputs):
    sweep = next((quick_outputs.outputs / "multirun").glob("experiment=admin_output_change__*"))
    result = run_cli(quick_outputs.outputs, "report", str(sweep))
    assert result.returncode == 0, result.stderr
    assert ("| group | points | sublayers | change_at_min | change_at_max | linear_r2 | log_r2 | seed_linear_r2 "
            "| seed_log_r2 |") in result.stdout
    # The printed fits are stabexp.analysis's on the same runs.
    from stabexp.analysis import last_w2_grad, output_change_fits, output_change_table, w2_grad_slopes
    from stabexp.plotting.collect import collect

    tables = collect(sweep)
    fits = output_change_fits(output_change_table(tables["metrics"], tables["layers"])).set_index("group")
    for group in ("postln", "preln", "admin"):
        f = fits.loc[group]
        assert (f"| {group} | 6 | 10-20 | {f.change_at_min:.3g} | {f.change_at_max:.3g} | {f.linear_r2:.3f} | "
                f"{f.log_r2:.3f} |") in result.stdout
    sweep = next((quick_outputs.outputs / "multirun").glob("experiment=grad_at_init__*"))
    printed = run_cli(quick_outputs.outputs, "report", str(sweep)).stdout
    slopes = w2_grad_slopes(last_w2_grad(collect(sweep)["layers"]))
    assert len(slopes) == 3
    for _, row in slopes.iterrows():
        assert f"| {row.group} | {row.points} | {row.slope:+.3f} | {row.r2:.3f} |" in printed
    sweep = next((quick_outputs.outputs / "multirun").glob("experiment=admin_clinic__*"))
    printed = run_cli(quick_outputs.outputs, "report", str(sweep)).stdout
    from stabexp.analysis import clinic_fits, encoder_input_change

    clinic = clinic_fits(encoder_input_change(collect(sweep)["layers"]))
    assert len(clinic) == 3 and (clinic.sublayers == 8).all() and (clinic.runs == 5).all()
    for _, row in clinic.iterrows():
        assert (f"| {row.model} | {row.group} | 5 | 8 | {row.change_at_1:.3g} | {row.change_at_last:.3g} | "
                f"{row.linear_r2:.3f} | {row.log_r2:.3f} | {row.seed_linear_r2} | {row.seed_log_r2} |") in printed
    assert "Post-LN / Pre-LN at the last sublayer (paper: about 13 at 200 sublayers)" in printed
    sweep = next((quick_outputs.outputs / "multirun").glob("*experiment=depth_table__*"))  # SHORT and NARROWER name it
    table = run_cli(quick_outputs.outputs, "report", str(sweep))
    assert "| group | 2L-2L | 3L-3L |" in table.stdout
    sweep = next((quick_outputs.outputs / "multirun").glob("*experiment=multi30k_table__*"))  # NARROWER names it
    table = run_cli(quick_outputs.outputs, "report", str(sweep)).stdout
    bleu = pd.read_csv(quick_outputs.outputs / "collected" / "runs.csv").query(
        "experiment == 'multi30k_table' and group == 'preln' and depth == 2").test_bleu.iloc[0]
    assert f"| preln | BLEU {bleu:.2f} (loss " in table and "Cells: test BLEU (sacreBLEU nrefs:1|" in table


def test_a_figure_without_its_preset_is_skipped_by_name(tmp_path, quick_outputs):
    # Only the deepnet_early runs: its three figures are drawn, the others name their preset.
    runs = pd.read_csv(quick_outputs.outputs / "collected" / "runs.csv")
    (tmp_path / "collected").mkdir()
    for name in ("runs", "metrics", "layers"):
        table = pd.read_csv(quick_outputs.outputs / "collected" / f"{name}.csv")
        table[table.run.isin(runs[runs.experiment == "deepnet_early"].run)].to_csv(
            tmp_path / "collected" / f"{name}.csv", index=False)
    for name, figure in FIGURES.items():
        line = draw(figure, tmp_path).line
        if figure.preset == "deepnet_early":
            assert line.startswith("wrote")
        else:
            assert line.startswith(f"skipped {name}: ") and f"stabexp run experiment={figure.preset}" in line
    # The command line draws the figures it names, a line each.
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_plots.py"), "model_update", "smd",
                             "--outputs", str(quick_outputs.outputs)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert [line.split(" ")[0] for line in result.stdout.splitlines()] == ["collected", "wrote", "wrote"]


def test_report_gives_the_layer_importance_and_the_stream_growth(quick_outputs):
    from stabexp.analysis import layer_importance_table, stream_growth
    from stabexp.plotting.collect import collect

    sweep = next((quick_outputs.outputs / "multirun").glob("*experiment=curse_of_depth*"))
    printed = run_cli(quick_outputs.outputs, "report", str(sweep)).stdout
    tables = collect(sweep)
    importance = layer_importance_table(tables["layer_importance"])
    assert sorted(importance.group) == ["mix_ln", "peri_ln", "preln"] and (importance.depth == 4).all()
    for _, row in importance.iterrows():
        assert (f"| {row.group} | 4 | decoder | 1 | {row.bottom_half:.4f} | {row.top_half:.4f} | "
                f"{row.largest:.4f} | {row.cheap_share:.2f} |") in printed
    for _, row in stream_growth(tables["layers"]).iterrows():
        assert f"| {row.group} | 4 | decoder | 1 | {row['first']:.2f} | {row['last']:.2f} | {row.growth:.2f} |" in printed
    sweep = next((quick_outputs.outputs / "multirun").glob("experiment=lr_sensitivity_muon*"))
    printed = run_cli(quick_outputs.outputs, "report", str(sweep)).stdout
    assert "Largest attention logit over the layers at the last probe step" in printed
    # Two settings (tau 0 and 100), each in the loss table and in the logit table.
    assert sum(line.startswith("| ") and "train.qk_clip_tau=" in line for line in printed.splitlines()) == 2 * 2
