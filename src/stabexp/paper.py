"""The papers' own numbers that stabexp's figures and report put beside its measurements: values
read off the papers' figures (by eye, so good to about the width of a line), and the fits the
papers' curves give. One place, so that a figure and the report cannot disagree about them.

Sources: Liu et al. 2020 (Admin, arXiv 2004.08249) Fig. 4 as Transformer-Clinic plots it; Wang et
al. 2022 (DeepNet, arXiv 2203.00555 v1) Figs. 4-8 and Table 2. The protocols behind each are in the
presets that reproduce them (conf/experiment/admin_clinic.yaml, deepnet_early_paper.yaml,
deepnet_depth_paper.yaml).
"""

# Admin Fig. 4: change of sublayer i's std-normalised input (squared Frobenius norm over one
# batch) along ONE 100-layer encoder at init, i = sublayer index -> value.
ADMIN_INPUT_CHANGE = {
    "postln": {1: 10, 10: 88, 20: 189, 50: 441, 100: 1094, 150: 1607, 200: 2170},
    "preln": {1: 6, 10: 45, 20: 76, 50: 114, 100: 141, 150: 161, 200: 164},
    "admin": {10: 48, 20: 80, 50: 109, 100: 133, 150: 151, 200: 152},
}
# R^2 of the fits of those curves over i (linear in i, log in i) and Post-LN / Pre-LN at i = 200.
ADMIN_FIT_R2 = {"postln": {"linear": 0.991, "log": 0.75},
                "preln": {"log": 0.987},
                "admin": {"log": 0.995, "linear": 0.8}}
ADMIN_POSTLN_OVER_PRELN = 13.0

# DeepNet v1 Fig. 4: model update ||F(x, theta_i) - F(x, theta_0)|| of 18L-18L d = 512 models over
# the first 30 updates (update -> value). Post-LN without warm-up stays flat near 28 after update 2.
DEEPNET_EARLY_UPDATE = {
    "postln": {0: 0.0, 1: 0.0, 2: 29.3},
    "postln_warmup": {3: 0.2, 10: 4.0, 20: 14.0, 29: 21.6},
    "postln_init": {10: 1.5, 20: 5.6, 29: 10.4},
}
# DeepNet v1 Fig. 5: the same update of 64-128-2 models against depth (N = M layers -> value);
# the step and the lr are not stated. Post-LN jumps between 0.09 and 0.47 beyond 40L; DeepNorm
# stays between these two values at every depth.
DEEPNET_DEPTH_UPDATE = {"postln": {6: 0.017, 40: 0.1}}
DEEPNET_DEPTH_DEEPNORM_RANGE = (0.001, 0.007)

# DeepNet v1 Fig. 4, lower panel: decoder gradient norm by layer (layer -> value; the update it
# is taken at is not stated) of the three curves.
DEEPNET_EARLY_DECODER_GRAD = {
    "postln": {1: 0.0, 14: 0.0, 18: 0.2},
    "postln_warmup": {1: 0.0, 15: 0.3, 18: 0.8},
    "postln_init": {1: 0.14, 18: 0.8},
}

# Admin's residual dependency, read off Transformer-Clinic's img/6_layer_dependency.png (a 6L
# encoder, 12 sublayers) and img/18_layer_dependency.png: beta_ii, the dependency of sublayer i's
# output on its own branch, as ranges (low, high) over the sublayers, at init and after training.
ADMIN_DEPENDENCY_DIAGONAL = {
    ("postln", "init"): "0.45-0.6 (6L)",
    ("postln", "end"): "0.45-0.65 (6L)",
    ("preln", "init"): "0.45 at x2 falling to 0.3 at x12 (6L)",
    ("preln", "end"): "0.35-0.45 (6L)",
    ("admin", "init"): "0.4 early, 0.15-0.2 deep (18L)",
    ("admin", "end"): "0.3-0.4 (18L)",
}

# DeepNet v1 Fig. 6: IWSLT-14 De-En test BLEU against depth (N = M layers -> BLEU), 8k steps.
# Post-LN: about 4 at 10L and 0 from 20L on; R-Fixup, ReZero and T-Fixup as their two ends.
DEEPNET_BLEU_DEPTH = {
    "deepnorm": {10: 29.9, 20: 30.9, 30: 31.1, 40: 31.3, 50: 31.2, 60: 31.4, 70: 31.7, 80: 31.5, 90: 31.5, 100: 31.7},
    "admin": {10: 28.8, 20: 29.2, 30: 28.8, 40: 28.2, 50: 27.9, 60: 22.6, 70: 16.7, 80: 16.8, 90: 0.5, 100: 0.7},
    "postln": {10: 4.0, 20: 0.0, 100: 0.0},
    "preln": {10: 29.6, 100: 24.2},
    "fixup": {10: 29.6, 100: 30.3},
    "rezero": {10: 25.9, 100: 28.0},
    "t_fixup": {10: 29.6, 100: 27.0},
}
# DeepNet v1 Fig. 8 / Table 2: OPUS-100 average BLEU against depth (layers per stack), fitted
# there as A log(depth) + B.
DEEPNET_DEPTH_LAW = {12: 25.3, 20: 26.6, 100: 30.1, 200: 31.1, 1000: 32.1}
# DeepNet v1 Fig. 7: final validation loss of an 18L-18L DeepNet on WMT-17 under one change.
DEEPNET_ROBUSTNESS = {"lr": {"5e-4": 3.97, "1e-3": 3.91, "1.5e-3": 3.89},
                      "batch": {"64x4k": 3.91, "128x4k": 3.89, "256x4k": 3.88},
                      "width": {"512": 3.99, "768": 3.99, "1024": 4.13}}
# DeepNet v1 Table 1: WMT-17 En-De BLEU at 6L / 18L / 50L / 100L per stack; None where the paper
# reports the run diverged. Vanilla Post-LN is the row of both stabexp groups `postln` and
# `postln_warmup`.
DEEPNET_TABLE1 = {
    "postln": {6: 28.1, 18: None, 50: None, 100: None},
    "ds_init": {6: 27.9, 18: None, 50: None, 100: None},
    "admin": {6: 27.9, 18: 28.8, 50: None, 100: None},
    "rezero": {6: 26.9, 18: None, 50: None, 100: None},
    "fixup": {6: 27.5, 18: 28.4, 50: 27.7, 100: None},
    "t_fixup": {6: 27.5, 18: 28.4, 50: 27.9, 100: None},
    "preln": {6: 27.0, 18: 28.1, 50: 28.0, 100: 27.4},
    "dlcl": {6: 27.4, 18: 28.2, 50: None, 100: 27.5},
    "normformer": {6: 27.0, 18: 28.3, 50: 27.8, 100: None},
    "deepnorm": {6: 27.8, 18: 28.8, 50: 29.0, 100: 28.9},
}
DEEPNET_TABLE1["postln_warmup"] = DEEPNET_TABLE1["postln"]
# Admin Table (Liu et al. 2020, Sec. 5): the 15 (lr, beta2) settings without warm-up (RAdam) on
# WMT'14 En-De 6L-6L: Post-LN diverges in 7, Pre-LN and Admin in none.
ADMIN_GRID_DIVERGED = {"postln": 7, "preln": 0, "admin": 0}
ADMIN_GRID_LRS = (1e-4, 2e-4, 3e-4, 4e-4, 5e-4)
# Admin (Liu et al. 2020, Sec. 5): test BLEU (newstest2014) of Admin's 60-layer encoder under a
# 12-layer decoder on WMT'14 En-Fr (Transformer-Clinic's nmt-experiments/wmt14_en-fr.md recipe).
ADMIN_60L_12L_EN_FR_BLEU = 43.8
