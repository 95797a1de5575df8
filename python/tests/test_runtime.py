"""kiln.runtime against the C API: select equals `kilnc select --json` (the
same kiln_rt_select called from C), unit and table lookup equal `kilnc
inspect --json`, bad blobs raise with the header's error texts, accounting
follows docs/runtime.md's table by hand, and the copy engine round-trips
bytes on the host backend and on the fake CUDA runtime
(build/libkiln_fake_cudart.so, tests/fake/fake_cudart.c)."""

import array
import ctypes
import json
import math
import os
import re

import pytest

from conftest import ROOT, build_dir, kilnc
from kiln import runtime
from kiln.runtime import KilnError, Runtime


def header_codes():
    """{NAME: (code, text)} read from include/kiln/runtime.h itself."""
    with open(os.path.join(ROOT, "include", "kiln", "runtime.h")) as f:
        rows = re.findall(r'X\((\w+), (-?\d+), "([^"]*)"\)', f.read())
    return {name: (int(code), text) for name, code, text in rows}


CODES = header_codes()


def inspect(blob, *extra):
    r = kilnc("inspect", blob, "--json", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def c_select(blob, stage, layer, how, free, pending=0):
    """kilnc select's answer: how is ("--tokens", "1,2") or ("--rows", "7")."""
    r = kilnc("select", blob, "--stage", str(stage), "--layer", str(layer), *how,
              "--free", str(free), "--pending", str(pending), "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


class Counts:
    """A stand-in for a tensor: only .tolist()."""

    def __init__(self, values):
        self.values = values

    def tolist(self):
        return list(self.values)


# (stage, layer, tokens per local expert or a row count, free bytes, pending):
# steady loads with room, a spike, a spike in little memory (over budget),
# a load beyond load.max_factor, a dense layer, warm-up with pending
# micro-batches, stage 1.
QUERIES = [
    (0, 1, [128, 128, 128, 128], 6 << 20, 0),
    (0, 1, [600, 100, 300, 280], 3 << 20, 0),
    (0, 2, [1200, 40, 20, 20], 1 << 20, 0),
    (0, 3, [5000, 5000, 0, 0], 4 << 20, 0),
    (0, 0, 0, 2 << 20, 0),
    (0, 1, [300, 300, 300, 300], 5 << 20, 1),
    (1, 5, [200, 900, 100, 100], 2 << 20, 0),
    (1, 7, 1500, 8 << 20, 0),
]


@pytest.mark.parametrize("q", QUERIES, ids=[str(i) for i in range(len(QUERIES))])
def test_select_equals_the_c_api(tiny_blob, q):
    stage, layer, tokens, free, pending = q
    if isinstance(tokens, int):
        how = ("--rows", str(tokens))
        rows = tokens
    else:
        how = ("--tokens", ",".join(map(str, tokens)))
        rows = sum(tokens)
    want = c_select(tiny_blob, stage, layer, how, free, pending)
    with Runtime(tiny_blob) as rt:
        forms = [tokens] if isinstance(tokens, int) else \
            [tokens, tuple(tokens), Counts(tokens), array.array("I", tokens)]
        for form in forms:
            p = rt.select(stage, layer, form, free, pending=pending)
            assert p.rows == rows == want["rows"]
            assert p.plan == want["plan"]
            assert p.template_id == want["template"]
            assert p.bucket == want["bucket"]
            assert p.load_factor == pytest.approx(want["load_factor"], rel=1e-12)
            for key in ("need_bytes", "saved_bytes", "resident_bytes", "avail_bytes"):
                assert getattr(p, key) == want[key], key
            assert p.exposed_us == pytest.approx(want["exposed_us"], rel=1e-6)
            assert p.over_budget == want["over_budget"]
            assert p.load_beyond == want["load_beyond"]
            assert list(p.actions.items()) == [(u["name"], u["action"]) for u in want["units"]]
            assert [runtime.ACTIONS[a] for a in p.action_codes] == list(p.actions.values())
            for i, u in enumerate(want["units"]):
                assert rt.unit_bytes(layer, i, rows) == u["bytes"], u["name"]
                assert rt.unit_bytes(layer, u["name"], rows) == u["bytes"], u["name"]
                assert p.action(i) == p.action(u["name"]) == u["action"]


def test_the_queries_cover_both_flags_and_both_kinds(tiny_blob):
    """The table above reaches over budget, load beyond and a dense layer
    (else the comparison would leave those paths untested)."""
    with Runtime(tiny_blob) as rt:
        plans = [rt.select(s, l, t, f, pending=p) for s, l, t, f, p in QUERIES]
        assert any(p.over_budget for p in plans)
        assert any(p.load_beyond for p in plans)
        assert any(not p.over_budget and not p.load_beyond for p in plans)
        assert not rt.layer(0).moe and rt.layer(1).moe


def test_units_tables_and_stages_equal_inspect(tiny_blob):
    doc = inspect(tiny_blob)
    with Runtime(tiny_blob) as rt:
        assert rt.info.model == doc["model"]["name"] == "tiny"
        assert rt.info.n_stages == len(doc["stages"])
        assert rt.info.n_model_layers == doc["model"]["layers"]
        assert "%016x" % rt.info.model_hash == doc["model"]["hash"]
        assert rt.plan_count() == doc["plans"]
        assert rt.template_count() == doc["templates"]
        for st in doc["stages"]:
            si = rt.stage(st["stage"])
            for key in ("capacity_bytes", "static_bytes", "floor_bytes", "transient_bytes"):
                assert getattr(si, key) == st[key], key
            assert rt.layers(st["stage"]) == st["layers"]
        for kind in doc["layer_kinds"]:
            layer = kind["first_layer"]
            li = rt.layer(layer)
            assert li.stage == kind["stage"]
            assert li.moe == (kind["kind"] == "moe")
            assert li.balanced_rows == kind["balanced_rows"]
            got = [(u.index, u.name, u.flags, u.base_bytes, u.per_row_bytes)
                   for u in rt.units(layer)]
            want = [(i, u["name"], u["flags"], u["base_bytes"], u["per_row_bytes"])
                    for i, u in enumerate(kind["units"])]
            assert got == want
            assert rt.unit_names(layer) == tuple(u["name"] for u in kind["units"])
            for i, u in enumerate(kind["units"]):
                assert rt.unit_index(layer, u["name"]) == i
                # docs/runtime.md: base + per_row * rows.
                assert rt.unit_bytes(layer, i, 777) == u["base_bytes"] + 777 * u["per_row_bytes"]
            g, gf = rt.group(layer), kind["group_fallback"]
            if gf is None:
                assert g.plan == -1 and g.fit_rows == 0 and not li.moe
            else:
                assert {k: getattr(g, k) for k in gf} == gf
                # docs/runtime.md, "Beyond the declared load": at least the
                # rows of the last bucket whose load is within the stage's
                # safety factor (what the tables promise; past the last
                # bucket it may be more, tests/test_group.c).
                safety = rt.stage(li.stage).safety_factor
                assert g.fit_rows >= max(
                    [t["max_rows"] for t in kind["tables"]
                     if t["load_factor"] <= safety * (1 + 1e-12)] or [0])
            for b, t in enumerate(kind["tables"]):
                ti = rt.table(layer, b)
                assert (ti.load_factor, ti.max_rows, ti.quantum_bytes, ti.keep_bytes,
                        ti.n_points) == (t["load_factor"], t["max_rows"], t["quantum_bytes"],
                                         t["keep_bytes"], len(t["points"]))
                for i in (0, len(t["points"]) - 1):
                    pt = rt.point(layer, b, i)
                    assert pt.saved_bytes == t["points"][i]["saved_bytes"]
                    assert pt.plan == t["points"][i]["plan"]
                    assert pt.exposed_us == pytest.approx(t["points"][i]["exposed_us"],
                                                          rel=1e-6)


def test_plans_and_templates_equal_inspect(tiny_blob):
    doc = inspect(tiny_blob, "--templates")
    with Runtime(tiny_blob) as rt:
        for i in (0, 1, len(doc["plan_pool"]) // 2, len(doc["plan_pool"]) - 1):
            codes, tpl = rt.plan(i)
            assert [runtime.ACTIONS[a] for a in codes] == doc["plan_pool"][i]["actions"]
            assert tpl == doc["plan_pool"][i]["template"]
        for t in (0, len(doc["template_list"]) - 1):
            want = doc["template_list"][t]
            got = rt.template(t)
            assert got.plan == want["plan"]
            assert got.makespan_us == pytest.approx(want["makespan_us"], rel=1e-6)
            assert [(k.name, k.stream_name, k.kind_name, k.chain, k.unit) for k in got.tasks] == \
                [(k["name"], k["stream"], k["kind"], k["chain"], k["unit"])
                 for k in want["tasks"]]
            assert [list(d) for d in got.deps] == want["deps"]


def expect_error(name, fn, *args):
    code, text = CODES[name]
    with pytest.raises(KilnError) as e:
        fn(*args)
    assert e.value.code == code
    assert e.value.text == text
    assert text in str(e.value)
    return e.value


def test_bad_blobs_raise_with_the_runtime_text(tiny_blob, tmp_path):
    with open(tiny_blob, "rb") as f:
        good = f.read()
    cases = {
        "empty": (b"", "ETRUNC"),
        "truncated": (good[: len(good) // 2], "ETRUNC"),
        "extended": (good + b"\0" * 8, "ETRUNC"),
        "bad magic": (b"NOTKILN!" + good[8:], "EMAGIC"),
        "flipped byte": (good[:-1] + bytes([good[-1] ^ 0x40]), "ECRC"),
    }
    for what, (data, name) in cases.items():
        path = tmp_path / (what.replace(" ", "_") + ".kiln")
        path.write_bytes(data)
        e = expect_error(name, Runtime, str(path))
        assert str(path) in str(e), what
        expect_error(name, Runtime.from_bytes, data)
    expect_error("EIO", Runtime, str(tmp_path / "missing.kiln"))
    expect_error("EIO", Runtime, str(tmp_path))
    # The good bytes, from memory, answer as the file does.
    with Runtime.from_bytes(good) as a, Runtime(tiny_blob) as b:
        assert a.select(0, 1, [500, 0, 0, 0], 3 << 20).plan == \
            b.select(0, 1, [500, 0, 0, 0], 3 << 20).plan


def test_bad_queries(tiny_blob):
    with Runtime(tiny_blob) as rt:
        expect_error("ERANGE", rt.select, 1, 1, [1], 1 << 20)  # layer 1 is on stage 0
        expect_error("ERANGE", rt.select, 2, 5, [1], 1 << 20)  # no stage 2
        expect_error("ERANGE", rt.layer, 99)
        expect_error("ERANGE", rt.unit, 1, 15)
        expect_error("ERANGE", rt.unit_bytes, 1, 15, 10)
        expect_error("ERANGE", rt.table, 1, rt.info.n_buckets)
        expect_error("EINVAL", rt.select, 0, 1, [1] * ((1 << 20) + 1), 1 << 20)
        expect_error("EINVAL", rt.select, 0, 1, [1], None)  # accounting not reset
        with pytest.raises(ValueError):
            rt.select(0, 1, [5, -1], 1 << 20)
        with pytest.raises(ValueError):
            rt.select(0, 1, [2**32], 1 << 20)
        with pytest.raises(ValueError):
            rt.select(0, 1, [1], -5)
        with pytest.raises(TypeError):
            rt.select(0, 1, [1], 1.5)
        with pytest.raises(KeyError, match="moe.expert_up"):
            rt.unit_index(1, "no.such_unit")
    with pytest.raises(ValueError, match="closed"):
        rt.select(0, 1, [1], 1 << 20)
    rt.close()  # twice is fine


def test_accounting_by_hand(tiny_blob):
    doc = inspect(tiny_blob)
    st0 = doc["stages"][0]
    with Runtime(tiny_blob) as rt:
        expect_error("EINVAL", rt.produced, 0, 1)  # before reset
        rt.acct_reset(0)
        a = rt.acct()
        # docs/runtime.md: limit 0 means capacity - static.
        assert a.limit_bytes == st0["capacity_bytes"] - st0["static_bytes"]
        rt.acct_reset(0, 1_000_000)
        rt.produced(0, 300_000)
        rt.acct_record(1, "produced", 200_000)
        a = rt.acct()
        assert (a.device_bytes, a.host_bytes, a.free_bytes, a.open_microbatches,
                a.peak_device_bytes) == (500_000, 0, 500_000, 2, 500_000)
        rt.offloaded(0, 100_000)
        a = rt.acct()
        assert (a.device_bytes, a.host_bytes, a.free_bytes) == (400_000, 100_000, 600_000)
        # Micro-batch 1 holds 200,000 on the device: freeing 300,000 is refused, nothing changes.
        expect_error("EACCT", rt.freed, 1, 300_000)
        assert rt.acct().device_bytes == 400_000
        rt.freed(1, 200_000)
        rt.reloaded(0, 100_000)
        rt.acct_record(0, runtime.ACCT_FREED, 300_000)
        a = rt.acct()
        assert (a.device_bytes, a.host_bytes, a.open_microbatches, a.peak_device_bytes,
                rt.free_bytes()) == (0, 0, 0, 500_000, 1_000_000)
        with pytest.raises(ValueError, match="unknown accounting event"):
            rt.acct_record(0, "spilled", 1)
        expect_error("EINVAL", rt.acct_record, 0, 7, 1)
        expect_error("ERANGE", rt.acct_reset, 5)


def test_select_from_accounting_is_the_documented_query(tiny_blob):
    """docs/runtime.md "Free memory from accounting": free = limit - device,
    pending = ceil(inflight) - (open + self), held = the micro-batch's device
    bytes. Stage 0 of tiny has 2 micro-batches in flight."""
    limit = 4 << 20
    with Runtime(tiny_blob) as rt:
        assert rt.stage(0).inflight == 2
        rt.acct_reset(0, limit)
        for tokens in ([100, 200, 300, 400], [1500, 100, 0, 0]):
            # Nothing recorded: micro-batch 0 is itself in flight, one more is pending.
            got = rt.select(0, 1, tokens, None, microbatch=0)
            want = rt.select(0, 1, tokens, limit, pending=1, held_bytes=0)
            assert (got.plan, got.avail_bytes, got.need_bytes) == \
                (want.plan, want.avail_bytes, want.need_bytes)
        rt.produced(0, 700_000)
        for tokens in ([100, 200, 300, 400], [1500, 100, 0, 0]):
            # Micro-batch 0 holds 700,000: open 1, self 0, pending 1.
            got = rt.select(0, 2, tokens, None, microbatch=0)
            want = rt.select(0, 2, tokens, limit - 700_000, pending=1, held_bytes=700_000)
            assert (got.plan, got.avail_bytes, got.need_bytes) == \
                (want.plan, want.avail_bytes, want.need_bytes)
        rt.produced(1, 900_000)
        # Both in flight hold bytes: pending 0, free limit - 1,600,000.
        got = rt.select(0, 3, [400, 400, 400, 400], None, microbatch=1)
        want = rt.select(0, 3, [400, 400, 400, 400], limit - 1_600_000, pending=0,
                         held_bytes=900_000)
        assert (got.plan, got.avail_bytes) == (want.plan, want.avail_bytes)


def test_strerror_and_error_objects():
    for name, (code, text) in CODES.items():
        assert runtime.strerror(code) == text, name
        if code < 0:
            e = KilnError(code, "kiln_rt_select")
            assert (e.code, e.text, e.call) == (code, text, "kiln_rt_select")
            assert str(e) == "kiln_rt_select: " + text


def test_copy_engine_host_round_trip():
    src = bytearray(os.urandom(10000))
    dst = bytearray(10000)
    with runtime.CopyEngine("host", pool_bytes=64 << 10) as ce:
        buf, ev = ce.offload(src, len(src))
        ce.wait(ev)
        assert ce.query(ev)
        src[:] = bytes(len(src))  # the pool holds its own copy
        ev2 = ce.reload(buf, dst)
        ce.wait(ev2)
        assert ce.query(ev2)
        # The reload released the buffer: reloading or dropping it again is refused.
        expect_error("ESTATE", ce.reload, buf, dst)
        expect_error("ESTATE", ce.drop, buf)
        # More than the pool holds.
        expect_error("ENOSPC", ce.offload, bytearray(128 << 10), 128 << 10)
        b2, e2 = ce.offload(dst, 4096)
        ce.wait(e2)
        ce.drop(b2)
        expect_error("EINVAL", ce.wait, 0)
    assert ce._h is None
    expect_error("EINVAL", runtime.CopyEngine, "host", 0)  # pool_bytes 0


def fake_cudart():
    path = os.path.join(build_dir(), "libkiln_fake_cudart.so")
    if not os.path.exists(path):
        pytest.skip("no build/libkiln_fake_cudart.so (Criterion not found at configure)")
    return path


def test_copy_engine_on_the_fake_cuda_runtime():
    path = fake_cudart()
    fake = ctypes.CDLL(path)  # the same object the engine dlopens by this path
    fake.fake_cudart_reset(1, 1)  # one device; copies held until released
    try:
        r = runtime.probe("cuda", path)
        assert (r.library, r.status, r.devices, r.missing) == (path, 0, 1, None)
        src = bytearray(b"kiln" * 1024)
        dst = bytearray(len(src))
        with runtime.CopyEngine("cuda", pool_bytes=1 << 20, library=path) as ce:
            buf, ev = ce.offload(src, len(src))
            assert not ce.query(ev)  # held by the fake stream
            fake.fake_cudart_release()
            ce.wait(ev)
            assert ce.query(ev)
            ce.wait(ce.reload(buf, dst))
        assert dst == src
        fake.fake_cudart_reset(0, 0)  # no device
        r = runtime.probe(runtime.COPY_CUDA, path)
        assert r.status == CODES["ENODEVICE"][0] and r.status_text == CODES["ENODEVICE"][1]
        expect_error("ENODEVICE", runtime.CopyEngine, "cuda", 1 << 20, 0, 0, path)
    finally:
        fake.fake_cudart_reset(1, 0)


def test_copy_engine_unavailable_backend(tmp_path):
    missing = str(tmp_path / "libcudart-missing.so")
    assert runtime.probe("cuda", missing).status == CODES["EUNAVAILABLE"][0]
    expect_error("EUNAVAILABLE", runtime.CopyEngine, "cuda", 1 << 20, 0, 0, missing)
    with pytest.raises(ValueError, match="unknown copy backend"):
        runtime.CopyEngine("tpu", 1 << 20)


def test_group_rows_fall_back_together_beyond_the_declared_load(tiny_blob):
    """select(..., group_rows=...): the EP group's fallback (docs/runtime.md,
    "Beyond the declared load"). The threshold is the layer's record
    (group(l).fit_rows; its value is checked by hand and by brute force in
    tests/test_group.c), at least the rows of the last bucket within the
    stage's safety factor (from the public getters); the fallback from
    what full recompute is (every unit but the layer input recomputed or
    offloaded), its bytes from unit_bytes by hand."""
    with Runtime(tiny_blob) as rt:
        for stage, layer in ((0, 1), (1, 6)):
            li = rt.layer(layer)
            safety = rt.stage(stage).safety_factor
            tables = 0
            for b in range(rt.info.n_buckets):
                t = rt.table(layer, b)
                if t.load_factor <= safety * (1 + 1e-12):
                    tables = t.max_rows
            fit = rt.group(layer).fit_rows
            assert fit >= tables > 0
            n = li.n_units
            for group in ([fit, 0, 3, fit], [fit + 1, 0, 5, 7], [1, 2, 3, 4 * fit]):
                beyond = max(group) > fit
                answers = []
                for r, mine in enumerate(group):
                    seen = group[r:] + group[:r]  # each rank lists the group its own way
                    alone = rt.select(stage, layer, mine, 4 << 20)
                    p = rt.select(stage, layer, mine, 4 << 20, group_rows=Counts(seen))
                    assert p.group_fallback == beyond
                    assert p.group_max_rows == max(group)
                    if not beyond:
                        # Step 8 (docs/runtime.md, "The group's slowest
                        # rank"): a rank with fewer rows than the group's
                        # most may save more, within the exposed time of the
                        # decision at the most rows; otherwise the counts
                        # change nothing.
                        free2, held2 = slack_memory(rt, stage, layer, 4 << 20)
                        top = rt.select(stage, layer, max(group), free2, held_bytes=held2)
                        if p.group_slack:
                            assert mine < max(group) and li.moe
                            assert p.bucket == alone.bucket
                            assert p.saved_bytes > alone.saved_bytes
                            assert alone.exposed_us < p.exposed_us <= top.exposed_us
                            assert p.flags == alone.flags | runtime.PLAN_GROUP_SLACK
                        else:
                            assert (p.plan, p.resident_bytes, p.flags) == \
                                (alone.plan, alone.resident_bytes, alone.flags)
                        continue
                    kept = [bool(rt.unit(layer, i).flags & runtime.UNIT_LAYER_INPUT)
                            for i in range(n)]
                    assert [a == runtime.KEEP for a in p.action_codes] == kept
                    assert p.resident_bytes == sum(rt.unit_bytes(layer, i, mine)
                                                   for i in range(n) if kept[i])
                    assert p.saved_bytes == sum(rt.unit_bytes(layer, i, mine)
                                                for i in range(n) if not kept[i])
                    answers.append(p.plan)
                assert len(set(answers)) <= 1, "every rank of the group gets one plan"
            # The dense layer 0 never falls back.
            assert not rt.select(0, 0, 0, 4 << 20, group_rows=[10 ** 9]).group_fallback
        with pytest.raises(ValueError):
            rt.select(0, 1, 10, 4 << 20, group_rows=[-1])
        with pytest.raises(TypeError):
            rt.select(0, 1, 10, 4 << 20, group_rows=["a"])
        with pytest.raises(ValueError):
            rt.select(0, 1, 10, 4 << 20, group_rows=[2 ** 32])


def slack_memory(rt, stage, layer, free, held=0):
    """Step 8's memory for the most loaded rank: its micro-batch holds its
    fair share through the earlier layers (the fair scale by its formula,
    docs/runtime.md step 5), the rest of this rank's held bytes free."""
    si, li = rt.stage(stage), rt.layer(layer)
    want = math.ceil(max(si.inflight, 1)) * si.steady_bytes
    room = si.capacity_bytes - si.static_bytes - si.transient_bytes
    scale = 1 if want <= 0 else (room / want if room > 0 else 0)
    fh = scale * (li.head_steady_bytes - li.steady_bytes)
    f2 = float(free) + float(held) - fh
    return (int(f2) if f2 > 0 else 0), (int(fh) if fh > 0 else 0)


def test_a_rank_below_the_groups_most_saves_within_its_exposure(tiny_blob):
    """Step 8 (docs/runtime.md, "The group's slowest rank"): a layer takes as
    long as the group's slowest rank, so a rank with fewer rows than the
    group's most saves the most its own table offers within the exposed time
    of the decision it would get at the most rows; from the table by hand."""
    moved = 0
    with Runtime(tiny_blob) as rt:
        for stage, layer in ((0, 1), (1, 6)):
            fit = rt.group(layer).fit_rows
            most, mine = fit, fit // 4
            for free in range(1 << 20, 12 << 20, 1 << 16):
                alone = rt.select(stage, layer, mine, free)
                free2, held2 = slack_memory(rt, stage, layer, free)
                top = rt.select(stage, layer, most, free2, held_bytes=held2)
                p = rt.select(stage, layer, mine, free, group_rows=[most, mine])
                assert not p.group_fallback and p.bucket == alone.bucket
                t = rt.table(layer, alone.bucket)
                pts = [rt.point(layer, alone.bucket, i) for i in range(t.n_points)]
                at = [q.plan for q in pts].index(alone.plan)
                to = at
                if not alone.over_budget:
                    while to + 1 < len(pts) and pts[to + 1].exposed_us <= top.exposed_us:
                        to += 1
                assert p.plan == pts[to].plan
                assert p.group_slack == (to != at)
                assert p.resident_bytes <= alone.resident_bytes <= alone.avail_bytes or \
                    alone.over_budget
                moved += to != at
    assert moved > 0, "some free memory leaves the most loaded rank more exposed"


def test_argument_types_and_ranges_are_checked(tiny_blob):
    # A path holding a null byte is refused as open() refuses it, not truncated.
    with pytest.raises(ValueError, match="embedded null byte"):
        Runtime(tiny_blob + "\0x")
    # strerror takes the C parameter's range: a 32-bit int.
    for code in (2**70, 2**31, -2**31 - 1):
        with pytest.raises(ValueError, match="32-bit"):
            runtime.strerror(code)
    with pytest.raises(TypeError):
        runtime.strerror(True)
    with Runtime(tiny_blob) as rt:
        # layers(stage) answers a stage the blob lacks as stage() does.
        for bad in (-1, 99, rt.info.n_stages):
            expect_error("ERANGE", rt.stage, bad)
            expect_error("ERANGE", rt.layers, bad)
        assert rt.layers(0) and sorted(rt.layers(0) + rt.layers(1)) == rt.layers()
        # bool is not an int; bytes, str, dicts and sets are not counts.
        for call in (lambda: rt.stage(True), lambda: rt.layers(False),
                     lambda: rt.layer(True), lambda: rt.select(True, 1, [1], 1 << 20),
                     lambda: rt.select(0, 1, [True, 2], 1 << 20),
                     lambda: rt.select(0, 1, [1], 1 << 20, pending=True)):
            with pytest.raises(TypeError):
                call()
        for tokens in (b"\x05\x05", bytearray(b"\x05\x05"), memoryview(b"\x05\x05"), "55",
                       {0: 5, 1: 5}, {5, 6}):
            with pytest.raises(TypeError, match="tokens_per_expert must be a sequence"):
                rt.select(0, 1, tokens, 1 << 20)
            with pytest.raises(TypeError, match="group_rows must be a sequence"):
                rt.select(0, 1, [5, 5], 1 << 20, group_rows=tokens)
        rt.select(0, 1, (5, 5), 1 << 20)
        rt.select(0, 1, array.array("I", [5, 5]), 1 << 20)
        info = rt.info
    # Every call raises ValueError after close(), info included.
    for call in (lambda: rt.info, lambda: rt.layers(), lambda: rt.stage(0)):
        with pytest.raises(ValueError, match="closed"):
            call()
    assert repr(rt) == "<kiln.runtime.Runtime closed>"
    assert info.n_stages >= 1
