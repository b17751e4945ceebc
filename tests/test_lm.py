"""Decoder-only and encoder-only models on task=lm: the text, the batches, the single-stack
constants, what a combination without meaning says, and whole runs."""

import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from stabexp.config import ConfigError, validate
from stabexp.data.corpus import DataError
from stabexp.data.lm import Characters, LanguageModelTask, builtin_text, mask_tokens
from stabexp.data.task import IGNORE
from stabexp.model import build_model, initialise
from stabexp.model.lm import LanguageModel
from stabexp.train.trainer import train

LM = ["task=lm", "task.vocab_size=160", "task.seq_len=8"]
CPU = torch.device("cpu")


def _cfg(make_cfg, *extra):
    return make_cfg(*LM, *extra)


def _task(cfg):
    return LanguageModelTask(cfg, CPU)


def test_builtin_text_splits_in_order_and_holds_english():
    text = builtin_text()
    sizes = {k: sum(len(x) + 1 for x in v) for k, v in text.items()}
    total = sum(sizes.values())
    assert 0.88 < sizes["train"] / total < 0.92 and 0.03 < sizes["valid"] / total < 0.07
    assert " the " in " ".join(text["train"])


def test_decoder_only_batches_are_shifted_windows_of_one_stream(make_cfg):
    task = _task(_cfg(make_cfg))
    src, tgt_in, tgt_out = task.train_batch()
    assert src.shape == (8, 0) and tgt_in.shape == tgt_out.shape == (8, 8)
    assert torch.equal(tgt_in[:, 1:], tgt_out[:, :-1])
    # The probe batch is the first validation windows, the same at every call.
    assert torch.equal(task.probe_batch()[1], task.probe_batch()[1])
    assert torch.equal(task.probe_batch()[1][0], task.streams["valid"][:8])
    assert task.chance_loss == pytest.approx(math.log(task.vocab_size))


def test_characters_option_and_folder_of_text(make_cfg, tmp_path):
    for split, text in (("train", "abc abd\nbcd\n"), ("valid", "abx\n" * 5), ("test", "cab\n" * 5)):
        (tmp_path / f"{split}.txt").write_text(text * 4)
    task = _task(_cfg(make_cfg, f"task.path={tmp_path}", "task.subword=char", "task.seq_len=4"))
    assert isinstance(task.tokenizer, Characters)
    assert task.vocab_size == 4 + len(set("abc d"))  # specials, then the training characters
    assert task.tokenizer.encode(["x"]) == [[3]]     # unseen in training: UNK
    # The unigram reference: the training stream holds a 8, b 12, c 8, d 8, space 4 and EOS 8
    # times (of 48); the eval targets are a, b, x (UNK, unseen: half a count) and EOS.
    ids = task.tokenizer.ids
    p = {ids["a"]: 8 / 48, ids["b"]: 12 / 48, 3: 0.5 / 48, 2: 8 / 48}
    targets = task.eval_batch()[2].flatten().tolist()
    expected = sum(-math.log(p[t]) for t in targets) / len(targets)
    assert task.unigram_loss() == pytest.approx(expected)
    assert task.info()["data"]["unigram_eval_loss"] == pytest.approx(expected)


def test_a_missing_split_file_is_one_clear_error(make_cfg, tmp_path):
    (tmp_path / "train.txt").write_text("some text\n")
    with pytest.raises(DataError, match="no file valid.txt"):
        _task(_cfg(make_cfg, f"task.path={tmp_path}"))


def test_masked_lm_masking_follows_bert():
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, 50, (200, 50), generator=gen)
    masked, targets = mask_tokens(tokens, mask_id=50, vocab=50, prob=0.15, gen=gen)
    chosen = targets != IGNORE
    assert chosen.float().mean().item() == pytest.approx(0.15, abs=0.01)
    assert torch.equal(targets[chosen], tokens[chosen])
    assert torch.equal(masked[~chosen], tokens[~chosen])
    as_mask = (masked[chosen] == 50).float().mean().item()
    kept = (masked[chosen] == tokens[chosen]).float().mean().item()
    assert as_mask == pytest.approx(0.8, abs=0.03) and kept == pytest.approx(0.1 + 0.1 / 46, abs=0.03)


def test_decoder_only_is_causal_and_encoder_only_is_not(make_cfg):
    for arch, causal in (("decoder_only", True), ("encoder_only", False)):
        cfg = _cfg(make_cfg, f"model.arch={arch}")
        torch.manual_seed(0)
        model = build_model(cfg, 40, None, 16).eval()
        assert isinstance(model, LanguageModel)
        x = torch.randint(0, 40, (2, 8))
        y = x.clone()
        y[:, -1] = (y[:, -1] + 1) % 40
        empty = x[:, :0]
        same_prefix = torch.allclose(model.features(empty, x)[:, :-1], model.features(empty, y)[:, :-1])
        assert same_prefix == causal
        stacks = {stack for stack, *_ in model.residuals()}
        assert stacks == {"decoder" if causal else "encoder"}
        assert [name for *_, name, _ in model.residuals()][:2] == ["self_attn", "ffn"]


@pytest.mark.parametrize("arch, stack", [("decoder_only", "decoder"), ("encoder_only", "encoder")])
@pytest.mark.parametrize("layers", [3, 6])
def test_deepnorm_uses_the_single_stack_constants(make_cfg, arch, stack, layers):
    """DeepNet Sec. 2.3, decoder-only / encoder-only rows: alpha (2L)^(1/4), beta (8L)^(-1/4)."""
    cfg = _cfg(make_cfg, "group=deepnorm", f"depth={layers}", f"model.arch={arch}",
               "model.d_model=64", "model.ffn_dim=128")
    torch.manual_seed(0)
    model = build_model(cfg, 40, None, 16)
    constants = initialise(model, "deepnorm", None)
    alpha, beta = (2 * layers) ** 0.25, (8 * layers) ** -0.25
    assert constants["alpha"] == {stack: pytest.approx(alpha)}
    assert constants["deepnorm"][stack]["beta"] == pytest.approx(beta)
    for *_, res in model.residuals():
        assert res.alpha == pytest.approx(alpha)
        for name, w in res.branch.matrices().items():
            xavier = math.sqrt(2.0 / sum(w.shape))
            gain = beta if name in ("v", "o", "w1", "w2") else 1.0
            assert w.std().item() / xavier == pytest.approx(gain, rel=0.1), name


def test_single_stack_constants_of_the_other_groups(make_cfg):
    def constants(group, layers=5):
        cfg = _cfg(make_cfg, f"group={group}", f"depth={layers}")
        task = _task(cfg)
        model = build_model(cfg, task.vocab_size, None, 16)
        return initialise(model, cfg.group.init, lambda: task.init_batch(4))

    assert constants("fixup")["fixup"]["L"] == 10                           # 2L branches, no cross-attention
    assert constants("subln")["subln_gamma"] == {"decoder": pytest.approx(math.sqrt(math.log(10)))}
    n_omega = constants("admin_closed_form")["admin_closed_form"]
    assert n_omega["sublayers"] == {"decoder": 10}
    assert len(constants("admin")["admin_omega"]["decoder"]) == 10


@pytest.mark.parametrize("overrides, match", [
    (["group=t_fixup"], "group.init=t_fixup is not allowed: its constants are defined for an encoder-decoder only"),
    (["group=hybrid_preln_postln"], "group.encoder_residual=preln is not allowed: a placement per stack needs the "
                                    "encoder-decoder"),
    (["decoder_depth=3"], "decoder_depth=3 is not allowed: model.arch=decoder_only has one stack"),
    (["model.arch=transformer"], "task=lm is not allowed: model.arch=transformer trains on tasks of kind"),
    (["task.subword=words"], "task.subword=words is not allowed: one of bpe, unigram, char"),
])
def test_combinations_without_meaning_are_clear_errors(make_cfg, overrides, match):
    with pytest.raises(ConfigError, match=match):
        validate(_cfg(make_cfg, *overrides))


def test_a_symbol_task_refuses_a_single_stack_model(make_cfg):
    with pytest.raises(ConfigError, match="task=sort is not allowed: model.arch=decoder_only trains on tasks of kind lm"):
        validate(make_cfg("model.arch=decoder_only"))


@pytest.mark.parametrize("arch", ["decoder_only", "encoder_only"])
@pytest.mark.parametrize("group", ["postln", "preln", "deepnorm", "fixup"])
def test_single_stack_runs_write_the_probes_and_the_test_loss(make_cfg, tmp_path, arch, group):
    cfg = _cfg(make_cfg, f"model.arch={arch}", f"group={group}", "model.qk_norm=true", "train.z_loss=1e-4")
    summary = train(cfg, tmp_path)
    assert summary["status"] == "completed" and summary["decoder_depth"] is None
    assert summary["arch"] == arch and math.isfinite(summary["test_loss"])
    assert summary["data"]["objective"] == ("next token" if arch == "decoder_only" else "masked LM (p=0.15)")
    metrics = pd.read_csv(tmp_path / "metrics.csv")
    layers = pd.read_csv(tmp_path / "layers.csv")
    assert metrics.eval_ppl.dropna().gt(1).all() and metrics.log_z_max.notna().all()
    assert (metrics.log_z_max >= metrics.log_z_mean - 1e-6).all()
    attn = layers[layers.sublayer == "self_attn"]
    assert attn.max_attn_logit.notna().all() and layers[layers.sublayer == "ffn"].max_attn_logit.isna().all()
    moved = layers[layers.step > 0]
    assert moved.relative_update.gt(0).all() and layers[layers.step == 0].relative_update.isna().all()


GROUPS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "conf" / "group").glob("*.yaml"))


# T-Fixup's constants and the hybrids' two placements need an encoder-decoder (each a clear error).
ENCODER_DECODER_ONLY = ("t_fixup", "hybrid_postln_preln", "hybrid_preln_postln")


@pytest.mark.parametrize("group", [g for g in GROUPS if g not in ENCODER_DECODER_ONLY])
def test_every_single_stack_group_trains_a_decoder_only_model(make_cfg, tmp_path, group):
    summary = train(_cfg(make_cfg, f"group={group}", "train.steps=2", "train.eval_every=2"), tmp_path)
    assert summary["status"] == "completed" and list(summary["constants"]["alpha"]) == ["decoder"]
