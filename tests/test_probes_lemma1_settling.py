"""DeepNet's Lemma 1 probe (attention_mixing) and the distance from init (init_distance): what
they read is the model's own attention and weights, and their numbers move where they should."""

import pandas as pd
import pytest
import torch

from stabexp.claims.measures import measures
from stabexp.plotting.collect import collect
from stabexp.probes.attention_mixing import _mixing
from stabexp.train.trainer import train

from conftest import fail_at_step


def test_mixing_of_uniform_weights_is_the_mean_of_the_values():
    torch.manual_seed(0)
    v = torch.randn(2, 3, 5, 4)
    weights = torch.full((2, 3, 6, 5), 1 / 5)
    y = weights @ v
    gain, bound, peak = _mixing(weights, v, y, None).tolist()
    expected = (torch.linalg.vector_norm(v.mean(-2), dim=-1) / torch.linalg.vector_norm(v, dim=-1).mean(-1)).mean()
    assert gain == pytest.approx(float(expected), rel=1e-5) and gain < 1
    assert bound < 1 and peak == pytest.approx(0.2)


def test_mixing_on_one_key_gives_that_keys_value():
    v = torch.tensor([[[[1.0, 0.0], [0.0, 3.0]]]])     # key 0 of norm 1, key 1 of norm 3
    weights = torch.tensor([[[[0.0, 1.0], [1.0, 0.0]]]])  # query 0 picks key 1, query 1 key 0
    gain, bound, peak = _mixing(weights, v, weights @ v, None).tolist()
    assert bound == pytest.approx(1.0) and peak == pytest.approx(1.0)
    # Each query's kept keys are the one it picks: its output is that key's value, gain 1.
    assert gain == pytest.approx(1.0)
    # Spread over both keys, the larger value picked: above a typical one, within the largest.
    weights = torch.tensor([[[[0.1, 0.9], [0.1, 0.9]]]])
    gain, bound, _ = _mixing(weights, v, weights @ v, torch.tensor([[True, False]])).tolist()
    assert gain > 1 and bound <= 1


def test_both_probes_read_a_run_and_become_measures(make_cfg, tmp_path):
    cfg = make_cfg("group=postln_warmup", "depth=3", "train.steps=12", "probe.attention_mixing=true",
                   "probe.init_distance=true", "probe.first_steps=12")
    train(cfg, tmp_path)
    mixing = pd.read_csv(tmp_path / "attention_mixing.csv")
    # Every attention sublayer at init and at the end: 3 encoder self, 3 decoder self and cross.
    assert sorted(mixing.step.unique()) == [0, 12] and len(mixing) == 2 * 9
    assert (mixing.bound <= 1 + 1e-5).all() and (mixing.gain > 0).all()
    # The decoder's first query sees only itself: its output is its value.
    assert mixing[(mixing["stack"] == "decoder") & (mixing.sublayer == "self_attn")].bound.max() == pytest.approx(1.0)
    layers = pd.read_csv(tmp_path / "layers.csv")
    rows = layers[layers.param.isna()]
    assert (rows[rows.step == 0].init_distance == 0).all()
    moving = rows[rows.step > 0].groupby("step").init_distance.mean()
    assert moving.is_monotonic_increasing and moving.iloc[-1] > 0
    found = measures(collect(tmp_path)).set_index("measure").value
    assert {"decoder_low_over_top_distance", "decoder_top_over_low_settle", "attention_gain_max@init",
            "attention_gain_max@end", "attention_bound_max", "attention_peak_max@end"} <= set(found.index)


def test_init_distance_resumes_against_the_same_init(make_cfg, tmp_path, monkeypatch):
    cfg = make_cfg("group=postln", "depth=2", "probe.init_distance=true", "probe.first_steps=0", "probe.every=2",
                   "train.checkpoint_every=2", "train.steps=8")
    train(cfg, tmp_path / "reference")
    fail_at_step(monkeypatch, cfg, tmp_path / "run", 5)
    assert train(cfg, tmp_path / "run")["resumed_from"] == [4]
    a, b = (pd.read_csv(tmp_path / name / "layers.csv") for name in ("reference", "run"))
    last = lambda t: t[(t.step == 8) & t.param.isna()].init_distance.to_numpy()  # noqa: E731
    assert last(b) == pytest.approx(last(a), rel=1e-6) and (last(a) > 0).all()


def test_overwrite_removes_the_probes_own_file(make_cfg, tmp_path):
    train(make_cfg("group=postln", "probe.attention_mixing=true"), tmp_path)
    assert (tmp_path / "attention_mixing.csv").is_file()
    train(make_cfg("group=postln", "overwrite=true"), tmp_path)
    assert not (tmp_path / "attention_mixing.csv").exists()
