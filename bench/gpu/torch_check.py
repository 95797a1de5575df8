"""bench/gpu/torch_check.py: one Mixtral-like MoE layer at full size
(hidden 4096, 8 experts of 14336, top-2, 32 heads / 8 KV heads, seq 4096,
micro-batch 1, bf16) on one GPU through kiln.torch, with offloads to pinned
host memory on a side stream. Run by bench/gpu/torch_check.sh; --dry runs
the same code on the CPU at tiny shapes (no CUDA figures).

Prints:
- peak memory over forward and backward (torch.cuda.max_memory_allocated
  above what was allocated before) and the activation bytes held after the
  forward, against kiln's prediction (the units' bytes at the real rows,
  kiln_rt_unit_bytes, and the plan's resident_bytes);
- per unit: the measured time of recomputing it (its recipe re-run) and of
  offloading and reloading it (pinned copies on a side stream), against the
  cost model (recompute: the forward time of the op that produces the unit,
  from the emitted MLIR; copies: bytes / d2h_gbps and bytes / h2d_gbps of
  the hardware profile, docs/cost-model.md);
- whether the losses and every gradient of keep and of kiln (in a budget of
  half the layer's activations) are bitwise equal."""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples", "torch"))

import torch  # noqa: E402
import yaml  # noqa: E402

import kiln.runtime  # noqa: E402
import kiln.torch  # noqa: E402
import moe  # noqa: E402


def description(dry):
    if dry:
        m = dict(layers=1, hidden=64, heads=4, kv_heads=2, head_dim=16, vocab=256, seq_len=64,
                 moe=dict(experts=8, top_k=2, expert_ffn_hidden=128, activation="swiglu"))
    else:
        m = dict(layers=1, hidden=4096, heads=32, kv_heads=8, head_dim=128, vocab=32000,
                 seq_len=4096,
                 moe=dict(experts=8, top_k=2, expert_ffn_hidden=14336, activation="swiglu"))
    m.update(dense_layers=0, attention="flash", activation="swiglu")
    return {"kiln": 1, "name": "mixtral-layer" + ("-dry" if dry else ""), "model": m,
            "training": {"micro_batch": 1, "global_batch": 1, "dtype": "bf16",
                         "optimizer": "adam"},
            "parallel": {"devices": 1, "tp": 1, "pp": 1, "ep": 1, "schedule": "1f1b"},
            "hardware": "h200", "load": {"max_factor": 1.0}}


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timed(dev, fn, n=3):
    """Mean seconds of fn over n runs (after one warm-up)."""
    fn()
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync(dev)
    return (time.perf_counter() - t0) / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--dry", action="store_true", help="CPU, tiny shapes")
    ap.add_argument("--json", help="also write the figures here")
    o = ap.parse_args()
    dev = torch.device("cpu" if o.dry else "cuda")
    if not o.dry and not torch.cuda.is_available():
        sys.exit("torch_check: no CUDA device (use --dry for the CPU path)")
    tmp = tempfile.mkdtemp(prefix="kiln-gpu-")
    desc = description(o.dry)
    ypath, blob = os.path.join(tmp, "layer.yaml"), os.path.join(tmp, "layer.kiln")
    with open(ypath, "w") as f:
        yaml.safe_dump(desc, f)
    mlir = os.path.join(tmp, "layer.mlir")
    r = subprocess.run([os.path.join(o.build, "kilnc"), "compile", ypath, "-o", blob,
                        "--emit-mlir", mlir], capture_output=True, text=True)
    if r.returncode:
        sys.exit("torch_check: kilnc compile: " + r.stderr)
    hw = yaml.safe_load(open(os.path.join(ROOT, "examples", "hardware", "h200.yaml")))
    cfg = moe.Config(desc)
    rt = kiln.runtime.Runtime(blob)
    # The memory options as kilnc understood the description (issue 15).
    cfg.adopt(rt.unit_names(0), rt.unit(0, "moe.perm_idx").per_row_bytes)
    torch.manual_seed(0)
    mod = moe.Layer(cfg, 0, 0, 1).to(device=dev, dtype=cfg.dtype)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(cfg.tokens, cfg.hidden, generator=g).to(device=dev, dtype=cfg.dtype)
    x.requires_grad_(True)
    out = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"}

    def step(mgr, measure_units=False):
        mod.zero_grad(set_to_none=True)
        x.grad = None
        sync(dev)
        base = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        with mgr.microbatch(0):
            with mgr.layer(0, x) as L:
                y = moe.layer_forward(cfg, L, mod, x, None, [], 0, 0, 0)
                mgr.output(y)
        sync(dev)
        t_fwd = time.perf_counter() - t0
        held = (torch.cuda.memory_allocated(dev) - base) if dev.type == "cuda" else None
        units = {u.name: u for u in L.units.values()}
        meas = measure(units) if measure_units else None
        t1 = time.perf_counter()
        loss = y.float().pow(2).mean()
        loss.backward()
        mgr.end_backward(0)
        sync(dev)
        t_bwd = time.perf_counter() - t1
        peak = (torch.cuda.max_memory_allocated(dev) - base) if dev.type == "cuda" else None
        grads = [p.grad.clone() for p in mod.parameters()] + [x.grad.clone()]
        return dict(loss=loss.detach().clone(), grads=grads, held=held, peak=peak,
                    fwd_s=t_fwd, bwd_s=t_bwd, plan=L.plan, rows=L.rows,
                    bytes={n: u.nbytes for n, u in units.items()}, meas=meas,
                    done={n: ("keep", "recompute", "offload")[u.action]
                          for n, u in units.items()})

    def measure(units):
        """Each held unit: recompute (its recipe) and the pinned copies."""
        res = {}
        side = torch.cuda.Stream(dev) if dev.type == "cuda" else None
        for n, u in units.items():
            r = {}
            if u.recipe is not None:
                r["recompute_s"] = timed(dev, lambda u=u: u.recipe.run(None))
            t = u.tensor
            flat = t.new_empty(0).set_(t.storage())
            host = torch.empty(flat.numel(), dtype=flat.dtype, pin_memory=dev.type == "cuda")
            back = torch.empty_like(flat)

            def d2h():
                if side is not None:
                    with torch.cuda.stream(side):
                        host.copy_(flat, non_blocking=True)
                    side.synchronize()
                else:
                    host.copy_(flat)

            def h2d():
                if side is not None:
                    with torch.cuda.stream(side):
                        back.copy_(host, non_blocking=True)
                    side.synchronize()
                else:
                    back.copy_(host)
            r["offload_s"] = timed(dev, d2h)
            r["reload_s"] = timed(dev, h2d)
            res[n] = r
        return res

    # keep: everything kept, no budget; then again with the units measured
    # one by one (apart, so that the measuring buffers stay out of the peak).
    keep = step(kiln.torch.Manager(rt, stage=0, policy="keep", device=dev))
    keep["meas"] = step(kiln.torch.Manager(rt, stage=0, policy="keep", device=dev),
                        measure_units=True)["meas"]
    total = sum(keep["bytes"].values())
    # kiln told that half the layer's activations are free, so that it must
    # save about half (the manager enforces the whole layer's bytes: plans
    # are carried out at the layer's end, so within the forward every unit
    # coexists, docs/torch.md "Limits").
    budget = total // 2 + keep["bytes"]["ln1.in"]
    km = kiln.torch.Manager(rt, stage=0, budget_bytes=total, policy="kiln", device=dev,
                            free_bytes_fn=lambda: max(budget - km.device_bytes, 0))
    kl = step(km)
    bitwise = torch.equal(keep["loss"], kl["loss"]) and all(
        torch.equal(a, b) for a, b in zip(keep["grads"], kl["grads"]))

    # kiln's predictions at the real rows.
    pred = {u.name: rt.unit_bytes(0, u.name, keep["rows"]) for u in rt.units(0)}
    print("device: %s; rows routed %d (balanced %d)" % (out["device"], keep["rows"],
                                                        rt.layer(0).balanced_rows))
    print("unit bytes: measured storage = kiln_rt_unit_bytes for %d of %d units" % (
        sum(keep["bytes"][n] == pred[n] for n in pred), len(pred)))
    if dev.type == "cuda":
        print("keep: held after forward %.1f MiB (kiln: the units %.1f MiB), peak over "
              "forward+backward %.1f MiB" % (keep["held"] / 2**20, total / 2**20,
                                            keep["peak"] / 2**20))
        print("kiln (told %.1f MiB free): held after forward %.1f MiB (plan resident_bytes %.1f "
              "MiB), peak %.1f MiB" % (budget / 2**20, kl["held"] / 2**20,
                                      kl["plan"].resident_bytes / 2**20 if kl["plan"] else 0,
                                      kl["peak"] / 2**20))
    print("time: keep forward %.2f ms backward %.2f ms; kiln forward %.2f ms backward %.2f ms "
          "(plan exposed_us %.0f)" % (keep["fwd_s"] * 1e3, keep["bwd_s"] * 1e3,
                                      kl["fwd_s"] * 1e3, kl["bwd_s"] * 1e3,
                                      kl["plan"].exposed_us if kl["plan"] else 0))
    if kl["plan"] is not None:
        print("kiln plan, as carried out (the router's output offloaded where the plan "
              "recomputes it): " + ", ".join("%s %s" % (n, a) for n, a in kl["done"].items()
                                             if a != "keep"))

    # The cost model per unit: the forward time of the op that produces it
    # (its recompute), from the emitted MLIR's kiln.op time_us (the
    # balanced load, which is the only load with one EP rank) and kiln.tensor
    # producer attributes (docs/mlir-dialect.md).
    ops, producer = {}, {}
    for line in open(mlir):
        m = re.search(r'"kiln\.op"\(\) \{(.*)\}', line)
        if m:
            at = m.group(1)
            i = re.search(r"\bid = (\d+)", at)
            t = re.search(r"time_us = ([0-9.e+-]+)", at)
            d = re.search(r'dir = "(\w+)"', at)
            if i and t and d and d.group(1) == "fwd":
                ops[int(i.group(1))] = float(t.group(1))
        m = re.search(r'"kiln\.tensor"\(\) \{(.*)\}', line)
        if m:
            at = m.group(1)
            n = re.search(r'name = "([^"]+)"', at)
            pr = re.search(r"producer = (-?\d+)", at)
            if n and pr:
                producer[n.group(1)] = int(pr.group(1))
    single = {n: ops[p] for n, p in producer.items() if p in ops}
    print("%-16s %10s %12s %12s %12s %12s %12s %12s" % (
        "unit", "MiB", "recomp ms", "model ms", "d2h ms", "model ms", "h2d ms", "model ms"))
    rows = []
    for n, r in keep["meas"].items():
        b = keep["bytes"][n]
        rec = r.get("recompute_s")
        row = dict(unit=n, bytes=b, recompute_ms=rec * 1e3 if rec is not None else None,
                   model_recompute_ms=single[n] / 1e3 if n in single else None,
                   d2h_ms=r["offload_s"] * 1e3, model_d2h_ms=b / (hw["d2h_gbps"] * 1e9) * 1e3,
                   h2d_ms=r["reload_s"] * 1e3, model_h2d_ms=b / (hw["h2d_gbps"] * 1e9) * 1e3)
        rows.append(row)

        def f(v):
            return "%12.4f" % v if v is not None else "%12s" % "-"
        print("%-16s %10.2f %s %s %s %s %s %s" % (
            n, b / 2**20, f(row["recompute_ms"]), f(row["model_recompute_ms"]),
            f(row["d2h_ms"]), f(row["model_d2h_ms"]), f(row["h2d_ms"]), f(row["model_h2d_ms"])))
    print("bitwise: losses and every gradient of keep and kiln %s" % (
        "EQUAL" if bitwise else "DIFFER"))
    out.update(rows=rows, bitwise=bitwise, keep_peak=keep["peak"], keep_held=keep["held"],
               kiln_peak=kl["peak"], kiln_held=kl["held"], units_bytes=total, budget=budget,
               resident=kl["plan"].resident_bytes if kl["plan"] else None,
               keep_ms=(keep["fwd_s"] + keep["bwd_s"]) * 1e3,
               kiln_ms=(kl["fwd_s"] + kl["bwd_s"]) * 1e3)
    if o.json:
        with open(o.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
