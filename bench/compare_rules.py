#!/usr/bin/env python3
"""bench/compare_rules.py: two builds' runtime rules side by side, on every shipped model and load profile.

usage: compare_rules.py OLD_KILNC NEW_KILNC [--iters N] [--seed S] [--models M,...]
                        [--loads L,...] [--no-oracle] [--no-slack old|new|both] [--json]

For each shipped model (examples/models) and each load profile (the seven named profiles,
examples/traces/spike.csv, and examples/traces/heavy_tail.py's trace for the model's EP size
where it is at least 12), runs `kilnc simulate MODEL --policy kiln,full-recompute,unbounded
--iters N --seed S --json` with both binaries on the same loads, and `--policy oracle` once
with NEW_KILNC (the oracle chooses from the blob's tables, not by the runtime's rule). Prints
one Markdown row per (model, loads): kiln / unbounded, kiln / full recompute and kiln /
oracle for the old and the new rule, kiln's OOMs (full recompute's beside them) and kiln's
exposed recompute and copy seconds; then the extremes of new / old. With --json, one JSON
document instead. --no-slack passes `kilnc simulate --no-slack` (docs/simulator.md, "Slack") to
one side's runs or both (the oracle's runs are the new side's): with the same binary twice and
--no-slack new, the two columns bracket a rule between the simulator's two timings of
exposed work. Progress goes to stderr. Exit status 1 when a run fails, 2 for bad
arguments. docs/results.md quotes its output.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ["tiny", "llama3-8b-dense", "mixtral-8x22b", "custom-moe-188b", "qwen3-235b-a22b",
          "deepseek-v3-671b", "kimi-k2-1t"]
PROFILES = ["paper", "balanced", "hot-expert", "hot-rank", "rotating", "burst", "zipf:1.2",
            "spike.csv", "heavy-tail"]


def ep_of(model_path):
    with open(model_path, encoding="utf-8") as f:
        for line in f:
            s = line.split("#", 1)[0].strip()
            if s.startswith("ep:"):
                return int(s[3:].strip())
    return 1


def simulate(kilnc, model_path, policies, loads, iters, seed, no_slack=False):
    cmd = [kilnc, "simulate", model_path, "--policy", policies, "--loads", loads,
           "--iters", str(iters), "--seed", str(seed), "--json"] + (["--no-slack"] if no_slack
                                                                   else [])
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       check=False)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()}")
    return {p["policy"]: p for p in json.loads(r.stdout)["policies"]}


def main(argv):
    ap = argparse.ArgumentParser(prog="compare_rules.py", description=__doc__.split("\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--loads", default=",".join(PROFILES))
    ap.add_argument("--no-oracle", action="store_true")
    ap.add_argument("--no-slack", choices=["old", "new", "both"])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.iters < 1 or a.seed < 0:
        ap.error("--iters must be at least 1 and --seed at least 0")
    for b in (a.old, a.new):
        if not os.access(b, os.X_OK):
            ap.error(f"{b}: not an executable kilnc")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for m in a.models.split(","):
            path = os.path.join(ROOT, "examples", "models", m + ".yaml")
            if not os.path.isfile(path):
                ap.error(f"{m}: no examples/models/{m}.yaml")
            for l in a.loads.split(","):
                loads = l
                if l == "spike.csv":
                    loads = os.path.join(ROOT, "examples", "traces", "spike.csv")
                elif l == "heavy-tail":
                    ep = ep_of(path)
                    if ep < 12:
                        continue
                    loads = os.path.join(tmp, f"heavy{ep}.csv")
                    with open(loads, "w", encoding="utf-8") as f:
                        subprocess.run([sys.executable, os.path.join(ROOT, "examples", "traces",
                                                                     "heavy_tail.py"), str(ep),
                                        "4", "4"], stdout=f, check=True)
                print(f"compare_rules: {m} {l}", file=sys.stderr, flush=True)
                try:
                    ns_old = a.no_slack in ("old", "both")
                    ns_new = a.no_slack in ("new", "both")
                    old = simulate(a.old, path, "kiln,full-recompute,unbounded", loads, a.iters,
                                   a.seed, ns_old)
                    new = simulate(a.new, path, "kiln,full-recompute,unbounded", loads, a.iters,
                                   a.seed, ns_new)
                    orc = None if a.no_oracle else simulate(a.new, path, "oracle", loads,
                                                            a.iters, a.seed, ns_new)["oracle"]
                except (RuntimeError, ValueError, KeyError) as e:
                    print(f"compare_rules: {e}", file=sys.stderr)
                    return 1
                row = {"model": m, "loads": l}
                for tag, d in (("old", old), ("new", new)):
                    k, u, f = d["kiln"], d["unbounded"], d["full-recompute"]
                    row[tag] = {"kiln_vs_unbounded": k["tokens_per_s"] / u["tokens_per_s"],
                                "kiln_vs_full_recompute": k["tokens_per_s"] / f["tokens_per_s"],
                                "kiln_vs_oracle": (k["tokens_per_s"] / orc["tokens_per_s"]
                                                   if orc else None),
                                "kiln_ooms": k["ooms"], "full_recompute_ooms": f["ooms"],
                                "recompute_s": k["exposed_recompute_s"],
                                "copy_s": k["exposed_copy_s"]}
                rows.append(row)
    if a.json:
        json.dump({"iterations": a.iters, "seed": a.seed, "no_slack": a.no_slack, "rows": rows},
                  sys.stdout, indent=1)
        print()
        return 0
    pct = lambda x: "-" if x is None else f"{100 * x:.2f}%"
    ns = f"; --no-slack on {a.no_slack}" if a.no_slack else ""
    print(f"{a.iters} iterations, seed {a.seed}; old: {a.old}, new: {a.new}{ns}\n")
    print("| model | loads | kiln/unb old | new | kiln/oracle old | new | kiln/full old | new "
          "| kiln OOMs old / new (full) | recomp s old / new | copy s old / new |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for r in rows:
        o, n = r["old"], r["new"]
        print(f"| {r['model']} | {r['loads']} | {pct(o['kiln_vs_unbounded'])} | "
              f"{pct(n['kiln_vs_unbounded'])} | {pct(o['kiln_vs_oracle'])} | "
              f"{pct(n['kiln_vs_oracle'])} | {o['kiln_vs_full_recompute']:.3f}x | "
              f"{n['kiln_vs_full_recompute']:.3f}x | {o['kiln_ooms']} / {n['kiln_ooms']} "
              f"({n['full_recompute_ooms']}) | {o['recompute_s']:.3f} / {n['recompute_s']:.3f} | "
              f"{o['copy_s']:.3f} / {n['copy_s']:.3f} |")
    ratios = [r["new"]["kiln_vs_unbounded"] / r["old"]["kiln_vs_unbounded"] for r in rows]
    if ratios:
        lo = min(range(len(rows)), key=lambda i: ratios[i])
        hi = max(range(len(rows)), key=lambda i: ratios[i])
        print(f"\nnew / old, kiln tokens/s: lowest {ratios[lo]:.4f} ({rows[lo]['model']} "
              f"{rows[lo]['loads']}), highest {ratios[hi]:.4f} ({rows[hi]['model']} "
              f"{rows[hi]['loads']}); kiln OOMs where full recompute has none: old "
              f"{sum(1 for r in rows if r['old']['kiln_ooms'] and not r['old']['full_recompute_ooms'])}"
              f", new {sum(1 for r in rows if r['new']['kiln_ooms'] and not r['new']['full_recompute_ooms'])}")
        orcs = [(r["new"]["kiln_vs_oracle"], r) for r in rows if r["new"]["kiln_vs_oracle"]]
        if orcs:
            w = min(orcs, key=lambda t: t[0])
            print(f"new rule, lowest kiln / oracle: {pct(w[0])} ({w[1]['model']} {w[1]['loads']})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
