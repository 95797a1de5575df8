"""kiln.torch: carries out kiln's plans in a PyTorch model.

A Manager attributes the tensors autograd saves for backward to kiln's
units and, per the plan kiln_rt_select gives at each MoE layer's post-gate
point, keeps them, offloads them to host memory (reloaded before the
backward needs them) or drops them and re-runs the op that made them in
backward (recompute). The layer code names the units it makes:

    mgr = kiln.torch.Manager(rt, stage=s, budget_bytes=B)
    with mgr.microbatch(mb):                # saved-tensor hooks on
        with mgr.layer(layer, x) as L:       # x: the layer input, unit "ln1.in"
            h = L.produce("attn.qkv_in", rmsnorm, x, w)
            ...                              # the router's probabilities
            plan = L.decide(tokens_per_expert, pending=p)   # post-gate
            ...                              # experts, combine
        # leaving the layer carries the plan out
    loss.backward()                          # reloads / recomputes as needed

Saved tensors are matched to units by storage (views and alias groups
count once: torch 1.13 has no untyped_storage(), so t.storage().data_ptr()).
Parameters and tensors that are no unit are kept and listed (extras).
Free memory comes from the CUDA caching allocator where the manager runs on
a CUDA device, otherwise from kiln's accounting API, which the manager feeds
with every produced, freed, offloaded and reloaded byte. An activation budget
is enforced: going over it raises OutOfMemory naming the unit, as a GPU
would. docs/torch.md is the reference.

Uses torch (this subpackage only) and kiln.runtime."""

import contextlib
import time

import torch

from kiln.runtime import PLAN_GROUP_SLACK

KEEP, RECOMPUTE, OFFLOAD = 0, 1, 2
_ACTION_CODES = {"keep": KEEP, "recompute": RECOMPUTE, "offload": OFFLOAD}
_ACTION_NAMES = ("keep", "recompute", "offload")

_OOMBase = getattr(torch.cuda, "OutOfMemoryError", RuntimeError)


class OutOfMemory(_OOMBase):
    """The activation budget would be exceeded. unit names the tensor that
    did not fit; need_bytes its size; held_bytes and budget_bytes the
    manager's count and limit at that moment."""

    def __init__(self, message, unit, need_bytes, held_bytes, budget_bytes):
        super().__init__(message)
        self.unit = unit
        self.need_bytes = need_bytes
        self.held_bytes = held_bytes
        self.budget_bytes = budget_bytes


def storage_key(t):
    """The identity of t's storage (views of one tensor share it)."""
    return t.storage().data_ptr()


def storage_bytes(t):
    s = t.storage()
    return s.size() * s.element_size()


class _Recipe:
    """One op's recompute: fn(*sources) re-run under no_grad with the RNG
    state it saw in the forward (rng: CPU state, CUDA device, its state);
    sources are _Units or plain tensors (held).
    Produces one tensor or a tuple; each unit knows its index in it."""

    __slots__ = ("fn", "sources", "rng", "cache")

    def __init__(self, fn, sources, rng):
        self.fn = fn
        self.sources = sources
        self.rng = rng
        self.cache = None

    def run(self, mgr):
        args = [s.get(mgr) if isinstance(s, _Unit) else s for s in self.sources]
        with torch.no_grad():
            if self.rng is not None:
                cpu, dev, cuda = self.rng
                with torch.random.fork_rng(devices=[dev] if dev is not None else []):
                    torch.random.set_rng_state(cpu)
                    if dev is not None:
                        torch.cuda.set_rng_state(cuda, dev)
                    out = self.fn(*args)
            else:
                out = self.fn(*args)
        return out


class _Unit:
    """One unit of one (micro-batch, layer): its tensor while on the device,
    its host copy while offloaded, its recipe for recompute."""

    __slots__ = ("name", "index", "mb", "layer", "tensor", "host", "event", "nbytes", "key",
                 "recipe", "out_index", "action", "state", "fixed", "router", "collective")

    def __init__(self, name, index, mb, layer, tensor, recipe, out_index, fixed):
        self.name = name
        self.index = index
        self.mb = mb
        self.layer = layer
        self.tensor = tensor
        self.host = None
        self.event = None
        self.nbytes = storage_bytes(tensor)
        self.key = storage_key(tensor)
        self.recipe = recipe
        self.out_index = out_index
        self.action = KEEP
        self.state = "held"
        self.fixed = fixed
        self.router = False
        self.collective = False

    def get(self, mgr):
        """The tensor, brought back (reload or recompute) if it was sent away."""
        if self.state != "held":
            mgr._restore_unit(self)
        if self.event is not None:  # a reload still on the side stream
            torch.cuda.current_stream(self.tensor.device).wait_event(self.event)
            self.event = None
        return self.tensor


class _Saved:
    """What the pack hook returns: the tensor until its layer ends, then
    (for a unit) the unit and the view of its storage the op saved."""

    __slots__ = ("tensor", "unit", "view")

    def __init__(self, tensor):
        self.tensor = tensor
        self.unit = None
        self.view = None


class Layer:
    """The scope of one layer's forward for one micro-batch (Manager.layer)."""

    def __init__(self, mgr, mb, layer):
        self.mgr = mgr
        self.mb = mb
        self.layer = layer
        self.units = {}
        self.saved = []
        self.plan = None
        self.rows = 0
        self.input_unit = None
        self.fixed = False

    def register(self, name, tensor, recipe=None, out_index=None, fixed=False):
        """Names tensor, already computed, as unit name of this layer (no
        recipe: it is never recomputed, e.g. the layer input or a collective's
        output). Returns tensor."""
        return self.mgr._register(self, name, tensor, recipe, out_index, fixed)

    def produce(self, name, fn, *sources, rng=False, router=False, collective=False):
        """Runs fn(*sources) and names its output unit name; recompute re-runs
        fn on the same sources (units among them are brought back first). name
        may be a tuple when fn returns a tuple: one unit per output (None for an
        output that is no unit). rng=True replays the RNG state (the CPU's, and
        the manager's CUDA device's when it has one). router=True
        marks the router's output: never recomputed, so that nothing in the
        backward can see other tokens per expert than the forward did (a plan
        that recomputes it has it offloaded instead: the same bytes leave the
        device, the exact values come back). collective=True says fn runs a
        collective of the EP group (the dispatch all-to-all): it is recomputed
        only where every rank of the group recomputes it alike, under the
        group's fallback (Plan.group_fallback, a function of the group's
        counts) or --policy mixed; a plan that asks otherwise is refused.
        Returns fn's output."""
        srcs = [self.mgr._unit_of(self, s) or s for s in sources]
        state = None
        if rng:
            dev = self.mgr.device if self.mgr.cuda else None
            state = (torch.random.get_rng_state(), dev,
                     torch.cuda.get_rng_state(dev) if dev is not None else None)
        recipe = _Recipe(fn, srcs, state)
        if router:
            recipe = None
        out = fn(*sources)
        names = name if isinstance(name, tuple) else (name,)
        outs = out if isinstance(name, tuple) else (out,)
        for i, (n, t) in enumerate(zip(names, outs)):
            if n is not None:
                self.mgr._register(self, n, t, recipe, i if isinstance(name, tuple) else None,
                                   False)
                self.units[n].router = router
                self.units[n].collective = collective
        return out

    def decide(self, tokens_per_expert, pending=0, fixed_after_bytes=0, group_rows=None):
        """The post-gate point: selects this layer's plan for this
        micro-batch from the real rows per local expert (a list or a 1-D
        tensor of counts). pending: forward passes this stage starts before
        its next backward (1F1B warm-up). fixed_after_bytes: bytes this
        micro-batch will hold after the stage's layers (the head's saved
        tensors on the last stage). group_rows (optional): the rows every
        rank of the EP group receives at this layer, from the count
        exchange before the dispatch (a list or a 1-D tensor), so that the
        whole group falls back together beyond the declared load
        (Runtime.select; docs/torch.md). Returns the plan (None under
        policy keep)."""
        return self.mgr._decide(self, tokens_per_expert, pending, fixed_after_bytes,
                                group_rows)


class Manager:
    """Saved-tensor management for one pipeline stage.

    rt: a kiln.runtime.Runtime on the stage's blob (None only with policy
    "keep" or "mixed"). budget_bytes: the activation budget (None: the
    stage's capacity minus its static bytes, from the blob; with neither,
    unlimited). policy: "kiln" (ask kiln_rt_select), "keep" (keep
    everything: the static baseline) or "mixed" (cycle keep, recompute and
    offload over the units: for tests, it drives every path). device: where
    activations live (CPU, or a CUDA device: then offloads go to pinned host
    memory on a side stream and free memory comes from the caching
    allocator). record: keep a log of every unit at every decision.
    free_bytes_fn: a callable returning the device bytes free for
    activations, instead of the allocator's or the accounting's figure (a
    host with its own allocator)."""

    def __init__(self, rt=None, stage=0, budget_bytes=None, policy="kiln", device=None,
                 record=False, free_bytes_fn=None):
        if policy not in ("kiln", "keep", "mixed"):
            raise ValueError("policy %r: one of kiln, keep, mixed" % (policy,))
        if policy == "kiln" and rt is None:
            raise ValueError("policy kiln needs a kiln.runtime.Runtime")
        self.rt = rt
        self.stage = stage
        self.policy = policy
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.cuda = self.device.type == "cuda"
        if budget_bytes is None and rt is not None:
            si = rt.stage(stage)
            budget_bytes = si.capacity_bytes - si.static_bytes
        self.budget_bytes = budget_bytes
        if rt is not None:
            rt.acct_reset(stage, budget_bytes or 0)
        self.device_bytes = 0
        self.host_bytes = 0
        self.peak_bytes = 0
        self.mb_bytes = {}
        self.layers = {}  # (mb, layer) -> Layer, until its backward ends
        self.step = 0
        self.cur = None
        self.mb = None
        self.extras = []  # (mb, layer, shape, dtype, bytes, producer) of saved non-units
        self.log = [] if record else None
        self.stats = dict(decisions=0, kept=0, recomputed=0, offloaded=0, over_budget=0,
                          load_beyond=0, offloaded_bytes=0, recomputed_bytes=0,
                          resident_checks=0, saved_tensors=0, router_offloads=0, templated_restores=0,
                          group_fallback=0, group_offloads=0, group_slack=0, decide_s=0.0)
        self._params = set()
        self._free_fn = free_bytes_fn
        self._templates = {}  # template id -> unit indices of its reloads, in start order
        self._stream = torch.cuda.Stream(self.device) if self.cuda else None

    # ------------------------------------------------------------ scopes

    def watch_parameters(self, module):
        """Storages of module's parameters: saved as themselves, never units."""
        for p in module.parameters():
            self._params.add(storage_key(p))

    @contextlib.contextmanager
    def microbatch(self, mb):
        """The forward of micro-batch mb: saved-tensor hooks on."""
        prev = self.mb
        self.mb = mb
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                yield self
        finally:
            self.mb = prev

    @contextlib.contextmanager
    def layer(self, layer, x=None):
        """The forward of model layer `layer` for the current micro-batch
        (a name instead of a number, e.g. "head": a scope of fixed
        activations outside the planned layers, always kept).
        x, if given, is the layer input, registered as the unit "ln1.in"
        (never recomputed); when it requires grad, the layer's units are
        released as soon as its gradient is computed. Leaving the block
        carries the plan out."""
        if self.mb is None:
            raise RuntimeError("Manager.layer outside Manager.microbatch")
        L = Layer(self, self.mb, layer)
        L.fixed = not isinstance(layer, int)
        prev = self.cur
        self.cur = L
        self.layers[(self.mb, layer)] = L
        if x is not None:
            self._register(L, "ln1.in", x, None, None, False)
            L.input_unit = L.units["ln1.in"]
            if x.requires_grad:
                self._on_grad(x, 0, (self.mb, layer))
        ok = False
        try:
            yield L
            ok = True
        finally:
            self.cur = prev
            if ok:
                self._finish_layer(L)

    def output(self, y):
        """Marks y as the current layer's output: when its gradient arrives
        (the layer's backward starts) the layer's offloaded units are
        reloaded (in the plan's template's order); dropped ones are
        recomputed where the backward first needs them."""
        if y.requires_grad:
            self._on_grad(y, 1, self.cur)
        return y

    def _on_grad(self, t, kind, arg):
        """When t's gradient is computed: first the layers whose input t is
        are released (their backward is done), then the layer whose output
        t is is restored (its backward starts), so the two never overlap."""
        acts = getattr(t, "_kiln_on_grad", None)
        if acts is None:
            acts = ([], [])
            t._kiln_on_grad = acts
            t.register_hook(lambda g, acts=acts: self._fire(acts))
        acts[kind].append(arg)

    def _fire(self, acts):
        releases, restores = acts
        for mb, layer in releases:
            self._release_layer(mb, layer)
        for L in restores:
            self._restore_layer(L)

    def end_backward(self, mb):
        """Micro-batch mb's backward is done: releases what it still holds."""
        for key in [k for k in self.layers if k[0] == mb]:
            self._release_layer(*key)

    def check_empty(self):
        """Raises when any activation byte is still accounted (after a step)."""
        if self.device_bytes or self.host_bytes or self.layers:
            raise RuntimeError("kiln.torch: %d device and %d host bytes still held by %d "
                               "layer scopes" % (self.device_bytes, self.host_bytes,
                                                 len(self.layers)))
        if self.rt is not None:
            a = self.rt.acct()
            if a.device_bytes or a.host_bytes:
                raise RuntimeError("kiln accounting holds %d device and %d host bytes after "
                                   "the step" % (a.device_bytes, a.host_bytes))

    # ------------------------------------------------------------ accounting

    def _acct(self, mb, event, nbytes):
        if self.rt is not None:
            self.rt.acct_record(mb, event, nbytes)

    def _charge(self, u, event, why=""):
        """u's bytes arrive on the device (produced or reloaded): the budget check."""
        held = self.device_bytes
        if self.budget_bytes is not None and held + u.nbytes > self.budget_bytes:
            why = " (%s)" % why if why else ""
            where = ("layer %d " % u.layer if isinstance(u.layer, int) else
                     "%s " % u.layer if u.layer is not None else "")
            raise OutOfMemory(
                "out of memory: step %d micro-batch %d %s%s%s needs %d bytes; the activation "
                "budget holds %d of its %d bytes (stage %d, policy %s)" % (
                    self.step, u.mb, where, u.name, why, u.nbytes, held, self.budget_bytes,
                    self.stage, self.policy), u.name, u.nbytes, held, self.budget_bytes)
        self.device_bytes += u.nbytes
        self.mb_bytes[u.mb] = self.mb_bytes.get(u.mb, 0) + u.nbytes
        self.peak_bytes = max(self.peak_bytes, self.device_bytes)
        self._acct(u.mb, event, u.nbytes)

    def _discharge(self, u, event):
        self.device_bytes -= u.nbytes
        self.mb_bytes[u.mb] -= u.nbytes
        self._acct(u.mb, event, u.nbytes)

    def free_bytes(self):
        """Device bytes free for activations now: from the CUDA caching
        allocator (free device memory plus what it caches unused, capped by
        the budget's remainder) on CUDA, otherwise from kiln's accounting."""
        if self._free_fn is not None:
            return int(self._free_fn())
        if self.cuda:
            free, _ = torch.cuda.mem_get_info(self.device)
            cached = (torch.cuda.memory_reserved(self.device) -
                      torch.cuda.memory_allocated(self.device))
            f = free + cached
            if self.budget_bytes is not None:
                f = min(f, max(self.budget_bytes - self.device_bytes, 0))
            return f
        if self.rt is not None:
            return self.rt.free_bytes()
        return max((self.budget_bytes or 0) - self.device_bytes, 0)

    # ------------------------------------------------------------ units

    def _unit_of(self, L, t):
        """The held unit of L whose storage t is (empty tensors, which all
        share data_ptr 0, only by identity)."""
        if not isinstance(t, torch.Tensor):
            return None
        for u in L.units.values():
            if u.tensor is t:
                return u
        if storage_bytes(t) == 0:
            return None
        k = storage_key(t)
        for u in L.units.values():
            if u.key == k and u.state == "held" and u.nbytes:
                return u
        return None

    def _register(self, L, name, tensor, recipe, out_index, fixed):
        if name in L.units:
            raise ValueError("unit %s registered twice in layer %s" % (name, L.layer))
        index = None
        if self.rt is not None and not L.fixed:
            index = self.rt.unit_index(L.layer, name)
        u = _Unit(name, index, L.mb, L.layer, tensor, recipe, out_index, fixed or L.fixed)
        L.units[name] = u
        self._charge(u, "produced")
        return tensor

    def _decide(self, L, tokens, pending, fixed_after, group_rows=None):
        t0 = time.perf_counter()
        counts = tokens.tolist() if hasattr(tokens, "tolist") else list(tokens)
        L.rows = int(sum(counts))
        if self.policy == "keep":
            L.plan = None
            self.stats["decide_s"] += time.perf_counter() - t0
            return None
        if self.policy == "mixed":
            L.plan = None
            self.stats["decide_s"] += time.perf_counter() - t0
            return None
        made = sum(u.nbytes for u in L.units.values())
        # kiln's accounting, fed every event, must agree with the manager.
        acct = self.rt.acct()
        if acct.device_bytes != self.device_bytes or acct.host_bytes != self.host_bytes:
            raise RuntimeError("kiln.torch: internal error: kiln's accounting holds %d device "
                               "and %d host bytes, the manager %d and %d" % (
                                   acct.device_bytes, acct.host_bytes, self.device_bytes,
                                   self.host_bytes))
        if self.cuda or self._free_fn is not None:
            free = self.free_bytes() + made
        else:
            free = acct.free_bytes + made
        free = free - fixed_after if free > fixed_after else 0
        held = self.mb_bytes.get(L.mb, 0) - made + fixed_after
        plan = self.rt.select(self.stage, L.layer, counts, free, pending=pending,
                              microbatch=L.mb, held_bytes=max(held, 0), group_rows=group_rows)
        L.plan = plan
        self.stats["decisions"] += 1
        self.stats["over_budget"] += plan.over_budget
        self.stats["load_beyond"] += plan.load_beyond
        self.stats["group_fallback"] += plan.group_fallback
        self.stats["group_slack"] += plan.group_slack
        self.stats["decide_s"] += time.perf_counter() - t0
        return plan

    def _action(self, L, u, i):
        if self.policy == "keep" or u.fixed:
            return KEEP
        if self.policy == "mixed":
            a = (i + L.mb + L.layer + self.step) % 3
            if a == RECOMPUTE and (u.recipe is None or u.router):
                a = OFFLOAD
            return a
        if L.plan is None:
            return KEEP
        a = L.plan.action_codes[u.index]
        if a == RECOMPUTE and u.router:
            self.stats["router_offloads"] += 1
            return OFFLOAD
        if a == RECOMPUTE and u.recipe is None and L.plan.group_fallback:
            # The group's plan may re-run the layer's collectives (full
            # recompute's does, on the whole group); a unit only a
            # collective rebuilds and that has no recipe (registered, not
            # produced with collective=True) is
            # offloaded instead: the same device bytes saved, alike on every
            # rank of the group.
            self.stats["group_offloads"] += 1
            return OFFLOAD
        if a == RECOMPUTE and u.collective and not L.plan.group_fallback:
            raise RuntimeError("plan %d recomputes %s at layer %d, a collective's output, "
                               "outside the group's fallback (one rank alone would run "
                               "the collective)" % (L.plan.plan, u.name, L.layer))
        if a == RECOMPUTE and u.recipe is None:
            raise RuntimeError("plan %d recomputes %s at layer %d, which has no recipe (a "
                               "layer input or a collective's output)" % (
                                   L.plan.plan, u.name, L.layer))
        return a

    # ------------------------------------------------------------ hooks

    def _pack(self, t):
        self.stats["saved_tensors"] += 1
        s = _Saved(t)
        L = self.cur
        if L is not None:
            L.saved.append(s)
        return s

    def _unpack(self, s):
        if s.unit is None:
            return s.tensor
        base = s.unit.get(self)
        if s.view is None:
            return base
        size, stride, offset = s.view
        return base.as_strided(size, stride, base.storage_offset() + offset)

    # ------------------------------------------------------------ carrying out

    def _finish_layer(self, L):
        """End of the layer's forward: binds what was saved to units, logs,
        carries the plan out."""
        by_key = {}
        for u in L.units.values():
            if u.nbytes:
                by_key.setdefault(u.key, u)
        seen = {}
        for s in L.saved:
            t = s.tensor
            k = storage_key(t)
            if not storage_bytes(t):
                s.view = None  # nothing saved (an empty slice): kept as it is
                continue
            u = by_key.get(k)
            if u is None:
                if k not in self._params and not isinstance(t, torch.nn.Parameter):
                    fn = type(t.grad_fn).__name__ if t.grad_fn is not None else None
                    self.extras.append((L.mb, L.layer, tuple(t.shape), str(t.dtype),
                                        storage_bytes(t), fn))
                continue
            ut = u.tensor
            if (t.shape == ut.shape and t.stride() == ut.stride() and
                    t.storage_offset() == ut.storage_offset()):
                s.view = None
            else:
                s.view = (tuple(t.shape), tuple(t.stride()),
                          t.storage_offset() - ut.storage_offset())
            s.unit = u
            s.tensor = None
            seen[u.name] = u
        L.saved = None
        if L.fixed:
            return
        for i, u in enumerate(L.units.values()):
            u.action = self._action(L, u, i)
        if self.log is not None:
            for u in L.units.values():
                self.log.append((self.step, L.mb, L.layer, u.index, u.name, L.rows, u.nbytes,
                                 u.name in seen, u.action))
        offloads = []
        for u in L.units.values():
            if u.action == RECOMPUTE:
                self.stats["recomputed"] += 1
                self.stats["recomputed_bytes"] += u.nbytes
                u.tensor = None
                u.state = "dropped"
                self._discharge(u, "freed")
            elif u.action == OFFLOAD:
                self.stats["offloaded"] += 1
                self.stats["offloaded_bytes"] += u.nbytes
                offloads.append(u)
            else:
                self.stats["kept"] += 1
        for u in offloads:
            self._offload(u)
        # The bound holds without OVER_BUDGET, LOAD_BEYOND and GROUP_FALLBACK;
        # GROUP_SLACK (step 8) only saves more.
        if self.policy == "kiln" and L.plan is not None and \
                not (L.plan.flags & ~PLAN_GROUP_SLACK):
            kept = sum(u.nbytes for u in L.units.values() if u.state == "held")
            if kept > L.plan.resident_bytes:
                raise RuntimeError("kiln.torch: layer %d keeps %d bytes, above the %d "
                                   "kiln_rt_select promised" % (L.layer, kept,
                                                                L.plan.resident_bytes))
            self.stats["resident_checks"] += 1

    def _offload(self, u):
        t = u.tensor
        if self.cuda:
            host = torch.empty(t.storage().size(), dtype=t.dtype, pin_memory=True)
            flat = t.new_empty(0).set_(t.storage())
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self._stream):
                host.copy_(flat, non_blocking=True)
            t.record_stream(self._stream)
        else:
            flat = t.new_empty(0).set_(t.storage())
            host = flat.clone()
        u.host = (host, tuple(t.shape), tuple(t.stride()), t.storage_offset())
        u.tensor = None
        u.state = "offloaded"
        self._discharge(u, "offloaded")
        self.host_bytes += u.nbytes

    def _restore_unit(self, u):
        if u.state == "offloaded":
            host, shape, stride, offset = u.host
            self._charge(u, "reloaded", "reload")
            if self.cuda:
                # On the side stream, after the compute stream's work so far
                # (the block may have been that stream's); the compute stream
                # waits for it only where a backward op unpacks the unit.
                # The offload's copy came earlier on the same stream.
                flat = torch.empty(host.numel(), dtype=host.dtype, device=self.device)
                self._stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(self._stream):
                    flat.copy_(host, non_blocking=True)
                    ev = torch.cuda.Event()
                    ev.record(self._stream)
                flat.record_stream(self._stream)
                u.event = ev
            else:
                flat = host.clone()
            u.tensor = flat.as_strided(shape, stride, offset)
            u.host = None
            self.host_bytes -= u.nbytes
            u.state = "held"
        elif u.state == "dropped":
            r = u.recipe
            out = r.cache
            if out is None:
                out = r.run(self)
            t = out[u.out_index] if u.out_index is not None else out
            if storage_bytes(t) != u.nbytes:
                raise RuntimeError("kiln.torch: recompute of %s made %d bytes, the forward "
                                   "%d" % (u.name, storage_bytes(t), u.nbytes))
            self._charge(u, "produced", "recompute")
            u.tensor = t
            u.state = "held"
            # Another unit of the same op still waiting keeps the result, so
            # that the op runs once.
            others = [v for v in self.layers.get((u.mb, u.layer), Layer(self, 0, 0)).units
                      .values() if v.recipe is r and v.state == "dropped"]
            r.cache = out if others else None
        elif u.state == "released":
            raise RuntimeError("kiln.torch: %s of layer %s used after its backward" % (
                u.name, u.layer))

    def _restore_layer(self, L):
        """The layer's backward starts: every offloaded unit is reloaded, in
        the order of the plan's template (its reload tasks, in start order:
        they overlap the other micro-batch's work there), the rest in unit
        order. Dropped units are recomputed where the backward first unpacks
        them, which is where the template places recomputes: just before the
        backward chunk that reads them, so their bytes arrive last; a
        collective's output (produce(collective=True)) right here instead."""
        order = []
        plan = L.plan
        if plan is not None and plan.template_id >= 0 and self.rt is not None:
            order = self._templates.get(plan.template_id)
            if order is None:
                t = self.rt.template(plan.template_id)
                order = [k.unit for k in t.tasks if k.chain == 1 and k.unit >= 0 and
                         k.kind_name == "copy"]
                self._templates[plan.template_id] = order
            self.stats["templated_restores"] += 1
        by_index = {u.index: u for u in L.units.values()}
        for i in order:
            u = by_index.get(i)
            if u is not None and u.state == "offloaded":
                self._restore_unit(u)
        for u in L.units.values():
            if u.state == "offloaded":
                self._restore_unit(u)
        # A collective's output is recomputed here, not where the backward
        # first unpacks it: every rank of the group must run the collective
        # at the same point, also a rank whose share is empty (no saved
        # tensor of it is ever unpacked there).
        for u in L.units.values():
            if u.collective and u.state == "dropped":
                self._restore_unit(u)

    def _release_layer(self, mb, layer):
        L = self.layers.pop((mb, layer), None)
        if L is None:
            return
        for u in L.units.values():
            if u.state == "held":
                self._discharge(u, "freed")
            elif u.state == "offloaded":
                self.host_bytes -= u.nbytes
                self._acct(u.mb, "dropped", u.nbytes)
            u.tensor = None
            u.host = None
            u.state = "released"
            if u.recipe is not None:
                u.recipe.cache = None
