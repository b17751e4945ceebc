"""scripts/crosscheck_torchscale.py: torchscale's own DeepNorm model on stabexp's task. Runs
where torchscale is installed (`make test` installs it without its dependencies)."""

import importlib.util
import sys
from pathlib import Path

import pytest

from stabexp.model.init import deepnorm_torchscale_constants

pytest.importorskip("fairscale")
pytest.importorskip("torchscale")
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "crosscheck_torchscale.py"


@pytest.fixture(scope="module")
def crosscheck():
    spec = importlib.util.spec_from_file_location("crosscheck_torchscale", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_torchscale_uses_the_alphas_of_our_deepnorm_torchscale_group(crosscheck, make_cfg):
    cfg = make_cfg("group=deepnorm_torchscale", "depth=3", "decoder_depth=5")
    model = crosscheck.build(cfg, 16).model
    k = deepnorm_torchscale_constants(3, 5)
    assert [layer.alpha for layer in model.encoder.layers] == pytest.approx([k["encoder"]["alpha"]] * 3)
    assert [layer.alpha for layer in model.decoder.layers] == pytest.approx([k["decoder"]["alpha"]] * 5)
    assert model.decoder.output_projection.weight is model.encoder.embed_tokens.weight  # tied


def test_the_script_trains_and_reports(crosscheck, capsys):
    assert crosscheck.main(["--task", "reverse", "--depth", "2", "--steps", "4", "--every", "2",
                            "model.d_model=16", "model.ffn_dim=32", "train.batch_size=8"]) == 0
    out = capsys.readouterr().out
    assert "torchscale DeepNorm 2L-2L on task=reverse" in out
    assert "step 2: train loss" in out and "step 4: train loss" in out
