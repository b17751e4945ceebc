# Set-up and everyday commands. `make run` and `make test` install what is missing first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU build of torch by default (a plain `torch` would pull a multi-GB CUDA build);
# GPU users: `make install TORCH=torch` (or any pip requirement) before anything else.
TORCH  ?= torch==2.13.0
# Optional extras of the package: `make install EXTRAS=test,launchers` adds Hydra's joblib and
# submitit launchers (SLURM); tensorboard, mlflow, wandb: the trackers; hf: Hugging Face datasets;
# monitor: transformers and Lightning, for stabexp.monitor on models of one's own.
# `make test` installs them all: their tests need them.
EXTRAS ?= test
comma  := ,
STAMP  := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

# The presets of conf/experiment, in the order `make reproduce` runs them; SCALE=quick for a quick pass.
# The Multi30k presets (admin_clinic, *_paper, multi30k_table, admin_rezero, deepnet_bleu_depth, deepnet_robustness)
# download it into $STABEXP_DATA on first use.
PRESETS := admin_output_change grad_at_init admin_clinic deepnet_early deepnet_depth depth_table smd \
           deepnet_depth_paper deepnet_early_paper multi30k_table lm_depth lr_sensitivity \
           admin_grad_vanishing admin_dependency admin_hybrid admin_grid admin_rezero admin_60l_12l \
           deepnet_bound deepnet_bound_encdec deepnet_depth_law deepnet_lm_depth deepnet_bleu_depth deepnet_robustness \
           deepnet_1000_layers lm_1000_layers curse_of_depth lr_sensitivity_2025 lr_sensitivity_muon
SCALE   ?= default

.PHONY: install run reproduce docs-figures test test-fast plots bench

install: $(STAMP)

$(STAMP): pyproject.toml
	@echo "Installing stabexp (editable) and its dependencies into $(VENV): a minute or more the first time"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[$(EXTRAS)]"
	touch $(STAMP)

# The headline: DeepNet's early-training experiment at 18L-18L (every group, 300 steps).
run: install
	$(BIN)/stabexp run experiment=deepnet_early
	$(BIN)/python scripts/make_plots.py
	$(BIN)/stabexp report "$${STABEXP_OUTPUTS:-outputs}/multirun/experiment=deepnet_early"
	@echo "Run folders: $${STABEXP_OUTPUTS:-outputs}/multirun/experiment=deepnet_early/ ; figures: outputs/figures/"

# Every preset, one after another, each packing its jobs onto the cores (docs/scale.md), then
# every figure (about 37 h on 2 cores at the default scale, 21 h of it estimated: each preset's
# `# cost:` line, summed by `python -m stabexp.presets`; docs/presets.md).
reproduce: install
	for p in $(PRESETS); do \
	  $(BIN)/stabexp run experiment=$$p $(if $(filter-out default,$(SCALE)),scale=$(SCALE)) || exit 1; \
	done
	$(BIN)/python scripts/make_plots.py

# The figures docs/results.md shows: copies of the last `make reproduce`'s PNGs.
docs-figures:
	mkdir -p docs/figures
	cp outputs/figures/*.png docs/figures/

# Two pytest workers (pytest-xdist), a test file per worker at a time (module fixtures run once),
# the longest files first (tests/conftest.py, LONGEST_FIRST),
# torch at one thread each: the tiny models gain nothing from a second thread, and two workers of
# two threads on two cores slow each other down.
PYTEST = OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder

# torchscale (Microsoft's DeepNet code) for tests/test_crosscheck.py, without its dependencies:
# its timm pulls torchvision, and scripts/crosscheck_torchscale.py stands in for timm's drop_path.
TEST_EXTRAS := test,launchers,tensorboard,mlflow,wandb,hf,monitor

test:
	$(MAKE) install EXTRAS=$(TEST_EXTRAS)
	$(BIN)/python -c "import torchscale, fairscale" 2>/dev/null || $(BIN)/pip install -q --no-deps torchscale==0.3.0 fairscale==0.4.0
	$(PYTEST) tests

# The edit loop: everything but the end-to-end, install, subprocess-signal and compile tests
# (the `slow` marker, tests/conftest.py), in under 3 minutes on 2 cores.
test-fast:
	$(MAKE) install EXTRAS=$(TEST_EXTRAS)
	$(BIN)/python -c "import torchscale, fairscale" 2>/dev/null || $(BIN)/pip install -q --no-deps torchscale==0.3.0 fairscale==0.4.0
	$(PYTEST) tests -m "not slow"

plots: install
	$(BIN)/python scripts/make_plots.py

# Speed and memory against a plain torch.nn.Transformer loop: the two commands of
# docs/benchmarks.md's synthetic table (their times are written beside them there).
bench: install
	$(BIN)/stabexp bench --sizes tiny --repeats 7 --steps 10 --out outputs/bench/tiny.json
	$(BIN)/stabexp bench --sizes small --repeats 3 --steps 5 --out outputs/bench/small.json
