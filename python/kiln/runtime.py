"""kiln.runtime: the kiln runtime (libkiln_rt) from Python, through ctypes.

Standard library only (no torch, no numpy): token counts are taken as a
list of ints or anything with a .tolist() (a torch or numpy array). Every
failing C call raises KilnError with the runtime's kiln_rt_strerror text and
its code. docs/python.md is the reference; include/kiln/runtime.h and
docs/runtime.md the C contract this mirrors.

The library is found, in order: the path in KILN_RT_LIBRARY; the one
installed with this package (kiln/_native/libkiln_rt.so.0, copied there by
`pip install ./python`; or the install prefix's, which `cmake --install`
records in kiln/_install.py); the loader's search path
(ctypes.util.find_library("kiln_rt"), then "libkiln_rt.so.0").
"""

import ctypes
import ctypes.util
import collections.abc
import os
import types

__all__ = [
    "KilnError", "Runtime", "Plan", "CopyEngine", "probe", "strerror", "library_path",
    "KEEP", "RECOMPUTE", "OFFLOAD", "ACTIONS",
    "UNIT_LAYER_INPUT", "UNIT_COLLECTIVE", "UNIT_RNG", "UNIT_EXPERT",
    "PLAN_OVER_BUDGET", "PLAN_LOAD_BEYOND", "PLAN_GROUP_FALLBACK", "PLAN_GROUP_SLACK",
    "FREE_FROM_ACCOUNTING",
    "ACCT_PRODUCED", "ACCT_FREED", "ACCT_OFFLOADED", "ACCT_RELOADED", "ACCT_DROPPED",
    "COPY_HOST", "COPY_HIP", "COPY_CUDA",
]

# ---------------------------------------------------------------- constants (runtime.h)

OK, EINVAL, ENOMEM, EIO, EMAGIC, EVERSION, ETRUNC, ECRC, ECORRUPT, ERANGE, EACCT = (
    0, -1, -2, -3, -4, -5, -6, -7, -8, -9, -10)
EUNAVAILABLE, ENODEVICE, EBACKEND, ENOSPC, ESTATE = -11, -12, -13, -14, -15

KEEP, RECOMPUTE, OFFLOAD = 0, 1, 2
ACTIONS = ("keep", "recompute", "offload")

UNIT_LAYER_INPUT, UNIT_COLLECTIVE, UNIT_RNG, UNIT_EXPERT = 1, 2, 4, 8
PLAN_OVER_BUDGET, PLAN_LOAD_BEYOND, PLAN_GROUP_FALLBACK, PLAN_GROUP_SLACK = 1, 2, 4, 8
FREE_FROM_ACCOUNTING = 2**64 - 1

ACCT_PRODUCED, ACCT_FREED, ACCT_OFFLOADED, ACCT_RELOADED, ACCT_DROPPED = 0, 1, 2, 3, 4
_ACCT_EVENTS = {"produced": 0, "freed": 1, "offloaded": 2, "reloaded": 3, "dropped": 4}

COPY_HOST, COPY_HIP, COPY_CUDA = 0, 1, 2
_BACKENDS = {"host": COPY_HOST, "hip": COPY_HIP, "cuda": COPY_CUDA}

STREAMS = ("compute", "comm", "d2h", "h2d")
TASK_KINDS = ("forward", "backward", "recompute", "copy", "comm")

_U64_MAX = 2**64 - 1
_U32_MAX = 2**32 - 1
_I32_MAX = 2**31 - 1

# ---------------------------------------------------------------- struct mirrors

_c = ctypes
_u64, _u32, _i32, _int, _dbl, _flt = _c.c_uint64, _c.c_uint32, _c.c_int32, _c.c_int, _c.c_double, _c.c_float


class _Info(_c.Structure):
    _fields_ = [("model", _c.c_char_p), ("compiler", _c.c_char_p), ("model_hash", _u64),
                ("major", _int), ("minor", _int), ("n_stages", _i32), ("n_layers", _i32),
                ("n_model_layers", _i32), ("n_buckets", _i32), ("max_factor", _dbl),
                ("blob_bytes", _c.c_size_t)]


class _StageInfo(_c.Structure):
    _fields_ = [("capacity_bytes", _u64), ("static_bytes", _u64), ("fixed_bytes", _u64),
                ("budget_bytes", _u64), ("steady_bytes", _u64), ("floor_bytes", _u64),
                ("transient_bytes", _u64), ("inflight", _dbl), ("safety_factor", _dbl),
                ("n_layers", _i32)]


class _LayerInfo(_c.Structure):
    _fields_ = [("model_layer", _i32), ("stage", _i32), ("position", _i32), ("moe", _int),
                ("n_units", _i32), ("balanced_rows", _u64), ("tail_floor_bytes", _u64),
                ("head_steady_bytes", _u64), ("steady_bytes", _u64), ("steady_keep_bytes", _u64)]


class _GroupInfo(_c.Structure):
    _fields_ = [("plan", _i32), ("fit_rows", _u64), ("resident_base_bytes", _u64),
                ("resident_per_row_bytes", _u64), ("saved_base_bytes", _u64),
                ("saved_per_row_bytes", _u64), ("transient_base_bytes", _u64),
                ("transient_per_row_bytes", _u64), ("exposed_base_us", _dbl),
                ("exposed_per_row_us", _dbl)]


class _UnitInfo(_c.Structure):
    _fields_ = [("name", _c.c_char_p), ("flags", _u32), ("base_bytes", _u64),
                ("per_row_bytes", _u64)]


class _TableInfo(_c.Structure):
    _fields_ = [("load_factor", _dbl), ("max_rows", _u64), ("quantum_bytes", _u64),
                ("keep_bytes", _u64), ("n_points", _i32)]


class _Point(_c.Structure):
    _fields_ = [("saved_bytes", _u64), ("exposed_us", _flt), ("plan", _i32)]


class _Query(_c.Structure):
    _fields_ = [("stage", _i32), ("layer", _i32), ("tokens", _c.POINTER(_u32)),
                ("n_tokens", _i32), ("total_rows", _u64), ("free_bytes", _u64),
                ("pending", _u32), ("microbatch", _u32), ("held_bytes", _u64),
                ("group_rows", _c.POINTER(_u32)), ("group_size", _i32)]


class _Plan(_c.Structure):
    _fields_ = [("actions", _c.POINTER(_c.c_uint8)), ("n_units", _i32), ("plan", _i32),
                ("template_id", _i32), ("bucket", _i32), ("load_factor", _dbl),
                ("need_bytes", _u64), ("saved_bytes", _u64), ("resident_bytes", _u64),
                ("avail_bytes", _u64), ("exposed_us", _flt), ("flags", _u32),
                ("transient_bytes", _u64), ("group_max_rows", _u64)]


class _TemplateInfo(_c.Structure):
    _fields_ = [("plan", _i32), ("n_tasks", _i32), ("n_deps", _i32), ("makespan_us", _flt),
                ("serial_us", _flt), ("base_us", _flt), ("load_factor", _flt)]


class _Task(_c.Structure):
    _fields_ = [("name", _c.c_char_p), ("stream", _int), ("kind", _int), ("chain", _int),
                ("unit", _i32)]


class _Acct(_c.Structure):
    _fields_ = [("limit_bytes", _u64), ("device_bytes", _u64), ("host_bytes", _u64),
                ("peak_device_bytes", _u64), ("open_microbatches", _u32), ("free_bytes", _u64)]


class _CopyConfig(_c.Structure):
    _fields_ = [("backend", _int), ("pool_bytes", _c.c_size_t), ("max_buffers", _u32),
                ("device", _int), ("library", _c.c_char_p)]


class _ProbeReport(_c.Structure):
    _fields_ = [("library", _c.c_char_p), ("n_required", _i32), ("n_optional", _i32),
                ("n_resolved", _i32), ("missing", _c.c_char_p), ("devices", _i32),
                ("status", _int)]


# The C structs each Python mirror stands for; tests/python/layout.c prints
# their sizes and offsets and python/tests/test_layout.py compares.
STRUCTS = {
    "kiln_rt_info": _Info, "kiln_rt_stage_info": _StageInfo, "kiln_rt_layer_info": _LayerInfo,
    "kiln_rt_unit_info": _UnitInfo, "kiln_rt_table_info": _TableInfo, "kiln_rt_point": _Point,
    "kiln_query": _Query, "kiln_plan": _Plan, "kiln_rt_template_info": _TemplateInfo,
    "kiln_rt_task": _Task, "kiln_acct": _Acct, "kiln_copy_config": _CopyConfig,
    "kiln_copy_probe_report": _ProbeReport, "kiln_rt_group_info": _GroupInfo,
}

# ---------------------------------------------------------------- the library

_P = _c.POINTER


def _signatures(lib):
    vp = _c.c_void_p
    sig = {
        "kiln_rt_strerror": (_c.c_char_p, [_int]),
        "kiln_rt_open": (_int, [vp, _c.c_size_t, _P(vp)]),
        "kiln_rt_open_file": (_int, [_c.c_char_p, _P(vp)]),
        "kiln_rt_close": (None, [vp]),
        "kiln_rt_info_get": (None, [vp, _P(_Info)]),
        "kiln_rt_stage_get": (_int, [vp, _i32, _P(_StageInfo)]),
        "kiln_rt_layer_get": (_int, [vp, _i32, _P(_LayerInfo)]),
        "kiln_rt_unit_get": (_int, [vp, _i32, _i32, _P(_UnitInfo)]),
        "kiln_rt_unit_bytes": (_u64, [vp, _i32, _i32, _u64]),
        "kiln_rt_table_get": (_int, [vp, _i32, _i32, _P(_TableInfo)]),
        "kiln_rt_point_get": (_int, [vp, _i32, _i32, _i32, _P(_Point)]),
        "kiln_rt_plan_get": (_int, [vp, _i32, _P(_P(_c.c_uint8)), _P(_i32), _P(_i32)]),
        "kiln_rt_group_get": (_int, [vp, _i32, _P(_GroupInfo)]),
        "kiln_rt_plan_count": (_i32, [vp]),
        "kiln_rt_template_count": (_i32, [vp]),
        "kiln_rt_select": (_int, [vp, _P(_Query), _P(_Plan)]),
        "kiln_rt_template_get": (_int, [vp, _i32, _P(_TemplateInfo)]),
        "kiln_rt_template_task": (_int, [vp, _i32, _i32, _P(_Task)]),
        "kiln_rt_template_dep": (_int, [vp, _i32, _i32, _P(_i32), _P(_i32)]),
        "kiln_rt_acct_reset": (_int, [vp, _i32, _u64]),
        "kiln_rt_acct_record": (_int, [vp, _u32, _int, _u64]),
        "kiln_rt_acct_get": (None, [vp, _P(_Acct)]),
        "kiln_copy_open": (_int, [_P(_CopyConfig), _P(vp)]),
        "kiln_copy_offload": (_int, [vp, vp, _c.c_size_t, _P(_u32), _P(_u64)]),
        "kiln_copy_reload": (_int, [vp, _u32, vp, _P(_u64)]),
        "kiln_copy_drop": (_int, [vp, _u32]),
        "kiln_copy_query": (_int, [vp, _u64]),
        "kiln_copy_wait": (_int, [vp, _u64]),
        "kiln_copy_close": (None, [vp]),
        "kiln_copy_probe": (_int, [_int, _c.c_char_p, _P(_ProbeReport)]),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args


_lib = None
_lib_path = None


def _candidates():
    env = os.environ.get("KILN_RT_LIBRARY")
    if env:
        return [env], True
    pkg = os.path.dirname(os.path.abspath(__file__))
    out = []
    here = os.path.join(pkg, "_native", "libkiln_rt.so.0")  # pip install ./python
    if os.path.exists(here):
        out.append(here)
    try:
        from . import _install  # cmake --install: the prefix's library directory
        installed = os.path.normpath(os.path.join(pkg, _install.LIBRARY))
        if os.path.exists(installed):
            out.append(installed)
    except ImportError:
        pass
    found = ctypes.util.find_library("kiln_rt")
    if found:
        out.append(found)
    out.append("libkiln_rt.so.0")
    return out, False


def _load():
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    names, from_env = _candidates()
    errors = []
    for name in names:
        try:
            lib = ctypes.CDLL(name)
        except OSError as e:
            errors.append("%s: %s" % (name, e))
            continue
        try:
            _signatures(lib)
        except AttributeError as e:
            errors.append("%s: not kiln's runtime library (%s)" % (name, e))
            continue
        _lib, _lib_path = lib, name
        return lib
    where = ("KILN_RT_LIBRARY=%s" % names[0]) if from_env else \
        "beside the package (kiln/_native, kiln/_install.py) or on the loader's search path"
    raise OSError("kiln: cannot load libkiln_rt from %s: %s (set KILN_RT_LIBRARY to the "
                  "path of libkiln_rt.so, e.g. build/libkiln_rt.so)" % (where, "; ".join(errors)))


def library_path():
    """The name or path libkiln_rt was loaded from (loading it if needed)."""
    _load()
    return _lib_path


def strerror(code):
    """kiln_rt_strerror's text for code, a 32-bit int (the C parameter's
    type): ValueError beyond it, TypeError for a non-int or a bool."""
    return _load().kiln_rt_strerror(_sint(code, "code")).decode()


class KilnError(Exception):
    """A kiln runtime call failed: .code is its KILN_RT_E* code (negative),
    .text kiln_rt_strerror's text, .call the C function's name."""

    def __init__(self, code, call, detail=None):
        self.code = code
        self.text = strerror(code)
        self.call = call
        msg = "%s: %s" % (call, self.text)
        if detail:
            msg = "%s: %s" % (detail, msg)
        super().__init__(msg)


def _check(rc, call, detail=None):
    if rc < 0:
        raise KilnError(rc, call, detail)
    return rc


def _uint(value, what, top=_U64_MAX):
    if isinstance(value, bool):
        raise TypeError("%s must be an int, not bool" % what)
    if not isinstance(value, int):
        if hasattr(value, "__index__"):
            value = value.__index__()
        else:
            raise TypeError("%s must be an int, not %s" % (what, type(value).__name__))
    if value < 0 or value > top:
        raise ValueError("%s must lie in [0, %d], got %d" % (what, top, value))
    return value


def _sint(value, what):
    if isinstance(value, bool):
        raise TypeError("%s must be an int, not bool" % what)
    if not isinstance(value, int):
        if hasattr(value, "__index__"):
            value = value.__index__()
        else:
            raise TypeError("%s must be an int, not %s" % (what, type(value).__name__))
    if value < -2**31 or value > _I32_MAX:
        raise ValueError("%s must be a 32-bit int, got %d" % (what, value))
    return value


def _fields(s):
    return {k: getattr(s, k) for k, _ in s._fields_}


class _Record(types.SimpleNamespace):
    """A plain record of a C struct's fields (names decoded to str)."""


def _record(s, **extra):
    d = _fields(s)
    for k, v in d.items():
        if isinstance(v, bytes):
            d[k] = v.decode("utf-8", "replace")
    d.update(extra)
    return _Record(**d)


# ---------------------------------------------------------------- the plan

class Plan:
    """One kiln_rt_select decision.

    actions: {unit name: "keep" | "recompute" | "offload"}, in unit order
    (read-only); action_codes: the same as a tuple of KEEP / RECOMPUTE /
    OFFLOAD per unit index; units: the unit names. plan, template_id,
    bucket, load_factor, need_bytes, saved_bytes, resident_bytes,
    avail_bytes, exposed_us, flags, transient_bytes, group_max_rows as in
    kiln_plan; over_budget, load_beyond and group_fallback test the flags.
    rows: the rows the decision was taken at."""

    __slots__ = ("_p", "stage", "layer", "rows", "units", "action_codes", "actions")

    plan = property(lambda self: self._p.plan, doc="plan pool index")
    template_id = property(lambda self: self._p.template_id,
                           doc="template to follow (Runtime.template), or -1")
    bucket = property(lambda self: self._p.bucket, doc="the load bucket used")
    load_factor = property(lambda self: self._p.load_factor,
                           doc="observed: rows / balanced rows (0 for dense layers)")
    need_bytes = property(lambda self: self._p.need_bytes, doc="bytes the layer had to save")
    saved_bytes = property(lambda self: self._p.saved_bytes,
                           doc="bytes the plan saves (at least), at the bucket's upper edge")
    resident_bytes = property(lambda self: self._p.resident_bytes,
                              doc="bytes the plan keeps (at most), at the bucket's upper edge")
    avail_bytes = property(lambda self: self._p.avail_bytes,
                           doc="free bytes minus the reserve for later work")
    exposed_us = property(lambda self: self._p.exposed_us,
                          doc="estimated extra time on the critical path, microseconds")
    flags = property(lambda self: self._p.flags,
                     doc="PLAN_OVER_BUDGET | PLAN_LOAD_BEYOND | PLAN_GROUP_FALLBACK"
                         " | PLAN_GROUP_SLACK")
    transient_bytes = property(lambda self: self._p.transient_bytes,
                               doc="the group plan's backward transient (else 0)")
    group_max_rows = property(lambda self: self._p.group_max_rows,
                              doc="the most rows of any rank of the group (0 without counts)")

    @property
    def over_budget(self):
        return bool(self.flags & PLAN_OVER_BUDGET)

    @property
    def load_beyond(self):
        return bool(self.flags & PLAN_LOAD_BEYOND)

    @property
    def group_fallback(self):
        return bool(self.flags & PLAN_GROUP_FALLBACK)

    @property
    def group_slack(self):
        return bool(self.flags & PLAN_GROUP_SLACK)

    def action(self, unit):
        """The action (a string) of unit, given by name or index."""
        if isinstance(unit, str):
            return self.actions[unit]
        return ACTIONS[self.action_codes[unit]]

    def units_with(self, action):
        """Names of the units whose action is action ("keep", "recompute", "offload")."""
        return [n for n, a in self.actions.items() if a == action]

    def __repr__(self):
        flags = "".join([" over_budget" if self.over_budget else "",
                         " load_beyond" if self.load_beyond else ""])
        return ("Plan(stage=%d, layer=%d, rows=%d, plan=%d, bucket=%d, saved_bytes=%d, "
                "resident_bytes=%d, exposed_us=%.3f%s, actions=%r)" % (
                    self.stage, self.layer, self.rows, self.plan, self.bucket,
                    self.saved_bytes, self.resident_bytes, self.exposed_us, flags,
                    dict(self.actions)))


def _sequence(values, what):
    """values (a sequence of ints, or anything with .tolist()) as a list;
    bytes-like, str, mappings and sets are a TypeError, not counts."""
    if isinstance(values, (bytes, bytearray, memoryview, str, dict, set, frozenset)) or \
            isinstance(values, collections.abc.Mapping):
        raise TypeError("%s must be a sequence of ints (list, tuple, array, .tolist()), "
                        "not %s" % (what, type(values).__name__))
    if hasattr(values, "tolist"):
        values = values.tolist()
    if not isinstance(values, (list, tuple)):
        values = list(values)
    return values


def _counts(tokens):
    """tokens per local expert as a list of ints (list, tuple, .tolist())."""
    tokens = _sequence(tokens, "tokens_per_expert")
    if tokens and isinstance(tokens[0], list):
        raise ValueError("tokens_per_expert must be one-dimensional (one count per local expert)")
    return tokens


# ctypes array types of n counts, made once each; an empty count list
# passes a valid pointer with n_tokens 0 (not NULL, which means total_rows).
_ARRAYS = {}
_EMPTY = (_c.c_uint32 * 1)()

# ---------------------------------------------------------------- the handle

class _Closing:
    """A handle released by close(): a context manager, closed when
    collected too."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class Runtime(_Closing):
    """A handle over a compiled plan blob (kilnc compile -o PLAN.kiln).

    Runtime(path) maps and validates the blob (kiln_rt_open_file);
    Runtime.from_bytes(data) validates a copy held in memory. close() (or
    leaving a with block) releases it; every other method then raises
    ValueError. Getters, unit lookup and select are safe from many threads;
    accounting calls follow the C contract (docs/runtime.md)."""

    def __init__(self, path=None, _blob=None):
        lib = _load()
        self._lib = lib
        self._h = None
        self._blob = None
        h = _c.c_void_p()
        if _blob is not None:
            self._blob = _blob
            rc = lib.kiln_rt_open(_c.addressof(_blob[0]) + _blob[1], _blob[2], _c.byref(h))
            _check(rc, "kiln_rt_open", "blob of %d bytes" % _blob[2])
            self.path = None
        else:
            if path is None:
                raise TypeError("Runtime() needs the path of a plan blob")
            p = os.fsencode(path)
            if b"\0" in p:
                raise ValueError("Runtime(): embedded null byte in the path")
            rc = lib.kiln_rt_open_file(p, _c.byref(h))
            _check(rc, "kiln_rt_open_file", os.fsdecode(p))
            self.path = os.fsdecode(p)
        self._h = h
        info = _Info()
        lib.kiln_rt_info_get(h, _c.byref(info))
        self._info = _record(info)
        self._layers = {}
        self._units = {}
        self._names = {}
        self._index = {}
        self._plan_actions = {}
        self._select = lib.kiln_rt_select
        self._record = lib.kiln_rt_acct_record

    @classmethod
    def from_bytes(cls, data):
        """A handle over a copy of data (bytes-like), kept 8-byte aligned and alive."""
        mv = memoryview(data).cast("B")
        n = mv.nbytes
        buf = (_c.c_uint8 * (n + 8))()
        off = (-_c.addressof(buf)) % 8
        _c.memmove(_c.addressof(buf) + off, bytes(mv), n)
        return cls(_blob=(buf, off, n))

    # -- lifetime

    def close(self):
        """Releases the handle (kiln_rt_close); safe to call twice."""
        if self._h is not None:
            self._lib.kiln_rt_close(self._h)
            self._h = None
            self._blob = None

    @property
    def closed(self):
        return self._h is None

    @property
    def info(self):
        """kiln_rt_info_get's record (read at open); ValueError once closed."""
        self._handle()
        return self._info

    def _handle(self):
        if self._h is None:
            raise ValueError("kiln.runtime.Runtime: the handle is closed")
        return self._h

    # -- blob facts

    def stage(self, stage):
        """kiln_rt_stage_get: the stage's capacity, static, fixed, budget,
        steady, floor and transient bytes, inflight, safety_factor, n_layers."""
        s = _StageInfo()
        _check(self._lib.kiln_rt_stage_get(self._handle(), _sint(stage, "stage"), _c.byref(s)),
               "kiln_rt_stage_get", "stage %d" % stage)
        return _record(s)

    def layer(self, layer):
        """kiln_rt_layer_get for a model layer number (cached)."""
        li = self._layers.get(layer)
        if li is None:
            s = _LayerInfo()
            _check(self._lib.kiln_rt_layer_get(self._handle(), _sint(layer, "layer"),
                                                 _c.byref(s)),
                   "kiln_rt_layer_get", "layer %d" % layer)
            li = _record(s, moe=bool(s.moe))
            self._layers[layer] = li
        else:
            self._handle()
        return li

    def group(self, layer):
        """kiln_rt_group_get: the layer's EP-group fallback (plan -1: none)."""
        g = _GroupInfo()
        _check(self._lib.kiln_rt_group_get(self._handle(), _sint(layer, "layer"), _c.byref(g)),
               "kiln_rt_group_get", "layer %d" % layer)
        return _record(g)

    def layers(self, stage=None):
        """Model layer numbers the blob plans (on stage, if given), ascending.
        A stage the blob does not have raises stage()'s KilnError (ERANGE)."""
        h = self._handle()
        if stage is not None:
            stage = _sint(stage, "stage")
            self.stage(stage)
        out = []
        s = _LayerInfo()
        for layer in range(self.info.n_model_layers):
            if self._lib.kiln_rt_layer_get(h, layer, _c.byref(s)) == OK:
                if stage is None or s.stage == stage:
                    out.append(layer)
        return out

    def units(self, layer):
        """The units of layer, in unit order: records with index, name,
        flags, base_bytes, per_row_bytes (cached)."""
        us = self._units.get(layer)
        if us is None:
            n = self.layer(layer).n_units
            ui = _UnitInfo()
            us = []
            for i in range(n):
                _check(self._lib.kiln_rt_unit_get(self._handle(), layer, i, _c.byref(ui)),
                       "kiln_rt_unit_get", "layer %d unit %d" % (layer, i))
                us.append(_record(ui, index=i))
            us = tuple(us)
            self._units[layer] = us
            self._names[layer] = tuple(u.name for u in us)
            self._index[layer] = {u.name: u.index for u in us}
        else:
            self._handle()
        return us

    def unit_names(self, layer):
        """The unit names of layer, in unit order (a tuple)."""
        if layer not in self._names:
            self.units(layer)
        return self._names[layer]

    def unit_index(self, layer, name):
        """The index of the unit called name in layer; KeyError naming the
        layer's units when there is none."""
        if layer not in self._index:
            self.units(layer)
        try:
            return self._index[layer][name]
        except KeyError:
            raise KeyError("layer %d has no unit %r; its units: %s" % (
                layer, name, ", ".join(self._names[layer]))) from None

    def unit(self, layer, unit):
        """One unit's record, by name or index (ERANGE as KilnError)."""
        if isinstance(unit, str):
            unit = self.unit_index(layer, unit)
        us = self.units(layer)
        if not 0 <= unit < len(us):
            raise KilnError(ERANGE, "kiln_rt_unit_get", "layer %d unit %d" % (layer, unit))
        return us[unit]

    def unit_bytes(self, layer, unit, rows):
        """kiln_rt_unit_bytes: the unit's exact bytes for one micro-batch at
        rows rows (base + per_row * rows, saturating); unit by name or index.
        A layer or unit out of range raises KilnError (ERANGE), where the C
        call returns 0."""
        if isinstance(unit, str):
            unit = self.unit_index(layer, unit)
        else:
            self.unit(layer, unit)
        return self._lib.kiln_rt_unit_bytes(self._handle(), layer, unit,
                                            _uint(rows, "rows"))

    def table(self, layer, bucket):
        """kiln_rt_table_get: load_factor, max_rows, quantum_bytes, keep_bytes, n_points."""
        t = _TableInfo()
        _check(self._lib.kiln_rt_table_get(self._handle(), _sint(layer, "layer"),
                                           _sint(bucket, "bucket"), _c.byref(t)),
               "kiln_rt_table_get", "layer %d bucket %d" % (layer, bucket))
        return _record(t)

    def point(self, layer, bucket, i):
        """kiln_rt_point_get: saved_bytes, exposed_us, plan."""
        p = _Point()
        _check(self._lib.kiln_rt_point_get(self._handle(), _sint(layer, "layer"),
                                           _sint(bucket, "bucket"), _sint(i, "point"),
                                           _c.byref(p)),
               "kiln_rt_point_get", "layer %d bucket %d point %d" % (layer, bucket, i))
        return _record(p)

    def plan_count(self):
        return self._lib.kiln_rt_plan_count(self._handle())

    def template_count(self):
        return self._lib.kiln_rt_template_count(self._handle())

    def plan(self, plan):
        """kiln_rt_plan_get: (action codes as a tuple, template index or -1)."""
        acts = _P(_c.c_uint8)()
        n = _i32()
        tpl = _i32()
        _check(self._lib.kiln_rt_plan_get(self._handle(), _sint(plan, "plan"), _c.byref(acts),
                                          _c.byref(n), _c.byref(tpl)),
               "kiln_rt_plan_get", "plan %d" % plan)
        return tuple(_c.string_at(acts, n.value)), tpl.value

    def template(self, template_id):
        """kiln_rt_template_get plus its tasks and deps: a record with plan,
        n_tasks, n_deps, makespan_us, serial_us, base_us, load_factor,
        tasks (records: name, stream, kind, chain, unit; stream and kind
        also as stream_name and kind_name) and deps ((task, dep) pairs)."""
        h = self._handle()
        ti = _TemplateInfo()
        t = _sint(template_id, "template")
        _check(self._lib.kiln_rt_template_get(h, t, _c.byref(ti)), "kiln_rt_template_get",
               "template %d" % template_id)
        tasks = []
        task = _Task()
        for i in range(ti.n_tasks):
            _check(self._lib.kiln_rt_template_task(h, t, i, _c.byref(task)),
                   "kiln_rt_template_task", "template %d task %d" % (template_id, i))
            tasks.append(_record(task, stream_name=STREAMS[task.stream]
                                 if 0 <= task.stream < len(STREAMS) else str(task.stream),
                                 kind_name=TASK_KINDS[task.kind]
                                 if 0 <= task.kind < len(TASK_KINDS) else str(task.kind)))
        deps = []
        a, b = _i32(), _i32()
        for j in range(ti.n_deps):
            _check(self._lib.kiln_rt_template_dep(h, t, j, _c.byref(a), _c.byref(b)),
                   "kiln_rt_template_dep", "template %d dep %d" % (template_id, j))
            deps.append((a.value, b.value))
        return _record(ti, tasks=tasks, deps=deps)

    # -- select

    def select(self, stage, layer, tokens_per_expert, free_bytes, pending=0, microbatch=0,
               held_bytes=0, group_rows=None):
        """One decision (kiln_rt_select) right after layer's MoE gate.

        tokens_per_expert: rows routed to each of this device's local
        experts: a list or tuple of ints, or anything with .tolist() (a
        1-D torch or numpy array of counts); an int is taken as their sum
        (total_rows). free_bytes: device bytes free now, or None for free
        memory from the accounting API (acct_reset first; pending then
        comes from accounting and held_bytes too). Returns a Plan; a C
        error raises KilnError, an argument of the wrong type or range
        TypeError or ValueError. group_rows (optional, blob 1.1): the rows
        every rank of this device's EP group receives at this layer, as the
        count exchange before the dispatch tells every rank (a sequence of
        ints, or anything with .tolist()); when some rank has more rows than
        the set's fit_rows (Runtime.group), every rank of the group gets
        the same group plan (Plan.group_fallback; docs/runtime.md,
        "Beyond the declared load"); otherwise a rank with fewer rows than
        the group's most may save more within the most loaded rank's
        exposed time (Plan.group_slack; docs/runtime.md, step 8). None:
        steps 1 to 7 alone. Thread-safe;
        about 3 us from a list of counts (docs/python.md)."""
        h = self._h
        if h is None:
            self._handle()
        q = _Query()
        # Fast paths for plain ints in range; anything else goes through
        # the checks that name the argument.
        if type(stage) is not int or not 0 <= stage <= _I32_MAX:
            stage = _sint(stage, "stage")
        if type(layer) is not int or not 0 <= layer <= _I32_MAX:
            layer = _sint(layer, "layer")
        q.stage = stage
        q.layer = layer
        t = tokens_per_expert
        if type(t) is not list:
            if type(t) is int:
                if not 0 <= t <= _U64_MAX:
                    _uint(t, "rows")
                t = None
            elif hasattr(t, "tolist") and not isinstance(t, memoryview):
                t = t.tolist()
            else:
                t = _counts(t)
            if t is not None and type(t) is not list:
                t = _counts(t)
        if t is None:
            rows = tokens_per_expert
            q.total_rows = rows
        else:
            n = len(t)
            if n:
                if n > (1 << 20):
                    raise KilnError(EINVAL, "kiln_rt_select", "%d local experts (at most 2^20)" % n)
                lo = min(t)
                hi = max(t)
                if type(lo) is not int or type(hi) is not int or lo < 0 or hi > _U32_MAX:
                    for i, c in enumerate(t):
                        _uint(c, "tokens_per_expert[%d]" % i, _U32_MAX)
                arr_t = _ARRAYS.get(n)
                if arr_t is None:
                    arr_t = _ARRAYS.setdefault(n, _u32 * n)
                try:
                    arr = arr_t(*t)
                except TypeError:
                    for i, c in enumerate(t):
                        _uint(c, "tokens_per_expert[%d]" % i, _U32_MAX)
                    raise
                q.tokens = arr
                q.n_tokens = n
                rows = sum(t)
            else:
                rows = 0
                q.tokens = _EMPTY
        if free_bytes is None:
            q.free_bytes = FREE_FROM_ACCOUNTING
        elif type(free_bytes) is int and 0 <= free_bytes <= _U64_MAX:
            q.free_bytes = free_bytes
        else:
            q.free_bytes = _uint(free_bytes, "free_bytes")
        if pending:
            q.pending = _uint(pending, "pending", _U32_MAX)
        if microbatch:
            q.microbatch = _uint(microbatch, "microbatch", _U32_MAX)
        if held_bytes:
            q.held_bytes = _uint(held_bytes, "held_bytes")
        if group_rows is not None:
            g = list(_sequence(group_rows, "group_rows"))
            if len(g) > (1 << 20):
                raise KilnError(EINVAL, "kiln_rt_select", "a group of %d ranks (at most 2^20)" % len(g))
            g = [_uint(c, "group_rows[%d]" % i, _U32_MAX) for i, c in enumerate(g)]
            garr = (_u32 * max(len(g), 1))(*g)
            q.group_rows = garr
            q.group_size = len(g)
        p = _Plan()
        rc = self._select(h, q, p)
        if rc < 0:
            raise KilnError(rc, "kiln_rt_select", "stage %d layer %d" % (stage, layer))
        out = Plan.__new__(Plan)
        out._p = p
        out.stage = stage
        out.layer = layer
        out.rows = rows
        cached = self._plan_actions.get((layer, p.plan))
        if cached is None:
            codes = tuple(_c.string_at(p.actions, p.n_units))
            names = self.unit_names(layer)
            cached = (codes, types.MappingProxyType(
                {names[i]: ACTIONS[a] for i, a in enumerate(codes)}), names)
            self._plan_actions[(layer, p.plan)] = cached
        out.action_codes, out.actions, out.units = cached
        return out

    # -- accounting

    def acct_reset(self, stage, limit_bytes=0):
        """kiln_rt_acct_reset: start accounting for stage with limit_bytes of
        device memory for activations (0: capacity - static)."""
        _check(self._lib.kiln_rt_acct_reset(self._handle(), _sint(stage, "stage"),
                                            _uint(limit_bytes, "limit_bytes")),
               "kiln_rt_acct_reset", "stage %d" % stage)

    def acct_record(self, microbatch, event, nbytes):
        """kiln_rt_acct_record: event is ACCT_* or its name ("produced",
        "freed", "offloaded", "reloaded", "dropped")."""
        if type(event) is not int:
            if isinstance(event, str):
                try:
                    event = _ACCT_EVENTS[event]
                except KeyError:
                    raise ValueError("unknown accounting event %r; one of %s" % (
                        event, ", ".join(_ACCT_EVENTS))) from None
            else:
                event = _sint(event, "event")
        if type(microbatch) is not int or not 0 <= microbatch <= _U32_MAX:
            microbatch = _uint(microbatch, "microbatch", _U32_MAX)
        if type(nbytes) is not int or not 0 <= nbytes <= _U64_MAX:
            nbytes = _uint(nbytes, "bytes")
        h = self._h
        if h is None:
            self._handle()
        rc = self._record(h, microbatch, event, nbytes)
        if rc < 0:
            raise KilnError(rc, "kiln_rt_acct_record", "micro-batch %d event %d of %d bytes" % (
                microbatch, event, nbytes))

    def produced(self, microbatch, nbytes):
        self.acct_record(microbatch, ACCT_PRODUCED, nbytes)

    def freed(self, microbatch, nbytes):
        self.acct_record(microbatch, ACCT_FREED, nbytes)

    def offloaded(self, microbatch, nbytes):
        self.acct_record(microbatch, ACCT_OFFLOADED, nbytes)

    def reloaded(self, microbatch, nbytes):
        self.acct_record(microbatch, ACCT_RELOADED, nbytes)

    def dropped(self, microbatch, nbytes):
        self.acct_record(microbatch, ACCT_DROPPED, nbytes)

    def acct(self):
        """kiln_rt_acct_get: limit_bytes, device_bytes, host_bytes,
        peak_device_bytes, open_microbatches, free_bytes."""
        a = _Acct()
        self._lib.kiln_rt_acct_get(self._handle(), _c.byref(a))
        return _record(a)

    def free_bytes(self):
        """Free device bytes by the accounting (limit - device, 0 when over)."""
        a = _Acct()
        self._lib.kiln_rt_acct_get(self._handle(), _c.byref(a))
        return a.free_bytes

    def __repr__(self):
        if self._h is None:
            return "<kiln.runtime.Runtime closed>"
        return "<kiln.runtime.Runtime %s: %d stages, %d layers, %d buckets>" % (
            self._info.model, self._info.n_stages, self._info.n_layers, self._info.n_buckets)


# ---------------------------------------------------------------- the copy engine

def _address(obj, what):
    """A memory address: an int, a ctypes object, or a writable buffer."""
    if isinstance(obj, int) and not isinstance(obj, bool):
        return obj
    if isinstance(obj, _c._SimpleCData) or isinstance(obj, (_c.Array, _c.Structure)):
        return _c.addressof(obj)
    try:
        return _c.addressof((_c.c_char * 0).from_buffer(obj))
    except TypeError as e:
        raise TypeError("%s must be an address (int), a ctypes object or a writable buffer: %s"
                        % (what, e)) from None


def _backend(b):
    if isinstance(b, str):
        try:
            return _BACKENDS[b]
        except KeyError:
            raise ValueError("unknown copy backend %r; one of host, hip, cuda" % b) from None
    return _sint(b, "backend")


def probe(backend, library=None):
    """kiln_copy_probe: loads backend's library (or library) and resolves
    its symbols without opening an engine. Returns a record with library,
    n_required, n_optional, n_resolved, missing, devices, status (0 or the
    code kiln_copy_open would fail with) and status_text."""
    r = _ProbeReport()
    name = None if library is None else os.fsencode(library)
    # r.library may point into name: read the report while name is alive.
    _load().kiln_copy_probe(_backend(backend), name, _c.byref(r))
    return _record(r, status_text=strerror(r.status))


class CopyEngine(_Closing):
    """The copy engine (docs/copy-engine.md): offloads device buffers into a
    host pool and reloads them, on the host backend, HIP or CUDA.

    CopyEngine(backend="host"|"hip"|"cuda", pool_bytes, max_buffers=0,
    device=0, library=None). Addresses are ints (tensor.data_ptr()),
    ctypes objects or writable buffers (bytearray, memoryview); the caller
    keeps them valid until the copy's event completes."""

    def __init__(self, backend="host", pool_bytes=0, max_buffers=0, device=0, library=None):
        lib = _load()
        self._lib = lib
        self._h = None
        cfg = _CopyConfig()
        cfg.backend = _backend(backend)
        cfg.pool_bytes = _uint(pool_bytes, "pool_bytes")
        cfg.max_buffers = _uint(max_buffers, "max_buffers", _U32_MAX)
        cfg.device = _sint(device, "device")
        self._library = None if library is None else os.fsencode(library)
        cfg.library = self._library
        h = _c.c_void_p()
        _check(lib.kiln_copy_open(_c.byref(cfg), _c.byref(h)), "kiln_copy_open",
               "backend %s" % backend)
        self._h = h

    def _handle(self):
        if self._h is None:
            raise ValueError("kiln.runtime.CopyEngine: the engine is closed")
        return self._h

    def offload(self, src, nbytes):
        """Queues a copy of nbytes from src into a new pool buffer:
        returns (buffer, event)."""
        buf, ev = _u32(), _u64()
        _check(self._lib.kiln_copy_offload(self._handle(), _address(src, "src"),
                                           _uint(nbytes, "nbytes"), _c.byref(buf),
                                           _c.byref(ev)),
               "kiln_copy_offload", "%d bytes" % nbytes)
        return buf.value, ev.value

    def reload(self, buf, dst):
        """Queues a copy of buffer buf back to dst; returns its event."""
        ev = _u64()
        _check(self._lib.kiln_copy_reload(self._handle(), _uint(buf, "buffer", _U32_MAX),
                                          _address(dst, "dst"), _c.byref(ev)),
               "kiln_copy_reload", "buffer %d" % buf)
        return ev.value

    def drop(self, buf):
        """Releases an offloaded buffer without reloading it."""
        _check(self._lib.kiln_copy_drop(self._handle(), _uint(buf, "buffer", _U32_MAX)),
               "kiln_copy_drop", "buffer %d" % buf)

    def query(self, event):
        """True when event has completed, False when not yet; never blocks."""
        rc = self._lib.kiln_copy_query(self._handle(), _uint(event, "event"))
        return bool(_check(rc, "kiln_copy_query", "event %d" % event))

    def wait(self, event):
        """Blocks until event completes; raises the copy's error."""
        _check(self._lib.kiln_copy_wait(self._handle(), _uint(event, "event")),
               "kiln_copy_wait", "event %d" % event)

    def close(self):
        """Waits for every queued copy and releases the engine; safe twice."""
        if self._h is not None:
            self._lib.kiln_copy_close(self._h)
            self._h = None
