"""Train the authors' own DeepNorm encoder-decoder (torchscale, Microsoft's DeepNet code) on
stabexp's synthetic task, to set a stabexp DeepNorm run beside the reference implementation on
the very same batches, seed, optimiser and lr schedule.

    pip install torchscale==0.3.0        # its fairscale and timm too
    python scripts/crosscheck_torchscale.py --task reverse --depth 6
    stabexp run group=deepnorm_torchscale depth=6 task=reverse   # the same, in stabexp

What comes from torchscale: the whole model (EncoderDecoderConfig(deepnorm=True)): its layers,
its α, its init and β (its DeepNet constants, stabexp's `deepnorm_torchscale` group), its tied
embeddings (TextEmbedding, N(0, d^-1/2), scaled by sqrt(d) as its machine-translation example
does: `no_scale_embedding=False`). What comes from stabexp: the batches (`make_task`), the
optimiser (`build_optimizer`: Adam, betas 0.9 / 0.98), the lr schedule of the group, and the
sinusoidal positions (fairseq's, as the MT example uses; torchscale's own PositionalEmbedding
is learned). The FFN activation is ReLU, as in fairseq's and stabexp's Transformer.
Prints the eval loss and token accuracy on the task's held-out batch every --every steps.
"""

from __future__ import annotations

import argparse
import math
import sys
import types

import torch
from torch import nn


def _import_torchscale():
    """torchscale 0.3.0 imports timm only for drop_path, and timm needs torchvision; with
    drop_path_rate 0 that function is never called, so a stand-in keeps torchvision optional."""
    try:
        import timm.models.layers  # noqa: F401
    except ImportError:
        def drop_path(x, drop_prob=0.0, training=False):
            if drop_prob:
                raise RuntimeError("drop_path stand-in: this cross-check runs with drop_path_rate 0")
            return x
        layers = types.ModuleType("timm.models.layers")
        layers.drop_path = drop_path
        for name in ("timm", "timm.models"):
            sys.modules.setdefault(name, types.ModuleType(name))
        sys.modules["timm.models.layers"] = layers
    from torchscale.architecture.config import EncoderDecoderConfig
    from torchscale.architecture.encoder_decoder import EncoderDecoder
    from torchscale.component.embedding import TextEmbedding
    return EncoderDecoderConfig, EncoderDecoder, TextEmbedding


class Sinusoids(nn.Module):
    """torchscale calls embed_positions(tokens): the table's first positions, as stabexp adds."""

    def __init__(self, d: int, max_len: int = 512):
        super().__init__()
        from stabexp.model.transformer import sinusoidal_positions

        self.register_buffer("table", sinusoidal_positions(max_len, d), persistent=False)

    def forward(self, tokens, **kwargs):
        return self.table[: tokens.shape[1]].unsqueeze(0)


class Adapter(nn.Module):
    """What a stabexp task's evaluate() calls: model(src, tgt_in) -> logits, feature_mask."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, src, tgt_in):
        return self.model(src, tgt_in)[0]

    def feature_mask(self, src, tgt_in):
        return None


def build(cfg, vocab_size: int) -> nn.Module:
    EncoderDecoderConfig, EncoderDecoder, TextEmbedding = _import_torchscale()
    m, n = cfg.model, cfg.depth
    args = EncoderDecoderConfig(
        encoder_embed_dim=m.d_model, decoder_embed_dim=m.d_model,
        encoder_ffn_embed_dim=m.ffn_dim, decoder_ffn_embed_dim=m.ffn_dim,
        encoder_attention_heads=m.n_heads, decoder_attention_heads=m.n_heads,
        encoder_layers=n, decoder_layers=cfg.decoder_depth or n,
        deepnorm=True, share_all_embeddings=True, no_scale_embedding=False,
        activation_fn="relu", dropout=0.0, vocab_size=vocab_size)
    embed = TextEmbedding(vocab_size, m.d_model)
    return Adapter(EncoderDecoder(args, encoder_embed_tokens=embed, encoder_embed_positions=Sinusoids(m.d_model),
                                  decoder_embed_positions=Sinusoids(m.d_model)))


def main(argv=None) -> int:
    from stabexp.compose import compose
    from stabexp.data import make_task
    from stabexp.train.optim import build_optimizer
    from stabexp.train.schedule import lr_factor

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="sort", help="a stabexp task: sort or reverse")
    p.add_argument("--depth", type=int, default=6, help="encoder and decoder layers")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--every", type=int, default=100, help="eval every this many steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("overrides", nargs="*", help="more stabexp overrides (train.lr=3e-3, ...)")
    a = p.parse_args(argv)
    cfg = compose(["group=deepnorm_torchscale", f"task={a.task}", f"depth={a.depth}", f"seed={a.seed}",
                   *a.overrides])
    torch.manual_seed(cfg.seed)
    device = torch.device("cpu")
    task = make_task(cfg, device)
    model = build(cfg, task.vocab_size)
    t = cfg.train
    opt = build_optimizer(cfg, model, device)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: lr_factor(cfg.group.schedule, i + 1, t.warmup_steps, None, t.decay_period))
    print(f"torchscale DeepNorm {a.depth}L-{a.depth}L on task={a.task}, seed {cfg.seed}, lr {t.lr}, "
          f"{sum(x.numel() for x in model.parameters())} parameters")
    row = task.evaluate(model)
    print(f"step 0: eval loss {row['eval_loss']:.4f}, accuracy {row['eval_acc']:.3f} (chance {task.chance_loss:.3f})")
    for step in range(1, a.steps + 1):
        src, tgt_in, tgt_out = task.train_batch()
        loss = task.loss(model(src, tgt_in), tgt_out)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        value = loss.item()
        if not math.isfinite(value):
            print(f"step {step}: loss {value}: diverged")
            return 0
        if step % a.every == 0 or step == a.steps:
            row = task.evaluate(model)
            print(f"step {step}: train loss {value:.4f}, eval loss {row['eval_loss']:.4f}, "
                  f"accuracy {row['eval_acc']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
