"""Pools the trials of several `qkindex tasks` runs (tasks.json) per (task, policy): one table
of scores with Wilson's 95 % interval on mean / 100 over all trials (as `tasks` computes it),
the average over tasks, and how often `index-topk` generated the exact top-k oracle's text.

usage: python3 combine.py RUN_DIR [RUN_DIR ...]   (each holds tasks.json; one table per length)
"""
import json
import math
import os
import sys
from collections import defaultdict


def wilson(mean, n, z=1.96):
    p = mean / 100.0
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return 100 * max(0.0, centre - half), 100 * min(1.0, centre + half)


def main(dirs):
    scores = defaultdict(list)  # (length, task, label) -> [score per trial]
    texts = defaultdict(dict)  # (length, task, label) -> {(run, trial): generated}
    labels, tasks, runs, lengths = [], [], [], []
    for i, d in enumerate(dirs):
        data = json.load(open(os.path.join(d, "tasks.json")))
        runs.append(f"{os.path.basename(os.path.normpath(d))} (seed {data['seed']}, {data['trials']} trials)")
        for cell in data["cells"]:
            task, label, length = cell["task"], cell["label"], cell["length"]
            if length not in lengths:
                lengths.append(length)
            if label not in labels:
                labels.append(label)
            if task not in tasks:
                tasks.append(task)
            for t in cell["trials"]:
                scores[(length, task, label)].append(t["score"])
                texts[(length, task, label)][(i, t["trial"])] = t["generated"]
    print("Runs pooled: " + "; ".join(runs))
    for length in sorted(lengths):
        table(length, tasks, labels, scores, texts)


def table(length, tasks, labels, scores, texts):
    tasks = [t for t in tasks if any((length, t, label) in scores for label in labels)]
    print(f"\n### {length} tokens\n")
    print("| task | trials | " + " | ".join(labels) + " |")
    print("|---|---|" + "---|" * len(labels))
    averages = defaultdict(list)
    for task in tasks:
        cells, n = [], 0
        for label in labels:
            s = scores.get((length, task, label), [])
            if not s:
                cells.append("—")
                continue
            n = len(s)
            mean = sum(s) / n
            lo, hi = wilson(mean, n)
            averages[label].append(mean)
            cells.append(f"{mean:.1f} [{lo:.0f}, {hi:.0f}]")
        print(f"| {task} | {n} | " + " | ".join(cells) + " |")
    print("| **average over tasks** | | " + " | ".join(
        f"**{sum(averages[l]) / len(averages[l]):.1f}**" if averages[l] else "—" for l in labels) + " |")
    print()
    for budget in ("100", "1000"):
        idx, oracle = f"index-topk@{budget}", f"exact-topk@{budget}"
        same = total = 0
        for task in tasks:
            a = texts.get((length, task, idx), {})
            b = texts.get((length, task, oracle), {})
            for key in a.keys() & b.keys():
                total += 1
                same += a[key] == b[key]
        if total:
            print(f"- {idx} generated the text of {oracle} in {same} of {total} prompts")


if __name__ == "__main__":
    main(sys.argv[1:])
