"""examples/torch/moe.py: the PyTorch MoE transformer of examples/torch.

The model examples/torch/model.yaml describes (the same shapes as the C
trainer's, examples/trainer): RMSNorm, grouped-query causal attention as a
flash-like autograd Function (it saves q, k, v, the output and the
log-sum-exp, as FlashAttention does), a top-k softmax router, SwiGLU
experts, fp32. Each op that makes one of kiln's units runs through the
kiln.torch layer scope (Layer.produce / Layer.register), so the manager can
keep, offload or recompute it; the ops are written so that autograd saves
exactly those units (plus the few small tensors docs/torch.md lists).

Expert parallelism: EP ranks exchange rows with all_to_all_single (gloo on
the CPU); the router's probabilities multiply as model.moe.prob_apply says
(expert_output: on the expert's output, on the expert's rank)."""

import math

import torch
import torch.distributed as dist


# ---------------------------------------------------------------- ops

class RMSNormFn(torch.autograd.Function):
    """y = x / rms(x) * w. Saves x and w only (the reciprocal RMS is
    recomputed in backward, a row reduction)."""

    @staticmethod
    def forward(ctx, x, w, eps):
        ctx.eps = eps
        ctx.save_for_backward(x, w)
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return x * r * w

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + ctx.eps)
        xn = x * r
        dw = (dy * xn).reshape(-1, x.shape[-1]).sum(0)
        g = dy * w
        dx = r * (g - xn * (g * xn).mean(-1, keepdim=True))
        return dx, dw, None


def rmsnorm(x, w, eps=1e-5):
    return RMSNormFn.apply(x, w, eps)


class RMSNormRstdFn(torch.autograd.Function):
    """RMSNorm that saves x, w and its fp32 reciprocal RMS per row (as
    Transformer Engine's fused norm does: norm_saves_rstd). Returns (y, rstd)."""

    @staticmethod
    def forward(ctx, x, w, eps):
        r = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, w, r)
        ctx.mark_non_differentiable(r)
        return (x.float() * r * w.float()).to(x.dtype), r

    @staticmethod
    def backward(ctx, dy, dr):
        x, w, r = ctx.saved_tensors
        xn = x.float() * r
        dw = (dy.float() * xn).reshape(-1, x.shape[-1]).sum(0)
        g = dy.float() * w.float()
        dx = r * (g - xn * (g * xn).mean(-1, keepdim=True))
        return dx.to(x.dtype), dw.to(w.dtype), None


def rmsnorm_rstd(x, w, eps=1e-5):
    return RMSNormRstdFn.apply(x, w, eps)


class FlashAttnFn(torch.autograd.Function):
    """Causal grouped-query attention over q [b, s, nh, d], k and v
    [b, s, nkv, d] (views of the projections' outputs). Returns the output
    [b*s, nh*d] (contiguous: the out-projection's input) and the fp32
    log-sum-exp [b, nh, s]. Saves q, k, v, out and lse, as FlashAttention
    does; the probabilities are rebuilt in backward."""

    @staticmethod
    def forward(ctx, q, k, v):
        b, s, nh, d = q.shape
        g = nh // k.shape[2]
        qt = q.permute(0, 2, 1, 3)
        kt = k.permute(0, 2, 1, 3).repeat_interleave(g, dim=1)
        vt = v.permute(0, 2, 1, 3).repeat_interleave(g, dim=1)
        scale = 1.0 / math.sqrt(d)
        sc = torch.matmul(qt, kt.transpose(-1, -2)).float() * scale
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        sc = sc.masked_fill(mask, float("-inf"))
        lse = torch.logsumexp(sc, dim=-1)
        p = torch.exp(sc - lse.unsqueeze(-1)).to(v.dtype)
        o = torch.matmul(p, vt)  # [b, nh, s, d]
        out = o.permute(0, 2, 1, 3).reshape(b * s, nh * d).contiguous()
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        b, s, nh, d = q.shape
        nkv = k.shape[2]
        g = nh // nkv
        qt = q.permute(0, 2, 1, 3)
        kt = k.permute(0, 2, 1, 3).repeat_interleave(g, dim=1)
        vt = v.permute(0, 2, 1, 3).repeat_interleave(g, dim=1)
        scale = 1.0 / math.sqrt(d)
        sc = torch.matmul(qt, kt.transpose(-1, -2)).float() * scale
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        sc = sc.masked_fill(mask, float("-inf"))
        p = torch.exp(sc - lse.unsqueeze(-1)).to(v.dtype)
        do = dout.reshape(b, s, nh, d).permute(0, 2, 1, 3)
        o = out.reshape(b, s, nh, d).permute(0, 2, 1, 3)
        dv = torch.matmul(p.transpose(-1, -2), do)
        dp = torch.matmul(do, vt.transpose(-1, -2))
        dsum = (do * o).sum(-1, keepdim=True)
        ds = (p * (dp - dsum) * scale).to(q.dtype)
        dq = torch.matmul(ds, kt)
        dk = torch.matmul(ds.transpose(-1, -2), qt)
        dk = dk.reshape(b, nkv, g, s, d).sum(2).permute(0, 2, 1, 3)
        dv = dv.reshape(b, nkv, g, s, d).sum(2).permute(0, 2, 1, 3)
        return dq.permute(0, 2, 1, 3), dk, dv


class SwiGLUFn(torch.autograd.Function):
    """up [n, 2f] (gate | up) -> silu(gate) * up [n, f]. Saves up only."""

    @staticmethod
    def forward(ctx, up):
        ctx.save_for_backward(up)
        f = up.shape[1] // 2
        a, u = up[:, :f], up[:, f:]
        return torch.nn.functional.silu(a) * u

    @staticmethod
    def backward(ctx, dy):
        (up,) = ctx.saved_tensors
        f = up.shape[1] // 2
        a, u = up[:, :f], up[:, f:]
        sg = torch.sigmoid(a)
        silu = a * sg
        da = dy * u * sg * (1 + a * (1 - sg))
        du = dy * silu
        return torch.cat([da, du], dim=1)


def wire(t):
    """t as gloo can send it: gloo in torch 1.13 has no bfloat16, so bf16
    travels as fp32 (exact both ways)."""
    return (t.float() if t.dtype == torch.bfloat16 else t).contiguous()


class WeightedSwiGLUFn(torch.autograd.Function):
    """up [n, 2f] and fp32 weights p [n] -> silu(gate) * up * p (prob_apply:
    activation, Megatron's weighted SwiGLU). Saves up and p."""

    @staticmethod
    def forward(ctx, up, p):
        ctx.save_for_backward(up, p)
        f = up.shape[1] // 2
        a, u = up[:, :f], up[:, f:]
        return torch.nn.functional.silu(a) * u * p.to(up.dtype).unsqueeze(1)

    @staticmethod
    def backward(ctx, dy):
        up, p = ctx.saved_tensors
        f = up.shape[1] // 2
        a, u = up[:, :f], up[:, f:]
        sg = torch.sigmoid(a)
        silu = a * sg
        dz = dy * p.to(dy.dtype).unsqueeze(1)
        da = dz * u * sg * (1 + a * (1 - sg))
        du = dz * silu
        return torch.cat([da, du], dim=1), (dy * silu * u).float().sum(1)


class AllToAllFn(torch.autograd.Function):
    """all_to_all_single of the rows of x: send[i] rows to rank i, recv[i]
    from it; backward sends the gradients the other way. Saves nothing."""

    @staticmethod
    def forward(ctx, x, send, recv, group):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        if group is None:  # one EP rank: the rows stay
            return x.clone()
        w = wire(x)
        out = w.new_empty((sum(recv),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, w, recv, send, group=group)
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        if ctx.group is None:
            return dy, None, None, None
        w = wire(dy)
        dx = w.new_empty((sum(ctx.send),) + tuple(dy.shape[1:]))
        dist.all_to_all_single(dx, w, ctx.send, ctx.recv, group=ctx.group)
        return dx.to(dy.dtype), None, None, None


class DispatchFn(torch.autograd.Function):
    """Rows in send order from the token side: x[tok] and their gate
    weights probs.flatten()[pidx]; route = stack(tok, pidx) (int64 [2, R],
    saved for the backward's scatter)."""

    @staticmethod
    def forward(ctx, x, probs, route):
        ctx.save_for_backward(route)
        ctx.shapes = (x.shape, probs.shape)
        return x.index_select(0, route[0]), probs.reshape(-1).index_select(0, route[1])

    @staticmethod
    def backward(ctx, drows, dw):
        (route,) = ctx.saved_tensors
        xs, ps = ctx.shapes
        dx = drows.new_zeros(xs).index_add_(0, route[0], drows)
        dp = dw.new_zeros(ps[0] * ps[1]).index_add_(0, route[1], dw).reshape(ps)
        return dx, dp, None


class CombineFn(torch.autograd.Function):
    """Returned rows (send order) summed into their tokens."""

    @staticmethod
    def forward(ctx, rows, route, n_tokens):
        ctx.save_for_backward(route)
        return rows.new_zeros((n_tokens, rows.shape[1])).index_add_(0, route[0], rows)

    @staticmethod
    def backward(ctx, dy):
        (route,) = ctx.saved_tensors
        return dy.index_select(0, route[0]), None, None


class PermuteFn(torch.autograd.Function):
    """Received rows (source-major) to expert-major order through perm
    (int32, the unit moe.perm_idx): out[i] = x[perm[i]]."""

    @staticmethod
    def forward(ctx, x, perm):
        ctx.save_for_backward(perm)
        return x.index_select(0, perm.long())

    @staticmethod
    def backward(ctx, dy):
        (perm,) = ctx.saved_tensors
        return dy.new_zeros(dy.shape).index_copy_(0, perm.long(), dy), None


class UnpermuteFn(torch.autograd.Function):
    """Expert-major rows back to the received (source-major) order."""

    @staticmethod
    def forward(ctx, y, perm):
        ctx.save_for_backward(perm)
        return y.new_zeros(y.shape).index_copy_(0, perm.long(), y)

    @staticmethod
    def backward(ctx, dy):
        (perm,) = ctx.saved_tensors
        return dy.index_select(0, perm.long()), None


class CrossEntropyFn(torch.autograd.Function):
    """Mean cross entropy of logits [T, V] against targets, times scale.
    Saves the logits (the head's fixed activation) and the targets."""

    @staticmethod
    def forward(ctx, logits, targets, scale):
        ctx.scale = scale
        ctx.save_for_backward(logits, targets)
        lse = torch.logsumexp(logits, dim=1)
        picked = logits.gather(1, targets.unsqueeze(1)).squeeze(1)
        return (lse - picked).mean() * scale

    @staticmethod
    def backward(ctx, dl):
        logits, targets = ctx.saved_tensors
        p = torch.softmax(logits, dim=1)
        p[torch.arange(p.shape[0], device=p.device), targets] -= 1.0
        return p * (dl * ctx.scale / logits.shape[0]), None, None


# ---------------------------------------------------------------- model

# The units of one layer without issue 15's memory options (what kilnc
# without them models): separate q, k and v, norms that save no statistics,
# probabilities applied on the expert output, an int32 row map.
UNITS = ("ln1.in", "attn.qkv_in", "attn.q", "attn.k", "attn.v", "attn.out", "attn.lse",
         "ln2.in", "moe.in", "moe.probs", "moe.perm_idx", "moe.expert_in", "moe.expert_up",
         "moe.expert_act", "moe.expert_out")

# The memory options (docs/model-format.md "Memory options", issue 15), as
# kilnc without them models the layer.
LEGACY = {"fused_qkv": False, "norm_saves_rstd": False, "prob_apply": "expert_output",
          "moe_permute_fusion": True}


class Config:
    """Shapes, read from the model description (examples/torch/model.yaml)."""

    def __init__(self, desc):
        m, t, p = desc["model"], desc["training"], desc["parallel"]
        self.layers = m["layers"]
        self.hidden = m["hidden"]
        self.heads = m["heads"]
        self.kv_heads = m.get("kv_heads", self.heads)
        self.head_dim = m.get("head_dim", self.hidden // self.heads)
        self.vocab = m["vocab"]
        self.seq = m["seq_len"]
        moe = m["moe"]
        self.experts = moe["experts"]
        self.top_k = moe["top_k"]
        self.ffn = moe["expert_ffn_hidden"]
        # Issue 15's memory options: what the description states (None: not
        # stated); in force: the stated value, else what the plan's units say
        # (adopt), else LEGACY.
        self.stated = {"fused_qkv": m.get("fused_qkv"),
                       "norm_saves_rstd": m.get("norm_saves_rstd"),
                       "prob_apply": moe.get("prob_apply"),
                       "moe_permute_fusion": p.get("moe_permute_fusion")}
        for k, v in LEGACY.items():
            setattr(self, k, self.stated[k] if self.stated[k] is not None else v)
        self.micro_batch = t["micro_batch"]
        self.global_batch = t["global_batch"]
        self.pp = p["pp"]
        self.ep = p["ep"]
        self.devices = p["devices"]
        dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
        if t.get("dtype") not in dtypes:
            raise ValueError("training.dtype %r: examples/torch runs fp32 or bf16" %
                             (t.get("dtype"),))
        self.dtype = dtypes[t["dtype"]]
        if m.get("activation", "swiglu") != "swiglu" or moe.get("activation",
                                                                "swiglu") != "swiglu":
            raise ValueError("examples/torch has SwiGLU experts only")
        if m.get("attention", "flash") != "flash":
            raise ValueError("examples/torch has flash-like attention only")
        if self.prob_apply not in ("expert_output", "activation"):
            raise ValueError("model.moe.prob_apply %r: examples/torch applies the "
                             "probabilities on the expert output (expert_output) or inside "
                             "the activation (activation)" % (self.prob_apply,))
        if m.get("dense_layers", 0) or moe.get("shared_experts", 0):
            raise ValueError("examples/torch has routed-expert MoE layers only")
        self.tokens = self.seq * self.micro_batch
        self.local_experts = self.experts // self.ep
        self.stage_layers = self.layers // self.pp
        self.dp = self.devices // self.pp
        self.microbatches = self.global_batch // (self.micro_batch * self.dp)

    def adopt(self, names, perm_row_bytes):
        """Takes the memory options from a plan's units (names, and the row
        map's bytes per row): kilnc decided them from the description, stated
        or by its defaults. Raises ValueError where they contradict what the
        description states, or name what this model cannot build."""
        names = set(names)
        seen = {"fused_qkv": "attn.qkv" in names,
                "norm_saves_rstd": "ln1.rstd" in names,
                "prob_apply": ("expert_output" if "moe.expert_out" in names else
                               "activation" if "moe.expert_probs" in names else "combine"),
                "moe_permute_fusion": perm_row_bytes == 4}
        for k, v in seen.items():
            if self.stated[k] is not None and self.stated[k] != v:
                raise ValueError("the plan's units say %s: %s, the description %s" % (
                    k, v, self.stated[k]))
            setattr(self, k, v)
        if self.prob_apply == "combine":
            raise ValueError("the plan applies the probabilities after the combine "
                             "(prob_apply: combine), which examples/torch does not build")

    def units(self):
        """{unit: (base bytes, bytes per routed row)} of one layer, from the
        cost model's formulas (docs/cost-model.md "Activations") for these
        shapes and options: e bytes per activation element, fp32 statistics
        and probabilities, the row map int32 or int64."""
        T, h = self.tokens, self.hidden
        e = torch.finfo(self.dtype).bits // 8
        qd, kvd = self.heads * self.head_dim, self.kv_heads * self.head_dim
        u = {"ln1.in": (e * T * h, 0), "attn.qkv_in": (e * T * h, 0),
             "attn.out": (e * T * qd, 0), "attn.lse": (4 * self.heads * T, 0),
             "ln2.in": (e * T * h, 0), "moe.in": (e * T * h, 0),
             "moe.probs": (4 * T * self.experts, 0),
             "moe.perm_idx": (0, 4 if self.moe_permute_fusion else 8),
             "moe.expert_in": (0, e * h), "moe.expert_up": (0, e * 2 * self.ffn),
             "moe.expert_act": (0, e * self.ffn)}
        if self.fused_qkv:
            u["attn.qkv"] = (e * T * (qd + 2 * kvd), 0)
        else:
            u.update({"attn.q": (e * T * qd, 0), "attn.k": (e * T * kvd, 0),
                      "attn.v": (e * T * kvd, 0)})
        if self.norm_saves_rstd:
            u.update({"ln1.rstd": (4 * T, 0), "ln2.rstd": (4 * T, 0)})
        if self.prob_apply == "activation":
            u["moe.expert_probs"] = (0, 4)
        else:
            u["moe.expert_out"] = (0, e * h)
        return u


def _param(gen, shape, scale):
    return torch.nn.Parameter(torch.randn(shape, generator=gen) * scale)


class Layer(torch.nn.Module):
    """One MoE transformer layer; this rank's share of its experts."""

    def __init__(self, cfg, layer, ep_rank, seed):
        super().__init__()
        h, nh, nkv, d = cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim
        g = torch.Generator().manual_seed(seed * 1000 + layer)
        self.ln1 = torch.nn.Parameter(torch.ones(h))
        wq = _param(g, (h, nh * d), h ** -0.5)
        wk = _param(g, (h, nkv * d), h ** -0.5)
        wv = _param(g, (h, nkv * d), h ** -0.5)
        self.fused = cfg.fused_qkv
        if self.fused:  # one GEMM: the same weights side by side
            self.wqkv = torch.nn.Parameter(torch.cat([wq, wk, wv], dim=1).detach())
        else:
            self.wq, self.wk, self.wv = wq, wk, wv
        self.wo = _param(g, (nh * d, h), (nh * d) ** -0.5)
        self.ln2 = torch.nn.Parameter(torch.ones(h))
        self.router = _param(g, (h, cfg.experts), h ** -0.5)
        up, down = [], []
        for e in range(cfg.experts):  # every expert drawn, so each rank's match
            up.append(torch.randn((h, 2 * cfg.ffn), generator=g) * h ** -0.5)
            down.append(torch.randn((cfg.ffn, h), generator=g) * cfg.ffn ** -0.5)
        lo = ep_rank * cfg.local_experts
        self.w_up = torch.nn.Parameter(torch.stack(up[lo:lo + cfg.local_experts]))
        self.w_down = torch.nn.Parameter(torch.stack(down[lo:lo + cfg.local_experts]))

    def replicated(self):
        """The parameters every EP rank of the stage holds (all but experts)."""
        qkv = [self.wqkv] if self.fused else [self.wq, self.wk, self.wv]
        return [self.ln1] + qkv + [self.wo, self.ln2, self.router]


def experts_up(x, w_up, counts):
    """Each local expert's rows (expert-major) through its up GEMM; one
    output storage (the unit moe.expert_up)."""
    outs, lo = [], 0
    for e, n in enumerate(counts):
        outs.append(torch.matmul(x[lo:lo + n], w_up[e]))
        lo += n
    return torch.cat(outs, dim=0)


def experts_down(a, w_down, counts):
    outs, lo = [], 0
    for e, n in enumerate(counts):
        outs.append(torch.matmul(a[lo:lo + n], w_down[e]))
        lo += n
    return torch.cat(outs, dim=0)


class WeightFn(torch.autograd.Function):
    """Expert output rows times their gate weights (prob_apply:
    expert_output): saves the expert output and the per-row weights."""

    @staticmethod
    def forward(ctx, y, w):
        ctx.save_for_backward(y, w)
        return y * w.to(y.dtype).unsqueeze(1)

    @staticmethod
    def backward(ctx, dz):
        y, w = ctx.saved_tensors
        return dz * w.to(dz.dtype).unsqueeze(1), (dz * y).float().sum(1)


def route(cfg, probs, spikes, key):
    """Top-k experts per token [T, k], unless a spike on this step sends a
    fraction of the tokens (drawn from key: seed, step, replica, micro-batch,
    layer) to the spike's experts; the rest of their k slots keep their own
    ranking."""
    with torch.no_grad():
        top = probs.topk(cfg.top_k, dim=1).indices
        for frac, experts in spikes:
            gen = torch.Generator().manual_seed(key)
            hit = (torch.rand(probs.shape[0], generator=gen) < frac).to(probs.device)
            p2 = probs.clone()
            pick = torch.empty_like(top)
            for j, e in enumerate(experts[:cfg.top_k]):
                pick[:, j] = e
                p2[:, e] = -1.0
            rest = p2.topk(cfg.top_k - len(experts[:cfg.top_k]), dim=1).indices
            pick[:, len(experts[:cfg.top_k]):] = rest
            top = torch.where(hit.unsqueeze(1), pick, top)
            break
    return top


def layer_forward(cfg, L, mod, x, group, spikes, key, pending, fixed_after):
    """The layer's forward for one micro-batch inside its kiln.torch layer
    scope L; x [T, h] is the unit ln1.in. Returns the layer output."""
    T, h = x.shape
    b, s = cfg.micro_batch, cfg.seq
    nh, nkv, d = cfg.heads, cfg.kv_heads, cfg.head_dim
    if cfg.norm_saves_rstd:
        qkv_in, _ = L.produce(("attn.qkv_in", "ln1.rstd"), rmsnorm_rstd, x, mod.ln1)
    else:
        qkv_in = L.produce("attn.qkv_in", rmsnorm, x, mod.ln1)
    if cfg.fused_qkv:
        qkv = L.produce("attn.qkv", torch.matmul, qkv_in, mod.wqkv)

        def attn_fused(qkv):
            heads = qkv.view(b, s, nh + 2 * nkv, d)  # q, k and v: views of one storage
            return FlashAttnFn.apply(heads[:, :, :nh], heads[:, :, nh:nh + nkv],
                                     heads[:, :, nh + nkv:])

        out, _ = L.produce(("attn.out", "attn.lse"), attn_fused, qkv)
    else:
        q = L.produce("attn.q", torch.matmul, qkv_in, mod.wq)
        k = L.produce("attn.k", torch.matmul, qkv_in, mod.wk)
        v = L.produce("attn.v", torch.matmul, qkv_in, mod.wv)

        def attn(q, k, v):
            return FlashAttnFn.apply(q.view(b, s, nh, d), k.view(b, s, nkv, d),
                                     v.view(b, s, nkv, d))

        out, _ = L.produce(("attn.out", "attn.lse"), attn, q, k, v)

    def residual(x, out, wo):
        return x + torch.matmul(out, wo)

    h1 = L.produce("ln2.in", residual, x, out, mod.wo)
    if cfg.norm_saves_rstd:
        moe_in, _ = L.produce(("moe.in", "ln2.rstd"), rmsnorm_rstd, h1, mod.ln2)
    else:
        moe_in = L.produce("moe.in", rmsnorm, h1, mod.ln2)

    def gate(m, w):
        return torch.softmax(torch.matmul(m, w).float(), dim=1)

    probs = L.produce("moe.probs", gate, moe_in, mod.router, router=True)

    # The gate: routing, then the rows each local expert receives.
    E, LE, ep = cfg.experts, cfg.local_experts, cfg.ep
    top = route(cfg, probs.detach(), spikes, key)
    flat = top.reshape(-1)
    order = torch.argsort(flat * flat.numel() + torch.arange(flat.numel(), device=flat.device))
    tok = order // cfg.top_k
    routed = torch.stack([tok, tok * E + flat[order]])
    send_cnt = torch.bincount(flat, minlength=E)  # per global expert = (rank, local)
    if group is None:
        recv_cnt = send_cnt.clone()
    else:
        recv_cnt = torch.empty_like(send_cnt)
        dist.all_to_all_single(recv_cnt, send_cnt, group=group)
    recv_cnt = recv_cnt.view(ep, LE)  # [source rank, local expert]
    per_expert = recv_cnt.sum(0).tolist()
    # Every rank's rows, so that the whole EP group takes the same decision
    # past the declared load (the group's fallback; Megatron-Core's
    # dispatcher all-gathers its counts over the EP group alike). Gathered
    # under every policy, so that the ranks' calls match.
    mine = torch.tensor([sum(per_expert)], dtype=torch.int64)
    if group is None:
        group_rows = mine.tolist()
    else:
        every = [torch.empty_like(mine) for _ in range(ep)]
        dist.all_gather(every, mine, group=group)
        group_rows = torch.cat(every).tolist()
    L.decide(per_expert, pending=pending, fixed_after_bytes=fixed_after, group_rows=group_rows)

    send_rows = send_cnt.view(ep, LE).sum(1).tolist()
    recv_rows = recv_cnt.sum(1).tolist()

    rc = recv_cnt.tolist()

    def perm_map():
        start, off = [[0] * LE for _ in range(ep)], 0
        for r in range(ep):
            for e in range(LE):
                start[r][e] = off
                off += rc[r][e]
        idx = []
        for e in range(LE):
            for r in range(ep):
                idx.extend(range(start[r][e], start[r][e] + rc[r][e]))
        return torch.tensor(idx, dtype=torch.int32 if cfg.moe_permute_fusion else torch.int64,
                            device=x.device)

    perm = L.produce("moe.perm_idx", perm_map)

    def dispatch_in(m, p, perm):
        """The dispatch: the rows of m and their gate weights sent to their
        experts' ranks (two all-to-alls, collectives of the EP group), each
        expert-major: moe.expert_in and the per-row weights."""
        rows, wts = DispatchFn.apply(m, p, routed)
        rrows = AllToAllFn.apply(rows, send_rows, recv_rows, group)
        rw = AllToAllFn.apply(wts, send_rows, recv_rows, group)
        return PermuteFn.apply(rrows, perm), PermuteFn.apply(rw.unsqueeze(1), perm).squeeze(1)

    # The weights multiply inside the activation (Megatron's weighted
    # SwiGLU): then the per-row probabilities are a unit, the expert output
    # none. Both units are rebuilt by re-running the dispatch.
    weighted_act = cfg.prob_apply == "activation"
    ein, w_rows = L.produce(("moe.expert_in", "moe.expert_probs" if weighted_act else None),
                            dispatch_in, moe_in, probs, perm, collective=True)
    up = L.produce("moe.expert_up", experts_up, ein, mod.w_up, per_expert)
    if weighted_act:
        act = L.produce("moe.expert_act", WeightedSwiGLUFn.apply, up, w_rows)
        weighted = experts_down(act, mod.w_down, per_expert)
    else:
        act = L.produce("moe.expert_act", SwiGLUFn.apply, up)
        eout = L.produce("moe.expert_out", experts_down, act, mod.w_down, per_expert)
        weighted = WeightFn.apply(eout, w_rows)

    back = UnpermuteFn.apply(weighted, perm)
    ret = AllToAllFn.apply(back, recv_rows, send_rows, group)
    return h1 + CombineFn.apply(ret, routed, T)


class Head(torch.nn.Module):
    """The last stage's final norm, output projection and loss."""

    def __init__(self, cfg, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed * 1000 + 999)
        self.norm = torch.nn.Parameter(torch.ones(cfg.hidden))
        self.out = _param(g, (cfg.hidden, cfg.vocab), cfg.hidden ** -0.5)


class Embed(torch.nn.Module):
    def __init__(self, cfg, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed * 1000 + 998)
        self.table = _param(g, (cfg.vocab, cfg.hidden), 1.0)


HEAD_UNITS = ("head.norm_in", "head.in", "head.logits")  # and head.final_norm.rstd


def head_bytes(cfg):
    """The head's saved tensors per micro-batch: its norm's input and the
    output projection's input (activation dtype), the fp32 logits, and the
    norm's fp32 reciprocal RMS per row with norm_saves_rstd."""
    e = torch.finfo(cfg.dtype).bits // 8
    rstd = 4 if cfg.norm_saves_rstd else 0  # head.final_norm.rstd
    return cfg.tokens * (2 * e * cfg.hidden + 4 * cfg.vocab + rstd)


def logits(h, w):
    """The output projection, in fp32 for the cross entropy (kiln counts
    head.logits at 4 bytes, docs/cost-model.md)."""
    return torch.matmul(h, w).float()
