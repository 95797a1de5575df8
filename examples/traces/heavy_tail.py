#!/usr/bin/env python3
"""examples/traces/heavy_tail.py: writes a heavy-tailed load trace (docs/simulator.md, "Traces").

usage: heavy_tail.py EP [ITERATIONS] [MICROBATCHES] > trace.csv

Per (iteration, micro-batch) one EP rank, (5 * iteration + 3 * micro-batch) mod EP, receives
F times its balanced rows, F cycling through 4, 11, 6, 8, 5, 9.5, 7, 4.5 (4x to 11x: past a
load.max_factor of 3); the other EP - 1 ranks share the rest, EP - F, in steps of 1e-4, so
that every sample's factors sum to EP exactly (routing conserves rows). One layer (0) is
written: the simulator replays it at every MoE layer (layer l replays l mod 1).
examples/traces/heavy-tail.csv is `heavy_tail.py 16`.
"""
import sys

SPIKES = [4, 11, 6, 8, 5, 9.5, 7, 4.5]


def main(argv):
    ep = int(argv[1]) if len(argv) > 1 else 16
    iterations = int(argv[2]) if len(argv) > 2 else 4
    microbatches = int(argv[3]) if len(argv) > 3 else 4
    if ep < 12:
        sys.exit("heavy_tail.py: EP must be at least 12 (a rank at 11x of balanced)")
    print(f"# examples/traces/heavy_tail.py {ep} {iterations} {microbatches}: per (iteration,")
    print("# micro-batch) one rank at 4x to 11x of its balanced rows, the others share the rest.")
    print("iteration,microbatch,layer,rank,factor")
    k = 0
    for it in range(iterations):
        for mb in range(microbatches):
            f = SPIKES[k % len(SPIKES)]
            k += 1
            hot = (5 * it + 3 * mb) % ep
            left = int(round((ep - f) * 10000))
            n = ep - 1
            share = [left // n + (1 if j < left % n else 0) for j in range(n)]
            j = 0
            for r in range(ep):
                if r == hot:
                    print(f"{it},{mb},0,{r},{f:g}")
                else:
                    print(f"{it},{mb},0,{r},{share[j] / 10000:.4f}")
                    j += 1


if __name__ == "__main__":
    main(sys.argv)
