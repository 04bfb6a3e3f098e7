"""The growth exponent of build seconds against n, shared by the scaling summaries here."""
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
