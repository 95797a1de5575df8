#!/usr/bin/env python3
"""No file-level dependency cycles among kiln's C files (docs/passes.md,
"Layering").

File A depends on file B when A's object uses a function or variable that
B's object defines (nm: an undefined symbol of A.o that B.o defines). That
is what a call through a folder's internal header really costs: A cannot be
read, tested or replaced without B. A cycle (A needs B, B needs A, through
any chain) means neither sits below the other; the fix is to move what the
lower side needs into a file (and a header section) of its own, owned by
the file that defines it.

Usage: file_cycles.py DIR...   every *.o under each DIR (CMake's object
                               folders); a source's name is its object's path
                               after "<target>.dir/", less ".o"
Exit status 0 when the only cycles are the known ones below, 1 when there
is another cycle or a known one is gone (take it off the list), 2 when no
object was found (nothing was checked).
"""
import os
import subprocess
import sys

# Cycles that exist and are not yet broken, each with why it stays for now.
# A cycle found that is not listed fails the check, and so does a listed one
# that is no longer found, so the list stays true.
KNOWN = {}  # none: the last (sim/oracle.c <-> sim/policy.c) went with sim/price.c

DEFINED = set("TDBRCGSVW")  # nm's defined (global) symbol types


def source_name(root, path):
    rel = os.path.relpath(path, root)
    key = ".dir" + os.sep
    if key in rel:
        rel = rel.split(key, 1)[1]
    return rel[:-2] if rel.endswith(".o") else rel


def symbols(path):
    out = subprocess.run(["nm", "-P", path], capture_output=True, text=True, check=True).stdout
    defs, undefs = set(), set()
    for line in out.splitlines():
        f = line.split()
        if len(f) < 2:
            continue
        if f[1] == "U":
            undefs.add(f[0])
        elif f[1] in DEFINED:
            defs.add(f[0])
    return defs, undefs


def sccs(graph):
    """Tarjan's strongly connected components, iteratively."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    defs, undefs = {}, {}
    for root in argv[1:]:
        for d, _, files in os.walk(root):
            for f in files:
                if f.endswith(".o"):
                    p = os.path.join(d, f)
                    name = source_name(root, p)
                    dset, uset = symbols(p)
                    undefs.setdefault(name, set()).update(uset)
                    for s in dset:
                        defs[s] = name
    if not undefs:
        print("file_cycles: no object files under " + " ".join(argv[1:]), file=sys.stderr)
        return 2
    graph = {n: set() for n in undefs}
    why = {}
    for a, us in undefs.items():
        for s in us:
            b = defs.get(s)
            if b and b != a:
                graph[a].add(b)
                why.setdefault((a, b), []).append(s)
    found = [c for c in sccs(graph) if len(c) > 1]
    bad = 0
    for c in found:
        known = frozenset(c) in KNOWN
        print("file_cycles: %s cycle: %s" % ("known" if known else "NEW", ", ".join(c)))
        for a in c:
            for b in c:
                if (a, b) in why:
                    print("  %s -> %s: %s" % (a, b, ", ".join(sorted(why[(a, b)]))))
        if known:
            print("  (stays for now: %s)" % KNOWN[frozenset(c)])
        else:
            bad += 1
    present = {frozenset(c) for c in found}
    for k in sorted(KNOWN, key=sorted):
        if k not in present:
            print("file_cycles: the known cycle %s is gone: take it off KNOWN in %s"
                  % (", ".join(sorted(k)), argv[0]))
            bad += 1
    print("file_cycles: %d files, %d cycles (%d not allowed)" % (len(graph), len(found), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
