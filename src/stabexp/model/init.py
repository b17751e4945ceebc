"""Named initialisation rules and the constants they use: Xavier, DeepNet's Post-LN-init and
DeepNorm (arXiv 2203.00555; torchscale 0.3.0's variant), Admin (arXiv 2004.08249;
Transformer-Clinic, admin-torch), DS-Init (arXiv 1908.11365), Fixup (arXiv 1901.09321), T-Fixup
(Huang et al. 2020) and Sub-LN (arXiv 2210.06423). Formulas, constants and where the authors'
code differs: docs/methods.md, "Initialisation rules", "DeepNorm constants" and "Admin".

Each rule takes a freshly built Seq2SeqTransformer and a callable giving one training batch
(only Admin's profiling needs it) and returns the constants it resolved, for summary.json.
A new rule is one function here plus its entry in INIT_RULES, or a function of a user's own
module named by a dotted path or an entry point (stabexp.plugins, `as_init_rule`). A rule whose
constants exist for an encoder-decoder only says so: `rule.encoder_decoder_only = True`.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, Tuple

import torch
import torch.nn as nn

from stabexp import plugins
from stabexp.model.norms import NORM_TYPES
from stabexp.model.placements import Residual
from stabexp.model.transformer import Seq2SeqTransformer
from stabexp.modes import train_mode

Batch = Tuple[torch.Tensor, torch.Tensor, torch.Tensor]


# --- DeepNorm constants (Wang et al. 2022, arXiv 2203.00555, Table in Sec. 2.3 / Fig. 2) ----

def deepnorm_single_stack(n_layers: int) -> Dict[str, float]:
    """Encoder-only or decoder-only DeepNet: alpha = (2N)^(1/4), beta = (8N)^(-1/4)."""
    return {"alpha": (2 * n_layers) ** 0.25, "beta": (8 * n_layers) ** -0.25}


def deepnorm_encoder_decoder(n_enc: int, n_dec: int) -> Dict[str, Dict[str, float]]:
    """Encoder-decoder DeepNet, following the paper (not torchscale 0.3.0, whose encoder beta is
    1.15 (N^4 M)^(-1/16) instead of the paper's 0.87 (N^4 M)^(-1/16); Transformer-Clinic
    agrees with the paper)."""
    nm = n_enc ** 4 * n_dec
    return {
        "encoder": {"alpha": 0.81 * nm ** (1 / 16), "beta": 0.87 * nm ** (-1 / 16)},
        "decoder": {"alpha": (3 * n_dec) ** 0.25, "beta": (12 * n_dec) ** -0.25},
    }


def deepnorm_constants(n_enc: int, n_dec: int) -> Dict[str, Dict[str, float]]:
    """DeepNorm's alpha and beta per stack of a model with n_enc encoder and n_dec decoder
    layers: the single-stack row when one stack is empty (decoder-only, encoder-only)."""
    if n_enc == 0 or n_dec == 0:
        return {"encoder" if n_dec == 0 else "decoder": deepnorm_single_stack(n_enc or n_dec)}
    return deepnorm_encoder_decoder(n_enc, n_dec)


# --- rules -------------------------------------------------------------------------------

def _stack_depth(model: Seq2SeqTransformer, stack: str) -> int:
    return len(model.encoder) if stack == "encoder" else len(model.decoder)


@torch.no_grad()
def xavier(model: Seq2SeqTransformer, batch: Callable[[], Batch] = None) -> Dict:
    """Every projection W ~ N(0, 1/d') with d' = (fan_in + fan_out)/2 (xavier_normal, gain 1),
    each of W_Q, W_K, W_V taken as its own d x d matrix; biases 0; LN weight 1, bias 0;
    embeddings N(0, d^-1/2) as in fairseq (they are scaled by sqrt(d) on input)."""
    nn.init.normal_(model.embed.weight, 0.0, model.config.d_model ** -0.5)
    for *_, res in model.residuals():
        for w in res.branch.matrices().values():
            nn.init.xavier_normal_(w)
        for m in res.branch.modules():
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
    for m in model.modules():
        if isinstance(m, NORM_TYPES):
            nn.init.ones_(m.weight)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
        if isinstance(m, Residual) and hasattr(m, "omega"):
            nn.init.ones_(m.omega)
    return {}


@torch.no_grad()
def postln_init(model: Seq2SeqTransformer, batch: Callable[[], Batch] = None) -> Dict:
    """DeepNet Sec. 3 "Post-LN-init": Xavier, then every weight matrix of layer l (1-based from
    the bottom of its stack of L layers) divided by k_l = L + 1 - l, i.e.
    W ~ N(0, 1/(k_l^2 d')). The bottom layer shrinks most, the top layer is unchanged. The paper
    shows the FFN output projection; scaling every matrix of the layer is our reading."""
    xavier(model)
    for stack, layer, _, res in model.residuals():
        k = _stack_depth(model, stack) + 1 - layer
        for w in res.branch.matrices().values():
            w.div_(k)
    return {"postln_init": {"k_bottom": {"encoder": len(model.encoder), "decoder": len(model.decoder)}}}


# The matrices DeepNorm scales by beta: V and O of every attention, W_1 and W_2 of the FFN.
DEEPNORM_SCALED = ("v", "o", "w1", "w2")


@torch.no_grad()
def deepnorm(model: Seq2SeqTransformer, batch: Callable[[], Batch] = None) -> Dict:
    """DeepNet Sec. 2.3: xavier_normal with gain beta for W_V, W_O, W_1, W_2 (the decoder's
    cross-attention V and O too), gain 1 for W_Q, W_K; beta per stack from the enc-dec table,
    or the single-stack row for a decoder-only or encoder-only model."""
    xavier(model)
    constants = deepnorm_constants(len(model.encoder), len(model.decoder))
    for stack, _, _, res in model.residuals():
        for name, w in res.branch.matrices().items():
            if name in DEEPNORM_SCALED:
                nn.init.xavier_normal_(w, gain=constants[stack]["beta"])
    return {"deepnorm": constants}


def _scaled(model: Seq2SeqTransformer, gains: Callable[[str, str, str], float]) -> None:
    """xavier_normal with gain gains(stack, sublayer, matrix) for every branch matrix."""
    for stack, _, sublayer, res in model.residuals():
        for name, w in res.branch.matrices().items():
            nn.init.xavier_normal_(w, gain=gains(stack, sublayer, name))


@torch.no_grad()
def ds_init(model: Seq2SeqTransformer, batch: Callable[[], Batch] = None, exponent: float = 0.5,
            alpha: float = 1.0) -> Dict:
    """DS-Init (Zhang, Titov, Sennrich 2019, arXiv 1908.11365), the paper's rule: every weight
    matrix of layer l (1-based in its stack, cross-attention included) ~ U(+-gamma alpha / l^(1/2)),
    gamma = sqrt(6 / (fan_in + fan_out)) the Xavier-uniform bound, alpha = 1."""
    xavier(model)
    for _, layer, _, res in model.residuals():
        for w in res.branch.matrices().values():
            fan_out, fan_in = w.shape
            bound = math.sqrt(6.0 / (fan_in + fan_out)) * alpha * layer ** -exponent
            nn.init.uniform_(w, -bound, bound)
    depth = max(len(model.encoder), len(model.decoder))
    return {"ds_init": {"alpha": alpha, "exponent": exponent,
                        "bound_factor_of_layer": [alpha * l ** -exponent for l in range(1, depth + 1)]}}


@torch.no_grad()
def ds_init_code(model: Seq2SeqTransformer, batch: Callable[[], Batch] = None) -> Dict:
    """DS-Init as the authors' code runs it (bzhangGo/zero models/transformer.py, which differs
    from the paper here): TF's variance_scaling(gain * l^(-1/2), fan_avg, uniform) puts l^(-1/2)
    on the variance, so the bound shrinks as l^(-1/4) (docs/methods.md, "DS-Init")."""
    return ds_init(model, batch, exponent=0.25)


def fixup_constants(n_enc: int, n_dec: int) -> Dict[str, float]:
    """Fixup's L residual branches, 2N + 3M in an encoder-decoder (2L in a single stack: no
    cross-attention), and its factors: attention inputs L^(-1/6) (treated as m = 4 layers
    deep), FFN input L^(-1/2) (m = 2)."""
    L = 2 * n_enc + 3 * n_dec if n_enc and n_dec else 2 * (n_enc + n_dec)
    return {"L": L, "attn_in": L ** (-1 / 6), "fc1": L ** -0.5}


@torch.no_grad()
def fixup(model: Seq2SeqTransformer, batch: Callable[[], Batch] = None) -> Dict:
    """Fixup (Zhang, Dauphin, Ma 2019) as its authors ported it to the Transformer
    (hongyi-zhang/Fixup transformer_zero.py; DeepNet's "R-Fixup"): Xavier, W_Q, W_K, W_V times
    L^(-1/6), W_O = 0, W_1 times L^(-1/2), W_2 = 0, so every branch is 0 at init. The
    cross-attention uses the same L (the authors' code falls back to L = 12 there, a quirk we
    do not copy). Embeddings stay tied with the output, so the output layer is not zeroed.
    "The other layers initialised normally" (the paper) is our per-matrix Xavier; the authors'
    code draws Xavier over the fused 3d x d QKV matrix, so its W_Q, W_K, W_V are sqrt(2) smaller."""
    xavier(model)
    k = fixup_constants(len(model.encoder), len(model.decoder))
    for *_, res in model.residuals():
        for name, w in res.branch.matrices().items():
            if name in ("o", "w2"):
                w.zero_()
            else:
                w.mul_(k["fc1"] if name == "w1" else k["attn_in"])
    return {"fixup": k}


def t_fixup_constants(n_enc: int, n_dec: int) -> Dict[str, float]:
    """T-Fixup (Huang et al. 2020): encoder 0.67 N^(-1/4), decoder (9M)^(-1/4); the shared
    embedding takes the encoder's (9N)^(-1/4) (fairseq with --share-all-embeddings)."""
    return {"encoder": 0.67 * n_enc ** -0.25, "decoder": (9 * n_dec) ** -0.25,
            "embedding": (9 * n_enc) ** -0.25}


@torch.no_grad()
def t_fixup(model: Seq2SeqTransformer, batch: Callable[[], Batch] = None) -> Dict:
    """T-Fixup: Xavier (gain 1 for every matrix, q and k included: the paper), then W_V, W_O of
    every attention (cross-attention too) and W_1, W_2 times the stack's factor, and the
    embeddings times (9N)^(-1/4), so the token embedding after the sqrt(d) scale has std
    (9N)^(-1/4). fairseq's code keeps q, k at Xavier gain 1/sqrt(2): not reproduced."""
    xavier(model)
    k = t_fixup_constants(len(model.encoder), len(model.decoder))
    for stack, _, _, res in model.residuals():
        for name, w in res.branch.matrices().items():
            if name in DEEPNORM_SCALED:
                w.mul_(k[stack])
    model.embed.weight.mul_(k["embedding"])
    return {"t_fixup": k}


t_fixup.encoder_decoder_only = True  # its factors are the encoder's and the decoder's


def subln_encoder_decoder(n_enc: int, n_dec: int) -> Dict[str, float]:
    """Sub-LN's gamma (Magneto, arXiv 2210.06423) for an encoder-decoder:
    encoder sqrt(ln(3M) ln(2N) / 3), decoder sqrt(ln 3M); a single stack of L layers
    (decoder-only, encoder-only) sqrt(ln 2L)."""
    if n_enc == 0 or n_dec == 0:
        return {"encoder" if n_dec == 0 else "decoder": math.sqrt(math.log(2 * (n_enc or n_dec)))}
    return {"encoder": math.sqrt(math.log(3 * n_dec) * math.log(2 * n_enc) / 3),
            "decoder": math.sqrt(math.log(3 * n_dec))}


@torch.no_grad()
def subln(model: Seq2SeqTransformer, batch: Callable[[], Batch] = None) -> Dict:
    """Sub-LN: xavier_normal with gain gamma for W_V, W_O, W_1, W_2, gain 1 for W_Q, W_K; the
    decoder's cross-attention keeps gain 1, as torchscale (`if "encoder_attn" in name: continue`)."""
    xavier(model)
    gamma = subln_encoder_decoder(len(model.encoder), len(model.decoder))
    _scaled(model, lambda stack, sub, name: gamma[stack]
            if name in DEEPNORM_SCALED and sub != "cross_attn" else 1.0)
    return {"subln_gamma": gamma}


def deepnorm_torchscale_constants(n_enc: int, n_dec: int) -> Dict[str, Dict[str, float]]:
    """torchscale 0.3.0's effective DeepNorm constants (microsoft/torchscale
    architecture/encoder.py, which differs from the paper here; docs/methods.md, "DeepNorm
    constants"): the same alphas, encoder beta 1.15 (N^4 M)^(-1/16) instead of the paper's
    0.87 (N^4 M)^(-1/16). A single stack: the paper's constants, which torchscale's (8L)^(1/4)
    matches."""
    k = deepnorm_constants(n_enc, n_dec)
    if n_enc and n_dec:
        k["encoder"]["beta"] = 1.15 * (n_enc ** 4 * n_dec) ** (-1 / 16)
    return k


@torch.no_grad()
def deepnorm_torchscale(model: Seq2SeqTransformer, batch: Callable[[], Batch] = None) -> Dict:
    """DeepNorm as torchscale 0.3.0 runs it: PyTorch's default nn.Linear init (U(+-1/sqrt(fan_in))
    for weights and biases: its xavier reset_parameters is never called), then the weights and
    biases of V, O, W_1, W_2 (cross-attention too) multiplied by beta_code."""
    xavier(model)
    k = deepnorm_torchscale_constants(len(model.encoder), len(model.decoder))
    for stack, _, _, res in model.residuals():
        for m in res.branch.modules():
            if isinstance(m, nn.Linear):
                m.reset_parameters()
        biases = res.branch.biases()
        for name, w in res.branch.matrices().items():
            if name in DEEPNORM_SCALED:
                w.mul_(k[stack]["beta"])
                biases[name].mul_(k[stack]["beta"])
    return {"deepnorm_torchscale": k}


class AdminProfile:
    """Transformer-Clinic's profiling walk over one stack's residual sublayers, bottom-up:
    before sublayer i, omega_i <- ratio; then ratio <- sqrt(Var(omega_i x_i) + Var(G_i(x_i))),
    starting at ratio = 1. Var is over the whole flattened tensor (population variance, as
    numpy's var in Clinic). It watches the forward pass through two hooks per sublayer (see
    model/transformer.py): the sublayer's input x, then its G(x) as added to the stream, which
    Admin.forward computes before it reads omega."""

    def __init__(self, tokens=None):
        self.ratio = 1.0
        self.omegas = []
        self.sublayers = []  # the Residual each of `omegas` belongs to
        self.tokens = tokens  # (B, T) real tokens of the stack's input; None: every position

    def attach(self, res: Residual) -> list:
        """Hook the profile onto one Admin sublayer; returns the handles to remove."""
        seen = {}

        def keep_input(module, args):
            seen["x"] = args[0]

        def step(module, args, g):
            self.step(res, seen.pop("x"), g)

        branch_output = res.drop if res.drop is not None else res.branch
        return [res.register_forward_pre_hook(keep_input), branch_output.register_forward_hook(step)]

    def step(self, res: Residual, x: torch.Tensor, g: torch.Tensor) -> None:
        res.omega.fill_(self.ratio)
        self.omegas.append(self.ratio)
        self.sublayers.append(res)
        x = res.omega * x
        if self.tokens is not None:  # padding is not part of the signal being profiled
            x, g = x[self.tokens], g[self.tokens]
        var_x = torch.var(x, unbiased=False)
        var_g = torch.var(g, unbiased=False)
        self.ratio = math.sqrt(float(var_x) + float(var_g))


@torch.no_grad()
def admin_profiled(model: Seq2SeqTransformer, batch: Callable[[], Batch]) -> Dict:
    """Admin (Liu et al. 2020, Sec. 4.2, Transformer-Clinic): Xavier init, then one forward pass
    on one training batch in training mode, setting each omega (a per-dimension vector filled
    with the profiled scalar) bottom-up in each stack."""
    xavier(model)
    src, tgt_in, _ = batch()
    profiles = {stack: AdminProfile(tokens) for stack, tokens in model.token_masks(src, tgt_in).items()}
    handles = [h for stack, _, _, res in model.residuals() for h in profiles[stack].attach(res)]
    try:
        with train_mode(model):
            model(src, tgt_in)
    finally:
        for h in handles:
            h.remove()
    # Again, after the pass: under FSDP the pass filled the layers' gathered copies of omega,
    # which are dropped after each layer's forward; this fills the shards the run keeps.
    for p in profiles.values():
        for res, omega in zip(p.sublayers, p.omegas):
            res.omega.fill_(omega)
    return {"admin_omega": {stack: p.omegas for stack, p in profiles.items()}}


def admin_closed_form_omega(n_sublayers: int) -> float:
    """admin-torch's omega without profiling, O(log n) target: sqrt((n+1)/ln(n+1) - 1) for a
    stack of n residual sublayers (microsoft/admin-torch; docs/methods.md, "Admin")."""
    n = n_sublayers
    return math.sqrt((n + 1) / math.log(n + 1) - 1)


@torch.no_grad()
def admin_closed_form(model: Seq2SeqTransformer, batch: Callable[[], Batch] = None) -> Dict:
    """Admin with admin-torch's closed-form omega (no profiling batch): Xavier, then one omega
    for every sublayer of a stack, n its residual sublayers: 2N (encoder, or any single stack)
    or 3M (decoder of an encoder-decoder)."""
    xavier(model)
    n: Dict[str, int] = {}
    for stack, *_ in model.residuals():
        n[stack] = n.get(stack, 0) + 1
    omega = {stack: admin_closed_form_omega(n[stack]) for stack in n}
    for stack, _, _, res in model.residuals():
        res.omega.fill_(omega[stack])
    return {"admin_closed_form": {"sublayers": n, "omega": omega}}


def initial_scalars(model: Seq2SeqTransformer) -> Dict:
    """The learnable scalars a placement starts from, read off the built model: ReZero's alpha,
    Fixup's shifts and scales, NormFormer's head scales, DLCL's combination weights (row l: the
    weight of each output below layer l + 1, uniform)."""
    from stabexp.model.norms import HeadScale, Scale, Shift
    from stabexp.model.transformer import DenseHistory

    def whole(p: torch.Tensor) -> torch.Tensor:  # a sharded parameter (FSDP) gathered; they are small
        return p.full_tensor() if hasattr(p, "full_tensor") else p

    found: Dict = {}
    for kind, values in (("rezero_alpha", [whole(m.alpha).item() for m in model.modules()
                                           if isinstance(m, Residual) and isinstance(getattr(m, "alpha", None), nn.Parameter)]),
                         ("fixup_shift", [whole(m.bias).item() for m in model.modules() if isinstance(m, Shift)]),
                         ("fixup_scale", [whole(m.weight).item() for m in model.modules() if isinstance(m, Scale)]),
                         ("head_scale", [g for m in model.modules() if isinstance(m, HeadScale) for g in whole(m.gamma).tolist()])):
        if values:
            found[kind] = sorted(set(values))
    for stack in ("encoder", "decoder"):
        history = getattr(model, f"{stack}_history", None)
        if isinstance(history, DenseHistory):
            w = whole(history.weight).detach()
            found.setdefault("dlcl_row_weights", {})[stack] = [
                sorted({round(float(v), 8) for v in w[l, : l + 1]}) for l in range(w.shape[0])]
    return found


INIT_RULES: Dict[str, Callable[..., Dict]] = {
    "xavier": xavier,
    "postln_init": postln_init,
    "deepnorm": deepnorm,
    "deepnorm_torchscale": deepnorm_torchscale,
    "admin_profiled": admin_profiled,
    "admin_closed_form": admin_closed_form,
    "ds_init": ds_init,
    "ds_init_code": ds_init_code,
    "fixup": fixup,
    "t_fixup": t_fixup,
    "subln": subln,
}


def as_init_rule(obj) -> Callable[..., Dict]:
    """What a name or dotted path may lead to (stabexp.plugins): a function (model, batch) ->
    dict of the constants it resolved, which land in summary.json's `constants`."""
    if not callable(obj) or isinstance(obj, type):
        raise plugins.Rejected(f"it is {plugins.what_is(obj)}, not a function (model, batch) -> dict")
    if not plugins.takes(obj, "model", "batch"):
        raise plugins.Rejected("it is a function that cannot be called as rule(model, batch)")
    return obj
