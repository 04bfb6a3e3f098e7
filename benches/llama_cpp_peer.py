#!/usr/bin/env python3
"""Peer benchmark of the model step: llama.cpp (through llama-cpp-python) beside `qkindex eval`.

For each GGUF model and context C, on the same text, the same machine and the same number of
threads, in one run:

  llama.cpp   prefill of the first C - 1 tokens of the text (one `Llama.eval` call, timed):
              prefill tokens/s; then --continuation tokens teacher-forced one per `eval` call
              (a decode step each, timed one by one): decode ms/token (mean and median).
  qkindex     `qkindex eval --text TEXT --context C --continuation N --policy full,index-topk
              --no-measure`
              (the same prefill of C - 1 tokens, then N teacher-forced decode steps per policy),
              read from its --json: prefill tokens/s, and decode ms/token as the wall clock of
              its step calls (`latency_ms.wall`: each step's forward pass and logits, timed around
              the call as the llama.cpp loop times `eval`; `--no-measure` leaves out the recall
              measurement that `eval` would otherwise run inside the loop), with the split.

The text is tokenized by each program's own tokenizer (both read the GGUF vocabulary: the token
ids agree for the bundled text, and the script reports the first C ids' agreement when it can).
Rows go to --out (JSON lines) and a Markdown table to stdout.

llama.cpp settings: n_threads = n_threads_batch = --threads, n_ctx = C + N, n_batch = n_ubatch =
--batch (512), everything else llama-cpp-python's default (flash attention as the library
decides, mmap, no GPU layers); each row records the settings the context was made with
(`llama_cpp_settings`: threads, batch sizes, flash attention, KV cache types). Loading is not
timed.

Packages: unless --no-venv is given, the script creates benches/.venv-llama (or --venv DIR),
installs benches/requirements-llama.txt there (llama-cpp-python built from source by pip: several
minutes on two cores), and re-runs itself with that environment's python.
"""
import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
REQUIREMENTS = HERE / "requirements-llama.txt"
DEFAULT_TEXT = ROOT / "driver" / "assets" / "texts" / "licenses.txt"
MODELS = {
    "smollm2-135m": ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3-270m": ROOT / "models" / "gemma-3-270m-q4_k_m.gguf",
    "qwen2.5-1.5b": ROOT / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
}


def ensure_venv(venv: Path) -> None:
    """Re-executes this script in `venv` with the requirements installed (pip runs again only
    when the requirements file changes)."""
    py = venv / "bin" / "python"
    if Path(sys.prefix).resolve() == venv.resolve():
        return
    stamp = venv / ".requirements.sha256"
    want = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    if not stamp.exists() or stamp.read_text().strip() != want:
        subprocess.run([str(py), "-m", "pip", "install", "-r", str(REQUIREMENTS)], check=True)
        stamp.write_text(want)
    os.execv(str(py), [str(py), *sys.argv])


def llama_cpp_run(model: Path, text: str, ctx: int, cont: int, threads: int, batch: int) -> dict:
    import llama_cpp_compat  # noqa: F401  (no AMX weight repacking: see the module)
    from llama_cpp import Llama, __version__

    llm = Llama(
        model_path=str(model),
        n_ctx=ctx + cont,
        n_threads=threads,
        n_threads_batch=threads,
        n_batch=batch,
        n_ubatch=batch,
        verbose=False,
    )
    ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
    need = ctx - 1 + cont
    if len(ids) < need:
        raise SystemExit(f"{model.name}: the text has {len(ids)} tokens, {need} needed")
    prompt, follow = ids[: ctx - 1], ids[ctx - 1 : need]
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt)
    prefill_s = time.perf_counter() - t0
    steps = []
    for t in follow:
        t0 = time.perf_counter()
        llm.eval([t])
        steps.append(time.perf_counter() - t0)
    ms = [1e3 * s for s in steps]
    cp = llm.context_params
    settings = {
        name: getattr(cp, name)
        for name in ("n_threads", "n_threads_batch", "n_batch", "n_ubatch", "n_ctx",
                     "flash_attn", "flash_attn_type", "type_k", "type_v")
        if hasattr(cp, name)
    }
    settings = {k: (v if isinstance(v, (int, float, bool, str)) else str(v)) for k, v in settings.items()}
    return {
        "impl": "llama.cpp",
        "version": __version__,
        "llama_cpp_settings": settings,
        "policy": "full",
        "prefill_tokens": len(prompt),
        "prefill_s": prefill_s,
        "prefill_tok_s": len(prompt) / prefill_s,
        "decode_ms_mean": statistics.fmean(ms),
        "decode_ms_median": statistics.median(ms),
        "ids_head": prompt[:64],
    }


def qkindex_run(
    binary: Path, model: str, text: Path, ctx: int, cont: int, policies: str, extra: list
) -> list:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "eval.json"
        cmd = [
            str(binary), "eval", "--model", model, "--text", str(text.resolve()),
            "--context", str(ctx),
            "--continuation", str(cont), "--policy", policies, "--no-measure", "--json", str(out),
            *extra,
        ]
        print("+", " ".join(cmd), file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT)
        res = json.loads(out.read_text())
    res = res if isinstance(res, list) else [res]
    rows = []
    for r in res:
        lat = r["latency_ms"]
        rows.append({
            "impl": "qkindex",
            "policy": r["policy"],
            "prefill_tokens": ctx - 1,
            "prefill_s": r["prefill_s"],
            "prefill_tok_s": (ctx - 1) / r["prefill_s"],
            # Wall clock per step call, as llama.cpp's loop is timed (see the module doc).
            "decode_ms_mean": lat["wall"],
            "latency_ms": lat,
            "ppl": r["ppl"],
        })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", default="smollm2-135m,gemma3-270m",
                    help="comma-separated names (%s) or GGUF paths" % ", ".join(MODELS))
    ap.add_argument("--contexts", default="2048,8192", help="comma-separated C values")
    ap.add_argument("--continuation", type=int, default=64, help="decode steps per run (64)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=512, help="llama.cpp n_batch = n_ubatch (512)")
    ap.add_argument("--text", type=Path, default=DEFAULT_TEXT)
    ap.add_argument("--qkindex", type=Path, help="the qkindex binary (omit: llama.cpp only)")
    ap.add_argument("--policies", default="full,index-topk")
    ap.add_argument("--qkindex-args", default="", help="extra arguments for `qkindex eval`")
    ap.add_argument("--out", type=Path, help="append result rows here (JSON lines)")
    ap.add_argument("--venv", type=Path, default=HERE / ".venv-llama")
    ap.add_argument("--no-venv", action="store_true")
    args = ap.parse_args()
    if not args.no_venv:
        ensure_venv(args.venv)
    text = args.text.read_text(encoding="utf-8")
    rows = []
    for name in args.models.split(","):
        path = MODELS.get(name, Path(name))
        for ctx in (int(c) for c in args.contexts.split(",")):
            base = {"model": name, "context": ctx, "continuation": args.continuation,
                    "threads": args.threads}
            runs = [llama_cpp_run(path, text, ctx, args.continuation, args.threads, args.batch)]
            if args.qkindex:
                runs += qkindex_run(args.qkindex, name, args.text, ctx, args.continuation,
                                    args.policies, args.qkindex_args.split())
            for r in runs:
                row = {**base, **r}
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "ids_head"}), file=sys.stderr,
                      flush=True)
                if args.out:
                    with args.out.open("a") as f:
                        f.write(json.dumps(row) + "\n")
    print("| model | context | impl | policy | prefill tok/s | decode ms/token | vs llama.cpp |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        peer = next(p for p in rows if p["model"] == r["model"] and p["context"] == r["context"]
                    and p["impl"] == "llama.cpp")
        ratio = r["decode_ms_mean"] / peer["decode_ms_mean"]
        print(f"| {r['model']} | {r['context']} | {r['impl']} | {r['policy']} | "
              f"{r['prefill_tok_s']:.0f} | {r['decode_ms_mean']:.1f} | {ratio:.2f}× |")


if __name__ == "__main__":
    main()
