#!/usr/bin/env python3
"""Fails on a file-level import cycle inside the directories that must have floors (issue 61).

    python3 scripts/check-floors.py              # the repository's three places; exit 1 on a cycle
    python3 scripts/check-floors.py --self-test  # a deliberate cycle must be found, floors must pass
    python3 scripts/check-floors.py --graph DIR  # print DIR's file graph, lowest floor first

A file A depends on a file B when A's code (not its `#[cfg(test)]` modules) names an item of B:
a `use` path, an inline `crate::`/`super::`/`self::` path, or a path relative to the current
module in a `use`. Paths through a `mod.rs`/`lib.rs` re-export (`pub use x::Item`) are followed
to the file that defines the item, so a facade module makes no cycle; a re-export in any other
file is a dependency of that file. `mod x;` declarations are not dependencies. Standard library
only; Rust sources are read with a small lexer (comments, strings and char literals removed).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (crate source root, directory inside it that must have no cycle)
PLACES = [
    ("model/src", "model/src"),
    ("driver/src", "driver/src/retrieval"),
    ("index-core/src", "index-core/src/attention"),
]

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_code(text: str) -> str:
    """Removes comments, string literals and char literals (keeping line breaks)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    if text[i] == "\n":
                        out.append("\n")
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not text[i - 1].isalnum()):
            m = re.match(r'r(#*)"', text[i:])
            end = text.find('"' + m.group(1), i + len(m.group(0)))
            end = n if end < 0 else end + 1 + len(m.group(1))
            out.append('""' + "\n" * text.count("\n", i, end))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'":
            m = re.match(r"'(?:\\.[^']{0,8}|[^\\'\n])'", text[i:])
            if m:
                out.append("' '")
                i += len(m.group(0))
            else:  # a lifetime
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching_brace(text: str, open_at: int) -> int:
    depth = 0
    for j in range(open_at, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(text) - 1


def drop_test_modules(text: str) -> str:
    """Blanks `#[cfg(test)] mod x { ... }` blocks (keeping line breaks)."""
    while True:
        m = re.search(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+" + IDENT + r"\s*\{", text)
        if not m:
            return text
        end = matching_brace(text, m.end() - 1)
        text = text[: m.start()] + "\n" * text.count("\n", m.start(), end + 1) + text[end + 1:]


def expand_use_tree(tree: str) -> list[tuple[list[str], str]]:
    """`a::b::{c, d::{e as f}, self}` -> [(["a","b","c"], "c"), ...] (path, name bound)."""
    tree = re.sub(r"\s+", "", tree)
    results: list[tuple[list[str], str]] = []

    def split_top(s: str) -> list[str]:
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        if cur:
            parts.append(cur)
        return parts

    def walk(prefix: list[str], s: str) -> None:
        if not s:
            return
        if s.startswith("{"):
            for part in split_top(s[1:-1]):
                walk(prefix, part)
            return
        brace = s.find("{")
        head = s if brace < 0 else s[:brace]
        if brace >= 0:
            segs = [x for x in head.split("::") if x]
            walk(prefix + segs, s[brace:])
            return
        segs = [x for x in head.split("::") if x]
        if segs and segs[-1] == "self":
            segs = segs[:-1]
        if segs:
            results.append((prefix + segs, segs[-1]))

    walk([], tree)
    return results


class Crate:
    """The module tree of one crate source directory."""

    def __init__(self, src: Path):
        self.src = src
        self.files: dict[tuple[str, ...], Path] = {}
        for p in sorted(src.rglob("*.rs")):
            rel = p.relative_to(src).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            if parts and parts[0] == "bin":
                continue
            self.files.setdefault(tuple(parts), p)
        self.code = {m: drop_test_modules(strip_code(p.read_text())) for m, p in self.files.items()}
        self.reexports: dict[tuple[str, ...], dict[str, list[str]]] = {}
        self.uses: dict[tuple[str, ...], list[tuple[list[str], str, bool, int, tuple[str, ...]]]] = {}
        for m, code in self.code.items():
            self._scan(m, code)

    def module_file(self, mod: tuple[str, ...]) -> tuple[str, ...] | None:
        """The file module of `mod` (an inline module belongs to the file around it)."""
        while mod not in self.files:
            if not mod:
                return None
            mod = mod[:-1]
        return mod

    def _scan(self, m: tuple[str, ...], code: str) -> None:
        """Records `use` items and inline paths of file module `m`, with the inline module each
        sits in."""
        inline: list[tuple[str, int]] = []  # (name, brace depth at its opening)
        depth = 0
        uses = self.uses.setdefault(m, [])
        reexp = self.reexports.setdefault(m, {})
        facade = self.files[m].name in ("mod.rs", "lib.rs") or self._has_children(m)
        i = 0
        use_re = re.compile(r"\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]*);")
        mod_re = re.compile(r"\bmod\s+(" + IDENT + r")\s*\{")
        path_re = re.compile(r"(?<![A-Za-z0-9_:])((?:crate|super|self)(?:\s*::\s*" + IDENT + r")+)")
        n = len(code)
        while i < n:
            ch = code[i]
            if ch == "{":
                depth += 1
                i += 1
                continue
            if ch == "}":
                depth -= 1
                while inline and inline[-1][1] >= depth:
                    inline.pop()
                i += 1
                continue
            here = m + tuple(name for name, _ in inline)
            line = code.count("\n", 0, i) + 1
            mm = mod_re.match(code, i)
            if mm and (i == 0 or not (code[i - 1].isalnum() or code[i - 1] == "_")):
                inline.append((mm.group(1), depth))
                depth += 1
                i = mm.end()
                continue
            um = use_re.match(code, i)
            if um and (i == 0 or not (code[i - 1].isalnum() or code[i - 1] == "_")):
                is_pub = bool(um.group(1))
                raw = um.group(2)
                aliases = dict(re.findall(r"(" + IDENT + r")\s+as\s+(" + IDENT + r")", raw))
                tree = re.sub(r"(" + IDENT + r")\s+as\s+" + IDENT, r"\1", raw)
                for path, name in expand_use_tree(tree):
                    bound = aliases.get(name, name)
                    if is_pub and facade and not inline:
                        reexp[bound] = path
                        # The facade's own code may use the name too: then it depends on it.
                        if len(re.findall(r"\b" + re.escape(bound) + r"\b", code)) > 1:
                            uses.append((path, bound, is_pub, line, here))
                    else:
                        uses.append((path, bound, is_pub, line, here))
                i = um.end()
                continue
            pm = path_re.match(code, i)
            if pm and (i == 0 or not (code[i - 1].isalnum() or code[i - 1] in "_:")):
                path = [s.strip() for s in pm.group(1).split("::")]
                uses.append((path, path[-1], False, line, here))
                i = pm.end()
                continue
            i += 1

    def _has_children(self, m: tuple[str, ...]) -> bool:
        return any(len(k) == len(m) + 1 and k[: len(m)] == m for k in self.files)

    def resolve(self, path: list[str], here: tuple[str, ...], depth: int = 0) -> tuple[str, ...] | None:
        """The file module whose item `path` names, seen from module `here`; None outside."""
        if depth > 20 or not path:
            return None
        head, rest = path[0], path[1:]
        if head == "crate":
            mod: tuple[str, ...] = ()
        elif head == "self":
            mod = here
        elif head == "super":
            mod = here
            while path and path[0] == "super":
                mod = mod[:-1]
                path = path[1:]
            rest = path
        elif here + (head,) in self.files or self._inline_exists(here + (head,)):
            mod, rest = here + (head,), rest
        else:
            return None  # another crate, std, or an item in scope
        # Walk into modules while they exist.
        while rest and (mod + (rest[0],) in self.files or self._inline_exists(mod + (rest[0],))):
            mod, rest = mod + (rest[0],), rest[1:]
        fmod = self.module_file(mod)
        if fmod is None:
            return None
        if rest and fmod == mod:
            target = self.reexports.get(fmod, {}).get(rest[0])
            if target is not None:
                got = self.resolve(target + rest[1:], fmod, depth + 1)
                if got is not None:
                    return got
        return fmod

    def _inline_exists(self, mod: tuple[str, ...]) -> bool:
        fmod = self.module_file(mod)
        if fmod is None or fmod == mod:
            return False
        inner = mod[len(fmod):]
        return re.search(r"\bmod\s+" + re.escape(inner[0]) + r"\s*\{", self.code[fmod]) is not None

    def graph(self, scope: tuple[str, ...]) -> dict[tuple[str, ...], dict[tuple[str, ...], list[int]]]:
        """File -> file -> lines, for files under module `scope`."""
        inside = lambda mod: mod[: len(scope)] == scope  # noqa: E731
        g: dict[tuple[str, ...], dict[tuple[str, ...], list[int]]] = {}
        for m, uses in self.uses.items():
            if not inside(m):
                continue
            g.setdefault(m, {})
            for path, _bound, _pub, line, here in uses:
                if path and path[-1] == "*":
                    path = path[:-1]
                target = self.resolve(path, here)
                if target is None or target == m or not inside(target):
                    continue
                g[m].setdefault(target, []).append(line)
        return g


def sccs(g: dict) -> list[list]:
    """Strongly connected components with more than one file (Tarjan)."""
    index: dict = {}
    low: dict = {}
    stack: list = []
    on: set = set()
    out: list[list] = []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, {}):
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

    sys.setrecursionlimit(10000)
    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def shown(p: Path) -> str:
    """`p` relative to the repository (or to a temporary directory, for the self-test)."""
    for base, name in ((ROOT, ""), (Path(tempfile.gettempdir()), "$TMPDIR/")):
        try:
            return name + str(p.resolve().relative_to(base.resolve()))
        except ValueError:
            pass
    return str(p)


def check(src: Path, scope_dir: Path, quiet: bool = False) -> int:
    crate = Crate(src)
    scope = tuple(scope_dir.relative_to(src).parts)
    g = crate.graph(scope)
    name = lambda mod: str(crate.files[mod].relative_to(src.parent))  # noqa: E731
    comps = sccs(g)
    for comp in comps:
        print(f"cycle in {shown(scope_dir)}: " + " <-> ".join(name(m) for m in comp))
        for a in comp:
            for b, lines in sorted(g[a].items()):
                if b in comp:
                    print(f"    {name(a)}:{','.join(map(str, lines[:5]))} -> {name(b)}")
    if not comps and not quiet:
        print(f"ok: {shown(scope_dir)} ({len(g)} files, no import cycle)")
    return len(comps)


def print_graph(src: Path, scope_dir: Path) -> None:
    crate = Crate(src)
    g = crate.graph(tuple(scope_dir.relative_to(src).parts))
    level: dict = {}

    def lvl(v, seen=()):
        if v in level:
            return level[v]
        if v in seen:
            return 0
        level[v] = 0
        level[v] = 1 + max((lvl(w, seen + (v,)) for w in g.get(v, {})), default=-1)
        return level[v]

    for v in sorted(g, key=lambda v: (lvl(v), v)):
        deps = ", ".join(crate.files[w].name if len(w) else "lib.rs" for w in sorted(g[v]))
        print(f"{lvl(v)}  {crate.files[v].relative_to(src)}  -> {deps}")


SELF_TEST = {
    "lib.rs": "pub mod a;\npub mod b;\npub mod c;\npub use a::Alpha;\npub use b::Beta;\n",
    "a.rs": "use crate::Beta;\npub struct Alpha(Beta);\n#[cfg(test)]\nmod tests { use crate::c::Gamma; }\n",
    "b.rs": "pub struct Beta;\n// use crate::a::Alpha;\nconst S: &str = \"crate::a::Alpha\";\n",
    "c.rs": "use super::a::Alpha;\npub struct Gamma(Alpha);\n",
}


def self_test() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for name, text in SELF_TEST.items():
            (src / name).write_text(text)
        # Floors: c -> a -> b (through lib.rs's re-export); comments, strings and test modules
        # make no edge.
        if check(src, src, quiet=True) != 0:
            print("self-test FAILED: a crate with floors was reported as a cycle")
            return 1
        # The deliberate cycle: b names a through the facade.
        (src / "b.rs").write_text("pub struct Beta;\npub fn f() -> usize { std::mem::size_of::<crate::Alpha>() }\n")
        if check(src, src, quiet=True) != 1:
            print("self-test FAILED: the deliberate cycle a <-> b was not found")
            return 1
    print("self-test ok: floors pass, a deliberate cycle fails")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--graph", metavar="DIR", help="print the file graph of DIR (a crate's src or a folder in it)")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    if args.graph:
        d = (ROOT / args.graph).resolve()
        src = d
        while not (src.name == "src"):
            src = src.parent
        print_graph(src, d)
        return 0
    bad = 0
    for src, scope in PLACES:
        bad += check(ROOT / src, ROOT / scope)
    if bad:
        print(f"check-floors: {bad} import cycle(s)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
