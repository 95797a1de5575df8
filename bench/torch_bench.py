"""bench/torch_bench.py: what kiln.torch costs, printed (not asserted).

    KILN_RT_LIBRARY=build/libkiln_rt.so PYTHONPATH=python \\
        /usr/bin/python3 bench/torch_bench.py build [STEPS]

1. microseconds per Layer.decide() (kiln_rt_select through kiln.runtime,
   from a list and from a counts tensor), beside a bare Runtime.select;
2. microseconds per saved tensor through the manager's hooks: one MoE
   layer of examples/torch (one EP rank, no collectives), forward and
   backward, under the manager (policy keep, then mixed: every third unit
   offloaded and every third recomputed) against the same layer with no
   hooks, divided by the tensors autograd saved;
3. tokens/s of examples/torch (4 processes) under keep-everything in 1 GiB
   and under kiln in the plan's budget, with the same spikes; the first
   step excluded. REPEAT=N alternates the pair N times (medians)."""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples", "torch"))

import torch  # noqa: E402
import yaml  # noqa: E402

import kiln.runtime  # noqa: E402
import kiln.torch  # noqa: E402
import moe  # noqa: E402


def best(fn, n, repeat=5):
    """Smallest mean seconds per call of fn over repeat rounds of n calls."""
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t0) / n)
    return min(out)


class Plain:
    """A layer scope that only runs the ops (no kiln)."""

    rows = 0

    def produce(self, name, fn, *src, rng=False, router=False):
        return fn(*src)

    def register(self, name, t):
        return t

    def decide(self, tokens, pending=0, fixed_after_bytes=0):
        return None


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    steps = max(int(sys.argv[2]) if len(sys.argv) > 2 else 10, 2)
    repeat = int(os.environ.get("REPEAT", "1"))
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="kiln-torch-bench-")
    blob = os.path.join(tmp, "torch.kiln")
    model = os.path.join(ROOT, "examples", "torch", "model.yaml")
    subprocess.run([os.path.join(build, "kilnc"), "compile", model, "-o", blob], check=True,
                   stdout=subprocess.DEVNULL)

    # 1. decide()
    rt = kiln.runtime.Runtime(blob)
    counts = [64, 64, 64, 64]
    tcounts = torch.tensor(counts)
    free = rt.stage(0).capacity_bytes - rt.stage(0).static_bytes
    n = 20000
    us_select = best(lambda: rt.select(0, 0, counts, free), n) * 1e6
    mgr = kiln.torch.Manager(rt, stage=0)
    x = torch.zeros(128, 64)
    with mgr.microbatch(0):
        with mgr.layer(0, x) as L:
            us_decide = best(lambda: L.decide(counts), n) * 1e6
            us_decide_t = best(lambda: L.decide(tcounts), n) * 1e6
            L.plan = None  # keep: nothing to carry out
    mgr.end_backward(0)
    print("decide: %.2f us per Layer.decide (a list of 4 counts), %.2f us from a counts "
          "tensor; Runtime.select alone %.2f us" % (us_decide, us_decide_t, us_select))

    # 2. hooks
    desc = yaml.safe_load(open(model))
    desc["parallel"]["ep"] = 1
    desc["parallel"]["devices"] = desc["parallel"]["pp"]
    cfg = moe.Config(desc)
    torch.manual_seed(0)
    mod = moe.Layer(cfg, 0, 0, 1)
    x0 = torch.randn(cfg.tokens, cfg.hidden, requires_grad=True)

    def plain():
        y = moe.layer_forward(cfg, Plain(), mod, x0, None, [], 0, 0, 0)
        y.sum().backward()

    def managed(m):
        def f():
            with m.microbatch(0):
                with m.layer(0, x0) as L:
                    y = moe.layer_forward(cfg, L, mod, x0, None, [], 0, 0, 0)
                    m.output(y)
            y.sum().backward()
            m.end_backward(0)
        return f

    # Interleaved rounds, the best of each: the machine is shared.
    def interleaved(fns, rounds):
        best_s = [float("inf")] * len(fns)
        for _ in range(rounds):
            for i, f in enumerate(fns):
                t0 = time.perf_counter()
                f()
                best_s[i] = min(best_s[i], time.perf_counter() - t0)
        return best_s

    mk = kiln.torch.Manager(None, policy="keep")
    mk.watch_parameters(mod)
    mk.stats["saved_tensors"] = 0
    managed(mk)()
    per_step = mk.stats["saved_tensors"]
    mm = kiln.torch.Manager(None, policy="mixed")
    mm.watch_parameters(mod)
    t_plain, t_keep, t_mixed = interleaved([plain, managed(mk), managed(mm)], 40)
    print("hooks: one MoE layer of examples/torch forward+backward: %.0f us plain, %.0f us "
          "under kiln.torch keeping everything, %.0f us under mixed (a third of the units "
          "offloaded, a third recomputed); %d saved tensors" % (
              t_plain * 1e6, t_keep * 1e6, t_mixed * 1e6, per_step))

    # A chain of 200 cheap ops, each output a unit its successor's op saves.
    n_ops = 200
    c0 = torch.randn(64, requires_grad=True)

    def chain_plain():
        t = c0
        for _ in range(n_ops):
            t = torch.tanh(t)
        t.sum().backward()

    mc = kiln.torch.Manager(None, policy="keep")

    def chain_managed():
        with mc.microbatch(0):
            with mc.layer(0) as L:
                t = c0
                for i in range(n_ops):
                    t = L.produce(i, torch.tanh, t)
        t.sum().backward()
        mc.end_backward(0)

    mc.stats["saved_tensors"] = 0
    chain_managed()
    saved = mc.stats["saved_tensors"]
    tp, tm = interleaved([chain_plain, chain_managed], 40)
    print("hooks: %.2f us per saved tensor (a chain of %d tanh ops, %d saved tensors, each "
          "a unit: registration, pack, binding at the layer's end, unpack): %.0f us plain, "
          "%.0f us managed" % ((tm - tp) * 1e6 / saved, n_ops, saved, tp * 1e6, tm * 1e6))

    # 3. tokens/s
    env = dict(os.environ)
    train = os.path.join(ROOT, "examples", "torch", "train.py")
    spikes = ["--spike", "4,11:1.0:0+1", "--spike", "7,15:0.5:5"]
    rates = {"keep": [], "kiln": []}
    for _ in range(repeat):
        for pol, extra in (("keep", ["--budget", "1G"]), ("kiln", [])):
            log = os.path.join(tmp, pol + ".log")
            subprocess.run([sys.executable, train, "--plan", blob, "--policy", pol,
                            "--steps", str(steps), *spikes, *extra, "--quiet", "--log", log],
                           check=True, env=env)
            recs = [json.loads(line) for line in open(log)][1:]
            tokens = sum(r["tokens_per_s"] * r["seconds"] for r in recs)
            rates[pol].append(tokens / sum(r["seconds"] for r in recs))
    k, s = statistics.median(rates["keep"]), statistics.median(rates["kiln"])
    print("tokens/s (examples/torch, 4 processes, steps 2-%d, %d run(s) each): keep %.0f "
          "(1 GiB), kiln %.0f (the plan's budget): kiln/keep %.3f" % (steps, repeat, k, s,
                                                                      s / k))


if __name__ == "__main__":
    main()
