#!/usr/bin/env python3
"""Markdown tables from `qkindex eval` / `decode-bench` / `passkey` JSON files (docs/DECODING.md).

usage: scripts/decode-tables.py eval FILE... | bench FILE | passkey FILE
"""
import json
import sys


def f(x, nd=4):
    return "—" if x is None else f"{x:.{nd}f}"


def eval_table(files):
    print("| run | policy | k | ppl | top-1 agreement | KL (nats) | mass | mass ratio | recall@k | reuse | inner products / selection | search ms | attention ms | rest ms | total ms | build s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for path in files:
        rows = json.load(open(path))
        rows = rows if isinstance(rows, list) else [rows]
        for r in rows:
            lat = r["latency_ms"]
            print(
                f"| {path.split('/')[-1].removesuffix('.json')} | {r['policy']} | {r['config']['k']} | {r['ppl']:.4f} | {f(r['top1_agreement'])} "
                f"| {f(r['kl'], 5)} | {f(r['mass'])} | {f(r['mass_ratio'])} | {f(r['recall'])} | {f(r.get('reuse_ratio'), 3)} "
                f"| {f(r['distance_computations'], 0)} | {lat['search']:.2f} | {lat['attention']:.2f} | {lat['rest']:.2f} | {lat['total']:.2f} | {r['build_s']:.1f} |"
            )


def bench_table(path):
    print("| policy | keys | search ms / step | attention ms / step | inner products / selection | recall@100 | mass ratio | build s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in json.load(open(path)):
        print(
            f"| {r['policy']} | {r['n_keys']:,} | {r['search_ms']:.3f} | {r['attention_ms']:.3f} | {r['distance_computations']:.0f} "
            f"| {f(r['recall'])} | {f(r['mass_ratio'])} | {r['build_s']:.1f} |"
        )


def passkey_table(path):
    j = json.load(open(path))
    lengths = [l for l, _, _ in j["summary"][0]["by_length"]]
    print("| policy | " + " | ".join(f"~{l} tokens" for l in lengths) + " | all |")
    print("|---|" + "---|" * (len(lengths) + 1))
    for s in j["summary"]:
        cells = " | ".join(f"{ok}/{n}" for _, ok, n in s["by_length"])
        print(f"| {s['policy']} | {cells} | {s['successes']}/{s['trials']} ({100 * s['rate']:.0f} %) |")


if __name__ == "__main__":
    kind, files = sys.argv[1], sys.argv[2:]
    {"eval": eval_table, "bench": lambda fs: bench_table(fs[0]), "passkey": lambda fs: passkey_table(fs[0])}[kind](files)
