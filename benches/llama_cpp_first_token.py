#!/usr/bin/env python3
"""The first answer tokens of a chat prompt under llama.cpp (greedy), with the top logits of the
first one: is a near-tie that our 8-bit activations flip one that llama.cpp flips too (issue 64,
item 0)? Runs in the llama.cpp environment of benches/llama_cpp_peer.py:

    benches/.venv-llama/bin/python benches/llama_cpp_first_token.py \
        models/SmolLM2-135M-Instruct.Q4_1.gguf "What is the capital of France?"

The prompt is the ChatML rendering `qkindex generate --chat` feeds the model (the template's
default system turn), tokenized by llama.cpp with special tokens parsed.
"""
import sys

import numpy as np

import llama_cpp_compat  # noqa: F401  (no AMX weight repacking: see the module)
from llama_cpp import Llama, __version__

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def main() -> None:
    model, question = sys.argv[1], sys.argv[2]
    system = sys.argv[3] if len(sys.argv) > 3 else SYSTEM
    llm = Llama(model_path=model, n_ctx=512, n_threads=2, logits_all=True, verbose=False)
    text = (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
            "<|im_start|>assistant\n")
    ids = llm.tokenize(text.encode(), add_bos=False, special=True)
    llm.eval(ids)
    logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    order = np.argsort(-logits)[:5]
    top = " | ".join(f"{llm.detokenize([int(i)]).decode(errors='replace')!r} {logits[i]:.3f}"
                     for i in order)
    print(f"llama.cpp {__version__}, {len(ids)} prompt tokens; first answer token: {top}")
    out = []
    for _ in range(12):
        t = int(np.argmax(np.array(llm.scores[llm.n_tokens - 1])))
        if t == llm.token_eos():
            break
        out.append(t)
        llm.eval([t])
    print("greedy:", repr(llm.detokenize(out).decode(errors="replace")))


if __name__ == "__main__":
    main()
