#!/usr/bin/env python3
"""Lists import cycles between the modules (files) of a crate: every `crate::a::b` path in a
file is an edge from that file's module to the longest module path it names. Exits 1 if any
cycle exists. `use super::*` in a file's test module is not an edge (tests sit beside code).
    scripts/module-cycles.py crates/gateway/src crates/keyengine/src
"""
import os, re, sys

def modules(src):
    """module path (tuple) -> file"""
    out = {}
    for dp, _, fs in os.walk(src):
        for f in fs:
            if not f.endswith('.rs'):
                continue
            rel = os.path.relpath(os.path.join(dp, f), src)[:-3].split(os.sep)
            if rel[-1] in ('mod', 'lib', 'main'):
                rel = rel[:-1]
            out[tuple(rel)] = os.path.join(dp, f)
    return out

def strip_tests(text):
    # Drop `#[cfg(test)] mod tests { ... }` blocks (brace-matched).
    out, i = [], 0
    for m in re.finditer(r'#\[cfg\(test\)\]\s*(pub(\(crate\))?\s+)?mod\s+\w+\s*\{', text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {'{': 1, '}': -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return ''.join(out)

def edges(src):
    mods = modules(src)
    g = {m: set() for m in mods}
    for m, path in mods.items():
        text = strip_tests(open(path).read())
        text = re.sub(r'//[^\n]*', '', text)  # comments and doc links are not imports
        for ref in re.findall(r'\bcrate::((?:[a-z_][a-z_0-9]*::)*[a-z_][a-z_0-9]*)', text):
            parts = tuple(ref.split('::'))
            # the longest prefix that is a module
            for k in range(len(parts), 0, -1):
                if parts[:k] in mods:
                    t = parts[:k]
                    if t != m and t != m[:len(t)]:   # a module may use its own ancestors' items
                        g[m].add(t)
                    break
        # `use super::x` / `super::x::` from a non-test context
        for ref in re.findall(r'\bsuper::([a-z_][a-z_0-9]*)', text):
            parent = m[:-1]
            t = parent + (ref,)
            if t in mods and t != m:
                g[m].add(t)
    return g

def cycles(g):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)
    def visit(v):
        index[v] = low[v] = n[0]; n[0] += 1; stack.append(v); on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)
    for v in g:
        if v not in index:
            visit(v)
    return out

bad = 0
for src in sys.argv[1:]:
    for comp in cycles(edges(src)):
        bad += 1
        names = sorted('::'.join(c) or '(root)' for c in comp)
        print(f'{src}: cycle among ' + ', '.join(names))
sys.exit(1 if bad else 0)
