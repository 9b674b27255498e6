#!/usr/bin/env bash
# The CUDA checks and figures of issue 20 in one bounded run: ~5 minutes on an H200 (each step
# has its own timeout; 9 minutes at worst, under the 600 s of one device call). From the
# repository root on the CUDA machine (a checkout holding this script), after `make gpu-wheels`
# here (wheels the image lacks: transformers of this venv's version, pydantic):
#     run(command="bash scripts/gpu_check.sh", carry=[".whl"], timeout_s=600)
# Results land in $OUT: gpu_tests.log, gate_compile.json, gpu.json (docs/results/gpu.json), logs.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || { echo "wheel install failed"; exit 3; }
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . \
    || { echo "project install failed"; exit 4; }
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, \
transformers.__version__, torch.cuda.get_device_name())" | tee "$OUT/versions.txt"
# 1. correctness on CUDA (~1-2 min): gate kernels == reference (all rules, split-V), static KV
#    and CUDA-graph decode == eager decode with rollbacks (tests marked gpu)
timeout 180 python3 -m pytest -q -p no:cacheprovider -m gpu -rs \
    tests/test_kernel_fused_gate.py tests/test_static_kv.py 2>&1 | tee "$OUT/gpu_tests.log"
# 2. registers / spills of the gate's kernels as this Triton compiles them (~20 s)
timeout 60 python3 -m asymagent.kernels.bench --compile-only --json "$OUT/gate_compile.json" \
    > "$OUT/gate_compile.log" 2>&1
# 3. the figures (~2-3 min): gate rows (kernel, kernel without split, eager) and engine decode
timeout 300 python3 -m asymagent.evals.probes.gpu_bench --json "$OUT/gpu.json" 2>&1 \
    | tee "$OUT/gpu_bench.log" | tail -60
