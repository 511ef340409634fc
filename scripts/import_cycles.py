#!/usr/bin/env python3
"""Which module of the library names which (every `crate::` path, in `use` or inline), the
circles among them, and the floors of the rest.

A node is a file's module (`ledger/error` for src/ledger/error.rs, `ledger` for its mod.rs);
test files and inline `#[cfg(test)] mod` blocks are left out (a module's tests may drive it from
above: the driver's own tests run whole locks through a Client). A path names the deepest module it reaches, and a
module names its submodules; the crate root's re-exports count as the module that defines them.
The binary (src/bin) is a crate of its own and is left out.

Usage: scripts/import_cycles.py [src] [-v]   (-v: print every module's floor and imports)
Exit status 1 when there is a circle other than the two docs/design.md ("Layers") declares, or
when a sans-I/O module (the wire layer and the machines above it) reaches the crate's `error`,
directly or through another module: each of those floors reports failures in its own types, which
`error` wraps from above.
"""
import os, re, sys
from collections import defaultdict

# The sans-I/O floors, which must not reach `error` (docs/design.md, "Layers"): a module is one
# of them when its node is one of these or lies under one.
SANS_IO = ("wire", "assign", "membership", "ledger", "group_view")

# The circles docs/design.md declares: floor 1's knot of types, floor 4's pair.
DECLARED = [
    {"error", "security", "security/cpu", "security/provider", "oauth"},
    {"client", "lock"},
]

args = [a for a in sys.argv[1:] if a != "-v"]
SRC = args[0] if args else "src"

def node_of(rel):  # "ledger/tests.rs" -> "ledger"
    parts = rel[:-3].split("/")
    if parts[-1] in ("mod", "tests"):
        parts.pop()
    if parts and parts[-1].endswith("_tests"):
        parts[-1] = parts[-1][: -len("_tests")]
    return "/".join(parts) or "lib"

def without_test_modules(text):  # drops each `#[cfg(test)] mod x { ... }` up to its closing brace
    out, at = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([\w:]+\))?\s+)?mod\s+\w+\s*\{", text):
        if m.start() < at:
            continue
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += (text[i] == "{") - (text[i] == "}")
            i += 1
        out.append(text[at:m.start()]); at = i
    return "".join(out) + text[at:]

files = {}
for root, _, names in os.walk(SRC):
    for n in names:
        rel = os.path.relpath(os.path.join(root, n), SRC)
        is_test = n == "tests.rs" or n.endswith("_tests.rs")
        if n.endswith(".rs") and not rel.startswith("bin") and not is_test:
            text = re.sub(r"//[^\n]*", "", open(os.path.join(SRC, rel)).read())
            files[rel] = without_test_modules(text)
nodes = {node_of(r) for r in files}

def flatten(tree, prefix=""):  # "a::{b, c::{d}}" -> ["a::b", "a::c::d"]
    tree = tree.strip()
    m = re.match(r"^(.*?)\{(.*)\}$", tree, re.S)
    if not m:
        return [prefix + tree]
    parts, depth, cur = [], 0, ""
    for ch in m.group(2):
        depth += (ch == "{") - (ch == "}")
        if ch == "," and depth == 0:
            parts.append(cur); cur = ""
        else:
            cur += ch
    return [p for part in parts + [cur] if part.strip() for p in flatten(part, prefix + m.group(1))]

root_names = {}  # name the crate root re-exports -> defining module path
for m in re.finditer(r"\bpub use\s+([\w:]+::\{.*?\}|[\w:]+);", files["lib.rs"], re.S):
    for p in flatten(m.group(1)):
        segs = [s.strip() for s in p.split("::") if s.strip()]
        root_names[segs[-1]] = segs[:-1]

def target(segs):
    if segs and segs[0] in root_names:
        segs = root_names[segs[0]] + segs[1:]
    for n in range(len(segs), 0, -1):
        if "/".join(segs[:n]) in nodes:
            return "/".join(segs[:n])
    return None

edges = defaultdict(set)
for rel, text in files.items():
    src = node_of(rel)
    paths = [p for m in re.finditer(r"\buse\s+crate::([^;]*);", text, re.S) for p in flatten(m.group(1))]
    paths += re.findall(r"\bcrate::((?:\w+::)*\w+)", re.sub(r"\buse\s+crate::[^;]*;", "", text, flags=re.S))
    for p in paths:
        t = target([s.strip() for s in p.split("::") if s.strip()])
        if t and t != src:
            edges[src].add(t)
for n in nodes:  # a module names its submodules
    if "/" in n:
        edges[n.rsplit("/", 1)[0] if n.rsplit("/", 1)[0] in nodes else "lib"].add(n)
    elif n != "lib":
        edges["lib"].add(n)
edges.pop("lib", None)  # the root declares everything; it is nobody's dependency

index, low, stack, on, sccs = {}, {}, [], set(), []
def visit(v):
    index[v] = low[v] = len(index); stack.append(v); on.add(v)
    for w in sorted(edges.get(v, ())):
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = set()
        while True:
            w = stack.pop(); on.discard(w); comp.add(w)
            if w == v:
                break
        sccs.append(comp)
sys.setrecursionlimit(10000)
for v in sorted(nodes - {"lib"}):
    if v not in index:
        visit(v)

comp_of = {v: i for i, c in enumerate(sccs) for v in c}
floor = {}
for i, c in enumerate(sccs):  # Tarjan yields components dependencies-first
    below = [floor[comp_of[w]] for v in c for w in edges.get(v, ()) if comp_of[w] != i]
    floor[i] = 1 + max(below, default=-1)
if "-v" in sys.argv:
    for i in sorted(range(len(sccs)), key=lambda i: (floor[i], sorted(sccs[i]))):
        for v in sorted(sccs[i]):
            print(f"floor {floor[i]:2}  {v:22} -> {', '.join(sorted(edges.get(v, ())))}")
circles = [c for c in sccs if len(c) > 1]
for c in circles:
    print("declared circle:" if c in DECLARED else "circle:", ", ".join(sorted(c)))
    for v in sorted(c):
        inside = sorted(edges.get(v, set()) & c)
        if inside:
            print(f"  {v} -> {', '.join(inside)}")

def path_to(start, goal):  # the first chain of imports from start to goal, or None
    seen, queue = {start: None}, [start]
    while queue:
        v = queue.pop(0)
        if v == goal:
            chain = []
            while v is not None:
                chain.append(v); v = seen[v]
            return chain[::-1]
        for w in sorted(edges.get(v, ())):
            if w not in seen:
                seen[w] = v; queue.append(w)
    return None

upward = []
for v in sorted(nodes):
    if any(v == p or v.startswith(p + "/") for p in SANS_IO):
        chain = path_to(v, "error")
        if chain:
            upward.append(chain)
            print("sans-I/O module reaches error:", " -> ".join(chain))
sys.exit(1 if upward or any(c not in DECLARED for c in circles) else 0)
