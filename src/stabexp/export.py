"""`stabexp export RUN [OUT]`: the final weights of a finished Admin run (train.save_model=true)
written as an equivalent Post-LN model, Admin's omegas folded into the norms and the branches'
input projections (model/fold.py). OUT defaults to RUN/postln_model.pt; `load_exported` reads it
back as a model whose outputs equal the Admin model's.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import List

import torch
from omegaconf import OmegaConf

from stabexp.atomic import write_atomic
from stabexp.errors import ConfigError
from stabexp.train import checkpoint, folder
from stabexp.train.files import MODEL

USAGE = "usage: stabexp export RUN_FOLDER [OUT_FILE]   (a finished Admin run made with train.save_model=true)"


def load_run_model(run: Path):
    """The model of a run folder, with the final weights it saved (train.save_model)."""
    from stabexp.config import with_defaults
    from stabexp.model import build_model

    run = Path(run)
    cfg = with_defaults(OmegaConf.create(folder.recorded_config(run)))
    saved = checkpoint.read(run / MODEL)
    model = build_model(cfg, saved["vocab_size"], saved["pad_id"], saved["max_positions"])
    model.load_state_dict(saved["state_dict"])
    return model.eval()


def load_exported(path):
    """The model `stabexp export` wrote, in eval mode."""
    from stabexp.model import LanguageModel, Seq2SeqTransformer, TransformerConfig

    saved = checkpoint.read(path)
    c = TransformerConfig(**saved["config"])
    model = LanguageModel(c, saved["arch"]) if saved["arch"] != "transformer" else Seq2SeqTransformer(c)
    model.load_state_dict(saved["state_dict"])
    return model.eval()


def export(run: Path, out: Path) -> Path:
    from stabexp.model.fold import admin_to_postln

    folded = admin_to_postln(load_run_model(run))
    data = {"config": asdict(folded.config), "arch": getattr(folded, "arch", "transformer"),
            "state_dict": folded.state_dict()}
    write_atomic(out, lambda f: torch.save(data, f))
    return out


def main(argv: List[str]) -> int:
    if not argv or len(argv) > 2 or argv[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    run = Path(argv[0])
    out = Path(argv[1]) if len(argv) > 1 else run / "postln_model.pt"
    if not (run / "config.yaml").is_file():
        print(f"stabexp: error: {run} is not a run folder (no config.yaml): pass a folder made by `stabexp run`",
              file=sys.stderr)
        return 2
    if not (run / MODEL).is_file():
        print(f"stabexp: error: {run} holds no final weights ({MODEL}): run it with train.save_model=true "
              "(a finished run: add it with overwrite=true)", file=sys.stderr)
        return 2
    try:
        group = folder.recorded_config(run).get("group") or {}
    except ConfigError as err:
        print(f"stabexp: error: {err}", file=sys.stderr)
        return 2
    residuals = {group.get(k) for k in ("residual", "encoder_residual", "decoder_residual")} - {None}
    if residuals != {"admin"}:
        print(f"stabexp: error: group.residual={','.join(sorted(residuals))} is not allowed: only an Admin run "
              "(group.residual=admin) folds into Post-LN", file=sys.stderr)
        return 2
    try:
        written = export(run, out)
    except ConfigError as err:
        print(f"stabexp: error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {written}: a Post-LN model with Admin's omegas folded in "
          "(stabexp.export.load_exported reads it)")
    return 0
