"""LayerScale (Touvron et al. 2021, "Going deeper with Image Transformers" (CaiT),
arXiv 2103.17239, Sec. 2; facebookresearch/deit cait_models.py, `LayerScale_Block`) as a
stabexp placement of a user's own module: Pre-LN with a learnable per-channel diagonal on each
branch,

    x' = x + diag(lambda) G(LN(x)),    lambda in R^d initialised to eps,

so that every branch starts close to zero and the stack close to the identity.

eps by depth, the paper's rule (Sec. 2): 0.1 for depth <= 18, 1e-5 for depth 24, 1e-6
deeper. Depths between 19 and 23, which the paper does not name, take 1e-5 here; depth is the
number of layers of the sublayer's stack (the encoder's or the decoder's). The deit code's class
default, init_values=1e-4, is not used: none of the models that file defines keeps it (depth 24:
1e-5, depths 36 and 48: 1e-6, as the paper's rule).

Run it with the folder on PYTHONPATH (examples/plugin_layerscale/README.md):

    PYTHONPATH=examples/plugin_layerscale stabexp run --config-dir examples/plugin_layerscale group=layerscale
"""

import torch
import torch.nn as nn

from stabexp.model.norms import make_norm
from stabexp.model.placements import Residual


def initial_scale(depth: int) -> float:
    """CaiT's eps for a stack of `depth` layers (Touvron et al. 2021, Sec. 2)."""
    if depth <= 18:
        return 0.1
    return 1e-5 if depth <= 24 else 1e-6


class LayerScale(Residual):
    final_norm = True        # Pre-LN-like: the stream is never normalised, so each stack ends with a norm
    encoder_decoder = True   # the formula needs nothing of one stack: both stacks may use it

    def __init__(self, branch, c, stack, shared, layer=1):
        super().__init__(branch, c, stack, shared, layer)
        self.ln = make_norm(c.norm, c.d_model)  # the norm on the stream is named `ln`
        depth = c.encoder_layers if stack == "encoder" else c.decoder_layers
        self.layer_scale = nn.Parameter(torch.full((c.d_model,), initial_scale(depth)))

    def forward(self, x, *context):
        return x + self.layer_scale * self._g(self.ln(x), *context)   # CaiT Sec. 2, LayerScale
