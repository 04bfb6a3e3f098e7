"""Compares two `run.sh` outputs (issue 43): index file hashes, bench rows and eval JSON, timings
aside. Usage: python3 compare.py BEFORE_DIR AFTER_DIR; exits 1 when anything differs."""
import json
import sys

TIMINGS = {"qps", "latency_us", "build_s", "latency_ms", "prefill_s", "wall_s", "seconds"}


def strip(x):
    if isinstance(x, dict):
        return {k: strip(v) for k, v in x.items() if k not in TIMINGS}
    if isinstance(x, list):
        return [strip(v) for v in x]
    return x


def main(before, after):
    ok = True
    hashes = [open(f"{d}/hashes.txt").read().splitlines() for d in (before, after)]
    same = hashes[0] == hashes[1]
    print(f"index files: {len(hashes[0])} / {len(hashes[1])} hashes, {'identical' if same else 'DIFFER'}")
    ok &= same
    rows = [strip(json.load(open(f"{d}/bench/bench.json"))["rows"]) for d in (before, after)]
    same = rows[0] == rows[1]
    print(f"bench rows: {len(rows[0])} / {len(rows[1])}, {'identical' if same else 'DIFFER'} (timings aside)")
    ok &= same
    evals = [strip(json.load(open(f"{d}/eval.json"))) for d in (before, after)]
    same = evals[0] == evals[1]
    print(f"eval JSON: {'identical' if same else 'DIFFER'} (timings aside)")
    ok &= same
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
