"""Every figure `make plots` draws, in one table: a row per figure naming the preset whose runs
it draws, what it shows, and the function that draws it, either a plot kind of plotting/kinds.py
with its arguments or a one-off of plotting/deepnet.py, admin.py or others.py.

A figure reads only the collected tables (outputs/collected, plotting/collect.py), keeps its
preset's runs (plotting.figures.preset_tables) and writes outputs/figures/NAME.png and .pdf. A
figure drawn from cells (`recipe`) can also draw the committed table of finished runs
(docs/data, stabexp/cells.py) instead of outputs/. `python scripts/make_plots.py` is the command.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Dict, List, Optional

import pandas as pd

from stabexp.plotting import admin, deepnet, kinds, others
from stabexp.plotting.figures import preset_tables, read_collected, save, scale_note


@dataclass(frozen=True)
class Figure:
    name: str  # outputs/figures/NAME.png and .pdf
    preset: str  # the experiment whose runs it draws (conf/experiment/PRESET.yaml)
    shows: str  # one line: what it shows, of which paper
    draw: Callable  # the collected tables -> a figure, or None when they hold nothing to draw
    recipe: Optional[str] = None  # drawn from cells of this recipe: draw(cells, curves) instead


def _ln_input_norm(tables):
    # DeepNet Fig. 4's LN-input panels: a LayerNorm output has norm sqrt(d), so an input far
    # above it is what the LN divides down.
    runs = tables["runs"]
    d_model = runs.d_model.dropna() if "d_model" in runs else pd.Series(dtype=float)
    fig = kinds.over_steps(kinds.per_stack_mean(tables["layers"], "ln_input_norm"), runs,
                           [("ln_input_norm", "mean ||LN input|| per token", "log")], facet="stack")
    if fig is not None and len(d_model):
        for ax in fig.axes:
            ax.axhline(float(d_model.iloc[0]) ** 0.5, color="k", ls="--", lw=1,
                       label=f"sqrt(d) = {float(d_model.iloc[0]) ** 0.5:.1f}")
        fig.axes[-1].legend(fontsize=6)
    return fig


def _over_steps(columns, **options):
    """A kinds.over_steps figure of the metrics table."""
    return lambda tables: kinds.over_steps(tables["metrics"], tables["runs"], columns, **options)


def _over_depth_cells(column, ylabel, xlabel):
    """A kinds.over_depth figure of a recipe's completed cells at their default settings."""
    def draw(cells, curves):
        done = cells[(cells.setting == "") & (cells.status == "completed")]
        return kinds.over_depth(done, column, ylabel, xlabel=xlabel)
    return draw


MODEL_UPDATE = ("model_update", "model update ||F(x,θ_i) − F(x,θ_0)||", "log")

FIGURES: Dict[str, Figure] = {f.name: f for f in (
    # DeepNet (Wang et al. 2022, arXiv 2203.00555)
    Figure("model_update", "deepnet_early", "DeepNet Fig. 4 (v1): the model update over the steps of "
           "18L-18L models, a line per run", _over_steps([MODEL_UPDATE], step_scale="log")),
    Figure("ln_input_norm", "deepnet_early", "DeepNet Fig. 4 (v1): the mean LN input norm over the steps, "
           "encoder and decoder, against sqrt(d)", _ln_input_norm),
    Figure("grad_norm_by_layer", "deepnet_early", "DeepNet Fig. 4 (v1): each layer's gradient norm at "
           "step 1, encoder and decoder", deepnet.grad_norm_by_layer),
    Figure("deepnet_early_paper", "deepnet_early_paper", "DeepNet Fig. 4 (v1) at the paper's 18L-18L "
           "d = 512: model update, decoder LN inputs, decoder gradient per layer", deepnet.early_paper),
    Figure("model_update_vs_depth", "deepnet_depth", "DeepNet Fig. 5 (v1): the model update at "
           "steps 1, 10 and the last against depth", lambda t: kinds.update_vs_depth(t["metrics"])),
    Figure("model_update_vs_depth_table1", "depth_table", "DeepNet Fig. 5 (v1) for every Table 1 group: "
           "the model update at steps 1, 10, 100 against depth",
           lambda t: kinds.update_vs_depth(t["metrics"], last=min(100, int(t["metrics"].step.max())))),
    Figure("deepnet_depth_paper", "deepnet_depth_paper", "DeepNet Fig. 5 (v1) on Multi30k: the model "
           "update against depth with the paper's values", deepnet.depth_paper),
    Figure("depth_table", "depth_table", "DeepNet Table 1's analogue on the synthetic task: the final "
           "eval loss of every group at every depth", others.depth_table),
    Figure("depth_table_multi30k", "multi30k_table", "DeepNet Table 1's analogue on Multi30k: the test "
           "BLEU of every group at every depth", others.depth_table),
    Figure("translation", "multi30k_table", "Multi30k De-En: validation BLEU, loss and model update over "
           "the updates, a panel per depth",
           _over_steps([("valid_bleu", "validation BLEU", "linear"), ("eval_loss", "validation loss", "linear"),
                        MODEL_UPDATE], facet="depth")),
    Figure("deepnet_bleu_depth", "deepnet_bleu_depth", "DeepNet Fig. 6: test BLEU against depth, with "
           "the paper's IWSLT-14 read-offs", deepnet.bleu_depth, recipe="multi30k_table"),
    Figure("deepnet_lm_depth", "deepnet_lm_depth", "DeepNet Fig. 6's methods on a decoder-only LM: final "
           "validation loss against depth",
           _over_depth_cells("final_eval_loss", "final validation loss", "layers (decoder-only)"),
           recipe="lm_depth"),
    Figure("deepnet_robustness", "deepnet_robustness", "DeepNet Fig. 7: validation loss over the updates "
           "under one change of lr, batch or width", deepnet.robustness, recipe="multi30k_table"),
    Figure("deepnet_depth_law", "deepnet_depth_law", "DeepNet Fig. 8: final validation loss against "
           "log(depth) with each group's A ln(depth) + B", deepnet.depth_law, recipe="lm_depth"),
    Figure("deepnet_bound", "deepnet_bound", "DeepNet Theorem 4.1: the bound and the measured model "
           "update, over the steps and against depth", kinds.update_bound),
    Figure("deepnet_bound_encdec", "deepnet_bound_encdec", "DeepNet Theorem 4.3 on the encoder-decoder: "
           "the bound and the decoder's measured update", kinds.update_bound),
    Figure("deepnet_1000_layers", "deepnet_1000_layers", "DeepNet's title: training, eval loss and "
           "model update of 500L-500L models",
           partial(kinds.training_curves, title="500L-500L, 64-128-2, sort task")),
    Figure("lm_1000_layers", "lm_1000_layers", "A 1,000-layer decoder-only LM: training, eval loss and "
           "model update", partial(kinds.training_curves, title="1,000-layer decoder-only LM, 64-128-2, the built-in text")),
    Figure("lm_depth", "lm_depth", "Decoder-only LMs at 6, 18 and 100 layers: validation loss over the "
           "steps against the chance and unigram losses",
           _over_steps([("eval_loss", "validation loss (nats / token)", "linear")], facet="depth",
                       references={"chance_loss": "chance (uniform)",
                                   "unigram_eval_loss": "unigram (token frequencies)"})),
    # Admin (Liu et al. 2020, arXiv 2004.08249) and Transformer-Clinic
    Figure("admin_grad_vanishing", "admin_grad_vanishing", "Admin Theorem 1: each sublayer output's "
           "gradient at init along encoder and decoder", admin.grad_vanishing),
    Figure("output_change", "admin_output_change", "Admin Theorem 2: the output change at init against "
           "the number of sublayers, with linear and log fits", admin.output_change),
    Figure("admin_clinic", "admin_clinic", "Admin Fig. 4 as Transformer-Clinic measures it: each "
           "sublayer's input change along a deep encoder", admin.clinic),
    Figure("admin_dependency", "admin_dependency", "Admin Sec. 4.1: the residual dependency beta_ij at "
           "init and after training", admin.dependency),
    Figure("admin_grid", "admin_grid", "Admin's (lr, beta2) grid without warm-up: the final eval loss "
           "or divergence per cell", admin.grid),
    Figure("admin_hybrid", "admin_hybrid", "Admin Sec. 3's hybrids: final eval loss per depth, eval "
           "loss over the steps at the largest", admin.hybrid),
    Figure("admin_rezero", "admin_rezero", "ReZero against Post-LN and Admin on translation: test BLEU "
           "and validation BLEU", admin.rezero),
    Figure("admin_60l_12l", "admin_60l_12l", "Admin Sec. 5's 60-layer encoder under a 12-layer decoder: "
           "training, eval loss and model update", partial(kinds.training_curves, title="60L-12L")),
    # Xiong et al. 2020; the stabilisers of 2023-2025; spherical motion dynamics
    Figure("grad_at_init", "grad_at_init", "Xiong et al. 2020 Sec. 3: gradients at init against depth, "
           "the last W_2's slope, Pre-LN's stream growth", others.grad_at_init),
    Figure("lr_sensitivity", "lr_sensitivity", "Wortsman et al. 2023 Fig. 1 / 3: final loss against "
           "lr with qk-layernorm and z-loss", kinds.lr_sensitivity),
    Figure("lr_sensitivity_2025", "lr_sensitivity_2025", "LR sensitivity (Wortsman et al. 2023's panels) "
           "for Pre-LN, Peri-LN and DyT", kinds.lr_sensitivity),
    Figure("lr_sensitivity_muon", "lr_sensitivity_muon", "LR sensitivity (Wortsman et al. 2023's "
           "panels) for Muon with QK-Clip off and at tau 100", kinds.lr_sensitivity),
    Figure("curse_of_depth", "curse_of_depth", "The Curse of Depth Fig. 2 / Mix-LN Fig. 1: layer "
           "importance per position; the residual stream's norm", others.curse_of_depth),
    Figure("smd", "smd", "Spherical motion dynamics: angular update and weight norm against the "
           "theory's equilibrium", others.smd),
)}


@dataclass
class Outcome:
    figure: Figure
    drawn: bool
    line: str  # "wrote ..." or "skipped ...: ..."


def draw(figure: Figure, outputs: Path, tables: Optional[dict] = None, cells_table: Optional[Path] = None) -> Outcome:
    """Draw one figure from the collected tables under `outputs` (or `tables`, read once for many
    figures), or with `cells_table` from a committed table of cells; save it into
    outputs/figures. Nothing to draw (no runs of its preset) is an Outcome, not an error."""
    from stabexp import cells as cell_tables

    if cells_table is not None:
        cells = cell_tables.read(cells_table)
        cells = cells[cells.recipe == figure.recipe]
        curves_file = cell_tables.curves_path(cells_table)
        curves = (cell_tables.read(curves_file) if curves_file.is_file()
                  else pd.DataFrame(columns=cell_tables.CURVE_COLUMNS))
        curves = curves[curves.recipe == figure.recipe]
        fig = figure.draw(cells, curves) if not cells.empty else None
        source = f"{len(cells)} cells of {figure.recipe} in {cells_table}"
    else:
        tables = preset_tables(read_collected(outputs / "collected") if tables is None else tables, figure.preset)
        source = f"{len(tables['runs'])} runs of {figure.preset}{scale_note(tables['runs'])}"
        if tables["runs"].empty:
            fig = None
        elif figure.recipe:
            cells, curves = cell_tables.from_tables(tables, figure.recipe)
            _drop_shared_settings(cells, curves)
            fig = figure.draw(cells, curves) if not cells.empty else None
        else:
            fig = figure.draw(tables)
    if fig is None:
        return Outcome(figure, False, f"skipped {figure.name}: no runs of the {figure.preset} preset under "
                       f"{outputs} (make them with `stabexp run experiment={figure.preset}`)")
    save(fig, outputs / "figures" / figure.name)
    return Outcome(figure, True, f"wrote {outputs / 'figures' / figure.name}.png and .pdf ({source})")


def _drop_shared_settings(cells: pd.DataFrame, curves: pd.DataFrame) -> None:
    # What every run of the sweep was given (`train.steps=12` on the command line) is not a
    # setting of one cell: a figure compares the settings that differ.
    shared = set.intersection(*(set(v.split()) for v in cells.setting)) if not cells.empty else set()
    for frame in (cells, curves):
        frame["setting"] = frame.setting.map(lambda v: " ".join(p for p in v.split() if p not in shared))


def draw_all(outputs: Path, names: Optional[List[str]] = None, cells_table: Optional[Path] = None) -> List[Outcome]:
    """The figures named (every one by default), the collected tables read once."""
    chosen = [FIGURES[n] for n in names] if names else list(FIGURES.values())
    tables = read_collected(outputs / "collected") if cells_table is None else None
    return [draw(f, outputs, tables=tables, cells_table=cells_table) for f in chosen]


def markdown(figures_dir: Path, link_prefix: str = "figures/") -> str:
    """The table of figures as docs/presets.md shows it, a row per figure, linked to its copy in
    `figures_dir` where there is one (`make docs-figures`)."""
    rows = ["| figure | preset | shows |", "|---|---|---|"]
    for f in FIGURES.values():
        name = (f"[`{f.name}`]({link_prefix}{f.name}.png)" if (Path(figures_dir) / f"{f.name}.png").is_file()
                else f"`{f.name}`")
        rows.append(f"| {name} | {f.preset} | {f.shows} |")
    return "\n".join(rows)
