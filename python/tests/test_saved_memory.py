"""kiln's saved-activation bytes against what PyTorch's autograd really saves.

For each supported combination of model.moe.prob_apply, model.fused_qkv and
model.attention (eager, or a flash-like autograd Function saving what
FlashAttention saves: q, k, v, the output and the log-sum-exp), this builds
in PyTorch one dense layer and one MoE layer of one device (expert parallel
2, so that a 2x routing spike can reach it), records every tensor autograd
saves for backward with torch.autograd.graph.saved_tensors_hooks
(deduplicated by storage, parameters excluded), and checks that the bytes per
layer equal the unit bytes kiln's runtime reads from the compiled blob
(kiln_rt_unit_bytes at the same rows) within 1%, at balanced load and at a
2x spike.

Where Megatron-Core runs a fused kernel (TE's RMSNorm, the fused SwiGLU and
weighted SwiGLU, the fused causal softmax, FlashAttention), the layer here
uses an autograd Function that saves what that kernel saves; everything else
is plain PyTorch whose autograd decides what is saved. docs/cost-model.md,
"Checked against PyTorch", lists every tensor PyTorch saves that kiln does
not count (and the reverse), with the reason: small ones (the router's
routing mask; the received rows' probabilities with expert_output) that the
1% tolerance covers, and none large.

The environment comes from `make test-python`: KILN_BUILD (the build
directory with kilnc) and KILN_RT_LIBRARY (libkiln_rt.so)."""

import ctypes
import math
import os
import subprocess
import tempfile

import pytest
import torch
import torch.nn.functional as F

# One device's layer: tp 1, micro-batch 1 (so that per-head views of the
# fused QKV output stay views), ep 2 with 4 of 8 experts local, top-2.
S = 64  # tokens (seq_len, micro_batch 1)
H = 128  # hidden
NH = 4  # heads
D = 32  # head_dim
F_DENSE = 256  # dense FFN width
E = 8  # experts
EP = 2
LE = E // EP  # local experts
K = 2  # top_k
FE = 64  # expert FFN width
DT = torch.bfloat16
N_BAL = S * K  # rows reaching this device at load factor 1 (Tr * k)


# ---------------------------------------------------------------- kiln side


class UnitInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("flags", ctypes.c_uint32),
        ("base_bytes", ctypes.c_uint64),
        ("per_row_bytes", ctypes.c_uint64),
    ]


class LayerInfo(ctypes.Structure):
    _fields_ = [
        ("model_layer", ctypes.c_int32),
        ("stage", ctypes.c_int32),
        ("position", ctypes.c_int32),
        ("moe", ctypes.c_int),
        ("n_units", ctypes.c_int32),
        ("balanced_rows", ctypes.c_uint64),
        ("tail_floor_bytes", ctypes.c_uint64),
        ("head_steady_bytes", ctypes.c_uint64),
        ("steady_bytes", ctypes.c_uint64),
        ("steady_keep_bytes", ctypes.c_uint64),
    ]


def runtime():
    lib = ctypes.CDLL(os.environ["KILN_RT_LIBRARY"])
    lib.kiln_rt_open_file.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.kiln_rt_close.argtypes = [ctypes.c_void_p]
    lib.kiln_rt_layer_get.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.POINTER(LayerInfo)]
    lib.kiln_rt_unit_get.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int32,
        ctypes.c_int32,
        ctypes.POINTER(UnitInfo),
    ]
    lib.kiln_rt_unit_bytes.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_uint64]
    lib.kiln_rt_unit_bytes.restype = ctypes.c_uint64
    return lib


def description(prob_apply, fused_qkv, attention, rstd, fusion):
    kv_heads = 2 if attention == "flash" else NH  # eager: see EagerCore
    return f"""kiln: 1
name: saved-memory-check
model:
  layers: 2
  dense_layers: 1
  hidden: {H}
  ffn_hidden: {F_DENSE}
  heads: {NH}
  kv_heads: {kv_heads}
  head_dim: {D}
  vocab: 256
  seq_len: {S}
  attention: {attention}
  activation: swiglu
  fused_qkv: {str(fused_qkv).lower()}
  norm_saves_rstd: {str(rstd).lower()}
  moe:
    experts: {E}
    top_k: {K}
    expert_ffn_hidden: {FE}
    prob_apply: {prob_apply}
training:
  micro_batch: 1
  global_batch: 2
  dtype: bf16
parallel:
  devices: 2
  ep: {EP}
  moe_permute_fusion: {str(fusion).lower()}
hardware:
  name: roomy
  memory_gib: 80
  reserved_gib: 1
  peak_tflops: 1000
  gemm_efficiency: 0.5
  hbm_gbps: 3000
  h2d_gbps: 25
  d2h_gbps: 25
  host_memory_gib: 1024
  devices_per_node: 8
  intra_node_gbps: 400
  inter_node_gbps: 50
load:
  max_factor: 2.0
"""


def kiln_units(prob_apply, fused_qkv, attention, rstd, fusion):
    """{model layer: [(unit name, bytes at N_BAL rows, bytes at 2 N_BAL)]}, from
    the blob kilnc compiles, read through the runtime library."""
    lib = runtime()
    with tempfile.TemporaryDirectory() as d:
        yaml = os.path.join(d, "m.yaml")
        blob = os.path.join(d, "m.kiln")
        with open(yaml, "w") as f:
            f.write(description(prob_apply, fused_qkv, attention, rstd, fusion))
        kilnc = os.path.join(os.environ["KILN_BUILD"], "kilnc")
        run = subprocess.run([kilnc, "compile", yaml, "-o", blob], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        rt = ctypes.c_void_p()
        assert lib.kiln_rt_open_file(blob.encode(), ctypes.byref(rt)) == 0
        try:
            out = {}
            for layer in (0, 1):
                li = LayerInfo()
                assert lib.kiln_rt_layer_get(rt, layer, ctypes.byref(li)) == 0
                assert li.moe == (layer == 1)
                if li.moe:
                    assert li.balanced_rows == N_BAL
                units = []
                for u in range(li.n_units):
                    ui = UnitInfo()
                    assert lib.kiln_rt_unit_get(rt, layer, u, ctypes.byref(ui)) == 0
                    units.append(
                        (
                            ui.name.decode(),
                            lib.kiln_rt_unit_bytes(rt, layer, u, N_BAL),
                            lib.kiln_rt_unit_bytes(rt, layer, u, 2 * N_BAL),
                        )
                    )
                out[layer] = units
            return out
        finally:
            lib.kiln_rt_close(rt)


# ------------------------------------------------------------- PyTorch side
#
# Functions standing for fused kernels save exactly what the kernel saves.


class RMSNorm(torch.autograd.Function):
    """TE's RMSNorm: saves its input, its weight and the fp32 1/rms per row;
    without rstd (examples/trainer) it recomputes the statistic."""

    @staticmethod
    def forward(ctx, x, w, save_rstd):
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1) + 1e-6)
        ctx.save_rstd = save_rstd
        if save_rstd:
            ctx.save_for_backward(x, w, rstd)
        else:
            ctx.save_for_backward(x, w)
        return (xf * rstd[:, None]).to(x.dtype) * w

    @staticmethod
    def backward(ctx, g):
        if ctx.save_rstd:
            x, w, rstd = ctx.saved_tensors
        else:
            x, w = ctx.saved_tensors
            rstd = torch.rsqrt(x.float().pow(2).mean(-1) + 1e-6)
        xf, gf = x.float(), (g * w).float()
        n = xf * rstd[:, None]
        dx = rstd[:, None] * (gf - n * (gf * n).mean(-1, keepdim=True))
        return dx.to(x.dtype), (g.float() * n).sum(0).to(w.dtype), None


def swiglu_math(u):
    a, b = u.float().chunk(2, dim=-1)
    return F.silu(a) * b


class SwiGLU(torch.autograd.Function):
    """Megatron's fused SwiGLU (bias_swiglu_impl): saves its input."""

    @staticmethod
    def forward(ctx, u):
        ctx.save_for_backward(u)
        return swiglu_math(u).to(u.dtype)

    @staticmethod
    def backward(ctx, g):
        (u,) = ctx.saved_tensors
        with torch.enable_grad():
            uu = u.detach().requires_grad_()
            (du,) = torch.autograd.grad(swiglu_math(uu), uu, g.float())
        return du


class WeightedSwiGLU(torch.autograd.Function):
    """Megatron's WeightedSwiGLUFunction (fused_bias_swiglu.py:266-271): saves
    its input and the fp32 weights, one per row."""

    @staticmethod
    def forward(ctx, u, p):
        ctx.save_for_backward(u, p)
        return (swiglu_math(u) * p[:, None]).to(u.dtype)

    @staticmethod
    def backward(ctx, g):
        u, p = ctx.saved_tensors
        with torch.enable_grad():
            uu = u.detach().requires_grad_()
            pp = p.detach().requires_grad_()
            du, dp = torch.autograd.grad(swiglu_math(uu) * pp[:, None], (uu, pp), g.float())
        return du, dp


class FlashCore(torch.autograd.Function):
    """FlashAttention's interface: saves q, k, v, the output and the fp32
    log-sum-exp per head and token; nothing of size s*s."""

    @staticmethod
    def math(q, k, v):
        # q: (s, nh, d), k and v: (s, nkv, d) -> (s, nh, d) and lse (nh, s)
        g = q.shape[1] // k.shape[1]
        kk = k.float().repeat_interleave(g, dim=1).transpose(0, 1)
        vv = v.float().repeat_interleave(g, dim=1).transpose(0, 1)
        sc = q.float().transpose(0, 1) @ kk.transpose(1, 2) / math.sqrt(q.shape[-1])
        causal = torch.ones(q.shape[0], q.shape[0], dtype=torch.bool).triu(1)
        sc = sc.masked_fill(causal, float("-inf"))
        lse = torch.logsumexp(sc, dim=-1)
        o = (torch.exp(sc - lse[..., None]) @ vv).transpose(0, 1)
        return o, lse

    @staticmethod
    def forward(ctx, q, k, v):
        o, lse = FlashCore.math(q, k, v)
        out = o.to(q.dtype).contiguous()
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, g):
        q, k, v, out, lse = ctx.saved_tensors
        with torch.enable_grad():
            qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
            o, _ = FlashCore.math(qq, kk, vv)
            return torch.autograd.grad(o, (qq, kk, vv), g.float())


class CausalSoftmax(torch.autograd.Function):
    """Megatron's fused upper-triangular masked softmax
    (ScaledUpperTriangMaskedSoftmax): saves its output."""

    @staticmethod
    def forward(ctx, x):
        causal = torch.ones(x.shape[-1], x.shape[-1], dtype=torch.bool).triu(1)
        y = torch.softmax(x.float().masked_fill(causal, float("-inf")), dim=-1).to(x.dtype)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        yf, gf = y.float(), g.float()
        return (yf * (gf - (gf * yf).sum(-1, keepdim=True))).to(y.dtype)


def eager_core(q, k, v):
    """Megatron's unfused core attention: bmm, fused causal softmax, bmm. The
    bmms save their operands, per-head views of q, k, v (one head each per
    kv head here: no GQA expansion, which would save copies)."""
    qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    sc = torch.bmm(qh, kh.transpose(1, 2)) * (1.0 / math.sqrt(q.shape[-1]))
    p = CausalSoftmax.apply(sc)
    return torch.bmm(p, vh).transpose(0, 1)


class AllToAll(torch.autograd.Function):
    """The dispatch (and, reversed, the combine) all-to-all of one rank: rows
    in, n_out rows out. A collective saves nothing for backward. Here the
    rows this rank receives are its own rows repeated, standing for the
    other rank's; the backward sums them back."""

    @staticmethod
    def forward(ctx, x, n_out):
        ctx.n_in = x.shape[0]
        reps = -(-n_out // x.shape[0])
        return x.repeat((reps,) + (1,) * (x.dim() - 1))[:n_out].clone()

    @staticmethod
    def backward(ctx, g):
        n = ctx.n_in
        out = torch.zeros((n,) + g.shape[1:], dtype=g.dtype)
        for i in range(0, g.shape[0], n):
            part = g[i : i + n]
            out[: part.shape[0]] += part
        return out, None


class FusedUnpermute(torch.autograd.Function):
    """TE's fused unpermute (moe_permute_fusion): the weighted sum of rows
    back to tokens, saving only the int32 row map."""

    @staticmethod
    def forward(ctx, rows, row_map):
        ctx.save_for_backward(row_map)
        return torch.zeros(S, rows.shape[1], dtype=rows.dtype).index_add(0, row_map, rows)

    @staticmethod
    def backward(ctx, g):
        (row_map,) = ctx.saved_tensors
        return g.index_select(0, row_map), None


class Weights(torch.nn.Module):
    def __init__(self, fused_qkv, kv_heads):
        super().__init__()
        g = torch.Generator().manual_seed(0)

        def p(*shape):
            return torch.nn.Parameter((torch.randn(*shape, generator=g) * 0.05).to(DT))

        self.kv = kv_heads
        self.g1, self.g2 = p(H), p(H)
        if fused_qkv:
            self.wqkv = p(NH * D + 2 * kv_heads * D, H)
        else:
            self.wq, self.wk, self.wv = p(NH * D, H), p(kv_heads * D, H), p(kv_heads * D, H)
        self.wo = p(H, NH * D)
        self.w1, self.w2 = p(2 * F_DENSE, H), p(H, F_DENSE)
        self.wr = p(E, H)
        self.we1 = torch.nn.ParameterList([p(2 * FE, H) for _ in range(LE)])
        self.we2 = torch.nn.ParameterList([p(H, FE) for _ in range(LE)])


def attention_block(W, x, fused_qkv, attention, rstd):
    n1 = RMSNorm.apply(x, W.g1, rstd)
    if fused_qkv:
        qkv = F.linear(n1, W.wqkv)
        q = qkv[:, : NH * D].view(S, NH, D)
        k = qkv[:, NH * D : (NH + W.kv) * D].view(S, W.kv, D)
        v = qkv[:, (NH + W.kv) * D :].view(S, W.kv, D)
    else:
        q = F.linear(n1, W.wq).view(S, NH, D)
        k = F.linear(n1, W.wk).view(S, W.kv, D)
        v = F.linear(n1, W.wv).view(S, W.kv, D)
    o = FlashCore.apply(q, k, v) if attention == "flash" else eager_core(q, k, v)
    return x + F.linear(o.reshape(S, NH * D), W.wo)


def dense_layer(W, x, fused_qkv, attention, rstd):
    x2 = attention_block(W, x, fused_qkv, attention, rstd)
    n2 = RMSNorm.apply(x2, W.g2, rstd)
    return x2 + F.linear(SwiGLU.apply(F.linear(n2, W.w1)), W.w2)


def moe_layer(W, x, fused_qkv, attention, rstd, prob_apply, n_rows, index_dtype):
    x2 = attention_block(W, x, fused_qkv, attention, rstd)
    n2 = RMSNorm.apply(x2, W.g2, rstd)
    # Router: fp32 softmax over all experts (saves its output), top-k routing.
    probs = torch.softmax(F.linear(n2, W.wr).float(), dim=-1)
    top = probs.detach().topk(K, dim=-1).indices
    routing_map = torch.zeros(S, E, dtype=torch.bool).scatter(1, top, True)
    # Megatron's permute (moe_utils.py:465-486): rows sorted by expert; the
    # row map and the probabilities' positions from the routing map.
    flat_sorted = routing_map.T.contiguous().reshape(-1).nonzero().squeeze(1)
    row_map = (flat_sorted % S).to(index_dtype)
    rows = n2.index_select(0, row_map)
    row_probs = probs.T.contiguous().reshape(-1)[flat_sorted]
    ein = AllToAll.apply(rows, n_rows)
    # The received rows, split evenly over the local experts (their order
    # needs no index: Megatron's sort_chunks_by_idxs is split and cat).
    split = [n_rows // LE + (1 if i < n_rows % LE else 0) for i in range(LE)]
    ups = torch.cat([F.linear(xe, w) for xe, w in zip(ein.split(split), W.we1)])
    if prob_apply == "activation":
        eprobs = AllToAll.apply(row_probs, n_rows)
        act = WeightedSwiGLU.apply(ups, eprobs)
    else:
        act = SwiGLU.apply(ups)
    eout = torch.cat([F.linear(a, w) for a, w in zip(act.split(split), W.we2)])
    if prob_apply == "expert_output":
        eprobs = AllToAll.apply(row_probs, n_rows)
        eout = (eout * eprobs[:, None]).to(DT)
    comb = AllToAll.apply(eout, rows.shape[0])
    if prob_apply == "combine":
        comb = (comb * row_probs[:, None]).to(DT)
    if index_dtype == torch.int64:
        # Megatron's unpermute (moe_utils.py:614-618): scatter_add saves the
        # (expanded) row map only.
        idx = row_map.unsqueeze(1).expand(-1, H)
        y = torch.zeros(S, H, dtype=comb.dtype).scatter_add(0, idx, comb)
    else:
        y = FusedUnpermute.apply(comb, row_map)
    return x2 + y


def saved_bytes(fn, params):
    """Runs fn() under saved-tensor hooks; returns the bytes of the distinct
    storages autograd saved, parameters excluded, and the tensors by storage."""
    param_storages = {p.storage().data_ptr() for p in params}
    seen = {}

    def pack(t):
        ptr = t.storage().data_ptr()
        if ptr not in param_storages and ptr not in seen:
            seen[ptr] = (tuple(t.shape), str(t.dtype), t.storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    out.float().sum().backward()  # the saved tensors really serve a backward
    return sum(v[2] for v in seen.values()), seen


# ---------------------------------------------------------------- the check

COMBOS = [
    (pa, fq, att)
    for pa in ("activation", "expert_output", "combine")
    for fq in (True, False)
    for att in ("flash", "eager")
]


def check(prob_apply, fused_qkv, attention, rstd=True, fusion=False):
    units = kiln_units(prob_apply, fused_qkv, attention, rstd, fusion)
    W = Weights(fused_qkv, 2 if attention == "flash" else NH)
    params = list(W.parameters())
    x = torch.randn(S, H, generator=torch.Generator().manual_seed(1)).to(DT).requires_grad_()
    index_dtype = torch.int32 if fusion else torch.int64
    cases = [
        (0, 1, lambda: dense_layer(W, x, fused_qkv, attention, rstd)),
        (1, 1, lambda: moe_layer(W, x, fused_qkv, attention, rstd, prob_apply, N_BAL, index_dtype)),
        (1, 2, lambda: moe_layer(W, x, fused_qkv, attention, rstd, prob_apply, 2 * N_BAL, index_dtype)),
    ]
    for layer, load, fn in cases:
        torch_bytes, seen = saved_bytes(fn, params)
        kiln_bytes = sum(b1 if load == 1 else b2 for _, b1, b2 in units[layer])
        what = (
            f"{prob_apply}, fused_qkv {fused_qkv}, {attention}, rstd {rstd}, layer {layer} "
            f"at load {load}: PyTorch {torch_bytes}, kiln {kiln_bytes}\n"
            f"kiln: {units[layer]}\nPyTorch: {sorted(seen.values())}"
        )
        assert abs(torch_bytes - kiln_bytes) <= 0.01 * torch_bytes, what


@pytest.mark.parametrize("prob_apply,fused_qkv,attention", COMBOS)
def test_saved_bytes_match_kiln(prob_apply, fused_qkv, attention):
    check(prob_apply, fused_qkv, attention)


def test_trainer_choices_match_kiln():
    # examples/trainer's options: norms without rstd, int32 row map.
    check("expert_output", False, "flash", rstd=False, fusion=True)
