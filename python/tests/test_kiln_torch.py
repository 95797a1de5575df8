"""kiln.torch's saved-tensor manager in one process (docs/torch.md, "What
the manager does"): one MoE layer of examples/torch with one EP rank, no
collectives, under keep, mixed and a budget; and bench/gpu/torch_check.py's
CPU path."""

import os
import re
import subprocess
import sys
import types

import pytest

torch = pytest.importorskip("torch")

from conftest import ROOT  # noqa: E402

import kiln.torch  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "examples", "torch"))
import moe  # noqa: E402


def config(options=None):
    # examples/torch/model.yaml's shapes with one EP rank (8 local experts);
    # options: issue 15's memory options, stated.
    o = dict(options or {})
    moe_keys = {"experts": 8, "top_k": 2, "expert_ffn_hidden": 128}
    if "prob_apply" in o:
        moe_keys["prob_apply"] = o.pop("prob_apply")
    par = {"devices": 1, "pp": 1, "ep": 1}
    if "moe_permute_fusion" in o:
        par["moe_permute_fusion"] = o.pop("moe_permute_fusion")
    desc = {"model": dict({"layers": 1, "hidden": 64, "heads": 4, "kv_heads": 2, "vocab": 256,
                           "seq_len": 64, "moe": moe_keys}, **o),
            "training": {"micro_batch": 2, "global_batch": 2, "dtype": "fp32"},
            "parallel": par}
    return moe.Config(desc)


# Every memory option away from the default of a kilnc without them.
ISSUE15 = {"fused_qkv": True, "norm_saves_rstd": True, "prob_apply": "activation",
           "moe_permute_fusion": False}


def one_step(mgr, spikes=(), options=None):
    """Forward and backward of the layer for one micro-batch; returns the
    loss, every gradient and the layer scope."""
    cfg = config(options)
    torch.manual_seed(0)
    mod = moe.Layer(cfg, 0, 0, 1)
    x = torch.randn(cfg.tokens, cfg.hidden, generator=torch.Generator().manual_seed(3))
    x.requires_grad_(True)
    if mgr is None:
        class Plain:
            rows = 0

            def produce(self, name, fn, *src, rng=False, router=False, collective=False):
                return fn(*src)

            def register(self, name, t):
                return t

            def decide(self, *a, **k):
                return None
        y = moe.layer_forward(cfg, Plain(), mod, x, None, list(spikes), 5, 0, 0)
        L = None
    else:
        mgr.watch_parameters(mod)
        with mgr.microbatch(0):
            with mgr.layer(0, x) as L:
                y = moe.layer_forward(cfg, L, mod, x, None, list(spikes), 5, 0, 0)
                mgr.output(y)
    loss = (y * y).mean()
    loss.backward()
    if mgr is not None:
        mgr.end_backward(0)
        mgr.check_empty()
    return loss.detach(), [p.grad for p in mod.parameters()] + [x.grad], L


UNIT_BYTES = {  # fp32, T = 128 tokens, h = 64, 4 heads and 2 KV heads of 16,
    # E = 8 experts of 128, N = 256 rows (every row is local with one rank):
    # docs/cost-model.md "Activations" worked by hand.
    "ln1.in": 4 * 128 * 64, "attn.qkv_in": 4 * 128 * 64, "attn.q": 4 * 128 * 64,
    "attn.k": 4 * 128 * 32, "attn.v": 4 * 128 * 32, "attn.out": 4 * 128 * 64,
    "attn.lse": 4 * 4 * 128, "ln2.in": 4 * 128 * 64, "moe.in": 4 * 128 * 64,
    "moe.probs": 4 * 128 * 8, "moe.perm_idx": 4 * 256, "moe.expert_in": 4 * 256 * 64,
    "moe.expert_up": 4 * 256 * 256, "moe.expert_act": 4 * 256 * 128,
    "moe.expert_out": 4 * 256 * 64}


def test_keep_sees_every_unit_at_its_bytes():
    mgr = kiln.torch.Manager(None, policy="keep", record=True)
    loss, grads, L = one_step(mgr)
    seen = {e[4]: (e[6], e[7]) for e in mgr.log}
    assert set(seen) == set(UNIT_BYTES)
    for name, want in UNIT_BYTES.items():
        assert seen[name] == (want, True), name
    assert {n: base + per_row * 256 for n, (base, per_row) in
            config().units().items()} == UNIT_BYTES
    # keep-everything's peak is every unit plus nothing else counted.
    assert mgr.peak_bytes == sum(UNIT_BYTES.values())
    plain_loss, plain_grads, _ = one_step(None)
    assert torch.equal(loss, plain_loss)
    assert all(torch.equal(a, b) for a, b in zip(grads, plain_grads))


@pytest.mark.parametrize("step", [0, 1, 2])
def test_mixed_is_bitwise_the_plain_layer(step):
    """Each step shifts mixed's cycle, so over three steps every unit is
    kept, offloaded and (where it has a recipe) recomputed once."""
    mgr = kiln.torch.Manager(None, policy="mixed")
    mgr.step = step
    loss, grads, _ = one_step(mgr, spikes=[(0.5, [1])])
    plain_loss, plain_grads, _ = one_step(None, spikes=[(0.5, [1])])
    assert torch.equal(loss, plain_loss)
    assert all(torch.equal(a, b) for a, b in zip(grads, plain_grads))
    assert mgr.stats["offloaded"] > 0
    assert mgr.stats["recomputed"] > 0 or step == 2


def test_the_routers_output_is_never_recomputed():
    mgr = kiln.torch.Manager(None, policy="mixed", record=True)
    for step in range(3):
        mgr.step = step
        one_step(mgr)
    acts = {e[8] for e in mgr.log if e[4] == "moe.probs"}
    assert kiln.torch.RECOMPUTE not in acts and kiln.torch.OFFLOAD in acts
    # The layer input has no recipe either. The dispatch's output has one
    # that re-runs the dispatch (produce(collective=True)), which mixed uses
    # (its actions are the same on every rank), and the recompute is
    # bitwise (test_mixed_is_bitwise_the_plain_layer).
    assert kiln.torch.RECOMPUTE not in {e[8] for e in mgr.log if e[4] == "ln1.in"}
    assert kiln.torch.RECOMPUTE in {e[8] for e in mgr.log if e[4] == "moe.expert_in"}


def test_a_collective_is_recomputed_only_under_the_group_fallback():
    """A plan may recompute a collective's output only when the whole EP
    group takes it alike: the group's fallback. Any other plan asking for it
    is refused, as one rank alone would run the collective."""
    mgr = kiln.torch.Manager(None, policy="mixed")
    mgr.policy = "kiln"  # _action as under kiln, with the plans below
    u = types.SimpleNamespace(fixed=False, router=False, collective=True, recipe=object(),
                              index=0, name="moe.expert_in")
    for fallback, want in ((True, kiln.torch.RECOMPUTE), (False, None)):
        plan = types.SimpleNamespace(action_codes=(kiln.torch.RECOMPUTE,),
                                     group_fallback=fallback, plan=7)
        L = types.SimpleNamespace(plan=plan, layer=3, mb=0)
        if want is None:
            with pytest.raises(RuntimeError, match="moe.expert_in at layer 3, a collective"):
                mgr._action(L, u, 0)
        else:
            assert mgr._action(L, u, 0) == want


def test_over_the_budget_is_an_out_of_memory_error_naming_the_unit():
    # Room for every unit up to moe.expert_in, not for moe.expert_up.
    order = list(UNIT_BYTES)
    room = sum(UNIT_BYTES[n] for n in order[:order.index("moe.expert_up")])
    mgr = kiln.torch.Manager(None, policy="keep", budget_bytes=room + 1)
    with pytest.raises(kiln.torch.OutOfMemory) as e:
        one_step(mgr)
    assert e.value.unit == "moe.expert_up"
    assert e.value.need_bytes == UNIT_BYTES["moe.expert_up"]
    assert e.value.held_bytes == room and e.value.budget_bytes == room + 1
    assert "micro-batch 0 layer 0 moe.expert_up needs 262144 bytes" in str(e.value)
    assert isinstance(e.value, RuntimeError)


def test_views_and_aliases_count_once():
    """A unit saved through a view (q as [b, s, nh, d] inside the attention,
    slices of expert_in per expert) is bound to its unit, not listed as an
    extra; what is listed is only the documented rest."""
    mgr = kiln.torch.Manager(None, policy="keep")
    one_step(mgr)
    kinds = sorted({(x[3], len(x[2])) for x in mgr.extras})
    # The dispatch's row map (int64 [2, T*k]) and the per-row gate weights.
    assert kinds == [("torch.float32", 1), ("torch.int64", 2)], kinds


def test_policy_kiln_needs_a_runtime():
    with pytest.raises(ValueError):
        kiln.torch.Manager(None, policy="kiln")
    with pytest.raises(ValueError):
        kiln.torch.Manager(None, policy="fastest")


def test_the_gpu_check_runs_on_the_cpu():
    """bench/gpu/torch_check.sh --dry: the GPU script's code at tiny shapes."""
    r = subprocess.run(["sh", os.path.join(ROOT, "bench", "gpu", "torch_check.sh"),
                        os.environ["KILN_BUILD"], "--dry"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    m = re.search(r"kiln_rt_unit_bytes for (\d+) of (\d+) units", r.stdout)
    assert m and m.group(1) == m.group(2) and int(m.group(1)) >= 13, r.stdout
    assert "bitwise: losses and every gradient of keep and kiln EQUAL" in r.stdout


def dropout_grad(policy, rng):
    torch.manual_seed(11)
    x = torch.randn(4096, generator=torch.Generator().manual_seed(2)).requires_grad_(True)
    m = kiln.torch.Manager(None, policy=policy)
    with m.microbatch(0):
        with m.layer(0, x) as L:
            # mixed at step 0: unit 1 ("drop") is recomputed, unit 2 offloaded.
            d = L.produce("drop", torch.nn.functional.dropout, x, 0.5, True, rng=rng)
            y = L.produce("sin", torch.sin, d)
            z = (y * y).sum()
            m.output(z)
    torch.rand(100)  # the RNG moves on before the backward, as in training
    z.backward()
    m.end_backward(0)
    m.check_empty()
    return x.grad, m.stats["recomputed"]


def test_a_recompute_replays_the_rng_state():
    keep, _ = dropout_grad("keep", True)
    mixed, n = dropout_grad("mixed", True)
    assert n == 1 and torch.equal(keep, mixed)
    # Without the replay the recompute draws another dropout mask.
    other, n = dropout_grad("mixed", False)
    assert n == 1 and not torch.equal(keep, other)


def test_issue15_options_see_their_units_and_stay_bitwise():
    """fused_qkv, norm_saves_rstd, prob_apply: activation and an int64 row
    map: the units the cost model names for them (docs/model-format.md
    "Memory options"), at hand-worked bytes; mixed bitwise the plain layer."""
    mgr = kiln.torch.Manager(None, policy="keep", record=True)
    loss, grads, _ = one_step(mgr, options=ISSUE15)
    seen = {e[4]: (e[6], e[7]) for e in mgr.log}
    want = dict(UNIT_BYTES)
    for name in ("attn.q", "attn.k", "attn.v", "moe.expert_out"):
        del want[name]
    want.update({"attn.qkv": 4 * 128 * (64 + 2 * 32),  # q, k, v side by side
                 "ln1.rstd": 4 * 128, "ln2.rstd": 4 * 128,  # fp32 per row
                 "moe.expert_probs": 4 * 256,  # fp32 per received row
                 "moe.perm_idx": 8 * 256})  # int64
    assert seen == {n: (b, True) for n, b in want.items()}
    # Config.units, the startup check's formulas, at these 256 rows.
    assert {n: base + per_row * 256 for n, (base, per_row) in
            config(ISSUE15).units().items()} == want
    # The per-row weights are a unit now, so only the row map is an extra.
    assert sorted({(x[3], len(x[2])) for x in mgr.extras}) == [("torch.int64", 2)]
    plain_loss, plain_grads, _ = one_step(None, options=ISSUE15)
    assert torch.equal(loss, plain_loss)
    for step in range(3):
        m = kiln.torch.Manager(None, policy="mixed")
        m.step = step
        l2, g2, _ = one_step(m, spikes=[(0.5, [1])], options=ISSUE15)
        pl, pg, _ = one_step(None, spikes=[(0.5, [1])], options=ISSUE15)
        assert torch.equal(l2, pl) and all(torch.equal(a, b) for a, b in zip(g2, pg)), step


def test_a_plan_with_other_options_than_stated_is_refused():
    cfg = config({"fused_qkv": False})
    with pytest.raises(ValueError, match="fused_qkv"):
        cfg.adopt(["attn.qkv", "moe.expert_out"], 4)
    with pytest.raises(ValueError, match="combine"):
        config().adopt(["attn.q", "moe.perm_idx"], 4)
