# Set-up and everyday commands. `make run` and `make test` install what is missing first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU build of torch by default (a plain `torch` would pull a multi-GB CUDA build);
# GPU users: `make install TORCH=torch` (or any pip requirement) before anything else.
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: install run test plots bench

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test]"
	touch $(STAMP)

# The headline: Post-LN without warm-up against Post-LN with warm-up at 18L-18L (tiny model).
run: install
	$(BIN)/stabexp run -m group=postln,postln_warmup depth=18
	$(BIN)/python scripts/make_plots.py
	@echo "Run folders: outputs/multirun/depth=18__group=postln,postln_warmup/ ; figures: outputs/figures/"

test: install
	$(BIN)/python -m pytest tests

plots: install
	$(BIN)/python scripts/make_plots.py

# Speed and memory against a plain torch.nn.Transformer loop (about 20 min on 2 cores).
bench: install
	$(BIN)/stabexp bench
