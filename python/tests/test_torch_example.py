"""examples/torch under kiln.torch (docs/torch.md "What the tests check"):
the 4-process PyTorch MoE trainer (gloo, 2 pipeline stages x 2 EP ranks,
1F1B) is bitwise identical under kiln in a budget that keep-everything
overflows and under keep-everything in a large one; keep-everything in that
budget fails with the out-of-memory error naming the unit; the bytes the
saved-tensor hooks see per unit are kiln_rt_unit_bytes at the real rows;
what else PyTorch saves is the documented list."""

import json
import os
import subprocess

import pytest

torch = pytest.importorskip("torch")

from conftest import ROOT, kilnc  # noqa: E402

import kiln.runtime  # noqa: E402

EXAMPLE = os.path.join(ROOT, "examples", "torch")
TRAIN = os.path.join(EXAMPLE, "train.py")
STEPS = 20
# 5 spike steps: 4 and 11 send every row of a stage to EP rank 0 (experts 0
# and 1 both live there: load 2x, the model's load.max_factor), 7 and 15 half
# the tokens to expert 5 (rank 1), 18 a quarter to expert 2.
SPIKES = ["--spike", "4,11:1.0:0+1", "--spike", "7,15:0.5:5", "--spike", "18:0.25:2"]
UNITS = ("ln1.in", "attn.qkv_in", "attn.q", "attn.k", "attn.v", "attn.out", "attn.lse",
         "ln2.in", "moe.in", "moe.probs", "moe.perm_idx", "moe.expert_in", "moe.expert_up",
         "moe.expert_act", "moe.expert_out")


def run(*args, timeout=240):
    env = dict(os.environ)
    return subprocess.run(["/usr/bin/python3", TRAIN, *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("torchplan") / "torch.kiln")
    r = kilnc("compile", os.path.join(EXAMPLE, "model.yaml"), "-o", out)
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module")
def runs(plan, tmp_path_factory):
    """keep-everything in 1 GiB and kiln in the plan's budget, same steps and
    spikes; each with its step log and tensor dump (kiln's with unit logs)."""
    d = tmp_path_factory.mktemp("torchruns")
    out = {}
    for name, extra in (("keep", ["--policy", "keep", "--budget", "1G"]),
                        ("kiln", ["--policy", "kiln", "--unit-log", str(d / "units")])):
        r = run("--plan", plan, "--steps", str(STEPS), *SPIKES, *extra, "--quiet",
                "--log", str(d / (name + ".log")), "--dump", str(d / name))
        assert r.returncode == 0, "%s run: %s" % (name, r.stderr[-3000:])
        with open(d / (name + ".log")) as f:
            log = [json.loads(line) for line in f]
        dumps = [torch.load(str(d / name / ("rank%d.pt" % k))) for k in range(4)]
        out[name] = (log, dumps)
    out["dir"] = d
    return out


def budget_of(plan):
    """The default budget: each stage's capacity minus its static bytes."""
    with kiln.runtime.Runtime(plan) as rt:
        return [rt.stage(s).capacity_bytes - rt.stage(s).static_bytes for s in range(2)]


def test_kiln_in_budget_is_bitwise_keep_in_a_large_one(runs, plan):
    keep_log, keep = runs["keep"]
    kiln_log, kl = runs["kiln"]
    assert len(keep_log) == len(kiln_log) == STEPS
    compared = 0
    for rank in range(4):
        assert len(keep[rank]) == len(kl[rank]) == STEPS
        for step in range(STEPS):
            a, b = keep[rank][step], kl[rank][step]
            for what in ("losses", "grads", "params"):
                assert len(a[what]) == len(b[what])
                for i, (x, y) in enumerate(zip(a[what], b[what])):
                    assert torch.equal(x, y), "rank %d step %d %s[%d] differ" % (
                        rank, step + 1, what, i)
                    compared += 1
    # The last stage's ranks each log 4 losses a step; every rank its grads
    # and parameters (2 layers x 9 tensors, or 7 with fused_qkv, plus the
    # embedding or the head): at least 15 of each per rank and step.
    assert compared >= 4 * STEPS * 2 * 15
    for k, s in zip(keep_log, kiln_log):
        assert k["loss_hex"] == s["loss_hex"], k["step"]
    # keep-everything overflowed kiln's budget: its peak on some rank is
    # above what that rank's stage may hold.
    budget = budget_of(plan)
    assert max(max(p - budget[r // 2] for r, p in enumerate(k["peak_bytes"]))
               for k in keep_log) > 0
    # kiln held within the budget, did something, and saw the 2x spikes.
    for s in kiln_log:
        assert all(p <= budget[r // 2] for r, p in enumerate(s["peak_bytes"])), s
        assert s["over_budget"] == 0 and s["load_beyond"] == 0, s
        # 4 micro-batches x 2 layers x 4 ranks decisions, each checked.
        assert s["resident_checks"] == s["decisions"] == 32, s
    # kiln moved something off the device (which action is the cost model's
    # choice: offload here, with recompute besides under the model without
    # issue 15's options; mixed, below, drives every recompute path).
    assert sum(s["offloaded"] for s in kiln_log) > 0
    # Reloads followed the plans' templates.
    assert sum(s["templated_restores"] for s in kiln_log) > 0
    assert kiln_log[3]["max_load"] == 2.0 and kiln_log[10]["max_load"] == 2.0
    assert kiln_log[0]["loss"] - kiln_log[-1]["loss"] > 1.0


def test_keep_in_the_budget_runs_out_of_memory_naming_the_unit(plan):
    r = run("--plan", plan, "--steps", str(STEPS), *SPIKES, "--policy", "keep", "--quiet")
    assert r.returncode == 3, r.stderr[-3000:]
    # The first spike (step 4) is where it fails, at an expert unit, whose
    # bytes grow with the rows (the same unit and bytes as the C trainer's
    # arena reports, docs/trainer.md "The arena").
    line = [x for x in r.stderr.splitlines() if "out of memory" in x]
    assert line, r.stderr[-3000:]
    assert "out of memory: step 4 " in line[0], line[0]
    assert "policy keep" in line[0]
    assert any(" %s needs " % u in line[0] for u in UNITS if u.startswith("moe.expert")), line


def test_mixed_drives_every_path_bitwise(runs, plan):
    """mixed cycles keep, recompute and offload over every unit: each reload
    and recompute path, equal to keep-everything's first steps."""
    d = runs["dir"]
    r = run("--plan", plan, "--steps", "5", *SPIKES, "--policy", "mixed", "--budget", "1G",
            "--quiet", "--dump", str(d / "mixed"))
    assert r.returncode == 0, r.stderr[-3000:]
    keep = runs["keep"][1]
    for rank in range(4):
        mixed = torch.load(str(d / "mixed" / ("rank%d.pt" % rank)))
        for step in range(5):
            for what in ("losses", "grads", "params"):
                for i, (x, y) in enumerate(zip(keep[rank][step][what], mixed[step][what])):
                    assert torch.equal(x, y), (rank, step + 1, what, i)


def unit_logs(d):
    units, extras = [], []
    for rank in range(4):
        with open(d / ("units.%d" % rank)) as f:
            for line in f:
                rec = json.loads(line)
                if "extras" in rec:
                    extras += [tuple(x) + (rank,) for x in rec["extras"]]
                else:
                    rec["rank"] = rank
                    units.append(rec)
    return units, extras


def test_past_the_declared_load_the_group_takes_the_group_plan(tmp_path):
    """Compiled at load.max_factor 1, every load above balanced is past the
    declared load. At step 4's spike (every row of a stage, 512, to EP rank
    0) the group's counts (all-gathered before the dispatch) make both ranks
    of a stage take the group's plan (Runtime.group; docs/runtime.md,
    "Beyond the declared load") alike, unit for unit, at each layer whose
    fit_rows is below 512, also on the rank that received no rows. On every
    step the two ranks re-run the dispatch (recompute moe.expert_in)
    together or not at all. The steps stay bit for bit those of keeping
    everything."""
    with open(os.path.join(EXAMPLE, "model.yaml")) as f:
        text = f.read()
    assert text.count("max_factor: 2.0") == 1
    model = tmp_path / "model.yaml"
    model.write_text(text.replace("max_factor: 2.0", "max_factor: 1.0"))
    plan1 = str(tmp_path / "m1.kiln")
    r = kilnc("compile", str(model), "-o", plan1)
    assert r.returncode == 0, r.stderr
    spike = ["--spike", "4:1.0:0+1"]
    dumps = {}
    for name, extra in (("keep", ["--policy", "keep", "--budget", "1G"]),
                        ("kiln", ["--policy", "kiln", "--unit-log", str(tmp_path / "units")])):
        r = run("--plan", plan1, "--model", str(model), "--steps", "5", *spike, *extra,
                "--quiet", "--log", str(tmp_path / (name + ".log")),
                "--dump", str(tmp_path / name))
        assert r.returncode == 0, "%s run: %s" % (name, r.stderr[-3000:])
        dumps[name] = [torch.load(str(tmp_path / name / ("rank%d.pt" % k))) for k in range(4)]
    for rank in range(4):
        for step in range(5):
            for what in ("losses", "grads", "params"):
                for i, (x, y) in enumerate(zip(dumps["keep"][rank][step][what],
                                               dumps["kiln"][rank][step][what])):
                    assert torch.equal(x, y), (rank, step + 1, what, i)
    with open(tmp_path / "kiln.log") as f:
        log = [json.loads(line) for line in f]
    with kiln.runtime.Runtime(plan1) as rt:
        falls = {layer for layer in range(4) if rt.group(layer).fit_rows < 512}
        group_acts = {layer: rt.plan(rt.group(layer).plan)[0] for layer in falls}
        index = {(layer, name): rt.unit_index(layer, name) for layer in falls
                 for name in rt.unit_names(layer)}
    assert falls, "no layer takes the group's plan at 512 rows: the test shows nothing"
    # 4 micro-batches x 2 EP ranks decisions per falling layer at step 4.
    assert log[3]["max_load"] == 2.0 and log[3]["group_fallback"] == 8 * len(falls), log[3]
    assert all(s["group_offloads"] == 0 for s in log), log
    units, _ = unit_logs(tmp_path)
    ein, taken = {}, 0
    for u in units:
        if u["name"] == "moe.expert_in":
            ein[(u["step"], u["mb"], u["layer"], u["rank"])] = (u["action"], u["rows"])
        if u["step"] == 4 and u["layer"] in falls:
            want = group_acts[u["layer"]][index[(u["layer"], u["name"])]]
            assert u["action"] == want, u
            taken += 1
    assert taken > 0
    assert len(ein) == 5 * 4 * 2 * 4
    for (step, mb, layer, rank), (action, rows) in ein.items():
        # The two EP ranks of a stage (2s and 2s + 1) re-run the dispatch
        # together or not at all (only the group's plan may recompute
        # expert_in; otherwise each rank's plan follows its own rows).
        other = ein[(step, mb, layer, rank ^ 1)][0]
        assert (action == kiln.runtime.RECOMPUTE) == (other == kiln.runtime.RECOMPUTE), (
            step, mb, layer, rank)
        if step == 4 and layer in falls:
            assert rows == (512 if rank % 2 == 0 else 0), (mb, layer, rank, rows)


def test_bytes_the_hooks_see_are_kiln_unit_bytes(runs, plan):
    units, _ = unit_logs(runs["dir"])
    # 20 steps x 4 micro-batches x 2 layers x every unit on each of 4 ranks.
    n_units = len({u["name"] for u in units})
    assert len(units) == STEPS * 4 * 2 * n_units * 4
    T, h, E, f, nh, nkv, d = 128, 64, 8, 128, 4, 2, 16
    names = {u["name"] for u in units}
    # The row map's width is a memory option (int32 with a fused
    # permutation, int64 without, issue 15); the plan says which.
    with kiln.runtime.Runtime(plan) as rt:
        perm_width = rt.unit(0, "moe.perm_idx").per_row_bytes
    assert perm_width in (4, 8)
    # Hand-worked bytes (fp32, docs/cost-model.md "Activations"), an
    # independent source beside kiln_rt_unit_bytes; the units of every
    # memory option this model builds.
    hand = {"ln1.in": lambda n: 4 * T * h, "attn.qkv_in": lambda n: 4 * T * h,
            "attn.q": lambda n: 4 * T * nh * d, "attn.k": lambda n: 4 * T * nkv * d,
            "attn.v": lambda n: 4 * T * nkv * d, "attn.qkv": lambda n: 4 * T * (nh + 2 * nkv) * d,
            "ln1.rstd": lambda n: 4 * T, "ln2.rstd": lambda n: 4 * T,
            "attn.out": lambda n: 4 * T * nh * d,
            "attn.lse": lambda n: 4 * nh * T, "ln2.in": lambda n: 4 * T * h,
            "moe.in": lambda n: 4 * T * h, "moe.probs": lambda n: 4 * T * E,
            "moe.perm_idx": lambda n: perm_width * n, "moe.expert_in": lambda n: 4 * n * h,
            "moe.expert_probs": lambda n: 4 * n,
            "moe.expert_up": lambda n: 4 * n * 2 * f, "moe.expert_act": lambda n: 4 * n * f,
            "moe.expert_out": lambda n: 4 * n * h}
    assert names <= set(hand), names
    rows_by = {}
    with kiln.runtime.Runtime(plan) as rt:
        for u in units:
            want = rt.unit_bytes(u["layer"], u["name"], u["rows"])
            assert u["bytes"] == want == hand[u["name"]](u["rows"]), u
            # Every unit with bytes was saved by some op (so the hooks saw it).
            assert u["saved"] or u["bytes"] == 0, u
            rows_by[(u["step"], u["mb"], u["layer"], u["rank"] // 2)] = \
                rows_by.get((u["step"], u["mb"], u["layer"], u["rank"] // 2), 0) + \
                (u["rows"] if u["name"] == "ln1.in" else 0)
    # The two EP ranks of a stage together receive every routed row: 2
    # replicas x 128 tokens x top-2.
    assert set(rows_by.values()) == {512}


def test_what_else_pytorch_saves_is_the_documented_list(runs):
    """Saved tensors that are no unit and no parameter (docs/torch.md,
    "What else PyTorch saves"): in each layer the dispatch's row map (int64
    [2, T*k]: token and probability index per sent row) and, with prob_apply:
    expert_output, the per-row gate weights on the expert side (fp32 [N]);
    the embedding's token ids (int64 [T]) on stage 0; the loss's targets
    (int64 [T]) on the last stage."""
    units, extras = unit_logs(runs["dir"])
    # With prob_apply: activation the per-row weights are a unit
    # (moe.expert_probs), not an extra.
    expert_output = any(u["name"] == "moe.expert_out" for u in units)
    kinds = set()
    for shape, dtype, nbytes, fn, layer, rank in extras:
        if isinstance(layer, int):
            if dtype == "torch.int64":
                assert shape == [2, 256] and nbytes == 2 * 256 * 8, (shape, dtype)
                kinds.add("route")
            else:
                assert dtype == "torch.float32" and len(shape) == 1
                assert nbytes == 4 * shape[0]
                kinds.add("row_weights")
        else:
            assert dtype == "torch.int64" and shape == [128] and nbytes == 128 * 8, shape
            assert (layer, rank // 2) in (("embed", 0), ("head", 1)), (layer, rank)
            kinds.add(layer)
    assert kinds == {"route", "embed", "head"} | ({"row_weights"} if expert_output else set())


@pytest.mark.parametrize("args,status,text", [
    (["--policy", "fastest"], 2, "invalid choice"),
    (["--spike", "4:1.5:0"], 2, "fraction must lie in [0, 1]"),
    (["--budget", "0"], 2, "from 1 byte"),
    (["--data", "/nonexistent/text"], 1, "no such file"),
])
def test_bad_arguments(plan, args, status, text):
    r = run("--plan", plan, *args, timeout=60)
    assert r.returncode == status, r.stderr
    assert text in r.stderr


def test_another_models_plan_is_refused(tiny_blob):
    r = run("--plan", tiny_blob, timeout=60)
    assert r.returncode == 1
    assert "was not compiled from this model" in r.stderr


def test_from_a_hugging_face_config_to_a_trained_step(tmp_path):
    """The README's path: examples/torch/config.json (a tiny Mixtral) through
    kilnc import hf and compile, then examples/torch trains on it with kiln
    deciding (bf16: the import's dtype; gloo carries it as fp32)."""
    yml, blob, log = tmp_path / "m.yaml", tmp_path / "m.kiln", tmp_path / "m.log"
    r = kilnc("import", "hf", os.path.join(EXAMPLE, "config.json"), "--devices", "4", "--pp",
              "2", "--ep", "2", "--micro-batch", "2", "--global-batch", "16", "--seq-len", "64",
              "--hardware", os.path.join(EXAMPLE, "cpu-arena.yaml"), "-o", str(yml))
    assert r.returncode == 0, r.stderr
    r = kilnc("compile", str(yml), "-o", str(blob))
    assert r.returncode == 0, r.stderr
    r = run("--model", str(yml), "--plan", str(blob), "--steps", "3", "--spike", "2:1.0:0+1",
            "--quiet", "--log", str(log))
    assert r.returncode == 0, r.stderr[-3000:]
    with open(log) as f:
        recs = [json.loads(line) for line in f]
    assert len(recs) == 3 and recs[1]["max_load"] == 2.0
    assert all(x["decisions"] == 32 and x["over_budget"] == 0 for x in recs)
    assert recs[-1]["loss"] < recs[0]["loss"]
