"""The fits of stabexp.analysis on data whose answer is known, and sublayer counting."""

import numpy as np
import pandas as pd
import pytest

from stabexp.analysis import (
    least_squares,
    linear_and_log_fits,
    loglog_slope,
    output_change_fits,
    output_change_table,
    sublayer_count,
    w2_grad_slopes,
)


def test_an_exact_line_has_its_slope_intercept_and_r2_of_one():
    fit = least_squares([1, 2, 3, 5], [1.5, 3.5, 5.5, 9.5])
    assert fit == pytest.approx({"slope": 2.0, "intercept": -0.5, "r2": 1.0})
    noisy = least_squares([1, 2, 3, 4], [1.0, 3.0, 2.0, 4.0])
    assert noisy["slope"] == pytest.approx(0.8) and noisy["r2"] == pytest.approx(0.64)  # by hand


def test_a_power_law_has_its_exponent_as_log_log_slope():
    x = np.array([6, 12, 25, 50, 100])
    fit = loglog_slope(x, 3.0 * x ** -0.5)
    assert fit["slope"] == pytest.approx(-0.5) and fit["r2"] == pytest.approx(1.0)


def test_a_log_curve_is_fit_better_by_the_log_fit_and_a_line_by_the_linear_one():
    n = np.array([10, 20, 50, 100, 200])
    log_curve = linear_and_log_fits(n, 2.0 + 3.0 * np.log(n))
    assert log_curve["log"]["r2"] == pytest.approx(1.0) and log_curve["log"]["slope"] == pytest.approx(3.0)
    assert log_curve["linear"]["r2"] < 0.95
    line = linear_and_log_fits(n, 1.0 + 0.5 * n)
    assert line["linear"]["r2"] == pytest.approx(1.0) and line["log"]["r2"] < line["linear"]["r2"]


def _layers(run, sublayers, with_weights):
    rows = [{"run": run, "step": 0, "param": np.nan} for _ in range(sublayers)]
    if with_weights:  # probe.weights adds a row per weight matrix, with `param` set
        rows += [{"run": run, "step": 0, "param": "weight"} for _ in range(3 * sublayers)]
    rows += [{"run": run, "step": 5, "param": np.nan} for _ in range(sublayers)]
    return rows


def test_sublayers_are_counted_without_the_weight_rows():
    layers = pd.DataFrame(_layers("a", 13, with_weights=True) + _layers("b", 26, with_weights=False))
    assert sublayer_count(layers).to_dict() == {"a": 13, "b": 26}


def test_output_change_fits_and_w2_slopes_on_known_curves():
    sublayers = [10, 25, 50, 100]
    metrics, layers, w2 = [], [], []
    for group, curve in (("postln", lambda n: 1e-4 * n), ("preln", lambda n: 1e-4 * np.log(n))):
        for n in sublayers:
            run = f"{group}{n}"
            metrics.append({"run": run, "group": group, "depth": n, "seed": 0, "step": 0, "output_change": curve(n)})
            layers += _layers(run, n, with_weights=True)
            w2.append({"run": run, "group": group, "depth": n, "seed": 0,
                       "w2_grad_norm": 2.0 if group == "postln" else n ** -0.5})
    table = output_change_table(pd.DataFrame(metrics), pd.DataFrame(layers))
    assert sorted(set(table.sublayers)) == sublayers
    fits = output_change_fits(table).set_index("group")
    assert fits.loc["postln", "linear_r2"] == pytest.approx(1.0) and fits.loc["postln", "log_r2"] < 0.99
    assert fits.loc["preln", "log_r2"] == pytest.approx(1.0) and fits.loc["preln", "linear_r2"] < 0.99
    slopes = w2_grad_slopes(pd.DataFrame(w2)).set_index("group").slope
    assert slopes["postln"] == pytest.approx(0.0, abs=1e-12) and slopes["preln"] == pytest.approx(-0.5)
