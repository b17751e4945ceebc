"""scripts/paper_scale.py, the paper-scale claims and the GPU path in one command, run at its
small size on the CPU (--device cpu --quick) so that it stays runnable where no GPU is; the
toy corpus stands in for Multi30k."""

import csv
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from conftest import cli_env
from corpus import translation_overrides

SCRIPT = Path(__file__).parents[1] / "scripts" / "paper_scale.py"


def _parts(summary: str) -> dict:
    """The outcome of each part, from summary.md's first table."""
    lines = summary.splitlines()
    first = lines.index(next(line for line in lines if line.startswith("| part |")))
    rows = [line for line in lines[first + 2:] if line.startswith("| ")]
    rows = rows[:next((i for i, line in enumerate(lines[first + 2:]) if not line.startswith("| ")), len(rows))]
    return {row.split("|")[1].strip(): row.split("|")[3].strip() for row in rows}


def _paper_scale(tmp_path, corpus_dir, *args):
    env = dict(cli_env(tmp_path / "outputs"), STABEXP_DIST_TIMEOUT_S="60", OMP_NUM_THREADS="1")
    overrides = [x for o in translation_overrides(corpus_dir) for x in ("--override", o)]
    return subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--out", str(tmp_path / "out"),
                           *overrides, *args], env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_every_part_runs_on_the_cpu_and_writes_what_docs_data_keeps(tmp_path, corpus_dir):
    # A budget no part reaches on a slow or shared CPU (the default 420 s cut the GPU check at
    # 93 s on one): this test asks that every part runs; the cutting has a test of its own.
    done = _paper_scale(tmp_path, corpus_dir, "--budget", "840")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == \
        ["bench.json", "evidence.csv", "log.txt", "runs.tar.gz", "summary.md"]  # at most 8 come back from a GPU machine
    summary = (out / "summary.md").read_text()
    assert any(line.startswith("| deepnet_depth_paper |") and "| 6 / 0 / 0 |" in line for line in summary.splitlines())
    assert _parts(summary) == dict.fromkeys(["throughput", "gpu_check", "deepnet_early_paper", "deepnet_depth_paper",
                                   "admin_clinic", "admin_grid"], "done")

    # throughput: stabexp and the plain nn.Transformer loop count the same model FLOPs per token
    bench = json.loads((out / "bench.json").read_text())
    for precision in ("fp32", "bf16"):
        rows = {r["variant"]: r for r in bench[precision]["rows"]}
        assert rows["a"]["flops_per_token"] == pytest.approx(rows["b:postln"]["flops_per_token"], rel=1e-6)
        assert rows["a"]["flops_per_token"] > 0 and rows["a"]["mfu"] is None  # no peak for a CPU
    # gpu_check: a process group of one rank computes what one process does
    table = [line for line in summary.splitlines() if line.startswith("| fp32, ")]
    assert len(table) == 3
    for line in table[1:]:
        assert line.endswith("| 0.0e+00, 0.0e+00 |"), line
        assert float(line.split("|")[4]) > 0  # the plan's peak beside the measured one
    assert any(line.startswith("| bf16, fsdp on 1 rank |") for line in summary.splitlines())

    # the runs' measures, in the recorded table's form, for every preset part
    with open(out / "evidence.csv", newline="") as f:
        recorded = list(csv.DictReader(f))
    assert {r["recipe"] for r in recorded} == {"deepnet_early_paper", "deepnet_depth_paper", "admin_clinic", "admin_grid"}
    assert {r["measure"] for r in recorded if r["recipe"] == "deepnet_early_paper"} >= {"model_update@1", "ln_input_growth@1"}
    assert {r["measure"] for r in recorded if r["recipe"] == "admin_clinic"} >= {"clinic_linear_r2", "clinic_log_r2"}
    with tarfile.open(out / "runs.tar.gz") as tar:
        names = tar.getnames()
    assert sum(n.endswith("summary.json") for n in names) == 3 + 6 + 3 + 3
    assert not any("checkpoint" in n for n in names)
    assert "DeepNet Fig. 4 (v1), the paper's protocol" in summary  # the claims these runs feed
    # recorded under their own scale, and reported as such: no claim reads a quick run
    assert {r["scale"] for r in recorded} == {"quick"}
    assert "15 runs at scale=quick (admin_clinic, admin_grid, deepnet_depth_paper, deepnet_early_paper), read by no claim" \
        in summary


@pytest.mark.slow
def test_a_part_past_its_time_is_cut_and_says_so(tmp_path, corpus_dir):
    # Runs far longer than the part's few seconds: train.steps for every Multi30k run.
    done = _paper_scale(tmp_path, corpus_dir, "--parts", "deepnet_depth_paper,admin_clinic", "--budget", "40",
                        "--override", "train.steps=100000")
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert _parts(summary)["deepnet_depth_paper"].startswith("cut after"), summary
    assert done.returncode == 0  # a cut part is an outcome, not a failure


def test_bad_arguments_end_in_one_line():
    for args, words in ((["--parts", "nope"], "--parts nope not allowed"), (["--budget", "10"], "--budget 10.0 not allowed"),
                        (["--grid-steps", "0"], "--grid-steps 0 not allowed")):
        done = subprocess.run([sys.executable, str(SCRIPT), "--out", "/nonexistent/x", *args],
                              capture_output=True, text=True)
        assert done.returncode == 2 and words in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_gpu_calls_runs_land_in_the_cells_of_the_claims_they_feed(tmp_path):
    """What each preset part's runs record on a GPU (the recipe and the setting claims.measures
    reads from a run's overrides) names the cells of the claims the part feeds, so that a GPU call
    cannot end in "not run" from a mismatch of names; Admin's grid, at --grid-steps updates
    instead of the paper's 8000, is recorded under that setting (the summary says so)."""
    sys.path.insert(0, str(SCRIPT.parent))
    import paper_scale

    from stabexp.analysis import setting
    from stabexp.claims import CLAIMS
    from stabexp.claims.measures import RECIPE_OF
    from stabexp.claims.registry import normal_setting

    args = paper_scale.parse_args(["--device", "cuda", "--out", str(tmp_path)])
    for part in (p for p in paper_scale.PARTS if p.recipe):
        for command in part.commands(args):
            overrides = [o for o in command[command.index("run") + 1:] if not o.startswith("seed=")]
            value = {o.split("=", 1)[0]: o.split("=", 1)[1] for o in overrides}
            recipe = RECIPE_OF.get(value["experiment"], value["experiment"])
            recipe += "" if value.get("scale", "default") == "default" else f"_{value['scale']}"
            assert recipe == part.recipe, part.name
            recorded = normal_setting(setting("__".join(overrides)))
            cells = [c for claim in CLAIMS for c in claim.needs if c.recipe == recipe]
            assert cells, part.name
            if part.name == "admin_grid":
                assert {x.split("=")[0] for x in recorded.split()} == {"task", "train.steps", "train.eval_every"}
            else:
                for c in cells:
                    assert recorded in {normal_setting(x) for x in c.settings}, (part.name, recorded, c.settings)
