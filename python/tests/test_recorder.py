"""kiln.recorder writes token traces `kilnc simulate --loads` accepts, whose
values round-trip: the CSV holds the counts recorded, and the factors kilnc
replays (its --emit-loads) are each row's sum over the balanced rows,
computed here by hand from tiny.yaml."""

import array
import csv
import os
import random

import pytest

from conftest import ROOT, kilnc
from kiln.recorder import Recorder, merge

TINY = os.path.join(ROOT, "examples", "models", "tiny.yaml")
# tiny.yaml: 8 layers, the first dense; 8 experts over ep 4 (2 per rank),
# top-2; an EP group's micro-batch is ep 4 x micro-batch 2 x seq 128 = 1024
# tokens, routing 1024 x 2 = 2048 rows: balanced rows per rank 2048 / 4 =
# 512 (kilnc report: load.balanced_rows); global batch 32 / (dp 4 x 2) = 4
# micro-batches.
MOE_LAYERS = [1, 2, 3, 4, 5, 6, 7]
EP, EXPERTS, BALANCED, ROWS, MICROBATCHES = 4, 2, 512, 2048, 4


class Counts:
    def __init__(self, values):
        self.values = values

    def tolist(self):
        return [list(v) if isinstance(v, (list, tuple)) else v for v in self.values]


def read_csv(path):
    with open(path) as f:
        lines = [ln for ln in f if ln.strip() and not ln.startswith("#")]
    rows = list(csv.reader(lines))
    return rows[0], {tuple(int(x) for x in r[:4]): [float(x) for x in r[4:]] for r in rows[1:]}


def recorded(tmp_path, iters=3):
    rng = random.Random(16)
    want = {}
    path = tmp_path / "trace.csv"
    with Recorder(path, layers=MOE_LAYERS) as rec:
        for it in range(iters):
            for mb in range(MICROBATCHES):
                for li, layer in enumerate(MOE_LAYERS):
                    # 2048 rows split over the 8 experts at random cut points.
                    cuts = sorted(rng.randrange(0, ROWS + 1) for _ in range(EP * EXPERTS - 1))
                    flat = [b - a for a, b in zip([0] + cuts, cuts + [ROWS])]
                    if (it, mb, li) == (1, 2, 0):
                        flat = [100] * 6 + [600, 848]  # rank 3 holds 1448 rows: 2.83x
                    counts = [flat[r * EXPERTS:(r + 1) * EXPERTS] for r in range(EP)]
                    if li % 2:
                        rec.record(it, mb, layer, None, Counts(counts))
                    else:
                        for r in range(EP):
                            rec.record(it, mb, layer, r, array.array("I", counts[r]))
                    for r in range(EP):
                        want[(it, mb, li, r)] = counts[r]
    return path, want


def test_trace_round_trips_through_kilnc(tmp_path):
    path, want = recorded(tmp_path)
    header, rows = read_csv(path)
    assert header == ["iteration", "microbatch", "layer", "rank", "e0", "e1"]
    assert rows == {k: [float(c) for c in v] for k, v in want.items()}
    emitted = tmp_path / "replayed.csv"
    r = kilnc("simulate", TINY, "--policy", "kiln", "--iters", "3", "--loads", str(path),
              "--emit-loads", str(emitted))
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr, r.stderr  # every key the replay looks up has a row
    eh, factors = read_csv(emitted)
    assert eh == ["iteration", "microbatch", "layer", "rank", "factor"]
    assert set(factors) == set(want)
    for key, counts in want.items():
        # docs/simulator.md: the factor is the row's sum over tokens * top_k / ep.
        assert factors[key] == [sum(counts) / BALANCED], key


def test_layers_numbered_in_order_without_a_list(tmp_path):
    path = tmp_path / "t.csv"
    rec = Recorder(path)
    rec.record(0, 0, 7, 0, [1, 2])
    rec.record(0, 0, 3, 0, [3, 4])
    rec.close()
    _, rows = read_csv(path)
    assert rows == {(0, 0, 0, 0): [3.0, 4.0], (0, 0, 1, 0): [1.0, 2.0]}
    rec.close()  # twice is fine


def test_merge_joins_per_process_traces(tmp_path):
    a, b = tmp_path / "stage0.csv", tmp_path / "stage1.csv"
    with Recorder(a, layers=MOE_LAYERS) as ra, Recorder(b, layers=MOE_LAYERS) as rb:
        ra.record(0, 0, 1, 0, [5, 6])
        rb.record(0, 0, 7, 1, [7, 8])
    out = tmp_path / "all.csv"
    merge([a, b], out)
    _, rows = read_csv(out)
    assert rows == {(0, 0, 0, 0): [5.0, 6.0], (0, 0, 6, 1): [7.0, 8.0]}
    with pytest.raises(ValueError, match="in two traces"):
        merge([a, a], tmp_path / "dup.csv")


def test_bad_records(tmp_path):
    rec = Recorder(tmp_path / "bad.csv", layers=MOE_LAYERS)
    rec.record(0, 0, 1, 0, [1, 2])
    with pytest.raises(ValueError, match="recorded twice"):
        rec.record(0, 0, 1, 0, [1, 2])
    with pytest.raises(ValueError, match="3 counts; the trace has 2"):
        rec.record(0, 0, 2, 0, [1, 2, 3])
    with pytest.raises(ValueError, match="not one of the MoE layers"):
        rec.record(0, 0, 0, 0, [1, 2])
    with pytest.raises(ValueError, match="non-negative"):
        rec.record(0, 1, 1, 0, [1, -2])
    with pytest.raises(TypeError):
        rec.record(0, 1, 1, 0, [1, 2.5])
    with pytest.raises(ValueError):
        rec.record(-1, 0, 1, 0, [1, 2])
    with pytest.raises(ValueError, match="nothing recorded"):
        Recorder(tmp_path / "empty.csv").flush()
    # A failing run inside `with` leaves no partial trace.
    with pytest.raises(RuntimeError):
        with Recorder(tmp_path / "failed.csv") as r2:
            r2.record(0, 0, 1, 0, [1, 2])
            raise RuntimeError("boom")
    assert not (tmp_path / "failed.csv").exists()


def test_ragged_first_record_is_refused(tmp_path):
    # The first record's first row sets the width, within that record too.
    rec = Recorder(tmp_path / "r.csv", layers=[1])
    with pytest.raises(ValueError, match="1 counts; the trace has 2"):
        rec.record(0, 0, 1, None, [[1, 2], [3]])
    assert len(rec) == 0 and rec.experts is None
    with pytest.raises(ValueError, match="3 counts; the trace has 2"):
        rec.record(0, 0, 1, None, Counts([[1, 2], [3, 4, 5]]))
    rec.record(0, 0, 1, None, [[1, 2], [3, 4]])
    assert rec.experts == 2


def test_counts_bounded_to_what_kilnc_reads(tmp_path):
    from kiln.recorder import MAX_COUNT
    rec = Recorder(tmp_path / "big.csv", layers=[1])
    for big in (10**400, int(1e308), MAX_COUNT + 1):
        with pytest.raises(ValueError, match="largest count"):
            rec.record(0, 0, 1, 0, [big])
        with pytest.raises(ValueError, match="largest count"):
            rec.record(0, 0, 1, None, [[1], [big]])
    assert len(rec) == 0
    rec.record(0, 0, 1, 0, [MAX_COUNT])
    rec.close()
    _, rows = read_csv(tmp_path / "big.csv")
    assert rows == {(0, 0, 0, 0): [float(MAX_COUNT)]}


def test_merge_refuses_what_is_not_a_trace(tmp_path):
    good = tmp_path / "good.csv"
    with Recorder(good, layers=[1]) as rec:
        rec.record(0, 0, 1, 0, [5, 6])
    bad = {"garbage.csv": "hello\n", "keys.csv": "iteration,microbatch,layer,e0\n0,0,0,1\n",
           "nocol.csv": "iteration,microbatch,layer,rank\n0,0,0,0\n",
           "norows.csv": "iteration,microbatch,layer,rank,e0\n",
           "fields.csv": "iteration,microbatch,layer,rank,e0,e1\n0,0,0,0,1\n",
           "key.csv": "iteration,microbatch,layer,rank,e0,e1\n0,x,0,0,1,2\n"}
    for name, text in bad.items():
        p = tmp_path / name
        p.write_text(text)
        for paths in ([p], [good, p]):
            with pytest.raises(ValueError, match=name):
                merge(paths, tmp_path / "m.csv")
    assert not (tmp_path / "m.csv").exists()
