"""Plug-ins (stabexp.plugins, docs/plugins.md): a placement, an init rule, a task and an
optimiser from a user's module, named by a dotted path or registered by another package's entry
point, run as the built-ins do; a bad one is one line at config validation, nothing written; and
the built-ins come through the same entry points, unchanged."""

import json
import os
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import TINY, cli_command, fail_at_step, one_line_error
from stabexp import plugins
from stabexp.model.placements import PLACEMENTS, Placement
from stabexp.model.transformer import Seq2SeqTransformer
from stabexp.model_options import TransformerConfig

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "plugin_layerscale"
D = 8


@pytest.fixture(autouse=True)
def fresh_registries():
    """Every test starts and ends with no entry point loaded and no name resolved, and forgets
    the modules it wrote."""
    before = set(sys.modules)
    plugins.clear()
    yield
    plugins.clear()
    for name in set(sys.modules) - before:
        if name.startswith(("plugtest_", "mylab_", "layerscale")):
            del sys.modules[name]


def write_module(folder: Path, name: str, source: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    return folder


# --- the example: LayerScale from examples/plugin_layerscale -------------------------------

G = torch.randn(3, 5, D, generator=torch.Generator().manual_seed(1))


class Stub(nn.Module):
    """A branch of known output G, recording its input (as tests/test_residual.py)."""

    def forward(self, x):
        self.seen = x
        return G


def test_layerscale_combines_x_and_its_branch_as_cait_writes(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    from layerscale import LayerScale, initial_scale

    c = TransformerConfig(vocab_size=4, d_model=D, encoder_layers=2, residual="layerscale.LayerScale")
    res = LayerScale(Stub(), c, "encoder", {})
    lam = torch.linspace(-1.0, 2.0, D)
    with torch.no_grad():
        res.layer_scale.copy_(lam)
    x = torch.randn(3, 5, D, generator=torch.Generator().manual_seed(0)) * 3 + 1
    torch.testing.assert_close(res(x), x + lam * G)                          # x + diag(lambda) G(LN(x))
    torch.testing.assert_close(res.branch.seen, F.layer_norm(x, (D,)))
    # eps by depth, CaiT Sec. 2: 0.1 up to 18 layers, 1e-5 at 24, 1e-6 deeper.
    assert [initial_scale(n) for n in (2, 18, 20, 24, 36)] == [0.1, 0.1, 1e-5, 1e-5, 1e-6]
    fresh = LayerScale(Stub(), TransformerConfig(vocab_size=4, d_model=D, encoder_layers=36), "encoder", {})
    assert torch.equal(fresh.layer_scale, torch.full((D,), 1e-6))
    # Pre-LN-like: each stack ends with a norm, as Placement.of reads off the class.
    model = Seq2SeqTransformer(c)
    assert isinstance(model.encoder_final_ln, nn.LayerNorm) and isinstance(model.decoder_final_ln, nn.LayerNorm)
    assert plugins.placement("layerscale.LayerScale") == Placement.of(LayerScale)


@pytest.mark.slow
def test_the_layerscale_example_trains_through_the_cli(tmp_path):
    import subprocess

    env = dict(os.environ, STABEXP_OUTPUTS=str(tmp_path / "outputs"), PYTHONPATH=str(EXAMPLE),
               PYTHONUNBUFFERED="1")
    args = ["run", "--config-dir", str(EXAMPLE), "group=layerscale", *TINY, "train.steps=3"]
    done = subprocess.run(cli_command(*args), capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    (run,) = (tmp_path / "outputs" / "runs").iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["constants"]["residual"] == "layerscale.LayerScale"
    layers = pd.read_csv(run / "layers.csv")
    at_init = layers[layers.step == 0]
    # Every sublayer of the 2L-2L model has its row, its stream norm `ln` found by the probes.
    assert len(at_init) == 2 * 2 + 2 * 3
    assert set(at_init.sublayer) == {"self_attn", "cross_attn", "ffn"}
    assert at_init.ln_input_norm.notna().all() and (layers.step == 3).any()


# --- an entry point of another package ------------------------------------------------------

MYLAB = """
    import torch.nn as nn

    from stabexp.model.norms import make_norm
    from stabexp.model.placements import Residual
    from stabexp.model.init import xavier


    class HalfPreLN(Residual):
        # x + G(LN(x)) / 2
        final_norm = True

        def __init__(self, branch, c, stack, shared, layer=1):
            super().__init__(branch, c, stack, shared, layer)
            self.ln = make_norm(c.norm, c.d_model)

        def forward(self, x, *context):
            return x + 0.5 * self._g(self.ln(x), *context)


    PLACEMENTS = {"half_preln": HalfPreLN}


    def xavier_again(model, batch):
        return xavier(model)
"""


@pytest.fixture
def mylab(tmp_path, monkeypatch):
    """A package `mylab` installed in tmp_path: a mapping of placements, one init rule, and an
    optimiser whose module is missing."""
    site = write_module(tmp_path / "site", "mylab_plugins", MYLAB)
    info = site / "mylab-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mylab\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[stabexp.placements]\nmylab = mylab_plugins:PLACEMENTS\n\n"
                                           "[stabexp.inits]\nxavier_again = mylab_plugins:xavier_again\n\n"
                                           "[stabexp.optimizers]\nbroken = mylab_missing:lion\n")
    monkeypatch.syspath_prepend(str(site))
    plugins.clear()
    return site


def test_an_entry_point_plugin_is_found_by_name_and_listed(mylab, make_cfg, capsys):
    from stabexp.listing import main as cmd_list
    from stabexp.config import validate
    from stabexp.model import build_model

    assert "half_preln" in plugins.names("placement") and "xavier_again" in plugins.names("init")
    assert plugins.names("placement")[0] == "postln"  # the package's own come first
    assert plugins.registry("placement").table()["half_preln"].distribution == "mylab"
    cfg = make_cfg("group.residual=half_preln", "group.init=xavier_again")
    validate(cfg)
    model = build_model(cfg, vocab_size=16)
    assert type(model.encoder[0].ffn).__name__ == "HalfPreLN"
    assert cmd_list([]) == 0
    out = capsys.readouterr().out
    assert "Plug-ins of other packages" in out
    assert "placement mylab" in out and "mylab_plugins:PLACEMENTS" in out and "[mylab 0.1]" in out
    assert "init xavier_again" in out
    # A package whose entry point does not load leaves every other name working.
    assert plugins.optimiser_factory("adam") is not None
    assert [(name, dist) for name, dist, _ in plugins.registry("optimiser").broken] == [("broken", "mylab")]
    assert "optimiser broken" in out


def test_without_the_packages_metadata_the_builtins_load_from_their_tables(monkeypatch):
    # A source tree on PYTHONPATH, not installed: no entry point of stabexp's own.
    monkeypatch.setattr(plugins, "entry_points", lambda group: [])
    plugins.clear()
    assert plugins.names("placement") == list(PLACEMENTS) and plugins.placement("preln") is PLACEMENTS["preln"]
    assert "adamw" in plugins.names("optimiser") and "lm" in plugins.names("task")


def test_a_group_naming_a_dotted_path_is_listed(capsys):
    from stabexp.listing import main as cmd_list

    assert cmd_list(["--config-dir", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "Groups with a plug-in" in out and "residual: layerscale.LayerScale" in out


# --- an init rule, a task and an optimiser by dotted path, in a real run --------------------

KINDS = """
    import torch

    from stabexp.data import ReverseTask
    from stabexp.model.init import xavier


    def halved_embeddings(model, batch):
        xavier(model)
        with torch.no_grad():
            model.embed.weight.mul_(0.5)
        return {"halved_embeddings": {"factor": 0.5}}


    class CopyTask(ReverseTask):
        # the target is the source itself
        archs = ("transformer",)

        def __init__(self, cfg, device):
            t = cfg.task
            super().__init__(t.vocab_size, t.seq_len, cfg.seed, device, batch_size=cfg.train.batch_size,
                             eval_batch_size=t.eval_batch_size, probe_batch_size=t.probe_batch_size)

        @staticmethod
        def target(src):
            return src


    def plain_sgd(model, cfg, device):
        return torch.optim.SGD(model.parameters(), lr=cfg.train.lr)
"""


def test_an_init_rule_a_task_and_an_optimiser_by_dotted_path_run(tmp_path, monkeypatch, make_cfg):
    from stabexp.train.trainer import train

    monkeypatch.syspath_prepend(str(write_module(tmp_path / "mods", "plugtest_kinds", KINDS)))
    cfg = make_cfg("group.init=plugtest_kinds.halved_embeddings", "task.kind=plugtest_kinds.CopyTask",
                   "optim.name=plugtest_kinds.plain_sgd", "train.steps=3", "probe.weights=false")
    summary = train(cfg, tmp_path / "run")
    assert summary["status"] == "completed" and summary["steps_done"] == 3
    assert summary["constants"]["init"] == "plugtest_kinds.halved_embeddings"
    assert summary["constants"]["halved_embeddings"] == {"factor": 0.5}
    assert summary["optim"]["name"] == "plugtest_kinds.plain_sgd" and "theory" not in summary
    task = plugins.task_factory("plugtest_kinds.CopyTask")(cfg, torch.device("cpu"))
    src, _, tgt_out = task.train_batch()
    assert torch.equal(src, tgt_out)
    assert len(pd.read_csv(tmp_path / "run" / "metrics.csv")) > 1


# --- bad plug-ins: one line at validation, exit 2, nothing written ---------------------------

BAD = """
    import torch.nn as nn

    from stabexp.data import Task
    from stabexp.model.placements import Residual


    def not_a_residual(x):
        return x


    class WrongShape(Residual):
        has_norm = False

        def forward(self, x, *context):
            return self._g(x, *context)[..., :3]


    class ClaimsANorm(Residual):
        # has_norm stays True, but there is no norm
        def forward(self, x, *context):
            return x + self._g(x, *context)


    class NotATask:
        archs = ("transformer",)

        def __init__(self, cfg, device):
            pass


    class NoArchs(Task):
        def __init__(self, cfg, device):
            pass


    NOT_CALLABLE = 3
"""


@pytest.mark.parametrize("override, words", [
    ("group.residual=plugtest_missing.Norm",
     ["group.residual=plugtest_missing.Norm is not allowed", "no module named plugtest_missing", "preln",
      "dotted path module.Class"]),
    ("group.residual=plugtest_bad.Nope", ["plugtest_bad has no attribute Nope", "postln", "Residual subclass"]),
    ("group.residual=plugtest_bad.not_a_residual",
     ["group.residual=plugtest_bad.not_a_residual", "a function, not a Residual subclass or Placement"]),
    ("group.residual=plugtest_bad.WrongShape", ["plugtest_bad.WrongShape", "fails", "RuntimeError"]),
    ("group.residual=plugtest_bad.ClaimsANorm", ["plugtest_bad.ClaimsANorm", "no norm outside its branch"]),
    ("group.decoder_residual=plugtest_bad.Nope", ["group.decoder_residual=plugtest_bad.Nope", "no attribute"]),
    ("group.residual=plugtest_raises.Norm", ["importing plugtest_raises raised ZeroDivisionError: division by zero"]),
    ("group.init=plugtest_bad.NOT_CALLABLE", ["group.init=plugtest_bad.NOT_CALLABLE", "not a function"]),
    ("task.kind=plugtest_bad.NotATask", ["task.kind=plugtest_bad.NotATask", "not a Task subclass"]),
    ("task.kind=plugtest_bad.NoArchs", ["task.kind=plugtest_bad.NoArchs", "archs"]),
    ("optim.name=plugtest_bad.NOT_CALLABLE", ["optim.name=plugtest_bad.NOT_CALLABLE", "not a factory"]),
    ("optim.name=lion", ["optim.name=lion", "adamw", "dotted path module.function"]),
])
def test_a_bad_plugin_is_one_line_and_nothing_is_written(stabexp_main, tmp_path, monkeypatch, override, words):
    mods = write_module(tmp_path / "mods", "plugtest_bad", BAD)
    write_module(mods, "plugtest_raises", "1 / 0\n")
    monkeypatch.syspath_prepend(str(mods))
    r = stabexp_main("run", override, "depth=2")
    assert r.returncode == 2
    one_line_error(r, *words)
    assert not stabexp_main.outputs.exists()


# --- the built-ins, through the same entry points ---------------------------------------------

def test_the_builtins_are_the_packages_own_entry_points():
    from stabexp.data import TASKS
    from stabexp.model.init import INIT_RULES
    from stabexp.train.builtin_hooks import STEP_HOOKS
    from stabexp.train.optim import OPTIMISERS

    for kind, table in (("placement", PLACEMENTS), ("init", INIT_RULES), ("task", TASKS),
                        ("optimiser", OPTIMISERS), ("step_hook", STEP_HOOKS)):
        registered = plugins.registry(kind).table()
        assert {n: r.obj for n, r in registered.items() if r.distribution == "stabexp"} == table, kind
    assert all(plugins.placement(name) is p for name, p in PLACEMENTS.items())
    # A Residual subclass alone makes the Placement the table spells out for it.
    for name in ("postln", "preln", "deepnorm", "admin", "rezero", "rezero_postln", "plain", "sandwich",
                 "reordered_norm", "layernorm_scaled"):
        assert Placement.of(PLACEMENTS[name].residual) == PLACEMENTS[name], name
    # Which archs each task trains, declared by the task.
    assert {k: TASKS[k].archs for k in TASKS} == {
        "sort": ("transformer",), "reverse": ("transformer",), "teacher": ("normmlp",),
        "translation": ("transformer",), "lm": ("decoder_only", "encoder_only")}
    assert [n for n, rule in INIT_RULES.items() if getattr(rule, "encoder_decoder_only", False)] == ["t_fixup"]


@pytest.mark.parametrize("name, kind, expected", [
    ("adam", torch.optim.Adam, {"fused": True, "weight_decay": 0.1}),
    ("adamw", torch.optim.AdamW, {"fused": True, "weight_decay": 0.1}),
    ("adamw_independent", torch.optim.AdamW, {"fused": True, "weight_decay": 0.1 / 2e-3}),
    ("radam", torch.optim.RAdam, {"foreach": True, "weight_decay": 0.1}),
    ("sgd", torch.optim.SGD, {"foreach": True, "momentum": 0.0, "weight_decay": 0.1}),
    ("sgdm", torch.optim.SGD, {"foreach": True, "momentum": 0.5, "weight_decay": 0.1}),
])
def test_each_builtin_optimiser_factory_builds_what_it_did(make_cfg, name, kind, expected):
    from stabexp.model import build_model
    from stabexp.train.optim import build_optimizer

    cfg = make_cfg(f"optim.name={name}", "optim.weight_decay=0.1", "optim.momentum=0.5", "train.lr=2e-3",
                   "optim.betas=[0.8,0.9]", "optim.eps=1e-7")
    model = build_model(cfg, vocab_size=16)
    opt = build_optimizer(cfg, model, torch.device("cpu"))
    assert type(opt) is kind
    decay, rest = opt.param_groups  # matrices decay, the rest does not
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in rest["params"])
    assert rest["weight_decay"] == 0.0 and decay["lr"] == 2e-3
    for key, value in expected.items():
        assert decay[key] == pytest.approx(value), key
    if kind is not torch.optim.SGD:
        assert decay["betas"] == (0.8, 0.9) and decay["eps"] == 1e-7


def test_a_plugin_probe_adds_its_layers_column_to_the_header(make_cfg, tmp_path, monkeypatch):
    """A probe of one's own that fills a layers.csv column no built-in has: the column joins the
    header after the built-ins' (docs/probes.md), each sublayer row holds its value, and a run
    resumed from a checkpoint writes the same file."""
    from stabexp.train import trainer
    from stabexp.train.recording import LAYERS_COLUMNS

    write_module(tmp_path / "site", "plugtest_probe", """
        import torch
        from stabexp.probes.base import Probe, Rows

        class BranchCount(Probe):
            layers_columns = ("sublayer_index",)  # a column of its own

            def measure(self, step):
                n = len(self.ctx.adapter.sublayers())
                return Rows(sublayers=[{"sublayer_index": float(i)} for i in range(n)])
        """)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    overrides = ["train.steps=6", "probe.every=2", "train.checkpoint_every=2", "probe.extra=[plugtest_probe.BranchCount]"]
    trainer.train(make_cfg(*overrides), tmp_path / "whole")
    layers = pd.read_csv(tmp_path / "whole" / "layers.csv")
    assert list(layers.columns) == [*LAYERS_COLUMNS, "sublayer_index"]
    rows = layers[layers.param.isna()]
    assert rows.groupby("step").sublayer_index.apply(lambda s: s.tolist() == list(map(float, range(len(s))))).all()
    assert rows[rows.step > 0].grad_norm.notna().all()  # the built-in probes' cells beside it

    fail_at_step(monkeypatch, make_cfg(*overrides), tmp_path / "resumed", 5)
    trainer.train(make_cfg(*overrides), tmp_path / "resumed")
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "resumed" / "layers.csv"), layers)


# --- step hooks ---------------------------------------------------------------------------------

HOOKS = """
    import json
    import os

    from stabexp.train.hooks import StepHook

    SEEN = []


    class Recording(StepHook):
        # Every moment it is called at, and the losses it is given; it ends the run where
        # PLUGTEST_END_AT says, as the divergence check would.
        def losses_read(self, ctx, readings):
            SEEN.append(("losses_read", [step for step, _, _ in readings], [loss for _, _, loss in readings]))
            end = int(os.environ.get("PLUGTEST_END_AT", 0))
            return end if end in [step for step, _, _ in readings] else None

        def after_optimizer_step(self, ctx):
            SEEN.append(("after_optimizer_step", ctx.first_loss() is not None))

        def after_step(self, ctx, step):
            SEEN.append(("after_step", step))

        def at_end(self, ctx):
            SEEN.append(("at_end",))


    class NotAHook:
        pass
"""


def test_a_step_hook_by_dotted_path_acts_at_its_moments_after_the_builtins(make_cfg, tmp_path, monkeypatch):
    """train.hooks names a StepHook of one's own module: it is called at each moment after the
    built-ins, given every loss the run reads (each step's on a CPU, the loss column's own
    values), and a step it returns from losses_read ends the run there as diverged, the step not
    applied and its row written, as the divergence check's would be."""
    from stabexp.train import trainer

    monkeypatch.syspath_prepend(str(write_module(tmp_path / "mods", "plugtest_hooks", HOOKS)))
    cfg = make_cfg("group=postln", "train.steps=4", "train.hooks=[plugtest_hooks.Recording]")
    assert [h.name for h in plugins.step_hooks(cfg)] == ["divergence", "checkpoints", "plugtest_hooks.Recording"]
    summary = trainer.train(cfg, tmp_path / "run")
    from plugtest_hooks import SEEN

    assert summary["status"] == "completed"
    reads = [s for s in SEEN if s[0] == "losses_read"]
    assert [r[1] for r in reads] == [[1], [2], [3], [4]]
    losses = pd.read_csv(tmp_path / "run" / "metrics.csv").set_index("step").loss
    assert [r[2][0] for r in reads] == pytest.approx(losses.loc[1:4].tolist(), rel=1e-6)
    assert [s for s in SEEN if s[0] == "after_step"] == [("after_step", n) for n in (1, 2, 3, 4)]
    assert SEEN[-1] == ("at_end",) and ("after_optimizer_step", True) in SEEN

    SEEN.clear()
    monkeypatch.setenv("PLUGTEST_END_AT", "3")
    summary = trainer.train(make_cfg("group=postln", "train.steps=4", "train.hooks=[plugtest_hooks.Recording]"),
                            tmp_path / "ended")
    assert summary["status"] == "diverged" and summary["diverged_at_step"] == 3 and summary["steps_done"] == 2
    assert pd.read_csv(tmp_path / "ended" / "metrics.csv").step.max() == 3
    assert [s for s in SEEN if s[0] == "after_step"] == [("after_step", 1), ("after_step", 2)]


@pytest.mark.parametrize("hooks, words", [
    ("[divergence]", "train.hooks=divergence is not allowed: a built-in, on where its own key turns it on"),
    ("[plugtest_hooks.Recording,plugtest_hooks.Recording]", "listed twice"),
    ("[plugtest_hooks.NotAHook]", "not a subclass of stabexp.train.hooks.StepHook"),
    ("[plugtest_hooks.Missing]", "plugtest_hooks has no attribute Missing"),
])
def test_a_bad_step_hook_is_one_line_and_nothing_is_written(stabexp_main, tmp_path, monkeypatch, hooks, words):
    monkeypatch.syspath_prepend(str(write_module(tmp_path / "mods", "plugtest_hooks", HOOKS)))
    r = stabexp_main("run", f"train.hooks={hooks}", "depth=2")
    assert r.returncode == 2
    one_line_error(r, words)
    assert not stabexp_main.outputs.exists()
