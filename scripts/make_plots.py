"""`make plots`: collect every run under outputs/ into outputs/collected/, then draw each
figure into outputs/figures/ from those tables only."""

import sys

import pandas as pd

from stabexp.config import outputs_dir
from stabexp.plotting.collect import write_collected
from stabexp.plotting.figures import grad_norm_by_layer, model_update_over_steps


def main() -> int:
    outputs = outputs_dir()
    collected = write_collected(outputs)
    runs = pd.read_csv(collected / "runs.csv") if (collected / "runs.csv").stat().st_size > 1 else pd.DataFrame()
    print(f"collected {len(runs)} runs into {collected}")
    figures = outputs / "figures"

    def read(name):
        path = collected / f"{name}.csv"
        return pd.read_csv(path) if path.stat().st_size > 1 else pd.DataFrame()

    metrics, layers = read("metrics"), read("layers")
    for name, draw, table in (("model_update", model_update_over_steps, metrics),
                              ("grad_norm_by_layer", grad_norm_by_layer, layers)):
        if draw(table, figures / name):
            print(f"wrote {figures / name}.png and .pdf")
        else:
            print(f"skipped {name}: no runs with its data under {outputs} (try `make run`)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
