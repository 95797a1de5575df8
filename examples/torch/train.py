"""examples/torch/train.py: trains the MoE transformer of moe.py with kiln
deciding, on 4 processes (torch.distributed, gloo): 2 pipeline stages x 2
expert-parallel ranks (also the stage's data-parallel replicas), 1F1B.

    ./build/kilnc compile examples/torch/model.yaml -o torch.kiln
    KILN_RT_LIBRARY=build/libkiln_rt.so PYTHONPATH=python \\
        /usr/bin/python3 examples/torch/train.py --plan torch.kiln --spike 4,11:1.0:0+1

docs/torch.md describes the options, the logs and the exit statuses:
0 done, 1 bad input or an internal error, 2 bad arguments, 3 out of memory
(the activation budget, enforced by kiln.torch's saved-tensor manager)."""

import argparse
import datetime
import json
import os
import random
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXIT_INPUT, EXIT_USAGE, EXIT_OOM = 1, 2, 3


def parse_bytes(text):
    m = re.fullmatch(r"([0-9]+)([KMGT]?)", text)
    if not m:
        raise argparse.ArgumentTypeError("%r is not a byte count (digits, optional K, M, G "
                                         "or T)" % text)
    n = int(m.group(1)) * 1024 ** " KMGT".index(m.group(2) or " ")
    if n < 1 or n > 2 ** 50:
        raise argparse.ArgumentTypeError("%r: from 1 byte to 2^50" % text)
    return n


def parse_spike(text):
    m = re.fullmatch(r"([0-9]+(?:,[0-9]+)*):([0-9.]+):([0-9]+(?:\+[0-9]+)?)", text)
    if not m:
        raise argparse.ArgumentTypeError("--spike %r: STEPS:FRACTION:EXPERTS, e.g. "
                                         "4,11:1.0:0+1" % text)
    frac = float(m.group(2))
    if not 0.0 <= frac <= 1.0:
        raise argparse.ArgumentTypeError("--spike %r: the fraction must lie in [0, 1]" % text)
    steps = [int(s) for s in m.group(1).split(",")]
    experts = [int(e) for e in m.group(3).split("+")]
    return steps, frac, experts


def options(argv):
    p = argparse.ArgumentParser(prog="examples/torch/train.py",
                                description="PyTorch MoE training with kiln deciding")
    p.add_argument("--plan", required=True, help="the blob kilnc compile made from --model")
    p.add_argument("--model", default=os.path.join(HERE, "model.yaml"))
    p.add_argument("--policy", choices=("kiln", "keep", "mixed"), default="kiln")
    p.add_argument("--budget", type=parse_bytes, default=None,
                   help="activation bytes per process (default: the stage's capacity "
                        "minus its static bytes, from the plan)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--spike", type=parse_spike, action="append", default=[])
    p.add_argument("--data", default="/usr/share/common-licenses/GPL-3")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--log", help="one JSON object per step")
    p.add_argument("--unit-log", help="PREFIX: per rank, every unit at every decision")
    p.add_argument("--dump", help="DIR: per rank, losses, gradients and parameters of "
                                  "every step (torch.save), for the bitwise test")
    p.add_argument("--port", type=int, default=0, help="rendezvous port (0: any free one)")
    p.add_argument("--quiet", action="store_true")
    o = p.parse_args(argv)
    if o.steps < 1:
        p.error("--steps must be at least 1")
    return o


def load_yaml(path):
    import yaml
    with open(path) as f:
        return yaml.safe_load(f)


# ---------------------------------------------------------------- one rank

def worker(rank, o, port, world):
    import torch
    import torch.distributed as dist

    sys.path.insert(0, HERE)
    import moe
    import kiln.runtime
    import kiln.torch

    torch.set_num_threads(1)
    cfg = moe.Config(load_yaml(o.model))
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    ep = cfg.ep
    stage, dp = rank // ep, rank % ep
    groups = [dist.new_group(list(range(s * ep, (s + 1) * ep))) for s in range(cfg.pp)]
    group = groups[stage]
    last = stage == cfg.pp - 1
    M = cfg.microbatches

    problem = adopt_plan(o.plan, cfg)  # checked by main; here for the options
    if problem:
        raise SystemExit(problem)
    rt = kiln.runtime.Runtime(o.plan)
    layers = list(range(stage * cfg.stage_layers, (stage + 1) * cfg.stage_layers))
    mgr = kiln.torch.Manager(rt, stage=stage, budget_bytes=o.budget, policy=o.policy,
                             record=bool(o.unit_log))

    mods = torch.nn.ModuleList([moe.Layer(cfg, l, dp, o.seed) for l in layers])
    embed = moe.Embed(cfg, o.seed) if stage == 0 else None
    head = moe.Head(cfg, o.seed) if last else None
    for m in (mods, embed, head):
        if m is not None:
            m.to(cfg.dtype)
    params = list(mods.parameters())
    replicated = [p for m in mods for p in m.replicated()]
    for extra in (embed, head):
        if extra is not None:
            params += list(extra.parameters())
            replicated += list(extra.parameters())
    for m in (mods, embed, head):
        if m is not None:
            mgr.watch_parameters(m)
    opt = torch.optim.AdamW(params, lr=o.lr)

    with open(o.data, "rb") as f:
        text = torch.tensor(list(f.read()), dtype=torch.long)
    S, B = cfg.seq, cfg.micro_batch

    def batch(step, mb):
        r = random.Random("%d-%d-%d-%d" % (o.seed, step, dp, mb))
        starts = [r.randrange(0, text.numel() - S - 1) for _ in range(B)]
        ids = torch.stack([text[s:s + S] for s in starts]).reshape(-1)
        tgt = torch.stack([text[s + 1:s + S + 1] for s in starts]).reshape(-1)
        return ids, tgt

    # 1F1B: stage s runs pp - s - 1 forwards, then alternates, then drains.
    warm = min(cfg.pp - stage - 1, M)
    ops = [("F", i) for i in range(warm)]
    for i in range(M - warm):
        ops += [("F", warm + i), ("B", i)]
    ops += [("B", M - warm + i) for i in range(warm)]
    is_fwd = [op == "F" for op, _ in ops]

    def pending_after(at):
        n = 0
        for f in is_fwd[at + 1:]:
            if not f:
                break
            n += 1
        return n

    hb = moe.head_bytes(cfg) if last else 0
    balanced = rt.layer(layers[0]).balanced_rows
    log = open(o.log + ".tmp", "w") if (o.log and rank == world - ep) else None
    unit_log = open("%s.%d" % (o.unit_log, rank), "w") if o.unit_log else None
    dumps = []
    total_tokens = 0
    t_all = 0.0
    for step in range(1, o.steps + 1):
        mgr.step = step
        spikes = [(frac, ex) for steps, frac, ex in o.spike if step in steps]
        t0 = time.perf_counter()
        acts, outs, losses, sends = {}, {}, {}, []
        max_rows = 0
        before = dict(mgr.stats)
        for at, (op, mb) in enumerate(ops):
            if op == "F":
                ids, tgt = batch(step, mb)
                with mgr.microbatch(mb):
                    if stage == 0:
                        with mgr.layer("embed"):
                            x = torch.nn.functional.embedding(ids, embed.table)
                    else:
                        x = torch.empty(cfg.tokens, cfg.hidden)
                        dist.recv(x, src=rank - ep)
                        x = x.to(cfg.dtype).requires_grad_(True)
                    acts[mb] = x
                    for li, l in enumerate(layers):
                        key = ((((o.seed * 1000003 + step) * 31 + dp) * 131 + mb) * 257 +
                               l) % (1 << 62)
                        with mgr.layer(l, x) as L:
                            y = moe.layer_forward(cfg, L, mods[li], x, group, spikes, key,
                                                  pending_after(at),
                                                  hb if li == len(layers) - 1 else 0)
                            mgr.output(y)
                            max_rows = max(max_rows, L.rows)
                        x = y
                    if last:
                        with mgr.layer("head") as H:
                            H.register("head.norm_in", x)
                            if cfg.norm_saves_rstd:
                                hin, _ = H.produce(("head.in", "head.final_norm.rstd"),
                                                   moe.rmsnorm_rstd, x, head.norm)
                            else:
                                hin = H.produce("head.in", moe.rmsnorm, x, head.norm)
                            logits = H.produce("head.logits", moe.logits, hin, head.out)
                            loss = moe.CrossEntropyFn.apply(logits, tgt, 1.0 / (M * cfg.dp))
                        del hin, logits
                        outs[mb] = loss
                        losses[mb] = loss.detach()
                    else:
                        outs[mb] = x
                        sends.append(dist.isend(moe.wire(x.detach()), dst=rank + ep))
                    del x, y
            else:
                if last:
                    outs.pop(mb).backward()
                else:
                    g = torch.empty(cfg.tokens, cfg.hidden)
                    dist.recv(g, src=rank + ep)
                    outs.pop(mb).backward(g.to(cfg.dtype))
                x = acts.pop(mb)
                if stage > 0:
                    sends.append(dist.isend(moe.wire(x.grad), dst=rank - ep))
                del x
                mgr.end_backward(mb)
        for s in sends:
            s.wait()
        mgr.check_empty()
        for p in replicated:
            gw = moe.wire(p.grad)
            dist.all_reduce(gw, group=group)
            p.grad.copy_(gw)
        step_loss = torch.zeros(1, dtype=torch.float64)
        if last:
            step_loss += float(sum(losses[m] for m in range(M)))
            dist.all_reduce(step_loss, group=group)
        if o.dump:
            dumps.append({"losses": [losses[m] for m in range(M)] if last else [],
                          "grads": [p.grad.clone() for p in params]})
        opt.step()
        opt.zero_grad(set_to_none=False)
        if o.dump:
            dumps[-1]["params"] = [p.detach().clone() for p in params]
        seconds = time.perf_counter() - t0
        # Every rank's counts, summed (peaks and loads: their maxima).
        keys = ("decisions", "kept", "recomputed", "offloaded", "over_budget", "load_beyond",
                "offloaded_bytes", "recomputed_bytes", "resident_checks", "router_offloads",
                "templated_restores", "group_fallback", "group_offloads")
        sums = torch.tensor([mgr.stats[k] - before[k] for k in keys], dtype=torch.float64)
        dist.all_reduce(sums)
        peaks = torch.zeros(world, dtype=torch.float64)
        peaks[rank] = mgr.peak_bytes
        dist.all_reduce(peaks)
        mx = torch.tensor([max_rows / balanced, seconds], dtype=torch.float64)
        dist.all_reduce(mx, op=dist.ReduceOp.MAX)
        mgr.peak_bytes = 0
        tokens = cfg.tokens * M * cfg.dp
        if step > 1:
            total_tokens += tokens
            t_all += mx[1].item()
        if log is not None:
            rec = {"step": step, "loss": step_loss.item(),
                   "loss_hex": float(step_loss.item()).hex(),
                   "peak_bytes": [int(v) for v in peaks.tolist()],
                   "max_load": round(mx[0].item(), 4)}
            rec.update({k: int(v) for k, v in zip(keys, sums.tolist())})
            rec["seconds"] = round(mx[1].item(), 4)
            rec["tokens_per_s"] = round(tokens / mx[1].item(), 1)
            log.write(json.dumps(rec) + "\n")
            log.flush()
        if rank == world - ep and not o.quiet:
            print("step %d loss %.4f max load %.2f  %.2fs" % (step, step_loss.item(),
                                                             mx[0].item(), mx[1].item()),
                  flush=True)
    if unit_log is not None:
        for e in mgr.log:
            unit_log.write(json.dumps({"step": e[0], "mb": e[1], "layer": e[2], "unit": e[3],
                                       "name": e[4], "rows": e[5], "bytes": e[6],
                                       "saved": e[7], "action": e[8]}) + "\n")
        unit_log.write(json.dumps({"extras": sorted(set(x[2:] + (x[1],)
                                                        for x in mgr.extras),
                                                    key=repr)}) + "\n")
        unit_log.close()
    if o.dump:
        os.makedirs(o.dump, exist_ok=True)
        torch.save(dumps, os.path.join(o.dump, "rank%d.pt" % rank))
    if log is not None:
        log.close()
        os.replace(o.log + ".tmp", o.log)
    if rank == world - ep and not o.quiet and total_tokens:
        print("tokens/s %.1f (policy %s, steps 2-%d)" % (total_tokens / t_all, o.policy,
                                                         o.steps), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    rt.close()


def entry(rank, o, port, world):
    import kiln.torch
    try:
        worker(rank, o, port, world)
    except kiln.torch.OutOfMemory as e:
        sys.stderr.write("examples/torch: rank %d: %s\n" % (rank, e))
        sys.stderr.flush()
        os._exit(EXIT_OOM)
    except SystemExit as e:
        sys.stderr.write("%s\n" % e)
        sys.stderr.flush()
        os._exit(EXIT_INPUT)


def adopt_plan(path, cfg):
    """Reads the plan at path; cfg takes its memory options from the units
    (Config.adopt). Returns None when the plan plans this model (its layers
    on our stages, each with the units this model makes at their bytes),
    else what is wrong."""
    import kiln.runtime
    try:
        rt = kiln.runtime.Runtime(path)
    except kiln.runtime.KilnError as e:
        return "%s: %s" % (path, e)
    with rt:
        if rt.info.n_model_layers != cfg.layers or rt.info.n_stages != cfg.pp:
            return ("%s was not compiled from this model: %d layers on %d stages, the model "
                    "has %d on %d" % (path, rt.info.n_model_layers, rt.info.n_stages,
                                      cfg.layers, cfg.pp))
        try:
            names = rt.unit_names(0)
            perm = rt.unit(0, "moe.perm_idx").per_row_bytes if "moe.perm_idx" in names else 0
            cfg.adopt(names, perm)
        except (ValueError, KeyError) as e:
            return "%s: %s" % (path, e)
        want = cfg.units()
        for l in range(cfg.layers):
            li = rt.layer(l)
            names = set(rt.unit_names(l))
            if li.stage != l // cfg.stage_layers or names != set(want):
                return ("%s was not compiled from this model: layer %d is on stage %d with "
                        "units %s" % (path, l, li.stage, ", ".join(rt.unit_names(l))))
            for u in rt.units(l):
                if (u.base_bytes, u.per_row_bytes) != want[u.name]:
                    return ("%s was not compiled from this model: layer %d unit %s has %d + "
                            "%d per row bytes, the model %d + %d" % (
                                path, l, u.name, u.base_bytes, u.per_row_bytes,
                                *want[u.name]))
    return None


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None):
    o = options(sys.argv[1:] if argv is None else argv)
    try:
        desc = load_yaml(o.model)
        sys.path.insert(0, HERE)
        import moe
        cfg = moe.Config(desc)
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.stderr.write("examples/torch: %s: %s\n" % (o.model, e))
        return EXIT_INPUT
    for path in (o.plan, o.data):
        if not os.path.isfile(path):
            sys.stderr.write("examples/torch: %s: no such file\n" % path)
            return EXIT_INPUT
    problem = adopt_plan(o.plan, cfg)
    if problem:
        sys.stderr.write("examples/torch: %s\n" % problem)
        return EXIT_INPUT
    world = cfg.devices
    if world != cfg.pp * cfg.ep:
        sys.stderr.write("examples/torch: %s: devices must equal pp x ep\n" % o.model)
        return EXIT_INPUT
    import torch.multiprocessing as mp
    port = o.port or free_port()
    ctx = mp.start_processes(entry, args=(o, port, world), nprocs=world, join=False,
                             start_method="spawn")
    try:
        while not ctx.join():
            pass
    except mp.ProcessExitedException as e:
        return e.exit_code if e.exit_code and e.exit_code > 0 else EXIT_INPUT
    except mp.ProcessRaisedException as e:
        sys.stderr.write("examples/torch: %s\n" % e)
        return EXIT_INPUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
