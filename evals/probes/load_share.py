"""Load share: an engine's decode throughput beside 0, 1 and 3 competing engines, old thread policy against new.

    flock /tmp/asym-bench.lock python -m asymagent.evals.probes.load_share --competitors 0,1,3 \
        --policies old,new --repeats 3 --json docs/results/load_share.json
    flock /tmp/asym-bench.lock python -m asymagent.evals.probes.load_share --demo --competitors 0,1 \
        --policies new --repeats 2 --timeout 200 --json docs/results/load_share_demo_quiet.json

Every engine is its own process on the embedded default (`--worker measure|compete`): a
competitor decodes without end (mode full, 16 new tokens a call) until it is stopped; the
measured engine loads beside the competitors once they decode, warms up, then decodes for
`--seconds` and reports tokens per second (new tokens over the calls' wall time, prefill of the
~150-token prompt included). All engines of a run have the same policy, as replicas or eval
workers on one machine have:
- `old`: the defaults before issue 44 (no OpenMP variable set: libgomp spins ~3 ms at every
  barrier; torch's thread count, one per core of the machine);
- `new`: the engine's policy on a busy machine (asymagent/modeling/cpu_threads.py:
  `use_omp_policy()` with ASYMAGENT_OMP_POLICY=passive before torch is imported, then
  `apply_threads()`); "auto", the CLI's default, picks it where the load average is at least the
  CPUs at start;
- `env:K=V+K=V` (e.g. `env:GOMP_SPINCOUNT=10000`): the old code path under those variables.
`--demo` measures `asymagent demo` (the embedded default's `make demo`) instead: its wall time
quiet and beside competitors of the old policy (a heavy job of someone else's, spinning); `old`
there is `GOMP_SPINCOUNT=300000` (libgomp's own default spin, which the CLI leaves alone).
Runs are interleaved (repeat-major, the policies in turn); the JSON has every run, the load
average before each, and per policy and competitor count the median throughput (or demo time)
and its share of the same policy's quiet median. A run past `--timeout` is recorded as timed out
(it counts as 0 tokens/s, a demo as the limit: a lower bound).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

PROMPT = ("Count from one to two hundred in English words, separated by commas, without skipping "
          "any number. " * 6)
OMP_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")
OLD_DEMO_ENV = {"GOMP_SPINCOUNT": "300000"}  # libgomp's default spin when no policy is set


def policy_env(policy: str, demo: bool = False) -> dict:
    """The environment of a process under `policy` (old, new, env:K=V+K=V)."""
    env = {k: v for k, v in os.environ.items() if k not in OMP_KEYS}
    if policy == "old" and demo:
        env.update(OLD_DEMO_ENV)
    elif policy.startswith("env:"):
        for item in policy[4:].split("+"):
            key, _, value = item.partition("=")
            env[key] = value
    elif policy not in ("old", "new"):
        raise ValueError(f"unknown policy {policy!r}: old, new or env:K=V+K=V")
    env["ASYMAGENT_LOAD_POLICY"] = policy
    return env


def worker(role: str, seconds: float, max_new_tokens: int) -> int:
    """One engine process: `compete` decodes until killed; `measure` prints "tokens seconds"."""
    policy = os.environ.get("ASYMAGENT_LOAD_POLICY", "old")
    if policy == "new":
        from asymagent.modeling.cpu_threads import apply_threads, use_omp_policy

        os.environ.setdefault("ASYMAGENT_OMP_POLICY", "passive")  # what "auto" picks on a busy machine
        use_omp_policy()
        apply_threads()
    import torch

    from asymagent import Engine

    engine = Engine.from_default()
    ids = engine.tokenizer(PROMPT)["input_ids"]  # [P]
    engine.generate(ids, mode="full", max_new_tokens=max_new_tokens)  # warm-up (row floors too)
    print(f"ready threads={torch.get_num_threads()}", flush=True)
    tokens, spent, t_end = 0, 0.0, time.perf_counter() + seconds
    while role == "compete" or time.perf_counter() < t_end or tokens == 0:
        t0 = time.perf_counter()
        r = engine.generate(ids, mode="full", max_new_tokens=max_new_tokens)
        spent += time.perf_counter() - t0
        tokens += len(r.token_ids)
    print(f"result {tokens} {spent:.4f}", flush=True)
    return 0


def start_competitors(n: int, env: dict, max_new_tokens: int) -> list:
    """`n` competing engine processes, returned once each decodes (printed "ready")."""
    procs = [subprocess.Popen([sys.executable, "-m", "asymagent.evals.probes.load_share", "--worker",
                               "compete", "--max-new-tokens", str(max_new_tokens)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for _ in range(n)]
    for p in procs:
        for line in p.stdout:
            if line.startswith("ready"):
                break
    return procs


def stop(procs: list) -> None:
    for p in procs:
        p.kill()
        p.wait()


def measure(policy: str, competitors: int, args) -> dict:
    """One run: the measured engine (or `asymagent demo`) beside `competitors` engines."""
    demo = args.demo
    rival_env = policy_env("old" if demo else policy)
    load = os.getloadavg()[0]
    rivals = start_competitors(competitors, rival_env, args.max_new_tokens)
    try:
        if demo:
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "asymagent", "demo", "--no-live"],
                           env=policy_env(policy, demo=True), check=True, timeout=args.timeout,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            return {"policy": policy, "competitors": competitors, "load_before": load,
                    "demo_s": time.perf_counter() - t0}
        out = subprocess.run([sys.executable, "-m", "asymagent.evals.probes.load_share", "--worker",
                              "measure", "--seconds", str(args.seconds), "--max-new-tokens",
                              str(args.max_new_tokens)], env=policy_env(policy), timeout=args.timeout,
                             capture_output=True, text=True, check=True).stdout
    except subprocess.TimeoutExpired:  # reported: a run that did not end within --timeout
        return {"policy": policy, "competitors": competitors, "load_before": load,
                "timed_out_s": args.timeout}
    finally:
        stop(rivals)
    ready = next(x for x in out.splitlines() if x.startswith("ready"))
    _, tokens, secs = next(x for x in out.splitlines() if x.startswith("result")).split()
    return {"policy": policy, "competitors": competitors, "load_before": load,
            "threads": int(ready.split("=")[1]), "tokens": int(tokens), "seconds": float(secs),
            "tok_s": int(tokens) / float(secs)}


def summarize(runs: list, demo: bool) -> dict:
    """{policy: {competitors: {"median", "share_of_quiet" (demo: "x_quiet")}}}."""
    key = "demo_s" if demo else "tok_s"
    out: dict = {}
    for r in runs:  # a run that timed out counts as its limit (a lower bound on its time)
        value = r.get(key, (r["timed_out_s"] if demo else 0.0) if "timed_out_s" in r else None)
        out.setdefault(r["policy"], {}).setdefault(str(r["competitors"]), []).append(value)
    summary = {}
    for policy, by_n in out.items():
        quiet = statistics.median(by_n["0"]) if "0" in by_n else None
        summary[policy] = {}
        for n, values in sorted(by_n.items()):
            med = statistics.median(values)
            ratio = med / quiet if quiet else None  # demo: times quiet; else: share of quiet
            summary[policy][n] = {"median": med, "values": values,
                                  ("x_quiet" if demo else "share_of_quiet"): ratio}
    return summary


def main(argv=None) -> int:
    from asymagent.evals.probes.harness import command, finish, parser

    p = parser(__doc__, "load_share", repeats=3)
    p.add_argument("--worker", choices=("measure", "compete"), default=None, help="(internal) one engine")
    p.add_argument("--competitors", default="0,1,3", help="comma list of competitor counts")
    p.add_argument("--policies", default="old,new", help="comma list: old, new, env:K=V+K=V")
    p.add_argument("--seconds", type=float, default=10.0, help="the measured engine's decode time")
    p.add_argument("--max-new-tokens", type=int, default=16, help="tokens per generate call")
    p.add_argument("--demo", action="store_true", help="measure `asymagent demo` instead")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds a measured run may take (beyond: recorded as timed out)")
    args = p.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.seconds, args.max_new_tokens)
    policies = [x for x in args.policies.split(",") if x]
    counts = [int(x) for x in args.competitors.split(",") if x]
    runs = []
    for rep in range(args.repeats):
        for n in counts:
            for policy in policies if rep % 2 == 0 else policies[::-1]:
                runs.append(measure(policy, n, args))
                print(runs[-1], file=sys.stderr, flush=True)
    import platform

    doc = {"command": command("load_share", argv), "cpu": _cpu_model(), "cpus": os.cpu_count(),
           "python": platform.python_version(), "runs": runs, "summary": summarize(runs, args.demo)}
    return finish(doc, args.json, show=True)


def _cpu_model() -> str:
    from asymagent.modeling.cpu_dtype import cpu_model

    return cpu_model() or "?"


if __name__ == "__main__":
    raise SystemExit(main())
