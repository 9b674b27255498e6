#!/usr/bin/env bash
# The CUDA checks and figures of issue 28 in ONE bounded run (<= 540 s in all; each step has its
# own timeout and the budget caps the last ones). On the device machine, from a checkout holding
# this script, after `make gpu-wheels` here (wheels the CUDA image lacks: transformers of this
# venv's version, pydantic):
#     run(command="bash scripts/gpu_check.sh", carry=[".whl"], timeout_s=600)
# Here, without CUDA: `bash scripts/gpu_check.sh --cpu` runs every step on tiny shapes with this
# checkout's venv (no installs; the gpu tests skip), so the script's bugs show up on the CPU.
# Without CUDA and without --cpu it says so and exits 2 (after writing gpu.json with the reason).
#
# Steps (each writes its own part file; gpu.json is re-merged after every step, so a timeout or
# a crash in one step keeps the figures of the others, and names what failed):
#   versions    torch / triton / transformers / device
#   engine_360m python -m asymagent.evals.probes.gpu_bench --part engine --shape smollm2-360m
#   gate        python -m asymagent.evals.probes.gpu_bench --part gate
#   tests       pytest -m gpu (gate kernels == reference; static KV, CUDA graphs and captured
#               rounds give eager decode's tokens)
#   engine_1.7b python -m asymagent.evals.probes.gpu_bench --part engine --shape smollm2-1.7b
#   compile     registers / spills of the gate kernels as this Triton compiles them
# Results in $OUT: gpu.json (-> docs/results/gpu.json), part_*.json, *.log, steps.tsv.
set -uo pipefail
START=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET:-540}
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
CPU=0
if [[ "${1:-}" == "--cpu" ]]; then CPU=1; fi
: > "$OUT/steps.tsv"

if [[ $CPU == 1 ]]; then
    PY=${PY:-.venv/bin/python}
    [[ -x $PY ]] || PY=python3
    export TRITON_INTERPRET=1 ASYMAGENT_GATE=${ASYMAGENT_GATE:-torch}
    DEV=(--device cpu)
    ENGINE_SMALL=(--shape tiny --prompt 300 --tokens 16 --repeats 1 --forwards 3)
    ENGINE_LARGE=(--shape tiny --prompt 200 --tokens 12 --repeats 1 --forwards 2 --modes full spec)
else
    PY=python3
    DEV=(--device cuda)
    ENGINE_SMALL=(--shape smollm2-360m --prompt 2048 --tokens 128 --repeats 3)
    ENGINE_LARGE=(--shape smollm2-1.7b --prompt 2048 --tokens 128 --repeats 2 --forwards 30)
fi

merge() {  # gpu.json from the part files and the step table (plain json: no torch import)
    "$PY" - "$OUT" <<'EOF'
import glob, json, os, sys
out = sys.argv[1]
report = {"engine": {}, "gate": [], "steps": [], "errors": {}, "tests": None}
for path in sorted(glob.glob(os.path.join(out, "part_*.json"))):
    name = os.path.basename(path)
    try:
        part = json.load(open(path))
    except Exception as exc:
        report["errors"][name] = f"not read: {exc!r}"[:300]
        continue
    for key, value in part.items():
        if key == "engine" and value:
            shape = value.get("shape", name)
            report["engine"][shape if shape not in report["engine"] else f"{shape} ({name})"] = value
        elif key == "gate":
            report["gate"].extend(value)
        elif key == "errors":
            report["errors"].update({f"{name}:{k}": v for k, v in value.items()})
        elif key not in report or report[key] in (None, {}, []):
            report[key] = value
for line in open(os.path.join(out, "steps.tsv")):
    name, rc, seconds = line.rstrip("\n").split("\t")
    rc = int(rc)
    report["steps"].append({"step": name, "rc": rc, "seconds": int(seconds),
                            "timed_out": rc in (124, 137), "skipped": rc == -1})
    if rc not in (0,):
        report["errors"].setdefault(f"step:{name}", f"exit {rc}" + (" (timeout)" if rc in (124, 137) else "") + (" (skipped: budget)" if rc == -1 else ""))
log = os.path.join(out, "tests.log")
if os.path.exists(log):
    lines = [l for l in open(log, errors="replace").read().splitlines() if l.strip()]
    summary = [l for l in lines if l.startswith(("FAILED", "ERROR", "SKIPPED")) or any(w in l for w in (" passed", " failed", " error"))]
    report["tests"] = {"summary": summary[-12:], "tail": lines[-5:]}
targets = {}
for shape, e in report["engine"].items():
    for mode in ("spec", "asym"):
        x, acc = e.get(f"{mode}_speedup_vs_full"), e.get(f"{mode}_acceptance_per_token")
        if x is not None:
            targets[f"{shape} {mode} >= 1.5x full tokens/s at acceptance <= 0.9"] = {
                "value": round(x, 3), "acceptance": acc, "met": bool(x >= 1.5 and (acc is None or acc <= 0.9))}
    if e.get("full_over_graph_forward") is not None:
        v = e["full_over_graph_forward"]
        targets[f"{shape} full <= 1.3x a graph forward"] = {"value": round(v, 3), "met": v <= 1.3}
for row in report["gate"]:
    if (row.get("vocab") == 151936 and row.get("k") == 8 and row.get("batch") in (1, 64)
            and row.get("views", 2) == 2 and row.get("block_v") == 1024 and row.get("splits", 0) != 8):
        times = {n: row.get(f"{n}_ms") for n in ("kernel", "graph", "graph_passes", "graph_fused")}
        times = {n: v for n, v in times.items() if v is not None}
        how = min(times, key=times.get)
        best = times[how]
        if row["batch"] == 64 and row.get("bound_ms"):
            targets["gate V=151936 K=8 B=64 <= 2x the bandwidth bound"] = {
                "value": round(best / row["bound_ms"], 2), "best": how, **times,
                "met": best / row["bound_ms"] <= 2.0}
        if row["batch"] == 1:
            targets["gate V=151936 K=8 B=1 <= 0.030 ms"] = {
                "value": round(best, 4), "best": how, **times, "met": best <= 0.030}
for row in report["gate"]:  # the engine's default asym (beta 0) and spec: one drafter view
    if row.get("vocab") == 151936 and row.get("k") == 8 and row.get("batch") == 1 and row.get("views") == 1:
        times = {n: row[f"{n}_ms"] for n in ("kernel", "graph", "graph_passes", "graph_fused") if row.get(f"{n}_ms") is not None}
        how = min(times, key=times.get)
        targets["gate V=151936 K=8 B=1 one view <= 0.030 ms"] = {
            "value": round(times[how], 4), "best": how, **times, "met": times[how] <= 0.030}
report["targets"] = targets
tmp = os.path.join(out, "gpu.json.tmp")
json.dump(report, open(tmp, "w"), indent=2)
os.replace(tmp, os.path.join(out, "gpu.json"))
EOF
}

step() {  # step NAME LIMIT_S CMD...: run under min(LIMIT, what the budget has left)
    local name=$1 limit=$2
    shift 2
    local left=$(( BUDGET - ($(date +%s) - START) - 8 ))  # 8 s kept for the last merge
    if (( left < limit )); then limit=$left; fi
    if (( limit < 10 )); then
        printf '%s\t%s\t%s\n' "$name" -1 0 >> "$OUT/steps.tsv"
        echo "[gpu_check] $name skipped: the budget is spent"
        merge
        return
    fi
    echo "[gpu_check] $name (limit ${limit}s, $(( $(date +%s) - START ))s elapsed)"
    local t0=$(date +%s)
    timeout -k 5 "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    printf '%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" >> "$OUT/steps.tsv"
    echo "[gpu_check] $name: exit $rc after $(( $(date +%s) - t0 ))s"
    tail -n 4 "$OUT/$name.log"
    merge
}

if [[ $CPU == 0 ]]; then
    # the image's torch says whether there is a device, before anything is installed
    if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
        printf '%s\t%s\t%s\n' cuda 2 0 >> "$OUT/steps.tsv"
        merge
        echo "[gpu_check] no CUDA device here: nothing measured (bash scripts/gpu_check.sh --cpu runs the steps on tiny CPU shapes)"
        exit 2
    fi
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl > "$OUT/install.log" 2>&1 \
        || echo "[gpu_check] wheel install failed (install.log); going on with the image's packages"
    export PYTHONPATH=/tmp/site
    python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >> "$OUT/install.log" 2>&1 \
        || echo "[gpu_check] project install failed (install.log); the steps will say what is missing"
fi

step versions 30 "$PY" -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"
step engine_360m 120 "$PY" -m asymagent.evals.probes.gpu_bench "${DEV[@]}" --part engine "${ENGINE_SMALL[@]}" --json "$OUT/part_engine_360m.json"
step gate 75 "$PY" -m asymagent.evals.probes.gpu_bench "${DEV[@]}" --part gate --json "$OUT/part_gate.json"
step tests 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu -rs tests/test_kernel_fused_gate.py tests/test_static_kv.py tests/test_graph_round.py
step engine_1.7b 130 "$PY" -m asymagent.evals.probes.gpu_bench "${DEV[@]}" --part engine "${ENGINE_LARGE[@]}" --json "$OUT/part_engine_1.7b.json"
step compile 40 env -u TRITON_INTERPRET "$PY" -m asymagent.kernels.bench --compile-only --json "$OUT/gate_compile.json"
merge
echo "[gpu_check] done in $(( $(date +%s) - START ))s: $OUT/gpu.json"
"$PY" -c "import json,sys; r=json.load(open(sys.argv[1])); print(json.dumps({'targets': r['targets'], 'errors': r['errors'], 'tests': r['tests']}, indent=1))" "$OUT/gpu.json"
