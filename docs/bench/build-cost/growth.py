"""The growth exponent of build seconds against n, and the table of the scaling summaries here."""
import math


def exponent(pts):
    """Least-squares slope of log seconds on log n over `pts` ((n, seconds), sorted by n), and
    the slope of each step between neighbouring sizes, as text."""
    xs = [math.log(n) for n, _ in pts]
    ys = [math.log(t) for _, t in pts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    steps = ", ".join(
        f"{a[0] // 1024}K→{b[0] // 1024}K {math.log(b[1] / a[1]) / math.log(b[0] / a[0]):.2f}"
        for a, b in zip(pts, pts[1:]))
    return slope, steps


def print_summary(table, scanned):
    """Prints `table` ((builder, n) -> (build_s, rows of bench.json)) as a Markdown table with
    the scanned fraction `scanned(rows, target)` at recall 0.95 and 0.99, then each builder's
    growth exponent."""
    fmt = lambda x: "not reached" if x is None else f"{x:.4f}"
    print("| builder | n | build s (knn + projection) | scanned @0.95 | scanned @0.99 | best recall |")
    print("|---|---|---|---|---|---|")
    for (name, n), (b, rows) in sorted(table.items()):
        print(f"| {name} | {n:,} | {b['total']:.2f} ({b['knn']:.2f} + {b['projection']:.2f}) | "
              f"{fmt(scanned(rows, 0.95))} | {fmt(scanned(rows, 0.99))} | "
              f"{max(r['recall'] for r in rows):.4f} |")
    print()
    for name in sorted({k[0] for k in table}):
        pts = sorted((n, b["total"]) for (v, n), (b, _) in table.items() if v == name)
        if len(pts) < 2:
            continue
        slope, steps = exponent(pts)
        print(f"- {name}: growth exponent {slope:.2f} ({pts[0][0]:,}–{pts[-1][0]:,} keys; steps {steps})")
