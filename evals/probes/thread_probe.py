"""Thread-safety probe on the embedded default: N threads calling Engine.chat at once, against the same requests one by one.

    OMP_NUM_THREADS=1 python -m asymagent.evals.probes.thread_probe [--threads 4] [--max-new-tokens 16]

Prints one JSON line: whether every concurrent output equals its one-by-one output (greedy and
sampled with a seed), the wall time of both, and any exception raised in a thread. Before issue
17 four threads failed here with `AttributeError: 'NoneType' object has no attribute 'ids'`.
"""

from __future__ import annotations

import json
import threading
import time

from asymagent.evals.probes.harness import finish, parser, timed

PROMPTS = ["Hello", "What is 2+2?", "Name a colour.", "Say hi.", "Spell cat.", "Count to 3.",
           "Name a fruit.", "What day follows Monday?"]


def main(argv=None) -> int:
    p = parser(__doc__, "thread_probe")
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=16)
    args = p.parse_args(argv)
    from asymagent import Engine

    engine = Engine.from_default()
    requests = [dict(messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                     temperature=0.0 if i % 2 == 0 else 0.8, seed=i, mode=("asym", "spec")[i % 2])
                for i in range(args.threads)]

    def call(i: int, prefix: str):
        return engine.chat(max_new_tokens=args.max_new_tokens, cache_key=f"{prefix}{i}",
                           **requests[i]).token_ids

    alone, t_alone = timed(lambda: [call(i, "alone-") for i in range(args.threads)])
    got, errors = [None] * args.threads, []

    def run(i: int) -> None:
        try:
            got[i] = call(i, "threads-")
        except Exception as exc:  # reported, not raised: the probe counts failures
            errors.append(repr(exc))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(args.threads)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    t_threads = time.perf_counter() - t0
    doc = {"threads": args.threads, "equal_to_one_by_one": got == alone, "errors": errors,
           "one_by_one_s": round(t_alone, 2), "concurrent_s": round(t_threads, 2)}
    print(json.dumps(doc))
    return finish(doc, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
