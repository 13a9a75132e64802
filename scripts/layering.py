#!/usr/bin/env python3
"""Checks that the modules of src/ import each other without a circle.

Every file of src/ is a node; an edge goes from a file to the file of each module its code
names (`use crate::a::b`, `super::x`, `self::x`, or a path like `crate::a::f(..)` in code;
comments and doc comments are skipped). A path resolves to the deepest module file it names
(`crate::a::b::Item` → src/a/b.rs if that file exists, else src/a.rs or src/a/mod.rs); a
path that starts with a child module of the file (`use x::Item` after `mod x;`) is an edge
to the child. Declaring a child (`mod x;`) is not an edge. Prints the files in each circle (a strongly
connected component of more than one file) and exits 1 if there is any; with --graph, prints
every edge. Standard library only.
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def module_of(path):
    """src/a/b.rs or src/a/b/mod.rs -> ['a', 'b']; src/lib.rs -> []."""
    rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib"):
        rel = rel[:-1]
    return rel


def file_of(parts):
    """The file of the deepest existing module along `parts`."""
    best = os.path.join(ROOT, "lib.rs")
    for n in range(1, len(parts) + 1):
        base = os.path.join(ROOT, *parts[:n])
        if os.path.isfile(base + ".rs"):
            best = base + ".rs"
        elif os.path.isfile(os.path.join(base, "mod.rs")):
            best = os.path.join(base, "mod.rs")
        else:
            break
    return best


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//")[0] for line in text.splitlines())


def inline_modules(code):
    """The spans of inline modules (`mod x { .. }`) in the code."""
    spans = []
    for m in re.finditer(r"\bmod\s+\w+\s*\{", code):
        depth, i = 0, m.end() - 1
        while i < len(code):
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            if depth == 0:
                break
            i += 1
        spans.append((m.start(), i))
    return spans


def use_paths(code):
    """Every module path the code names, as lists of segments, braces of `use` trees
    expanded; inside an inline module, its `self`/`super` are taken as the file's."""
    spans = inline_modules(code)
    paths = []

    def add(path, at):
        inside = sum(1 for a, b in spans if a <= at <= b)
        while inside and path and path[0] in ("super", "self"):
            path = ["self"] + path[1:] if path[0] == "super" else path
            inside -= 1
        paths.append(path)

    for m in re.finditer(r"\buse\s+([^;]+);", code):
        for path in expand(m.group(1).replace("\n", " ")):
            add(path, m.start())
    for m in re.finditer(r"(?<![\w:])(\w+(?:::\w+)+)", code):
        add(m.group(1).split("::"), m.start())
    return paths


def expand(tree):
    tree = tree.strip()
    m = re.match(r"^([\w:]*?)::\{(.*)\}$", tree, flags=re.S)
    if not m:
        return [re.split(r"\s+as\s+", tree)[0].split("::")]
    prefix, inner = m.group(1), m.group(2)
    out, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    result = []
    for part in out:
        part = part.strip()
        if not part:
            continue
        if part == "self":
            result.append(prefix.split("::"))
        else:
            result += [prefix.split("::") + p for p in expand(part)]
    return result


def resolve(here, path, children):
    mod = module_of(here)
    head, rest = path[0], path[1:]
    if head in children:
        return file_of(mod + path)
    if head == "crate":
        base = []
    elif head == "self":
        base = mod
    elif head == "super":
        base = mod[:-1]
        while rest and rest[0] == "super":
            base, rest = base[:-1], rest[1:]
    else:
        return None  # an external crate, std, or a child module declared here
    return file_of(base + rest)


def main():
    files = []
    for d, _, names in os.walk(ROOT):
        files += [os.path.join(d, n) for n in names if n.endswith(".rs")]
    edges = {f: set() for f in files}
    for f in files:
        code = strip_comments(open(f, encoding="utf-8").read())
        # Test modules may reach anywhere; they are not part of the layering.
        code = re.split(r"#\[cfg\((?:all\()?test", code)[0]
        children = set(re.findall(r"\bmod\s+(\w+)\s*;", code))
        for path in use_paths(code):
            target = resolve(f, path, children)
            if target and target != f and target in edges:
                edges[f].add(target)
    rel = lambda p: os.path.relpath(p, os.path.join(ROOT, ".."))
    if "--graph" in sys.argv:
        for f in sorted(edges):
            for t in sorted(edges[f]):
                print(f"{rel(f)} -> {rel(t)}")
    # Tarjan's strongly connected components.
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
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
            comps.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    circles = [sorted(rel(f) for f in c) for c in comps if len(c) > 1]
    for c in circles:
        print("import circle:", " ".join(c))
    print(f"{len(files)} files, {sum(map(len, edges.values()))} imports, {len(circles)} circles")
    return 1 if circles else 0


if __name__ == "__main__":
    sys.exit(main())
