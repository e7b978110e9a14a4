"""Engine host time per decode step early and late in the output: what the engine does around the model (scheduling,
inputs, sampling, detokenizing, stop checks, deltas) must not grow with the output's length.
`mili bench engine host_overhead [--batch 8] [--early 100] [--late 4000]`.

Host time of a step = the step's wall time minus the time inside the model's forward. Prints a table (median
host ms per step at both positions, and late / early) and writes JSON under benchmarks/results/."""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.common import print_table, write_json

from python_layer import InferenceEngine, SamplingParams
from python_layer.model.loader import load_model


class _TimedForward:
    """Wraps the model's forward and adds up the seconds spent in it."""

    def __init__(self, forward) -> None:
        self.forward, self.seconds = forward, 0.0

    def __call__(self, *args):
        started = time.perf_counter()
        out = self.forward(*args)
        self.seconds += time.perf_counter() - started
        return out


def host_ms_per_step(engine: InferenceEngine, timed: _TimedForward, steps: int) -> list[float]:
    samples = []
    for _ in range(steps):
        timed.seconds = 0.0
        started = time.perf_counter()
        engine.step()
        samples.append((time.perf_counter() - started - timed.seconds) * 1e3)
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--model", default=None, help="checkpoint (default: the built-in model: host time is what is timed)"
    )
    parser.add_argument("--backend", default="mojo")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--early", type=int, default=100, help="output position of the first measurement")
    parser.add_argument("--late", type=int, default=4000, help="output position of the second measurement")
    parser.add_argument("--steps", type=int, default=50, help="decode steps timed at each position")
    parser.add_argument("--stop", action="store_true", help="give every request a stop string (text is searched)")
    args = parser.parse_args(argv)

    model = load_model(args.model, backend=args.backend)
    timed = _TimedForward(model.forward_fn)
    model.forward_fn = timed
    engine = InferenceEngine(model, max_num_seqs=args.batch)
    max_tokens = args.late + args.steps + 1
    # greedy: sampling from the whole vocabulary costs the same at every position and would hide what grows
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                            stop=["\u2603never\u2603"] if args.stop else None)
    for i in range(args.batch):
        engine.add_request([1000 + i, 2000, 3000, 4000], params)
    rows = []
    position = 0
    for target in (args.early, args.late):
        while position < target:
            engine.step()
            position += 1
        samples = host_ms_per_step(engine, timed, args.steps)
        position += args.steps
        rows.append(dict(position=target, batch=args.batch, host_ms_median=statistics.median(samples),
                         host_ms_p90=sorted(samples)[int(0.9 * len(samples))]))
        print(f"output position {target}: host {rows[-1]['host_ms_median']:.3f} ms per step", flush=True)
    rows[1]["late_over_early"] = rows[1]["host_ms_median"] / rows[0]["host_ms_median"]
    print_table(rows, ["position", "batch", "host_ms_median", "host_ms_p90", "late_over_early"])
    write_json("host_overhead", vars(args), rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
