"""kiln.recorder: observed tokens per expert, written as a kiln load trace.

A training loop records, after each MoE gate, the tokens each local expert
of an EP rank received; the file written is a token trace in the format of
docs/simulator.md "Traces" (header iteration,microbatch,layer,rank,e0,...),
so `kilnc simulate MODEL --policy all --loads TRACE.csv` replays the run.
Standard library only; counts may be lists or anything with .tolist().

    rec = Recorder("trace.csv", layers=moe_layers)  # model layer numbers of the MoE layers
    ...
    rec.record(iteration, microbatch, layer, ep_rank, tokens_per_expert)
    ...
    rec.close()                                      # or: with Recorder(...) as rec:

The trace's layer column numbers the MoE layers 0, 1, ... : `layers` gives
the model's MoE layer numbers in order (Runtime.layers() filtered on
.moe, say), so that every process of a pipeline numbers them alike; without
it the layer numbers recorded are numbered in ascending order. Each process
may write its own file; merge() joins them.
"""

import os
import tempfile

from .runtime import _uint as _key  # the library loads on first use, not here

__all__ = ["Recorder", "merge", "MAX_ROWS", "MAX_BYTES", "MAX_COUNT"]

# What kilnc simulate --loads reads (sim/sim.h KILN_LOAD_TRACE_MAX_ROWS, _BYTES).
MAX_ROWS = 10_000_000
MAX_BYTES = 256 << 20
# The largest token count written. kilnc's trace reader takes a value of at
# most 256 characters (docs/cli.md, "Numbers") that fits a double, and a row
# whose sum is finite; counts below 10^15 (as kilnc's router-log converter
# requires, docs/simulator.md) are all that and stay exact as doubles.
MAX_COUNT = 10**15 - 1
_MAX_ITERATION = 10**18 - 1
_MAX_KEY = 2**31 - 2


def _counts(tokens, what):
    if hasattr(tokens, "tolist"):
        tokens = tokens.tolist()
    tokens = list(tokens)
    for i, c in enumerate(tokens):
        if isinstance(c, bool) or not isinstance(c, int):
            raise TypeError("%s[%d] must be an int token count, not %s" % (
                what, i, type(c).__name__))
        if c < 0:
            raise ValueError("%s[%d] is %d, not a non-negative count" % (what, i, c))
        if c > MAX_COUNT:
            raise ValueError("%s[%d] is over %d, the largest count written" % (
                what, i, MAX_COUNT))
    return tokens


class Recorder:
    """Collects (iteration, microbatch, layer, rank) -> tokens per local
    expert and writes them as a token trace on close() (and on flush()),
    replacing path whole (a temporary file renamed over it).

    layers: the model layer numbers of the MoE layers, in order (the trace
    numbers them 0, 1, ...); None: the layers recorded, ascending.
    experts: tokens per row (the local experts of a rank); None: the first
    record's. Recording a key twice, a row of another width, a layer not in
    layers or more rows than kilnc reads is a ValueError."""

    def __init__(self, path, layers=None, experts=None):
        self.path = os.fspath(path)
        self._layer_index = None
        if layers is not None:
            layers = [_key(l, "layers[%d]" % i, _MAX_KEY) for i, l in enumerate(layers)]
            if len(set(layers)) != len(layers):
                raise ValueError("layers lists a layer twice: %r" % (layers,))
            self._layer_index = {l: i for i, l in enumerate(layers)}
        self.experts = None if experts is None else _key(experts, "experts", 1 << 20)
        if self.experts == 0:
            raise ValueError("experts must be at least 1")
        self._rows = {}
        self.closed = False

    def __len__(self):
        return len(self._rows)

    def record(self, iteration, microbatch, layer, rank, tokens_per_expert):
        """One row: the tokens each local expert of EP rank rank received in
        micro-batch microbatch of iteration at model layer layer. With rank
        None, tokens_per_expert is 2-D (one row per EP rank, rank 0 first:
        an all-gathered [ep, experts] counts tensor)."""
        if self.closed:
            raise ValueError("kiln.recorder.Recorder: the recorder is closed")
        it = _key(iteration, "iteration", _MAX_ITERATION)
        mb = _key(microbatch, "microbatch", _MAX_KEY)
        layer = _key(layer, "layer", _MAX_KEY)
        if self._layer_index is not None and layer not in self._layer_index:
            raise ValueError("layer %d is not one of the MoE layers given (%s)" % (
                layer, ", ".join(map(str, self._layer_index))))
        if rank is None:
            rows = tokens_per_expert.tolist() if hasattr(tokens_per_expert, "tolist") \
                else list(tokens_per_expert)
            items = [(r, row) for r, row in enumerate(rows)]
        else:
            items = [(_key(rank, "rank", _MAX_KEY), tokens_per_expert)]
        staged = []
        for r, row in items:
            counts = _counts(row, "tokens_per_expert" if rank is not None
                             else "tokens_per_expert[%d]" % r)
            if self.experts is not None:
                width = self.experts
            elif staged:  # the first record's first row sets the width for the rest
                width = len(staged[0][1])
            else:
                width = len(counts)
            if width == 0 or len(counts) != width:
                raise ValueError("tokens_per_expert has %d counts; the trace has %d per row" % (
                    len(counts), width))
            key = (it, mb, layer, r)
            if key in self._rows or any(k == key for k, _ in staged):
                raise ValueError("iteration %d, micro-batch %d, layer %d, rank %d recorded twice"
                                 % key)
            staged.append((key, tuple(counts)))
        if len(self._rows) + len(staged) > MAX_ROWS:
            raise ValueError("over %d rows, the most kilnc simulate --loads reads" % MAX_ROWS)
        if self.experts is None and staged:
            self.experts = len(staged[0][1])
        for key, counts in staged:
            self._rows[key] = counts

    def _text(self):
        if self._layer_index is not None:
            index = self._layer_index
        else:
            index = {l: i for i, l in enumerate(sorted({k[2] for k in self._rows}))}
        out = ["# kiln load trace (docs/simulator.md, \"Traces\"), written by kiln.recorder: "
               "tokens per local expert\n",
               "iteration,microbatch,layer,rank,%s\n" % ",".join(
                   "e%d" % i for i in range(self.experts or 1))]
        rows = sorted((it, mb, index[l], r, c) for (it, mb, l, r), c in self._rows.items())
        for it, mb, l, r, c in rows:
            out.append("%d,%d,%d,%d,%s\n" % (it, mb, l, r, ",".join(map(str, c))))
        return "".join(out)

    def flush(self):
        """Writes every row recorded so far to path (whole, atomically).
        Nothing recorded yet: ValueError (kilnc refuses a trace without rows)."""
        if not self._rows:
            raise ValueError("nothing recorded: a trace needs at least one row")
        _write(self.path, self._text())

    def close(self):
        """Writes the trace (flush) and closes the recorder; an empty
        recorder writes nothing. Safe to call twice."""
        if self.closed:
            return
        self.closed = True
        if self._rows:
            _write(self.path, self._text())

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *rest):
        if exc_type is None:
            self.close()
        else:
            self.closed = True  # a failed run writes no partial trace
        return False


def _write(path, text):
    data = text.encode()
    if len(data) > MAX_BYTES:
        raise ValueError("the trace is %d bytes, over the %d kilnc simulate --loads reads" % (
            len(data), MAX_BYTES))
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".kiln-trace-", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


_KEYS = ["iteration", "microbatch", "layer", "rank"]


def _check_header(path, line):
    names = [x.strip() for x in line.split(",")]
    if names[:4] != _KEYS or len(names) < 5 or not all(names[4:]):
        raise ValueError("%s: not a load trace: expected the header "
                         "'iteration,microbatch,layer,rank,...', got %r" % (path, line[:80]))


def merge(paths, output):
    """Joins token traces written by kiln.recorder (one per process, say)
    into output: same columns required, a key in two files is a ValueError."""
    header = None
    rows = {}
    for p in paths:
        with open(p) as f:
            lines = [ln.strip() for ln in f if ln.strip() and not ln.lstrip().startswith("#")]
        if not lines:
            raise ValueError("%s: empty trace" % p)
        _check_header(p, lines[0])
        if header is None:
            header = lines[0]
        elif lines[0] != header:
            raise ValueError("%s: header %r differs from %r" % (p, lines[0], header))
        if len(lines) == 1:
            raise ValueError("%s: no data rows after the header" % p)
        width = len(lines[0].split(","))
        for ln in lines[1:]:
            fields = [x.strip() for x in ln.split(",")]
            if len(fields) != width:
                raise ValueError("%s: expected %d fields as in the header, got %d: %r" % (
                    p, width, len(fields), ln))
            try:
                key = tuple(int(x) for x in fields[:4])
            except ValueError:
                key = (-1,)
            if min(key) < 0:
                raise ValueError("%s: a row's first four fields are not non-negative "
                                 "integer keys: %r" % (p, ln))
            if key in rows:
                raise ValueError("%s: iteration %d, micro-batch %d, layer %d, rank %d is in "
                                 "two traces" % ((p,) + key))
            rows[key] = ln
    if header is None:
        raise ValueError("merge: no traces given")
    text = ["# kiln load trace merged by kiln.recorder from %d files\n" % len(paths),
            header + "\n"]
    text += [rows[k] + "\n" for k in sorted(rows)]
    _write(os.fspath(output), "".join(text))
