"""stabexp.monitor: the probes on a model and loop of one's own (docs/probes.md). A Hugging Face
GPT-2 and a Llama-style decoder built from a config, a model on torch.nn.Transformer, stabexp's
own model; a plain loop, the Hugging Face Trainer callback and the Lightning callback. Each
number a probe writes is checked against a computation by hand on the same step, and the folder
is read by `stabexp report` and the API."""

import math
import re
import sys

import pandas as pd
import pytest
import torch
import torch.nn as nn

# Most of these tests run Hugging Face models: without the monitor extra the module is skipped.
pytest.importorskip("transformers", reason="the monitor extra: make install EXTRAS=monitor")
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from stabexp.monitor import Monitor  # noqa: E402

VOCAB, T = 64, 16


def _gpt2(layers=4):
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=layers, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=32,
                                      bos_token_id=0, eos_token_id=0))


def _llama_layout(family: str, layers: int = 2, **extra):
    """A 2-layer decoder of Llama's layout with grouped-query attention: Llama; Mistral (its
    sliding window wider than the probe's sequences); Qwen2 (biases on q, k and v); Qwen3 (q and
    k normalised per head, q_norm and k_norm, before the rotation)."""
    import transformers as t

    config, model = {"llama": (t.LlamaConfig, t.LlamaForCausalLM), "mistral": (t.MistralConfig, t.MistralForCausalLM),
                     "qwen2": (t.Qwen2Config, t.Qwen2ForCausalLM), "qwen3": (t.Qwen3Config, t.Qwen3ForCausalLM)}[family]
    torch.manual_seed(0)
    return model(config(num_hidden_layers=layers, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=32, bos_token_id=0,
                        eos_token_id=0, pad_token_id=0, **extra))


def _llama(layers=2):
    return _llama_layout("llama", layers)


def _qwen3(layers=2):
    return _llama_layout("qwen3", layers, head_dim=8)


def _mistral(layers=2):
    return _llama_layout("mistral", layers)


def _qwen2(layers=2):
    return _llama_layout("qwen2", layers)


def _neox(layers=2):
    """GPT-NeoX (Pythia's layout): attention and FFN in parallel from one stream, partial rotary."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    return GPTNeoXForCausalLM(GPTNeoXConfig(num_hidden_layers=layers, hidden_size=32, intermediate_size=64,
                                            num_attention_heads=4, vocab_size=VOCAB, max_position_embeddings=32,
                                            bos_token_id=0, eos_token_id=0, pad_token_id=0))


def _gptj(layers=2):
    """GPT-J: one LayerNorm feeding attention and FFN in parallel, rotary on part of each head."""
    from transformers import GPTJConfig, GPTJForCausalLM

    torch.manual_seed(0)
    return GPTJForCausalLM(GPTJConfig(n_layer=layers, n_embd=32, n_head=4, rotary_dim=4, vocab_size=VOCAB,
                                      n_positions=32, bos_token_id=0, eos_token_id=0, pad_token_id=0))


def _tokens(*shape, seed=0):
    return torch.randint(0, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def _train_lm(model, optimizer, monitor, batches, network=None):
    """A plain language-model loop over `batches` of token ids, the monitor stepped after each
    optimiser step; `network`: the model to call where `model` holds it."""
    for tokens in batches:
        loss = (network or model)(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        monitor.step(loss)


def _hf_sublayer_grads(model):
    """By hand: the gradient norm of each residual sublayer (its norm and branch) and the total."""
    base = model.base_model
    if hasattr(base, "h") and not hasattr(base.h[0], "ln_2"):  # GPT-J: ln_1 counted with the FFN
        blocks = [((), b.attn, b.ln_1, b.mlp) for b in base.h]
    elif hasattr(base, "h"):
        blocks = [(b.ln_1, b.attn, b.ln_2, b.mlp) for b in base.h]
    else:
        blocks = [(b.input_layernorm, getattr(b, "self_attn", None) or b.attention, b.post_attention_layernorm, b.mlp)
                  for b in base.layers]

    def norm(*modules):
        return math.sqrt(sum(p.grad.pow(2).sum().item() for m in modules if m != () for p in m.parameters()))
    per = [n for ln1, attn, ln2, mlp in blocks for n in (norm(ln1, attn), norm(ln2, mlp))]
    return per, norm(model)


class _Recorded(list):
    """The largest logit of each attention call, and in `scores` its logits before the mask."""

    def __init__(self):
        super().__init__()
        self.scores = []

    def clear(self):
        super().clear()
        self.scores.clear()


@pytest.fixture
def logit_recorder(monkeypatch):
    """Every attention's largest logit as the model itself computes it (q.k * scaling, plus T5's
    position bias, masked), recorded by an attention function of transformers' own interface
    that then runs eager."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.llama.modeling_llama import repeat_kv

    seen = _Recorded()

    def recording(module, query, key, value, attention_mask, scaling=None, **kwargs):
        logits = query @ repeat_kv(key, query.shape[1] // key.shape[1]).transpose(2, 3) * scaling
        if kwargs.get("position_bias") is not None:  # T5's relative position bias, before the mask
            logits = logits + kwargs["position_bias"]
        seen.scores.append(logits)
        if attention_mask is not None:
            logits = logits.masked_fill(attention_mask[..., :key.shape[-2]] < -1, float("-inf"))
        seen.append(logits.amax().item())
        eager = sys.modules[type(module).__module__].eager_attention_forward  # the model's own
        return eager(module, query, key, value, attention_mask, scaling=scaling, **kwargs)

    ALL_ATTENTION_FUNCTIONS.register("stabexp_recording", recording)
    ALL_MASK_ATTENTION_FUNCTIONS.register("stabexp_recording", ALL_MASK_ATTENTION_FUNCTIONS["eager"])
    return seen


@pytest.mark.parametrize("build", [_gpt2, _llama, _mistral, _qwen2, _qwen3, _neox, _gptj],
                         ids=["gpt2", "llama", "mistral", "qwen2", "qwen3", "gpt_neox", "gptj"])
def test_a_hugging_face_decoder_in_a_plain_loop(build, tmp_path, logit_recorder):
    """50 steps of a 4-layer GPT-2 (a 2-layer Llama with grouped-query attention and RoPE; a Qwen3,
    the same with q and k normalised per head; a GPT-NeoX and a GPT-J, their branches in parallel): the
    model update, per-sublayer gradient norms, LN input norms and attention logits written, each
    equal to its computation by hand on the same step."""
    model = build(4) if build is _gpt2 else build()
    data, probe = _tokens(50, 8, T), {"input_ids": _tokens(4, T, seed=1)}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    by_hand = {}

    def grads_by_hand(opt, args, kwargs):
        by_hand[len(by_hand) + 1] = _hf_sublayer_grads(model)
    optimizer.register_step_pre_hook(grads_by_hand)
    held_out = _tokens(8, T, seed=2)

    def evaluate(m):
        out = m(input_ids=held_out, labels=held_out)
        acc = (out.logits[:, :-1].argmax(-1) == held_out[:, 1:]).float().mean().item()
        return {"eval_loss": out.loss.item(), "eval_acc": acc}
    monitor = Monitor(model, probe, tmp_path / "run", optimizer=optimizer, probes=("layers", "weights"),
                      evaluate=evaluate, eval_every=25, steps=50, describe={"group": "hf", "seed": 0})
    _train_lm(model, optimizer, monitor, data)
    assert monitor.close()["status"] == "completed"

    metrics = pd.read_csv(tmp_path / "run" / "metrics.csv").set_index("step")
    layers = pd.read_csv(tmp_path / "run" / "layers.csv")
    sublayers = layers[layers.param.isna()]
    assert metrics.model_update[0] == 0 and (metrics.model_update.loc[1:] > 0).all()
    assert metrics.log_z_mean.notna().all() and metrics.eval_loss.notna().sum() == 2
    for step in (1, 10, 50):
        per, total = by_hand[step]
        rows = sublayers[sublayers.step == step]
        assert rows.grad_norm.tolist() == pytest.approx(per, rel=1e-5)
        assert metrics.grad_norm[step] == pytest.approx(total, rel=1e-5)
    attention = sublayers[sublayers.sublayer == "self_attn"]
    assert attention.max_attn_logit.notna().all() and sublayers[sublayers.sublayer == "ffn"].max_attn_logit.isna().all()

    # Step 50's LN inputs and attention logits, by hand on the same weights.
    norms = []
    hooks = [norm.register_forward_pre_hook(lambda m, args: norms.append(args[0].norm(dim=-1).mean().item()))
             for s in _blocks_norms(model) for norm in s]
    model.config._attn_implementation = "stabexp_recording"
    model.eval()
    logit_recorder.clear()
    with torch.no_grad():
        model(**probe)
    for h in hooks:
        h.remove()
    last = sublayers[sublayers.step == 50]
    assert last.ln_input_norm.tolist() == pytest.approx(norms, rel=1e-5)
    assert last.stream_norm.tolist() == pytest.approx(norms, rel=1e-5)  # Pre-LN: the stream is the norm's input
    assert last[last.sublayer == "self_attn"].max_attn_logit.tolist() == pytest.approx(logit_recorder, rel=1e-4)


def _decoder(family: str, **options):
    """A 2-layer decoder of a Hugging Face family, tiny, with the attention options named."""
    import transformers as t

    config, model = {"mistral": (t.MistralConfig, t.MistralForCausalLM), "stablelm": (t.StableLmConfig, t.StableLmForCausalLM),
                     "glm": (t.GlmConfig, t.GlmForCausalLM), "gpt_bigcode": (t.GPTBigCodeConfig, t.GPTBigCodeForCausalLM),
                     "gemma2": (t.Gemma2Config, t.Gemma2ForCausalLM), "gemma3": (t.Gemma3TextConfig, t.Gemma3ForCausalLM),
                     "phi": (t.PhiConfig, t.PhiForCausalLM), "phi3": (t.Phi3Config, t.Phi3ForCausalLM),
                     "falcon": (t.FalconConfig, t.FalconForCausalLM)}[family]
    sizes = (dict(n_layer=2, n_embd=32, n_head=4, n_positions=32) if family == "gpt_bigcode" else
             dict(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                  max_position_embeddings=32))
    torch.manual_seed(0)
    return model(config(**sizes, vocab_size=VOCAB, bos_token_id=0, eos_token_id=0, pad_token_id=0, **options))


# Each family's attention options, and its blocks' children: (the attention's norm, the
# attention with any norm on its output, the FFN's norm (None: the attention's, in parallel),
# the FFN with any norm on its output).
ATTENTION_OPTIONS = {
    "mistral_sliding_window": (lambda: _decoder("mistral", num_key_value_heads=2, sliding_window=4),
                               ("input_layernorm", ("self_attn",), "post_attention_layernorm", ("mlp",))),
    "stablelm_partial_rotary": (lambda: _decoder("stablelm", num_key_value_heads=2, partial_rotary_factor=0.25),
                                ("input_layernorm", ("self_attn",), "post_attention_layernorm", ("mlp",))),
    "glm_partial_rotary": (lambda: _decoder("glm", num_key_value_heads=2, head_dim=8),
                           ("input_layernorm", ("self_attn",), "post_attention_layernorm", ("mlp",))),
    "gpt_bigcode_multi_query": (lambda: _decoder("gpt_bigcode", multi_query=True),
                                ("ln_1", ("attn",), "ln_2", ("mlp",))),
    "gpt_bigcode_multi_head": (lambda: _decoder("gpt_bigcode", multi_query=False),
                               ("ln_1", ("attn",), "ln_2", ("mlp",))),
    "gemma2_softcap_window": (lambda: _decoder("gemma2", num_key_value_heads=2, head_dim=8, sliding_window=4,
                                               attn_logit_softcapping=0.02, query_pre_attn_scalar=32),
                              ("input_layernorm", ("self_attn", "post_attention_layernorm"), "pre_feedforward_layernorm",
                               ("mlp", "post_feedforward_layernorm"))),
    "gemma3_qk_norm_window": (lambda: _decoder("gemma3", num_key_value_heads=2, head_dim=8, sliding_window=4),
                              ("input_layernorm", ("self_attn", "post_attention_layernorm"), "pre_feedforward_layernorm",
                               ("mlp", "post_feedforward_layernorm"))),
    "phi_parallel_qk_layernorm": (lambda: _decoder("phi", qk_layernorm=True),
                                  ("input_layernorm", ("self_attn",), None, ("mlp",))),
    "phi3_fused_qkv": (lambda: _decoder("phi3", num_key_value_heads=2),
                       ("input_layernorm", ("self_attn",), "post_attention_layernorm", ("mlp",))),
    "falcon_alibi_parallel": (lambda: _decoder("falcon", alibi=True),
                              ("input_layernorm", ("self_attention",), None, ("mlp",))),
    "falcon_two_norms_grouped": (lambda: _decoder("falcon", new_decoder_architecture=True, num_kv_heads=2),
                                 ("ln_attn", ("self_attention",), "ln_mlp", ("mlp",))),
    # An encoder: bidirectional, local attention in every other layer; no norm on layer 1's stream.
    "modernbert_local_window": (lambda: _modernbert(),
                                ("attn_norm", ("attn",), "mlp_norm", ("mlp",))),
}


def _modernbert():
    import transformers as t

    torch.manual_seed(0)
    return t.ModernBertForMaskedLM(t.ModernBertConfig(num_hidden_layers=3, hidden_size=32, intermediate_size=64,
                                                      num_attention_heads=4, vocab_size=VOCAB, max_position_embeddings=32,
                                                      pad_token_id=0, local_attention=4, global_attn_every_n_layers=2))


class _SoftmaxInputs(list):
    """The largest logit each attention's softmax sees in the model's own eager attention: the input
    of each softmax over the keys of a (B, h, T, S) tensor, its masked entries (the dtype's minimum
    added) left out. It reads neither q, k nor the attention function's arguments."""

    def __enter__(self):
        self.softmax = torch.nn.functional.softmax

        def softmax(scores, dim=None, *args, **kwargs):
            if scores.dim() == 4 and dim in (-1, 3):
                kept = scores > torch.finfo(scores.dtype).min / 2
                self.append(scores.masked_fill(~kept, float("-inf")).amax().item())
            return self.softmax(scores, dim, *args, **kwargs)
        torch.nn.functional.softmax = softmax
        return self

    def __exit__(self, *exc):
        torch.nn.functional.softmax = self.softmax


def _eager(model):
    for module in model.modules():
        if getattr(module, "config", None) is not None:
            module.config._attn_implementation = "eager"


@pytest.mark.parametrize("family", list(ATTENTION_OPTIONS))
def test_a_decoder_s_attention_options_are_in_its_logits(family, tmp_path):
    """Decoders whose attention options a recomputation of q.k from the weights would miss: a
    sliding window narrower than the probe's sequences, partial rotary, multi-query and grouped
    query, a softcap and Gemma's query_pre_attn_scalar, q / k norms, ALiBi, a fused qkv; the
    layouts of Gemma's norms on the branches' outputs and of parallel branches from one norm;
    ModernBERT, an encoder with local attention.
    After 3 steps on a padded probe batch, each attention's largest logit equals the largest
    input of the softmax in the model's own eager attention over the kept pairs; each
    sublayer's gradient norm, from the parameters' own gradients, and each norm's input norm,
    over the real tokens, equal their computation by hand."""
    build, (attn_norm, attention, ffn_norm, ffn) = ATTENTION_OPTIONS[family]
    model = build()
    mask = torch.ones(3, T, dtype=torch.long)
    mask[1, :5] = 0  # a left-padded probe sequence: its first keys are not real
    probe = {"input_ids": _tokens(3, T, seed=1), "attention_mask": mask}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    monitor = Monitor(model, probe, tmp_path / family, optimizer=optimizer, steps=3)
    blocks = list(getattr(model.base_model, "layers", None) or model.base_model.h)

    def norm(names, block):
        return math.sqrt(sum(p.grad.pow(2).sum().item() for n in names if n is not None
                             for p in getattr(block, n).parameters()))
    by_hand = []
    for step in range(1, 4):
        tokens = _tokens(4, T, seed=10 + step)
        model(input_ids=tokens, labels=tokens).loss.backward()
        # One norm feeding both branches counts in the FFN's sublayer.
        by_hand = [n for b in blocks for n in (norm((attn_norm if ffn_norm else None, *attention), b),
                                               norm((ffn_norm or attn_norm, *ffn), b))]
        optimizer.step()
        optimizer.zero_grad()
        monitor.step()
    assert monitor.close()["status"] == "completed"
    rows = pd.read_csv(tmp_path / family / "layers.csv")
    last = rows[rows.param.isna() & (rows.step == 3)]
    assert last.grad_norm.tolist() == pytest.approx(by_hand, rel=1e-5)

    real = mask.bool()
    norms = []
    # An Identity in a norm's place (ModernBERT's first layer) is no norm: its cell is empty.
    hooks = [getattr(b, name).register_forward_pre_hook(
        lambda m, args: norms.append(math.nan if isinstance(m, nn.Identity) else
                                     args[0].norm(dim=-1)[real].mean().item()))
        for b in blocks for name in (attn_norm, ffn_norm or attn_norm)]
    _eager(model)
    model.eval()
    with torch.no_grad(), _SoftmaxInputs() as softmax_inputs:
        model(**probe)
    for h in hooks:
        h.remove()
    assert last.ln_input_norm.tolist() == pytest.approx(norms, rel=1e-5, nan_ok=True)
    assert len(softmax_inputs) == len(blocks)
    assert last[last.sublayer == "self_attn"].max_attn_logit.tolist() == pytest.approx(softmax_inputs, rel=1e-5)
    assert last[last.sublayer == "ffn"].max_attn_logit.isna().all()


def test_an_attention_that_adds_to_its_scores_what_its_arguments_do_not_say_is_left_empty(tmp_path, monkeypatch,
                                                                                        caplog):
    """A Llama whose eager attention adds a bias of its own to the scores (as an attention sink or a
    bias folded in elsewhere would): the logits recorded from the call's arguments no longer
    give the model's attention weights, so its max_attn_logit cells are empty and one line at
    the start, kept in summary.json, says why; never a recomputed guess."""
    from transformers.models.llama import modeling_llama

    eager = modeling_llama.eager_attention_forward

    def biased(module, query, key, value, attention_mask, **kwargs):
        bias = torch.zeros(key.shape[-2])
        bias[0] = 3.0  # every query leans on the first key
        return eager(module, query, key, value,
                     bias if attention_mask is None else attention_mask + bias, **kwargs)
    monkeypatch.setattr(modeling_llama, "eager_attention_forward", biased)
    model = _llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with caplog.at_level("WARNING", logger="stabexp"):
        monitor = Monitor(model, {"input_ids": _tokens(2, T, seed=1)}, tmp_path / "biased", optimizer=optimizer,
                          steps=1)
        _train_lm(model, optimizer, monitor, [_tokens(2, T)])
    summary = monitor.close()
    rows = pd.read_csv(tmp_path / "biased" / "layers.csv")
    assert rows[rows.param.isna()].max_attn_logit.isna().all()
    lines = [r.getMessage() for r in caplog.records if "max_attn_logit is empty" in r.getMessage()]
    assert len(lines) == 1 and "LlamaAttention" in lines[0] and "differs from its attention weights" in lines[0]
    assert "LlamaAttention" in summary["unobserved_attention"]


def test_an_attention_that_departs_from_its_arguments_later_is_said_when_it_does(tmp_path, monkeypatch, caplog):
    """A term of the scores that is zero at first and grows later (a zero-initialised bias of the
    model's own): its cells are filled while the record matches the model's attention, empty from
    the probe pass where it no longer does, and the line is said then, once."""
    from transformers.models.llama import modeling_llama

    eager, lean = modeling_llama.eager_attention_forward, {"on": 0.0}

    def biased(module, query, key, value, attention_mask, **kwargs):
        bias = torch.zeros(key.shape[-2])
        bias[0] = lean["on"]
        return eager(module, query, key, value, attention_mask + bias, **kwargs)
    monkeypatch.setattr(modeling_llama, "eager_attention_forward", biased)
    model = _llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with caplog.at_level("WARNING", logger="stabexp"):
        monitor = Monitor(model, {"input_ids": _tokens(2, T, seed=1)}, tmp_path / "later", optimizer=optimizer,
                          steps=3, first_steps=3)
        for step, tokens in enumerate([_tokens(2, T), _tokens(2, T, seed=3), _tokens(2, T, seed=4)], start=1):
            lean["on"] = 3.0 if step >= 2 else 0.0
            model(input_ids=tokens, labels=tokens).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            monitor.step()
    summary = monitor.close()
    rows = pd.read_csv(tmp_path / "later" / "layers.csv")
    attention = rows[rows.param.isna() & (rows.sublayer == "self_attn")]
    assert attention[attention.step <= 1].max_attn_logit.notna().all()
    assert attention[attention.step >= 2].max_attn_logit.isna().all()
    lines = [r.getMessage() for r in caplog.records if "max_attn_logit is empty" in r.getMessage()]
    assert len(lines) == 1 and "LlamaAttention" in lines[0] and "LlamaAttention" in summary["unobserved_attention"]


def test_an_empty_cell_is_on_the_device_of_the_attention_it_stands_for():
    """A NaN for a refused or unobserved attention is made where the recorded values live, so that
    the probe's stack of them works on a GPU as on the CPU (a meta tensor stands in here)."""
    from stabexp.probes.observed_attention import ObservedAttention

    observed = ObservedAttention(nn.Linear(2, 2))
    module = nn.Linear(2, 2, device="meta")
    observed.refuse(module, torch.zeros(1, device="meta"), "a reason")
    assert observed.seen[module].device.type == "meta"
    assert observed.largest(nn.Linear(2, 2, device="meta"))().device.type == "meta"


def test_gpt2_with_reorder_and_upcast_attn_is_not_observed_and_says_why(tmp_path, caplog):
    """GPT-2's reorder_and_upcast_attn runs its own fp32-upcast attention outside the interface,
    which the probe pass would replace by plain eager: its logit column is empty, said in one line."""
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=32,
                                       reorder_and_upcast_attn=True))
    with caplog.at_level("WARNING", logger="stabexp"):
        Monitor(model, _tokens(2, T), tmp_path / "upcast", steps=1).close()
    rows = pd.read_csv(tmp_path / "upcast" / "layers.csv")
    assert rows.max_attn_logit.isna().all()
    assert any("reorder_and_upcast_attn" in r.getMessage() for r in caplog.records)


def test_a_model_whose_attention_is_not_observable_leaves_the_column_empty_and_says_why(tmp_path, caplog):
    """DeBERTa-v2 (disentangled relative attention, computed outside transformers' attention
    interface): every other column is written, max_attn_logit is empty, and one line says why."""
    import transformers as t

    torch.manual_seed(0)
    model = t.DebertaV2ForMaskedLM(t.DebertaV2Config(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                                     intermediate_size=64, vocab_size=VOCAB,
                                                     max_position_embeddings=T, pad_token_id=0))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with caplog.at_level("WARNING", logger="stabexp"):
        monitor = Monitor(model, {"input_ids": _tokens(2, T, seed=1)}, tmp_path / "deberta", optimizer=optimizer,
                          steps=2)
        for tokens in (_tokens(2, T), _tokens(2, T, seed=3)):
            model(input_ids=tokens, labels=tokens).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            monitor.step()
    assert monitor.close()["status"] == "completed"
    rows = pd.read_csv(tmp_path / "deberta" / "layers.csv")
    sublayers = rows[rows.param.isna()]
    assert len(sublayers[sublayers.step == 2]) == 4
    assert sublayers.max_attn_logit.isna().all() and sublayers[sublayers.step > 0].grad_norm.notna().all()
    assert sublayers.ln_input_norm.notna().all()
    lines = [r.getMessage() for r in caplog.records if "max_attn_logit is empty" in r.getMessage()]
    assert len(lines) == 1 and "attention interface" in lines[0]


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_a_bert_encoder_in_a_plain_loop(family, tmp_path):
    """10 masked-LM steps of a 2-layer BERT (RoBERTa; Post-LN, not causal) with a padded probe
    batch: the per-sublayer gradient norms, each LayerNorm's input norm and each attention's
    largest logit over the real tokens, equal to their computation by hand on the same step."""
    import transformers as t

    torch.manual_seed(0)
    sizes = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64,
                 vocab_size=VOCAB, max_position_embeddings=T + 2)  # RoBERTa's positions start after its pad id
    model = (t.BertForMaskedLM(t.BertConfig(**sizes)) if family == "bert"
             else t.RobertaForMaskedLM(t.RobertaConfig(**sizes)))
    mask = torch.ones(4, T, dtype=torch.long)
    mask[1, T // 2:] = 0  # a padded probe sequence
    probe = {"input_ids": _tokens(4, T, seed=1), "attention_mask": mask}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    monitor = Monitor(model, probe, tmp_path / "bert", optimizer=optimizer, steps=10)
    layers = model.base_model.encoder.layer
    by_hand = {}
    for step in range(1, 11):
        tokens = _tokens(8, T, seed=10 + step)
        model(input_ids=tokens, labels=tokens).loss.backward()

        def norm(*modules):
            return math.sqrt(sum(p.grad.pow(2).sum().item() for m in modules for p in m.parameters()))
        by_hand[step] = [n for layer in layers for n in (norm(layer.attention), norm(layer.intermediate, layer.output))]
        optimizer.step()
        optimizer.zero_grad()
        monitor.step()
    monitor.close()
    rows = pd.read_csv(tmp_path / "bert" / "layers.csv")
    for step in (1, 10):
        assert rows[rows.step == step].grad_norm.tolist() == pytest.approx(by_hand[step], rel=1e-5)

    # Step 10's LayerNorm inputs and attention logits, by hand over the real tokens.
    real = mask.bool()
    norms, logits = [], []
    hooks = [ln.register_forward_pre_hook(lambda m, args: norms.append(args[0].norm(dim=-1)[real].mean().item()))
             for layer in layers for ln in (layer.attention.output.LayerNorm, layer.output.LayerNorm)]

    def scores(attn, args, kwargs):
        h = args[0]
        q, k = (f(h).unflatten(-1, (4, 8)).transpose(1, 2) for f in (attn.query, attn.key))
        logits.append((q @ k.transpose(-1, -2) / math.sqrt(8)).masked_fill(~real[:, None, None, :], -1e9).amax().item())
    hooks += [layer.attention.self.register_forward_pre_hook(scores, with_kwargs=True) for layer in layers]
    model.eval()
    with torch.no_grad():
        model(**probe)
    for h in hooks:
        h.remove()
    last = rows[rows.step == 10]
    assert last.ln_input_norm.tolist() == pytest.approx(norms, rel=1e-5)
    assert last[last.sublayer == "self_attn"].max_attn_logit.tolist() == pytest.approx(logits, rel=1e-5)
    assert last.sublayer.tolist() == ["self_attn", "ffn"] * 2 and set(last["stack"]) == {"encoder"}


def test_log_z_of_a_classifier_is_over_its_sequences_and_a_model_without_logits_leaves_it_empty(tmp_path):
    """A sequence classifier's head gives one row of logits per sequence (B, C): log Z is read over
    the probe batch's sequences (equal to logsumexp by hand); a body without a head (BertModel,
    GPT2Model, T5Model) gives no logits: its log Z cells are empty, every other column is written."""
    from transformers import BertConfig, BertForSequenceClassification, BertModel, T5Config, T5Model

    torch.manual_seed(0)
    bert = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64,
                vocab_size=VOCAB, max_position_embeddings=32)
    classifier = BertForSequenceClassification(BertConfig(num_labels=3, **bert))
    mask = torch.ones(4, T, dtype=torch.long)
    mask[1, T // 2:] = 0
    probe = {"input_ids": _tokens(4, T, seed=1), "attention_mask": mask}
    optimizer = torch.optim.AdamW(classifier.parameters(), lr=1e-3)
    monitor = Monitor(classifier, probe, tmp_path / "classifier", optimizer=optimizer, steps=3)
    for step in range(1, 4):
        classifier(input_ids=_tokens(8, T, seed=10 + step), labels=torch.arange(8) % 3).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        monitor.step()
    monitor.close()
    classifier.eval()
    with torch.no_grad():
        by_hand = torch.logsumexp(classifier(**probe).logits, dim=-1)
    last = pd.read_csv(tmp_path / "classifier" / "metrics.csv").iloc[-1]
    assert last.step == 3 and last.log_z_mean == pytest.approx(by_hand.mean().item(), rel=1e-5)
    assert last.log_z_max == pytest.approx(by_hand.max().item(), rel=1e-5)

    from transformers import GPT2Model

    bodies = {"bert_body": (BertModel(BertConfig(**bert)), probe),
              "gpt2_body": (GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=32)),
                            {"input_ids": _tokens(4, T, seed=1)}),
              "t5_body": (T5Model(T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)),
                          {"input_ids": _tokens(4, T, seed=1), "decoder_input_ids": _tokens(4, T, seed=2)})}
    for name, (body, batch) in bodies.items():
        optimizer = torch.optim.AdamW(body.parameters(), lr=1e-3)
        monitor = Monitor(body, batch, tmp_path / name, optimizer=optimizer, steps=2)
        for _ in range(2):
            out = body(**batch)
            out.last_hidden_state.pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            monitor.step()
        monitor.close()
        metrics = pd.read_csv(tmp_path / name / "metrics.csv")
        assert metrics.log_z_mean.isna().all() and metrics.log_z_max.isna().all(), name
        assert metrics.model_update.iloc[-1] > 0 and metrics.grad_norm.iloc[-1] > 0, name


@pytest.mark.parametrize("family", ["bart", "marian"])
def test_a_bart_style_encoder_decoder_in_a_plain_loop(family, tmp_path):
    """10 steps of a 2L-2L BART (Marian), the papers' Post-LN encoder-decoder, with padded source
    and target probe sequences: per-sublayer gradient norms (encoder, then decoder with its
    cross-attentions), each LayerNorm's input norm over its stack's real tokens and each
    attention's largest logit over the pairs it may use, equal to their computation by hand."""
    import transformers as t

    torch.manual_seed(0)
    sizes = dict(encoder_layers=2, decoder_layers=2, d_model=32, encoder_attention_heads=4, decoder_attention_heads=4,
                 encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=VOCAB, max_position_embeddings=32, pad_token_id=1,
                 bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
    model = (t.BartForConditionalGeneration(t.BartConfig(**sizes)) if family == "bart"
             else t.MarianMTModel(t.MarianConfig(**sizes)))
    src_mask, tgt_mask = torch.ones(3, T, dtype=torch.long), torch.ones(3, T // 2, dtype=torch.long)
    src_mask[0, T // 2:], tgt_mask[2, T // 4:] = 0, 0
    probe = {"input_ids": _tokens(3, T, seed=1), "attention_mask": src_mask,
             "decoder_input_ids": _tokens(3, T // 2, seed=2), "decoder_attention_mask": tgt_mask}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    monitor = Monitor(model, probe, tmp_path / family, optimizer=optimizer, steps=10)
    encoder, decoder = model.model.encoder.layers, model.model.decoder.layers

    def groups(layer, decoder_layer):
        attentions = [(layer.self_attn, layer.self_attn_layer_norm)]
        if decoder_layer:
            attentions.append((layer.encoder_attn, layer.encoder_attn_layer_norm))
        return [*attentions, (layer.fc1, layer.fc2, layer.final_layer_norm)]
    sublayers = [g for layer in encoder for g in groups(layer, False)] + [g for layer in decoder for g in groups(layer, True)]
    by_hand = {}
    for step in range(1, 11):
        src, tgt = _tokens(8, T, seed=10 + step), _tokens(8, T // 2, seed=30 + step)
        model(input_ids=src, decoder_input_ids=tgt, labels=tgt).loss.backward()
        by_hand[step] = [math.sqrt(sum(p.grad.pow(2).sum().item() for m in g for p in m.parameters())) for g in sublayers]
        optimizer.step()
        optimizer.zero_grad()
        monitor.step()
    monitor.close()
    rows = pd.read_csv(tmp_path / family / "layers.csv")
    for step in (1, 10):
        assert rows[rows.step == step].grad_norm.tolist() == pytest.approx(by_hand[step], rel=1e-5)

    # Step 10's LayerNorm inputs and attention logits, by hand over the real tokens.
    real = {"encoder": src_mask.bool(), "decoder": tgt_mask.bool()}
    norms, logits = [], []

    def ln_input(stack):
        return lambda m, args: norms.append(args[0].norm(dim=-1)[real[stack]].mean().item())

    def scores(causal, keys):
        def hook(attn, args, kwargs):
            h = args[0] if args else kwargs["hidden_states"]
            kv = kwargs.get("key_value_states")
            q = attn.q_proj(h).unflatten(-1, (4, 8)).transpose(1, 2)
            k = attn.k_proj(h if kv is None else kv).unflatten(-1, (4, 8)).transpose(1, 2)
            s = q @ k.transpose(-1, -2) / math.sqrt(8)
            allowed = real[keys][:, None, None, :].expand_as(s)
            if causal:
                allowed = allowed & torch.ones(s.shape[-2:], dtype=torch.bool).tril()
            logits.append(s.masked_fill(~allowed, -1e9).amax().item())
        return hook
    hooks = []
    for stack, layers in (("encoder", encoder), ("decoder", decoder)):
        for layer in layers:
            lns = [layer.self_attn_layer_norm, *([layer.encoder_attn_layer_norm] if stack == "decoder" else []),
                   layer.final_layer_norm]
            hooks += [ln.register_forward_pre_hook(ln_input(stack)) for ln in lns]
            hooks.append(layer.self_attn.register_forward_pre_hook(scores(stack == "decoder", stack), with_kwargs=True))
            if stack == "decoder":
                hooks.append(layer.encoder_attn.register_forward_pre_hook(scores(False, "encoder"), with_kwargs=True))
    model.eval()
    with torch.no_grad():
        model(**probe)
    for h in hooks:
        h.remove()
    last = rows[rows.step == 10]
    assert last.ln_input_norm.tolist() == pytest.approx(norms, rel=1e-5)
    assert last[last.sublayer != "ffn"].max_attn_logit.tolist() == pytest.approx(logits, rel=1e-5)
    assert last.sublayer.tolist() == ["self_attn", "ffn"] * 2 + ["self_attn", "cross_attn", "ffn"] * 2


def _opt(pre_ln: bool):
    """A 2-layer OPT: Pre-LN (do_layer_norm_before, most OPT sizes), or Post-LN laid out as
    OPT-350m (no final norm; word_embed_proj_dim != hidden_size: project_in, project_out)."""
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(0)
    return OPTForCausalLM(OPTConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, ffn_dim=64,
                                    word_embed_proj_dim=32 if pre_ln else 16, do_layer_norm_before=pre_ln,
                                    vocab_size=VOCAB, max_position_embeddings=32, bos_token_id=0, eos_token_id=0,
                                    pad_token_id=1))


def _recording_attention(model):
    """Every attention of `model` (its stacks' deep-copied configs too) through the
    logit_recorder fixture's attention and eager masks."""
    for module in model.modules():
        if getattr(module, "config", None) is not None:
            module.config._attn_implementation = "stabexp_recording"


def _masks_matter(recorded, keys, causal, padded=True):
    """The batch tells a wrong mask from the right one: in some attention call a padded key
    (unless not `padded`), and in some causal one a later key, would hold the largest logit if
    let in (`keys`: each call's real keys (B, S); `causal`: which calls are)."""
    padded_in, later_in = [], []
    for scores, real, is_causal in zip(recorded.scores, keys, causal):
        later = torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1) if is_causal else None
        padded_in.append(scores.masked_fill(later, float("-inf")).amax().item() if is_causal else scores.amax().item())
        later_in.append(scores.masked_fill(~real[:, None, None, :], float("-inf")).amax().item() if is_causal else None)
    assert len(recorded) == len(keys)
    assert not padded or any(p > m for p, m in zip(padded_in, recorded))
    assert any(l is not None and l > m for l, m in zip(later_in, recorded))


def _grad_norm(parameters):
    """By hand: the norm of the parameters' gradients, together."""
    return math.sqrt(sum(p.grad.pow(2).sum().item() for p in parameters))


def _per_token_update(features, features_init, real):
    """By hand: sqrt(mean over the real tokens of ||F_t - F_0||^2)."""
    return (features - features_init).pow(2).sum(-1)[real].mean().sqrt().item()


@pytest.mark.parametrize("pre_ln", [True, False], ids=["pre_ln", "post_ln_350m_layout"])
def test_an_opt_decoder_in_a_plain_loop(pre_ln, tmp_path, logit_recorder):
    """10 steps of a 2-layer OPT, Pre-LN and OPT-350m's Post-LN layout, with a probe batch padded
    on the right and on the left: per-sublayer gradient norms, each LayerNorm's input norm and
    each sublayer's stream norm over the real tokens (Post-LN: the layer's input, then the
    self-attention's LayerNorm output), each attention's largest logit over the causal pairs of
    real keys, and the model update of the last hidden state the model returns (after
    project_out in the 350m layout), equal to their computation by hand on the same step."""
    model = _opt(pre_ln)
    mask = torch.ones(4, T, dtype=torch.long)
    mask[1, T // 2:], mask[2, :T // 2], mask[3, :3] = 0, 0, 0  # padded on the right, on the left
    probe = {"input_ids": _tokens(4, T, seed=7), "attention_mask": mask}
    real = mask.bool()
    model.eval()
    with torch.no_grad():
        features_init = model(**probe, output_hidden_states=True).hidden_states[-1]
    model.train()
    assert features_init.shape[-1] == (32 if pre_ln else 16)  # 350m's layout: F is project_out's output
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    monitor = Monitor(model, probe, tmp_path / "opt", optimizer=optimizer, steps=10)
    layers = model.model.decoder.layers
    groups = [g for layer in layers for g in ((layer.self_attn, layer.self_attn_layer_norm),
                                              (layer.fc1, layer.fc2, layer.final_layer_norm))]
    by_hand = {}
    for step in range(1, 11):
        tokens = _tokens(8, T, seed=10 + step)
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        by_hand[step] = ([_grad_norm(p for m in g for p in m.parameters()) for g in groups],
                         _grad_norm(model.parameters()))
        optimizer.step()
        optimizer.zero_grad()
        monitor.step(loss)
    monitor.close()
    metrics = pd.read_csv(tmp_path / "opt" / "metrics.csv").set_index("step")
    rows = pd.read_csv(tmp_path / "opt" / "layers.csv")
    rows = rows[rows.param.isna()]
    for step in (1, 10):
        assert rows[rows.step == step].grad_norm.tolist() == pytest.approx(by_hand[step][0], rel=1e-5)
        assert metrics.grad_norm[step] == pytest.approx(by_hand[step][1], rel=1e-5)

    # Step 10, by hand on the same weights: each LayerNorm's input over the real tokens (OPT's
    # layer hands its FFN the stream flattened to (B*T, d)), the stream entering each sublayer.
    def mean_norm(x):
        return x.norm(dim=-1).reshape(real.shape)[real].mean().item()
    ln_inputs, outputs = {}, {}
    hooks = []
    for i, layer in enumerate(layers):
        for name, ln in (("self_attn", layer.self_attn_layer_norm), ("ffn", layer.final_layer_norm)):
            hooks.append(ln.register_forward_pre_hook(lambda m, args, key=(i, name): ln_inputs.update({key: args[0]})))
            hooks.append(ln.register_forward_hook(lambda m, args, out, key=(i, name): outputs.update({key: out})))
    _recording_attention(model)
    model.eval()
    logit_recorder.clear()
    with torch.no_grad():
        out = model(**probe, output_hidden_states=True)
    for h in hooks:
        h.remove()
    norms = [mean_norm(ln_inputs[i, name]) for i in range(2) for name in ("self_attn", "ffn")]
    if pre_ln:
        streams = norms  # the stream entering a sublayer is its norm's input
    else:  # the layer's input (hidden_states[i]), then the self-attention's LayerNorm output
        streams = [s for i in range(2) for s in (mean_norm(out.hidden_states[i]), mean_norm(outputs[i, "self_attn"]))]
        assert not any(abs(a - b) < 1e-6 for a, b in zip(norms, streams))  # Post-LN: the norm takes x + G(x)
    last = rows[rows.step == 10]
    assert last.sublayer.tolist() == ["self_attn", "ffn"] * 2 and set(last["stack"]) == {"decoder"}
    assert last.ln_input_norm.tolist() == pytest.approx(norms, rel=1e-5)
    assert last.stream_norm.tolist() == pytest.approx(streams, rel=1e-5)
    assert last[last.sublayer == "self_attn"].max_attn_logit.tolist() == pytest.approx(logit_recorder, rel=1e-4)
    # In the Post-LN model here no padded key would hold the largest logit if let in: the Pre-LN
    # one tells the padding mask's work.
    _masks_matter(logit_recorder, [real, real], causal=[True, True], padded=pre_ln)
    assert metrics.model_update[10] == pytest.approx(
        _per_token_update(out.hidden_states[-1], features_init, real), rel=1e-4)
    top = out.hidden_states[-1] if pre_ln else model.model.decoder.project_out(outputs[1, "ffn"])
    assert torch.allclose(out.hidden_states[-1], top) and torch.allclose(out.logits, model.lm_head(top), atol=1e-6)


def _t5(family):
    """A 2L-2L T5 (classic: ReLU FFN, its output scaled by d_model^-1/2 before lm_head) or mT5
    (T5 v1.1's gated-GELU FFN: DenseReluDense.wi_0, wi_1)."""
    import transformers as t

    torch.manual_seed(0)
    sizes = dict(num_layers=2, d_model=32, num_heads=4, d_kv=8, d_ff=64, vocab_size=VOCAB, decoder_start_token_id=0,
                 pad_token_id=0, eos_token_id=1)
    if family == "t5":
        return t.T5ForConditionalGeneration(t.T5Config(**sizes))
    return t.MT5ForConditionalGeneration(t.MT5Config(feed_forward_proj="gated-gelu", **sizes))


@pytest.mark.parametrize("family", ["t5", "mt5"])
def test_a_t5_encoder_decoder_in_a_plain_loop(family, tmp_path, logit_recorder):
    """10 steps of a 2L-2L T5 (an mT5 with T5 v1.1's gated FFN), Pre-LN with RMS norms and a
    relative position bias, with padded source and target probe sequences: per-sublayer gradient
    norms (encoder, then decoder with its cross-attentions), each T5LayerNorm's input norm over
    its stack's real tokens (the stream itself), each attention's largest logit as the softmax
    sees it (q.k unscaled plus the position bias, over the pairs the masks keep), the model
    update of the decoder's last hidden state (its final_layer_norm's output) and log Z of the
    model's logits, equal to their computation by hand on the same step."""
    model = _t5(family)
    src_mask, tgt_mask = torch.ones(3, T, dtype=torch.long), torch.ones(3, T // 2, dtype=torch.long)
    src_mask[0, T // 2:], src_mask[1, :2], tgt_mask[2, T // 4:] = 0, 0, 0
    probe = {"input_ids": _tokens(3, T, seed=3), "attention_mask": src_mask,
             "decoder_input_ids": _tokens(3, T // 2, seed=4), "decoder_attention_mask": tgt_mask}
    real = {"encoder": src_mask.bool(), "decoder": tgt_mask.bool()}
    model.eval()
    with torch.no_grad():
        features_init = model(**probe, output_hidden_states=True).decoder_hidden_states[-1]
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    monitor = Monitor(model, probe, tmp_path / family, optimizer=optimizer, steps=10)
    stacks = [("encoder", model.encoder.block), ("decoder", model.decoder.block)]
    parts = [(stack, part) for stack, blocks in stacks for block in blocks for part in block.layer]
    by_hand = {}
    for step in range(1, 11):
        src, tgt = _tokens(8, T, seed=10 + step), _tokens(8, T // 2, seed=30 + step)
        loss = model(input_ids=src, labels=tgt).loss
        loss.backward()
        by_hand[step] = ([_grad_norm(part.parameters()) for _, part in parts], _grad_norm(model.parameters()))
        optimizer.step()
        optimizer.zero_grad()
        monitor.step(loss)
    monitor.close()
    metrics = pd.read_csv(tmp_path / family / "metrics.csv").set_index("step")
    rows = pd.read_csv(tmp_path / family / "layers.csv")
    rows = rows[rows.param.isna()]
    for step in (1, 10):
        assert rows[rows.step == step].grad_norm.tolist() == pytest.approx(by_hand[step][0], rel=1e-5)
        assert metrics.grad_norm[step] == pytest.approx(by_hand[step][1], rel=1e-5)

    # Step 10, by hand on the same weights: each sub-layer norm's input over its stack's real
    # tokens; the logits the model's own attention computes, recorded (q.k + position bias).
    norms, top = [], []
    hooks = [part.layer_norm.register_forward_pre_hook(
        lambda m, args, stack=stack: norms.append(args[0].norm(dim=-1)[real[stack]].mean().item()))
        for stack, part in parts]
    hooks.append(model.decoder.final_layer_norm.register_forward_hook(lambda m, args, out: top.append(out)))
    _recording_attention(model)
    model.eval()
    logit_recorder.clear()
    with torch.no_grad():
        out = model(**probe, output_hidden_states=True)
    for h in hooks:
        h.remove()
    last = rows[rows.step == 10]
    assert last.sublayer.tolist() == ["self_attn", "ffn"] * 2 + ["self_attn", "cross_attn", "ffn"] * 2
    assert last["stack"].tolist() == ["encoder"] * 4 + ["decoder"] * 6
    assert last.ln_input_norm.tolist() == pytest.approx(norms, rel=1e-5)
    assert last.stream_norm.tolist() == pytest.approx(norms, rel=1e-5)  # Pre-LN: the stream is the norm's input
    assert len(logit_recorder) == 6
    assert last[last.sublayer != "ffn"].max_attn_logit.tolist() == pytest.approx(logit_recorder, rel=1e-4)
    # In the model's order: the encoder's self-attentions, then each decoder block's self and cross.
    _masks_matter(logit_recorder, [real[k] for k in ("encoder",) * 2 + ("decoder", "encoder") * 2],
                  causal=[False, False, True, False, True, False])
    features = out.decoder_hidden_states[-1]
    assert torch.equal(features, top[0])  # F: after the decoder's final_layer_norm
    assert metrics.model_update[10] == pytest.approx(_per_token_update(features, features_init, real["decoder"]),
                                                     rel=1e-4)
    log_z = torch.logsumexp(out.logits, dim=-1)[real["decoder"]]
    assert [metrics.log_z_mean[10], metrics.log_z_max[10]] == pytest.approx([log_z.mean().item(), log_z.max().item()],
                                                                            rel=1e-5)


def _blocks_norms(model):
    base = model.base_model
    if hasattr(base, "h"):
        return [(b.ln_1, getattr(b, "ln_2", b.ln_1)) for b in base.h]  # GPT-J: one norm for both
    return [(b.input_layernorm, b.post_attention_layernorm) for b in base.layers]


def test_stabexp_report_and_the_api_read_a_monitored_folder(tmp_path, capsys):
    from stabexp import api
    from stabexp.report import main as report

    model, probe = _gpt2(2), {"input_ids": _tokens(2, T, seed=1)}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    held_out = _tokens(4, T, seed=2)
    monitor = Monitor(model, probe, tmp_path / "sweep" / "gpt2", optimizer=optimizer, steps=4, eval_every=2,
                      evaluate=lambda m: {"eval_loss": m(input_ids=held_out, labels=held_out).loss.item()},
                      describe={"group": "gpt2_from_config", "seed": 0, "task": "random tokens"})
    _train_lm(model, optimizer, monitor, [_tokens(4, T, seed=10 + step) for step in range(4)])
    summary = monitor.close()
    assert report([str(tmp_path / "sweep")]) == 0
    out = capsys.readouterr().out
    assert "gpt2_from_config" in out and f"{summary['final_eval_loss']:.3f}" in out
    run = api.load_run(tmp_path / "sweep" / "gpt2")
    assert run.metrics.model_update.notna().all() and len(run.layers.query("step == 4")) == 4


class _Seq2Seq(nn.Module):
    """A model of one's own on torch.nn.Transformer (encoder-decoder)."""

    def __init__(self, norm_first: bool):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, 16)
        self.body = nn.Transformer(16, 2, 2, 2, 32, dropout=0.0, batch_first=True, norm_first=norm_first)
        self.out = nn.Linear(16, VOCAB)

    def forward(self, src, tgt):
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        return self.out(self.body(self.embed(src), self.embed(tgt), tgt_mask=mask, tgt_is_causal=True))


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")  # nn.Transformer's own, for norm_first
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
def test_a_torch_nn_transformer_in_a_plain_loop(norm_first, tmp_path):
    """Encoder and decoder sublayers (self, cross, FFN) of nn.Transformer, Post-LN and Pre-LN:
    gradient norms and LN inputs by hand; Post-LN's norm takes x + G(x), Pre-LN's the stream."""
    model = _Seq2Seq(norm_first)
    probe = (_tokens(2, 6, seed=1), _tokens(2, 5, seed=2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = Monitor(model, probe, tmp_path, optimizer=optimizer, every=1)
    src, tgt = _tokens(4, 6, seed=3), _tokens(4, 5, seed=4)
    loss = nn.functional.cross_entropy(model(src, tgt).flatten(0, 1), tgt.flatten())
    loss.backward()
    layers_of = [l for stack in (model.body.encoder.layers, model.body.decoder.layers) for l in stack]
    expected = []
    for layer in layers_of:
        attns = [(layer.self_attn, layer.norm1)] + ([(layer.multihead_attn, layer.norm2)]
                                                    if hasattr(layer, "multihead_attn") else [])
        ffn_norm = layer.norm3 if hasattr(layer, "norm3") else layer.norm2
        groups = [[attn, norm] for attn, norm in attns] + [[layer.linear1, layer.linear2, ffn_norm]]
        expected += [math.sqrt(sum(p.grad.pow(2).sum().item() for m in g for p in m.parameters())) for g in groups]
    optimizer.step()
    optimizer.zero_grad()
    monitor.step(loss)
    monitor.close()
    layers = pd.read_csv(tmp_path / "layers.csv")
    rows = layers[layers.step == 1]
    assert rows.sublayer.tolist() == ["self_attn", "ffn"] * 2 + ["self_attn", "cross_attn", "ffn"] * 2
    assert rows.grad_norm.tolist() == pytest.approx(expected, rel=1e-5)
    assert rows.max_attn_logit.notna().tolist() == [s != "ffn" for s in rows.sublayer]
    same = (rows.ln_input_norm - rows.stream_norm).abs() < 1e-6
    assert same.all() if norm_first else not same.any()


def test_the_logits_of_a_forward_that_returns_a_dict_are_its_logits_entry(tmp_path):
    """A model whose forward returns {"logits": ..., ...}: log Z is read from that entry."""

    class DictOutput(nn.Module):
        def __init__(self):
            super().__init__()
            layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
            self.body, self.head = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), nn.Linear(16, 7)

        def forward(self, x):
            hidden = self.body(x)
            return {"logits": self.head(hidden), "hidden": hidden}

    torch.manual_seed(0)
    model, probe = DictOutput(), torch.randn(2, 5, 16)
    monitor = Monitor(model, probe, tmp_path)
    model(torch.randn(4, 5, 16))["logits"].pow(2).mean().backward()
    monitor.step()
    monitor.close()
    model.eval()
    with torch.no_grad():
        by_hand = torch.logsumexp(model(probe)["logits"], dim=-1)
    last = pd.read_csv(tmp_path / "metrics.csv").iloc[-1]
    assert last.log_z_mean == pytest.approx(by_hand.mean().item(), rel=1e-5)
    assert last.log_z_max == pytest.approx(by_hand.max().item(), rel=1e-5)


def test_on_stabexps_own_model_the_monitor_writes_what_stabexp_run_writes(make_cfg, tmp_path):
    """The same seed and batches in a plain loop: every probe column of metrics.csv and
    layers.csv equal to the trainer's, bit for bit."""
    from stabexp.data import make_task
    from stabexp.train.build import describe, lr_schedule, model_for
    from stabexp.train.optim import build_optimizer
    from stabexp.train.trainer import train

    cfg = make_cfg("train.steps=9", "probe.weights=true", "optim=adamw")
    train(cfg, tmp_path / "run")
    cpu = torch.device("cpu")
    torch.manual_seed(cfg.seed)  # as a Run: the seed, the probe batch, then the model
    task = make_task(cfg, cpu)
    src, tgt_in, _ = task.probe_batch()
    model = model_for(cfg, task, cpu)
    describe(cfg, model, task, cpu, {})
    optimizer = build_optimizer(cfg, model, cpu)
    schedule = lr_schedule(cfg, optimizer)
    monitor = Monitor(model, (src, tgt_in), tmp_path / "monitor", optimizer=optimizer, probes=("layers", "weights"),
                      every=cfg.probe.every, first_steps=cfg.probe.first_steps, steps=cfg.train.steps)
    model.train()
    for step in range(1, cfg.train.steps + 1):
        batch_src, batch_tgt_in, tgt_out = task.train_batch()
        loss = task.loss(model(batch_src, batch_tgt_in), tgt_out)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        monitor.step(loss)
    monitor.close()
    for name, columns in (("metrics.csv", ["step", "lr", "loss", "grad_norm", "model_update", "log_z_mean",
                                           "log_z_max"]),
                          ("layers.csv", ["step", "stack", "layer", "sublayer", "param", "grad_norm", "ln_input_norm",
                                          "stream_norm", "max_attn_logit", "relative_update", "weight_norm",
                                          "angular_update", "effective_lr", "scale_invariant"])):
        run = pd.read_csv(tmp_path / "run" / name)[columns]
        monitored = pd.read_csv(tmp_path / "monitor" / name)[columns]
        assert run.step.tolist() == monitored.step.tolist()
        pd.testing.assert_frame_equal(run, monitored, check_exact=True)


def test_a_probe_the_model_cannot_give_is_refused_in_one_line(tmp_path):
    from stabexp.errors import ConfigError

    with pytest.raises(ConfigError, match="probe dependency needs .*stabexp_model.*GPT2LMHeadModel"):
        Monitor(_gpt2(1), {"input_ids": _tokens(1, 4)}, tmp_path, probes=("dependency",))
    with pytest.raises(ConfigError, match=r"probes=\['gradnorm'\] is not allowed"):
        Monitor(_gpt2(1), {"input_ids": _tokens(1, 4)}, tmp_path, probes=("gradnorm",))


def test_grad_norm_is_before_the_loop_s_clipping_summed_over_micro_batches(tmp_path):
    """A loop that accumulates two micro-batches and clips to 0.01 before its optimiser step:
    grad_norm is the accumulated gradient's, before clipping, with the optimiser's pre-hook and
    with before_step called after the clipping alike."""
    for hooked in (True, False):
        model = _gpt2(2)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
        monitor = Monitor(model, {"input_ids": _tokens(4, T, seed=1)}, tmp_path / str(hooked),
                          optimizer=optimizer if hooked else None, every=2, first_steps=1, steps=4)
        by_hand = {}
        for step in range(1, 5):
            for half in _tokens(2, 4, T, seed=step):
                (model(input_ids=half, labels=half).loss / 2).backward()
            by_hand[step] = _hf_sublayer_grads(model)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
            if not hooked:
                monitor.before_step()
            optimizer.step()
            optimizer.zero_grad()
            monitor.step()
        monitor.close()
        metrics = pd.read_csv(tmp_path / str(hooked) / "metrics.csv").set_index("step")
        layers = pd.read_csv(tmp_path / str(hooked) / "layers.csv")
        assert metrics.index.tolist() == [0, 1, 2, 4]
        for step in (1, 2, 4):
            per, total = by_hand[step]
            assert total > 0.1  # well above what the clipping leaves
            assert metrics.grad_norm[step] == pytest.approx(total, rel=1e-5)
            assert layers[layers.step == step].grad_norm.tolist() == pytest.approx(per, rel=1e-5)


def test_grad_norm_under_a_loss_scaler_is_the_unscaled_gradient_s(tmp_path):
    """fp16-style loss scaling (a GradScaler at scale 1024): the backward pass leaves the
    gradients 1024 times too large; grad_norm is the unscaled one, before clipping."""
    model = _gpt2(2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    monitor = Monitor(model, {"input_ids": _tokens(4, T, seed=1)}, tmp_path / "scaled", optimizer=optimizer,
                      grad_scaler=scaler, every=1, steps=3)
    by_hand = {}
    for step in range(1, 4):
        tokens = _tokens(4, T, seed=step)
        scaler.scale(model(input_ids=tokens, labels=tokens).loss).backward()
        scaler.unscale_(optimizer)
        by_hand[step] = _hf_sublayer_grads(model)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        monitor.step()
    monitor.close()
    metrics = pd.read_csv(tmp_path / "scaled" / "metrics.csv").set_index("step")
    for step in (1, 2, 3):
        assert metrics.grad_norm[step] == pytest.approx(by_hand[step][1], rel=1e-5)


def test_the_hugging_face_trainer_callback(tmp_path):
    """The same probes from a Trainer: 50 steps of a 4-layer GPT-2 whose gradients the
    Trainer clips (max_grad_norm 1). The gradient norms are those before clipping: the total
    is the grad_norm the Trainer logs, and each sublayer's the one the optimiser steps with
    (by hand in a callback of the same moment) scaled back by the clipping's one factor;
    `stabexp report` reads the folder."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from stabexp.monitor import HFTrainerMonitor
    from stabexp.report import main as report

    model, data = _gpt2(4), _tokens(400, T)
    by_hand, logged = {}, {}

    class ByHand(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            by_hand[state.global_step + 1] = _hf_sublayer_grads(model)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if "grad_norm" in (logs or {}):
                logged[state.global_step] = logs["grad_norm"]

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return len(data)

        def __getitem__(self, i):
            return {"input_ids": data[i], "labels": data[i]}

    args = TrainingArguments(output_dir=str(tmp_path / "hf"), max_steps=50, per_device_train_batch_size=8,
                             learning_rate=1e-3, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True,
                             logging_strategy="steps", logging_steps=1, max_grad_norm=1.0)
    monitor = HFTrainerMonitor({"input_ids": _tokens(4, T, seed=1)}, tmp_path / "sweep" / "gpt2",
                               describe={"group": "gpt2_trainer", "seed": 0})
    Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[monitor, ByHand()]).train()
    metrics = pd.read_csv(tmp_path / "sweep" / "gpt2" / "metrics.csv").set_index("step")
    layers = pd.read_csv(tmp_path / "sweep" / "gpt2" / "layers.csv")
    assert metrics.index.tolist() == list(range(21)) + [30, 40, 50]
    assert metrics.loss.loc[1:].notna().all() and metrics.model_update.loc[1:].gt(0).all()
    clipped = [step for step in (1, 2, 3, 20, 50) if logged[step] > 1.0]
    assert clipped, logged  # the clipping acted on a step compared here
    for step in (1, 2, 3, 20, 50):
        per, total = by_hand[step]  # as the optimiser steps with them: clipped where above 1
        assert metrics.grad_norm[step] == pytest.approx(logged[step], rel=1e-5)
        unclip = logged[step] / total
        assert layers[layers.step == step].grad_norm.tolist() == pytest.approx([g * unclip for g in per], rel=1e-4)
    assert report([str(tmp_path / "sweep")]) == 0


def test_the_lightning_callback(tmp_path):
    """A LightningModule on nn.TransformerEncoder (Post-LN): 10 steps; the gradient norms those
    of on_before_optimizer_step, by hand in a callback of the same moment."""
    L = pytest.importorskip("lightning", reason="the monitor extra: make install EXTRAS=monitor")

    from stabexp.monitor import LightningMonitor

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.embed = nn.Embedding(VOCAB, 16)
            layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
            self.body = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.out = nn.Linear(16, VOCAB)

        def forward(self, x):
            return self.out(self.body(self.embed(x)))

        def training_step(self, batch, index):
            x = batch[0]
            return nn.functional.cross_entropy(self(x).flatten(0, 1), x.flip(1).flatten())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    by_hand = {}

    class ByHand(L.Callback):
        def on_before_optimizer_step(self, trainer, module, optimizer):
            by_hand[trainer.global_step + 1] = math.sqrt(sum(p.grad.pow(2).sum().item() for p in module.parameters()))

    data = torch.utils.data.TensorDataset(_tokens(80, 8))
    trainer = L.Trainer(max_steps=10, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu",
                        callbacks=[LightningMonitor(_tokens(4, 8, seed=1), tmp_path, probes=("layers", "weights")),
                                   ByHand()])
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=8))
    metrics = pd.read_csv(tmp_path / "metrics.csv").set_index("step")
    assert metrics.index.tolist() == list(range(11))
    assert metrics.grad_norm.loc[1:].tolist() == pytest.approx([by_hand[s] for s in range(1, 11)], rel=1e-5)
    layers = pd.read_csv(tmp_path / "layers.csv")
    assert set(layers.dropna(subset=["param"]).param) >= {"body.layers.0.linear1.weight"}



def test_the_documented_adapter_of_ones_own(tmp_path, monkeypatch):
    """docs/probes.md's BlocksAdapter, as the page writes it, on a model of timm's layout: the
    gradient norm of each sublayer by hand, and its LN inputs those of its norms."""
    import re
    import sys
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "probes.md").read_text()
    code = re.search(r"```python\n(# my_adapter\.py\n.*?)```", page, re.S).group(1)
    (tmp_path / "my_adapter.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_adapter", raising=False)
    from my_adapter import BlocksAdapter

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(16), nn.LayerNorm(16)
            self.attn = nn.Linear(16, 16)  # a stand-in token mixer
            self.mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))

        def forward(self, x):
            x = x + self.attn(self.norm1(x))
            return x + self.mlp(self.norm2(x))

    class Vit(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.embed, self.blocks, self.head = nn.Linear(8, 16), nn.Sequential(Block(), Block()), nn.Linear(16, 4)

        def forward_features(self, x):
            return self.blocks(self.embed(x))

        def forward_head(self, features):
            return self.head(features.mean(1))

        def forward(self, x):
            return self.forward_head(self.forward_features(x))

    model = Vit()
    x, y = torch.randn(4, 5, 8, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1, 2, 3])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = Monitor(model, x, tmp_path / "run", optimizer=optimizer, adapter=BlocksAdapter(model))
    nn.functional.cross_entropy(model(x), y).backward()
    expected = [math.sqrt(sum(p.grad.pow(2).sum().item() for m in group for p in m.parameters()))
                for b in model.blocks for group in ((b.norm1, b.attn), (b.norm2, b.mlp))]
    optimizer.step()
    monitor.step(0.0)
    monitor.close()
    rows = pd.read_csv(tmp_path / "run" / "layers.csv").query("step == 1")
    assert rows.grad_norm.tolist() == pytest.approx(expected, rel=1e-5)
    assert (rows.ln_input_norm == rows.stream_norm).all() and rows.max_attn_logit.isna().all()


def test_the_monitor_logs_to_the_trackers_what_it_writes(tmp_path):
    """logger="tensorboard": the same points as metrics.csv and layers.csv, inside the monitor's
    folder (it writes nowhere else)."""
    from test_tracking import assert_same_points, csv_column, events, scalars

    model, probe = _gpt2(2), {"input_ids": _tokens(2, T, seed=1)}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    folder = tmp_path / "sweep" / "gpt2"
    monitor = Monitor(model, probe, folder, optimizer=optimizer, logger="tensorboard", steps=5)
    _train_lm(model, optimizer, monitor, [_tokens(4, T, seed=step) for step in range(5)])
    monitor.close()
    acc = events(folder / "tensorboard" / "gpt2")
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir()) == ["gpt2"]
    for column in ("loss", "model_update", "grad_norm"):
        assert_same_points(scalars(acc, column), csv_column(folder / "metrics.csv", column), column)
    tag = "ln_input_norm/decoder/2/ffn"
    assert_same_points(scalars(acc, tag), csv_column(folder / "layers.csv", "ln_input_norm", stack="decoder", layer=2,
                                                     sublayer="ffn"), tag)


def test_a_monitor_takes_its_folder_as_a_run_does(tmp_path):
    """The folder's lock held while it runs; a folder holding a run's files, or held by a live
    process, refused in one line with nothing touched; overwrite=True replaces a finished run."""
    from stabexp.errors import ConfigError
    from stabexp.train.files import RunLock

    model, batch = _gpt2(1), _tokens(2, T)
    first = Monitor(model, batch, tmp_path / "m", every=1)
    with pytest.raises(ConfigError, match="is being run by pid"):
        Monitor(model, batch, tmp_path / "m")  # a second monitor while the first writes
    first.step(1.0)
    first.close()
    before = {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir() if p.is_file()}
    with pytest.raises(ConfigError, match=r"holds a run's files \(summary.json.*overwrite=True") as refused:
        Monitor(model, batch, tmp_path / "m")
    assert "\n" not in str(refused.value)
    assert {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir() if p.is_file()} == before
    again = Monitor(model, batch, tmp_path / "m", overwrite=True)
    again.close()
    assert pd.read_csv(tmp_path / "m" / "metrics.csv").step.tolist() == [0]  # the old run's rows gone

    held = RunLock(tmp_path / "live").acquire()  # a run (or anything) holding its folder
    try:
        with pytest.raises(ConfigError, match="is being run by"):
            Monitor(model, batch, tmp_path / "live")
    finally:
        held.release()
    assert not (tmp_path / "live" / "metrics.csv").exists()


def test_a_monitor_refuses_bad_arguments_in_one_line(tmp_path):
    from stabexp.errors import ConfigError

    model, batch = _gpt2(1), _tokens(2, T)
    for options, words in (({"every": 0}, "every=0 is not allowed"), ({"eval_every": 0}, "eval_every=0 is not allowed"),
                           ({"first_steps": -1}, "first_steps=-1 is not allowed"), ({"steps": 0}, "steps=0 is not allowed")):
        with pytest.raises(ConfigError, match=words):
            Monitor(model, batch, tmp_path / "bad", **options)
    with pytest.raises(ConfigError, match="has no parameters"):
        Monitor(nn.ReLU(), batch, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()  # refused before the folder is made
    monitor = Monitor(model, batch, tmp_path / "ok")
    with pytest.raises(TypeError, match="loss is a str"):
        monitor.step("0.5")
    monitor.step(torch.tensor(0.5))
    monitor.close()
    assert monitor.close()["steps_done"] == 1  # a second close writes nothing more
    with pytest.raises(RuntimeError, match="after monitor.close"):
        monitor.step(0.4)


def test_a_monitor_whose_start_fails_leaves_no_run_behind(tmp_path):
    """A start that fails after the folder is taken (a probe batch the model cannot take) leaves
    no summary.json reading "running" and no header-only CSVs: the folder it made is gone, one
    that was there keeps only what it held, and the next try with a good batch starts. A model,
    an optimiser or a describe of the wrong type is refused in one line before any folder."""
    from stabexp.errors import ConfigError

    model = _gpt2(1)
    with pytest.raises(Exception):
        Monitor(model, "not a batch", tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    with pytest.raises(Exception):
        Monitor(model, {"input_ids": "not ids"}, kept)
    assert sorted(p.name for p in kept.iterdir()) == ["notes.txt"]
    Monitor(model, _tokens(2, T), kept, steps=1).close()
    assert (kept / "summary.json").exists()
    cases = [(("notamodel", _tokens(2, T)), {}, "model='notamodel' is not allowed: a torch.nn.Module"),
             ((model, _tokens(2, T)), {"optimizer": "adam"}, "optimizer='adam' is not allowed"),
             ((model, _tokens(2, T)), {"describe": {"depth": "two"}},
              "describe={'depth': 'two'} is not allowed: its 'depth' is \"two\", where a run's summary has an int")]
    for args, options, words in cases:
        with pytest.raises(ConfigError, match=re.escape(words)) as refused:
            Monitor(*args, tmp_path / "refused", **options)
        assert "\n" not in str(refused.value)
    assert not (tmp_path / "refused").exists()


def test_a_module_holding_its_network_as_an_attribute_is_monitored_through_it(tmp_path):
    """The usual LightningModule: the Hugging Face model as `self.model`. The monitor finds it
    (the one child an adapter knows) and writes what it writes on the model itself; a module
    with no such child is refused naming what to pass."""
    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = _gpt2(2)

    probe, data = {"input_ids": _tokens(4, T, seed=1)}, _tokens(5, 8, T)
    written = {}
    for name, build in (("inner", lambda: _gpt2(2)), ("holder", Holder)):
        module = build()
        network = module.model if name == "holder" else module
        optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)
        monitor = Monitor(module, probe, tmp_path / name, optimizer=optimizer)
        _train_lm(module, optimizer, monitor, data, network)
        monitor.close()
        written[name] = pd.read_csv(tmp_path / name / "layers.csv")
    columns = ["step", "layer", "sublayer", "grad_norm", "ln_input_norm", "max_attn_logit"]
    pd.testing.assert_frame_equal(written["holder"][columns], written["inner"][columns])
    with pytest.raises(TypeError, match="no adapter knows Linear: pass the module that holds the layers"):
        Monitor(nn.Linear(4, 4), torch.zeros(1, 4), tmp_path / "linear")


def test_the_report_of_a_folder_monitored_without_evaluate_says_so(tmp_path, capsys):
    from stabexp.report import main as report

    model, probe = _gpt2(2), {"input_ids": _tokens(2, T, seed=1)}
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    monitor = Monitor(model, probe, tmp_path / "sweep" / "gpt2", optimizer=optimizer, steps=2)
    _train_lm(model, optimizer, monitor, [_tokens(2, T, seed=step) for step in range(2)])
    monitor.close()
    capsys.readouterr()
    assert report([str(tmp_path / "sweep")]) == 0
    out = capsys.readouterr().out
    assert "| not evaluated |" in out and "evaluate=" in out and "nan" not in out


def test_an_encoder_lm_s_attention_logits_read_the_mask_it_is_called_with():
    """An nn.TransformerEncoder language model called with a causal mask: the largest logit is
    over the pairs the mask allows (the encoder's self-attention is not causal by its kind)."""
    from stabexp.probes.adapters import adapter_for

    class EncoderLM(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(3)
            self.embed = nn.Embedding(VOCAB, 16)
            self.body = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True), 1,
                                              enable_nested_tensor=False)
            self.out = nn.Linear(16, VOCAB)

        def forward(self, x):
            mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
            return self.out(self.body(self.embed(x), mask=mask, is_causal=True))

    model, x = EncoderLM(), _tokens(2, 8, seed=4)
    attention = next(s for s in adapter_for(model).sublayers() if s.attention is not None)
    module, _, logits_of = attention.attention
    seen = []
    handle = module.register_forward_pre_hook(lambda m, args, kwargs: seen.append(logits_of(m, args, kwargs).item()),
                                              with_kwargs=True)
    adapter_for(model).probe_pass(x)
    handle.remove()
    mha, h = model.body.layers[0].self_attn, 2
    with torch.no_grad():
        q, k = nn.functional.linear(model.embed(x), mha.in_proj_weight[:32], mha.in_proj_bias[:32]).chunk(2, dim=-1)
        q, k = (t.unflatten(-1, (h, 8)).transpose(1, 2) for t in (q, k))
        every_pair = q @ k.transpose(-1, -2) / math.sqrt(8)
        causal = every_pair.masked_fill(torch.ones(8, 8, dtype=torch.bool).triu(1), float("-inf"))
    assert causal.amax().item() < every_pair.amax().item()  # the mask matters for this batch
    assert seen == pytest.approx([causal.amax().item()], rel=1e-5)


@pytest.mark.parametrize("family", ["mbart", "pegasus", "umt5"])
def test_a_model_no_adapter_knows_is_one_line_naming_the_adapter_to_write(family, tmp_path):
    """mBART and Pegasus (BART's names in Pre-LN order), UMT5 (T5's layout with a position bias
    in every block): refused when the monitor is built, in one line that names what to write,
    never an AttributeError later."""
    import transformers as t

    small = dict(vocab_size=VOCAB, bos_token_id=0, eos_token_id=2, pad_token_id=1)
    seq2seq = dict(encoder_layers=1, decoder_layers=1, d_model=16, encoder_attention_heads=2, decoder_attention_heads=2,
                   encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32, decoder_start_token_id=2,
                   **small)
    build = {
        "mbart": lambda: t.MBartForConditionalGeneration(t.MBartConfig(**seq2seq)),
        "pegasus": lambda: t.PegasusForConditionalGeneration(t.PegasusConfig(**seq2seq)),
        "umt5": lambda: t.UMT5ForConditionalGeneration(t.UMT5Config(num_layers=1, d_model=16, num_heads=2, d_ff=32,
                                                                    d_kv=8, vocab_size=VOCAB)),
    }[family]
    with pytest.raises(TypeError, match=re.escape(f"({family})") + ".*write a stabexp.probes.adapters.Adapter for it"):
        Monitor(build(), {"input_ids": _tokens(1, 4)}, tmp_path / family)
    assert not (tmp_path / family).exists()


def test_a_t5_probe_batch_of_input_ids_alone_is_refused_in_one_line(tmp_path):
    """T5, unlike BART, makes no decoder inputs of the input ids: a tensor probe batch is refused
    when the monitor is built, in one line that says what to give."""
    from transformers import T5Config, T5ForConditionalGeneration

    model = T5ForConditionalGeneration(T5Config(vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=1,
                                                num_heads=2))
    with pytest.raises(TypeError, match="a T5 probe batch is a dict of the model's inputs") as raised:
        Monitor(model, _tokens(2, T), tmp_path / "t5")
    assert "\n" not in str(raised.value)


class _MaskedEncoder(nn.Module):
    """An nn.TransformerEncoder body (sequence-first or batch-first) on (B, T) tokens."""

    def __init__(self, batch_first: bool):
        super().__init__()
        torch.manual_seed(5)
        self.batch_first = batch_first
        self.embed = nn.Embedding(VOCAB, 16)
        self.body = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=batch_first),
                                          2, enable_nested_tensor=False)

    def forward(self, x):
        h = self.embed(x)
        return self.body(h if self.batch_first else h.transpose(0, 1))


def _masked_adapter(model, masks):
    from stabexp.probes.adapters import TorchTransformerAdapter

    class Masked(TorchTransformerAdapter):
        def token_masks(self, batch):
            return masks

    return Masked(model)


def test_token_masks_need_batch_first_streams_and_a_stack_without_one_is_every_position():
    """An adapter's (B, T) token mask against a sequence-first stream (T, B, d) is refused in one
    line (its norms would be masked in the wrong order); a stack the masks leave out is read over
    every position, as a mask of all True would read it."""
    from stabexp.probes import LayerProbe

    x = _tokens(3, 5, seed=6)
    real = torch.ones(3, 5, dtype=torch.bool)
    real[0, 3:] = False
    with pytest.raises(ValueError, match=r"needs batch-first streams \(B, T, d\)"):
        LayerProbe(_masked_adapter(_MaskedEncoder(batch_first=False), {"encoder": real})).measure_pass(x)
    model = _MaskedEncoder(batch_first=True)
    left_out = LayerProbe(_masked_adapter(model, {})).measure_pass(x)
    every = LayerProbe(_masked_adapter(model, {"encoder": torch.ones(3, 5, dtype=torch.bool)})).measure_pass(x)
    masked = LayerProbe(_masked_adapter(model, {"encoder": real})).measure_pass(x)
    for i in (1, 3):  # ln_input_norm, stream_norm
        assert not torch.isnan(left_out[i]).any() and torch.allclose(left_out[i], every[i])
        assert not torch.allclose(masked[i], every[i])
    # The masked mean by hand: the first layer's stream is the embedding.
    with torch.no_grad():
        norms = model.embed(x).norm(dim=-1)
    assert masked[3][0].item() == pytest.approx((norms[real].mean()).item(), rel=1e-5)
