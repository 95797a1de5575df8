#!/usr/bin/env python3
"""Converts per-expert token counts from a training log into a kilnc trace.

    router_log_to_trace.py LOG [-o TRACE.csv] [--keep-layer-numbers]

LOG holds one record per (iteration, micro-batch, MoE layer, EP rank): the
tokens each of that rank's local experts received, as a Megatron-style
router hook records them after the dispatch (docs/simulator.md, "Traces
from a training log"). A record is a JSON object, either a whole line or
following the tag "kiln-tokens" anywhere in a line, so the records can sit
among the other lines of a training log:

    {"iteration": 120, "microbatch": 0, "layer": 2, "ep_rank": 1, "tokens_per_expert": [512, 498]}
    [rank 3] 2025-01-07 12:00:01 kiln-tokens {"iteration": 120, "microbatch": 0, ...}

Every other line is skipped. "layer" is the layer number as the training
framework counts it (Megatron's layer_number is 1-based and counts dense
layers too); the trace numbers the MoE layers 0, 1, ... in the order of
the numbers seen, unless --keep-layer-numbers. The trace written (stdout
without -o) has the header iteration,microbatch,layer,rank,e0,...,eK-1 and
one row per record, sorted; kilnc simulate --loads reads it as token
counts and checks them against the model (columns per rank, ranks,
micro-batches, routed rows).

Bad input is reported as LOG:LINE: error: MESSAGE (up to 20), exit status 1;
bad arguments exit 2. Nothing is written unless the whole log converts.
Python 3 standard library only.
"""

import json
import os
import sys
import tempfile

TAG = "kiln-tokens"
KEYS = ("iteration", "microbatch", "layer", "ep_rank")
MAX_ERRORS = 20
MAX_KEY = (10**18 - 1, 2**31 - 2, 2**31 - 2, 2**31 - 2)  # what kilnc reads
MAX_COUNT = 1e15  # far beyond any micro-batch; keeps every count a short decimal


def usage(msg):
    sys.stderr.write("router_log_to_trace.py: error: %s\n" % msg)
    sys.stderr.write("usage: router_log_to_trace.py LOG [-o TRACE.csv] [--keep-layer-numbers]\n")
    sys.exit(2)


def record_text(line):
    """The JSON text of the record on line, or None when it holds none."""
    at = line.find(TAG)
    if at >= 0:
        return line[at + len(TAG):].strip()
    s = line.strip()
    return s if s.startswith("{") else None


def parse(path, lines):
    """Records as (key tuple, counts, line number); errors as messages."""
    records, errors, width, width_line = [], [], None, 0
    for no, line in enumerate(lines, 1):
        if len(errors) >= MAX_ERRORS:
            break
        text = record_text(line)
        if text is None:
            continue

        def err(msg):
            errors.append((no, "%s:%d: error: %s" % (path, no, msg)))

        try:
            rec = json.loads(text)
        except ValueError as e:
            err("not a JSON record: %s" % e)
            continue
        if not isinstance(rec, dict):
            err("a record is a JSON object")
            continue
        key, bad = [], False
        for name, top in zip(KEYS, MAX_KEY):
            v = rec.get(name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v > top:
                err("'%s' must be an integer from 0 to %d, got %s" % (name, top, json.dumps(v)))
                bad = True
            key.append(v)
        counts = rec.get("tokens_per_expert")
        if not isinstance(counts, list) or not counts:
            err("'tokens_per_expert' must be a non-empty list of token counts")
            continue
        for c in counts:
            ok = isinstance(c, (int, float)) and not isinstance(c, bool)
            if not ok or not (0 <= c < MAX_COUNT):
                err("token counts must be numbers from 0 to below 1e15, got %s" % json.dumps(c))
                bad = True
                break
        if bad:
            continue
        if width is None:
            width, width_line = len(counts), no
        elif len(counts) != width:
            err("%d token counts, but line %d has %d: every record is one EP rank's local "
                "experts" % (len(counts), width_line, width))
            continue
        records.append((tuple(key), counts, no))
    if not records and not errors:
        errors.append((0, "%s: error: no records (JSON objects with %s, whole lines or after "
                          "the tag '%s')" % (path, ", ".join(KEYS + ("tokens_per_expert",)), TAG)))
    return records, errors


def main(argv):
    path, out, keep = None, None, False
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "-o":
            if i + 1 >= len(argv) or not argv[i + 1]:
                usage("-o needs a file name")
            out = argv[i + 1]
            i += 1
        elif a == "--keep-layer-numbers":
            keep = True
        elif a in ("-h", "--help"):
            sys.stdout.write(__doc__)
            return 0
        elif a.startswith("-") and a != "-":
            usage("unknown option '%s'" % a)
        elif path is None:
            path = a
        else:
            usage("one LOG at a time, got '%s' and '%s'" % (path, a))
        i += 1
    if path is None:
        usage("needs a LOG file")
    # kilnc's output rule: the output may not be the input.
    if out is not None and path != "-" and os.path.exists(out) and os.path.exists(path) \
            and os.path.samefile(out, path):
        usage("-o %s is the LOG %s: writing it would destroy the log" % (out, path))
    try:
        if path == "-":
            lines = sys.stdin.read().splitlines()
        else:
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
    except OSError as e:
        sys.stderr.write("%s: error: %s\n" % (path, e.strerror or e))
        return 1
    records, errors = parse(path, lines)
    seen = {}
    for key, _, no in records:
        if key in seen:
            errors.append((no, "%s:%d: error: a second record for iteration %d, micro-batch "
                               "%d, layer %d, EP rank %d (the first is on line %d)"
                           % (path, no, *key, seen[key])))
        else:
            seen[key] = no
    if errors:
        errors.sort(key=lambda e: e[0])
        for _, e in errors[:MAX_ERRORS]:
            sys.stderr.write(e + "\n")
        if len(errors) >= MAX_ERRORS:
            sys.stderr.write("%s: note: stopping after %d errors\n" % (path, MAX_ERRORS))
        return 1
    layer_of = {n: n for n in {k[2] for k, _, _ in records}}
    if not keep:
        layer_of = {n: i for i, n in enumerate(sorted(layer_of))}
    width = len(records[0][1])
    rows = sorted(((k[0], k[1], layer_of[k[2]], k[3]), c) for k, c, _ in records)
    text = ["# %s: per-expert token counts (examples/traces/router_log_to_trace.py)\n"
            % os.path.basename(path)]
    if not keep and any(n != i for n, i in layer_of.items()):
        text.append("# MoE layers renumbered: %s\n"
                    % ", ".join("%d -> %d" % (n, i) for n, i in sorted(layer_of.items())))
    text.append("iteration,microbatch,layer,rank,%s\n"
                % ",".join("e%d" % e for e in range(width)))
    for key, counts in rows:
        text.append("%d,%d,%d,%d,%s\n" % (key + (",".join(repr(c) for c in counts),)))
    body = "".join(text)
    if out is None:
        sys.stdout.write(body)
        return 0
    # Written whole or not at all: a temporary file beside out, renamed.
    d = os.path.dirname(os.path.abspath(out))
    try:
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(out) + ".tmp.", dir=d)
    except OSError as e:
        sys.stderr.write("router_log_to_trace.py: error: cannot write %s: %s\n"
                         % (out, e.strerror or e))
        return 1
    try:
        with os.fdopen(fd, "w") as f:
            f.write(body)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, out)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        sys.stderr.write("router_log_to_trace.py: error: cannot write %s: %s\n"
                         % (out, e.strerror or e))
        return 1
    return 0


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
