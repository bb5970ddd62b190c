#!/usr/bin/python3
"""callgraph.py: the calls between the .c files of one process, and cycles.

Reads the object files the build made for a folder (nm: the symbols each
file defines and the ones it uses), draws an edge a -> b when a.c uses a
function or variable b.c defines, and prints every edge, then each cycle
(strongly connected component of more than one file). Exits 1 when there
is a cycle, so CI can hold the rule "files do not call each other in
circles".

usage: scripts/callgraph.py BUILD_DIR FOLDER...   (e.g. build frontend broker)
"""
import glob
import os
import subprocess
import sys


def symbols(obj):
    defined, used = set(), set()
    out = subprocess.run(["nm", obj], capture_output=True, text=True,
                         check=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] == "T":
            defined.add(parts[2])
        elif len(parts) == 2 and parts[0] == "U":
            used.add(parts[1])
    return defined, used


def graph(build, folder):
    objs = [o for o in glob.glob(os.path.join(
        build, folder, "CMakeFiles", "*_lib.dir", "*.c.o"))
        if not o.endswith("_test.c.o")]
    objs += glob.glob(os.path.join(build, folder, "CMakeFiles",
                                   f"smg-{folder}.dir", "main.c.o"))
    owner, uses = {}, {}
    for o in objs:
        name = os.path.basename(o)[:-2]
        d, u = symbols(o)
        for s in d:
            owner[s] = name
        uses[name] = u
    edges = {n: sorted({owner[s] for s in u if s in owner} - {n})
             for n, u in uses.items()}
    return edges


def cycles(edges):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    bad = False
    for folder in sys.argv[2:]:
        edges = graph(sys.argv[1], folder)
        if not edges:
            sys.exit(f"callgraph: no objects for {folder} in {sys.argv[1]}")
        n = sum(len(v) for v in edges.values())
        print(f"{folder}: {len(edges)} files, {n} file-to-file edges")
        for a in sorted(edges):
            if edges[a]:
                print(f"  {a} -> {' '.join(edges[a])}")
        cyc = cycles(edges)
        for c in cyc:
            print(f"  CYCLE: {' '.join(c)}")
        if not cyc:
            print("  no cycle")
        bad = bad or bool(cyc)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
