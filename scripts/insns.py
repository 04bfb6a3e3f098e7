#!/usr/bin/env python3
"""Instruction counts of the inner-product kernels, for scripts/arm64-insns.sh.

  insns.py loops OBJDUMP_TXT ARCH          hot loops of the kernel symbols in an objdump -d -C
                                           --no-show-raw-insn listing (static counts)
  insns.py qemu BINARY ISA KERNEL DIM ROWS instructions one call executes, aarch64 under qemu
  insns.py gdb BINARY ISA KERNEL DIM ROWS  the same on x86, single-stepped by gdb
  insns.py hot BINARY ARCH OBJDUMP_TXT ISA the hot loop of each kernel of a set, found from
                                           where its function pointers point
  insns.py table COUNTS_TSV HOT_TSV...     the table of docs/ARM64.md from those

The dynamic counts run `kernel_insns` (index-core/examples/kernel_insns.rs): under qemu, every
instruction executed in the binary's own code except `main` is logged (-singlestep -d
nochain,exec -dfilter), and a call is (count at 21 reps - count at 1 rep) / 20; under gdb the
second call of `measured` is stepped from its first instruction to its return.
"""
import os
import re
import subprocess
import sys
import tempfile

FN = re.compile(r"^([0-9a-f]+) <(.*)>:$")
INSN = re.compile(r"^\s*([0-9a-f]+):\s+(\S+)\s*(.*)$")


def functions(path):
    """{start: (name, [(addr, mnemonic, operands)])} of an objdump listing."""
    out, cur = {}, None
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            m = FN.match(line)
            if m:
                cur = []
                out[int(m.group(1), 16)] = (m.group(2), cur)
                continue
            m = INSN.match(line)
            if m and cur is not None:
                cur.append((int(m.group(1), 16), m.group(2), m.group(3)))
    return out


KERNEL_SYMBOLS = {
    "aarch64": re.compile(r"^qkindex::metric::(neon::|int8::dot_i8$|int8::dot_q8$)"),
    "x86_64": re.compile(r"^qkindex::metric::(x86|x86_int8)::"),
}
BRANCH_AARCH64 = re.compile(r"^(b\.\w+|b|cbn?z|tbn?z)$")
BRANCH_X86 = re.compile(r"^j\w+$")


def target(mnemonic, operands, arch):
    """The numeric target of a direct branch, or None."""
    if arch == "aarch64" and BRANCH_AARCH64.match(mnemonic):
        m = re.search(r"(?:^|,\s*)([0-9a-f]+) <", operands)
        return int(m.group(1), 16) if m else None
    if arch == "x86_64" and BRANCH_X86.match(mnemonic):
        m = re.match(r"([0-9a-f]+) <", operands)
        return int(m.group(1), 16) if m else None
    return None


def is_mul(mnemonic, operands, arch):
    """Vector multiply(-add) instructions: the work of an inner product."""
    if arch == "aarch64":
        return mnemonic in ("fmla", "fmul", "sdot", "smlal", "smlal2", "smull", "smull2",
                            "mla", "mul") and "v" in operands
    return bool(re.match(r"^v(fmadd|fmul|pdpbusd|pdpwssd|pmaddwd|pmaddubsw|pmulld)", mnemonic))


def lanes(mnemonic, operands):
    """f32 lanes of one vector FMA (zmm 16, ymm 8, xmm or NEON .4s 4), 0 for others."""
    if mnemonic == "fmla" and ".4s" in operands:
        return 4
    if mnemonic.startswith("vfmadd") and mnemonic.endswith("ps"):
        dest = operands.split(",")[-1].strip().lstrip("%")  # AT&T: the destination is last
        return {"z": 16, "y": 8, "x": 4}.get(dest[:1], 0)
    return 0


def loops_in(name, insns, arch):
    """The backward-branch loops of one function that hold vector multiplies: (function, loop
    start, body instructions, multiplies, f32 FMA lanes, inner/outer, the most frequent
    mnemonics)."""
    rows = []
    index = {a: i for i, (a, _, _) in enumerate(insns)}
    for i, (addr, mn, ops) in enumerate(insns):
        t = target(mn, ops, arch)
        if t is None or t > addr or t not in index:
            continue
        body = insns[index[t]:i + 1]
        muls = [b for b in body if is_mul(b[1], b[2], arch)]
        if not muls:
            continue
        fma_lanes = sum(lanes(m, o) for _, m, o in body)
        kinds = {}
        for _, m, _ in body:
            kinds[m] = kinds.get(m, 0) + 1
        top = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])[:6])
        # Innermost: no other backward branch inside the body.
        nested = any(
            (tb := target(m, o, arch)) is not None and t <= tb <= a and a != addr
            for a, m, o in body)
        rows.append((name, hex(t), len(body), len(muls), fma_lanes,
                     "outer" if nested else "inner", top))
    return rows


def loops(listing, arch):
    """loops_in of every kernel symbol of an objdump listing (by name)."""
    rows = []
    for name, insns in functions(listing).values():
        if KERNEL_SYMBOLS[arch].match(name) and insns:
            rows.extend(loops_in(name, insns, arch))
    return rows


def hot(binary, arch, listing, isa):
    """For each kernel of the set `isa`: the innermost loop with the most multiplies (ties: the
    shorter body) in the function its pointer points to or in the functions that one calls or
    jumps to (two levels: the pointers point to closure shims that the kernels inline into or
    call). Prints: isa, kernel, body, f32 FMA lanes, function."""
    run = (["qemu-aarch64"] if arch == "aarch64" else []) + [binary, isa, "addrs"]
    out = subprocess.run(run, capture_output=True, text=True, check=True).stdout
    nm = "aarch64-linux-gnu-nm" if arch == "aarch64" else "nm"
    measured = next(s for s, _, n in symbols(binary, nm) if n == "kernel_insns::measured")
    funcs = functions(listing)
    for line in out.split("\n"):
        if not line.strip():
            continue
        kernel, off = line.split()
        start = measured + int(off)
        seen, frontier = {start}, [start]
        for _ in range(2):
            nxt = []
            for f in frontier:
                for _, m, o in funcs.get(f, ("", []))[1]:
                    mt = re.search(r"(?:^|,\s*)([0-9a-f]+) <", o)
                    if (m.startswith(("b", "call", "j")) and mt
                            and int(mt.group(1), 16) in funcs):
                        t = int(mt.group(1), 16)
                        if t not in seen:
                            seen.add(t)
                            nxt.append(t)
            frontier = nxt
        cands = []
        for f in seen:
            if f in funcs:
                name, insns = funcs[f]
                for row in loops_in(name, insns, arch):
                    if row[5] == "inner":
                        cands.append((-row[3], row[2], row[4], name))
        if cands:
            _, body, fl, name = min(cands)
            print(f"{isa}\t{kernel}\t{body}\t{fl}\t{name}")


def symbols(binary, nm):
    """[(start, end, name)] of the binary's function symbols."""
    out = subprocess.run([nm, "-S", "-C", "--defined-only", binary], capture_output=True,
                         text=True, check=True).stdout
    syms = []
    for line in out.splitlines():
        parts = line.split(" ", 3)
        if len(parts) == 4 and parts[2] in "tTwW":
            start, size = int(parts[0], 16), int(parts[1], 16)
            if size:
                syms.append((start, start + size, parts[3]))
    return syms


def qemu_count(binary, args, ranges):
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "exec.log")
        subprocess.run(["qemu-aarch64", "-singlestep", "-d", "nochain,exec", "-dfilter", ranges,
                        "-D", log, binary] + args, check=True, capture_output=True)
        n = 0
        with open(log, errors="replace") as f:
            for line in f:
                if line.startswith("Trace "):
                    n += 1
        return n


def qemu(binary, isa, kernel, dim, rows):
    # The load address of the (PIE) binary under qemu-user: `-d page` prints start_code.
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "page.log")
        subprocess.run(["qemu-aarch64", "-d", "page", "-D", log, binary, isa, kernel, dim, rows,
                        "1"], check=True, capture_output=True)
        text = open(log).read()
    load = int(re.search(r"start_code\s+0x([0-9a-f]+)", text).group(1), 16)
    syms = symbols(binary, "aarch64-linux-gnu-nm")
    first = min(s for s, _, _ in syms)
    base = load - (first & ~0xffff) if load > first else 0
    # Every function of the binary except main (its loop around the calls is not the call).
    spans = sorted((s + base, e + base) for s, e, n in syms if n != "kernel_insns::main")
    ranges = ",".join(f"0x{s:x}..0x{e - 1:x}" for s, e in spans)
    # Too many ranges make a long argument; merge adjacent ones.
    merged = []
    for s, e in spans:
        if merged and s <= merged[-1][1] + 64:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    ranges = ",".join(f"0x{s:x}..0x{e - 1:x}" for s, e in merged)
    # The exec log's count per call varies by a few instructions with the number of calls
    # (seen: 152.9 to 157 at d = 128), so a call is the mean over 20 more.
    one = qemu_count(binary, [isa, kernel, dim, rows, "1"], ranges)
    more = qemu_count(binary, [isa, kernel, dim, rows, "21"], ranges)
    return round((more - one) / 20, 1)


GDB_SCRIPT = r"""
import gdb
gdb.execute("set pagination off")
gdb.execute("set confirm off")
gdb.execute("set language c")
gdb.execute("starti", to_string=True)
binary = gdb.current_progspace().filename
base = None
for line in gdb.execute("info proc mappings", to_string=True).splitlines():
    parts = line.split()
    if len(parts) >= 5 and parts[-1] == binary:
        base = int(parts[0], 16)
        break
gdb.execute("break *0x%x" % (base + OFFSET), to_string=True)
gdb.execute("continue", to_string=True)   # first call: lazy binding, page faults
gdb.execute("continue", to_string=True)   # second call: the one counted
ret = int(gdb.parse_and_eval("*(unsigned long *)$sp"))
gdb.execute("delete", to_string=True)
n = 0
while True:
    gdb.execute("stepi", to_string=True)
    n += 1
    if int(gdb.parse_and_eval("$pc")) == ret:
        break
print("COUNT %d" % n)
gdb.execute("kill", to_string=True)
"""


def gdb(binary, isa, kernel, dim, rows):
    syms = symbols(binary, "nm")
    offset = next(s for s, _, n in syms if n == "kernel_insns::measured")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(GDB_SCRIPT.replace("OFFSET", hex(offset)))
        script = f.name
    try:
        out = subprocess.run(["gdb", "-nx", "--batch", "-ex", f"source {script}", "--args", binary,
                              isa, kernel, dim, rows, "2"], capture_output=True, text=True,
                             check=True).stdout
    finally:
        os.unlink(script)
    return int(re.search(r"COUNT (\d+)", out).group(1))


def table(counts_path, *hot_paths):
    hot_loops = {}
    for p in hot_paths:
        for line in open(p):
            isa, kernel, body, fl, name = line.rstrip("\n").split("\t")
            hot_loops[(isa, kernel)] = (int(body), int(fl), name)
    counts = {}
    order = []
    for line in open(counts_path):
        isa, kernel, d, c = line.split()
        if (isa, kernel) not in counts:
            order.append((isa, kernel))
        counts.setdefault((isa, kernel), {})[int(d)] = float(c)
    print("| kernel | set | hot loop insns/iter | elements/iter | insns/element | "
          "per IP d=64 | d=128 | d=256 | fixed part | hot loop in |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for isa, kernel in order:
        c = counts[(isa, kernel)]
        delta = c[256] - c[128]
        per_elem = delta / 128
        body, fl, name = hot_loops.get((isa, kernel), (None, None, None))
        # Elements per iteration: the f32 lanes of its FMAs; for the int8 kernels (other
        # multiplies) the dynamic ratio 128 · iteration / (IP(256) - IP(128)).
        elems = fl if fl else (f"{128 * body / delta:.0f}" if body and delta else "?")
        fixed = c[128] - 128 * per_elem
        r = lambda x: f"{round(x, 1):g}"
        print(f"| {kernel} | {isa} | {body or '?'} | {elems} | {per_elem:.3g} | {r(c[64])} | "
              f"{r(c[128])} | {r(c[256])} | {r(fixed)} | `{name}` |")


def main():
    cmd = sys.argv[1]
    if cmd == "loops":
        for row in loops(sys.argv[2], sys.argv[3]):
            print("\t".join(map(str, row)))
    elif cmd in ("qemu", "gdb"):
        count = (qemu if cmd == "qemu" else gdb)(*sys.argv[2:7])
        print(f"{count:g}")
    elif cmd == "hot":
        hot(*sys.argv[2:6])
    elif cmd == "table":
        table(*sys.argv[2:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
