#!/usr/bin/env python3
"""Writes the seed inputs of the `gguf` and `dump` fuzz targets (standard library only).

    python3 fuzz/seeds.py fuzz/seeds

gguf/: tiny Llama models (byte-level BPE and SentencePiece vocabularies, F32 and quantized
matrices), a tiny Gemma 3 and a file holding one tensor of every type the reader dequantizes.
dump/: inputs in the framing of fuzz_targets/dump.rs (an optional 'F' byte, then the manifest
and the .npy files separated by SEP): a tiny valid dump, the same with the file-reading
comparison on, one with int32 ids, and the manifest of data/smollm2-8k-subset with the first
bytes of its real .npy files (their headers).
"""

import math
import os
import struct
import sys

# --- GGUF -------------------------------------------------------------------------------

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_value(ty, v):
    fmt = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
           BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}
    if ty == STR:
        return gguf_string(v)
    if ty == ARR:
        elem, items = v
        return struct.pack("<IQ", elem, len(items)) + b"".join(gguf_value(elem, x) for x in items)
    return struct.pack(fmt[ty], v)


def write_gguf(meta, tensors, align=32):
    """meta: [(key, type, value)]; tensors: [(name, dims, ggml type, data bytes)]."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta))
    for key, ty, v in meta:
        out += gguf_string(key) + struct.pack("<I", ty) + gguf_value(ty, v)
    offset = 0
    offsets = []
    for _, _, _, data in tensors:
        offsets.append(offset)
        offset += (len(data) + align - 1) // align * align
    for (name, dims, ty, _), off in zip(tensors, offsets):
        out += gguf_string(name) + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", ty, off)
    out += b"\0" * (-len(out) % align)
    for (_, _, _, data), off in zip(tensors, offsets):
        out += data + b"\0" * (-len(data) % align)
    return out


def floats(n, seed):
    return [math.sin(i * seed) * 0.5 for i in range(n)]


def f16_bits(x):
    return struct.pack("<e", x)


def quantize(ty, xs):
    """Encodes xs in ggml type ty (rough encoders: the fuzzer needs valid layouts, not accuracy)."""
    if ty == 0:
        return b"".join(struct.pack("<f", x) for x in xs)
    if ty == 1:
        return b"".join(f16_bits(x) for x in xs)
    out = b""
    if ty in (3, 6, 8):  # Q4_1, Q5_0, Q8_0: blocks of 32
        for b in range(0, len(xs), 32):
            blk = xs[b:b + 32]
            lo, hi = min(blk), max(blk)
            amax = max(abs(lo), abs(hi)) or 1.0
            if ty == 8:
                d = amax / 127
                out += f16_bits(d) + bytes((round(x / d) & 0xFF) for x in blk)
            elif ty == 3:
                d = (hi - lo) / 15 or 1.0
                q = [min(15, round((x - lo) / d)) for x in blk]
                out += f16_bits(d) + f16_bits(lo)
                out += bytes(q[i] | (q[i + 16] << 4) for i in range(16))
            else:
                d = amax / 15
                q = [max(0, min(31, round(x / d) + 16)) for x in blk]
                qh = sum(((q[i] >> 4) & 1) << i for i in range(32))
                out += f16_bits(d) + struct.pack("<I", qh)
                out += bytes((q[i] & 15) | ((q[i + 16] & 15) << 4) for i in range(16))
        return out
    if ty == 12:  # Q4_K: 256 weights in 144 bytes
        for b in range(0, len(xs), 256):
            out += f16_bits(0.01) + f16_bits(0.001) + bytes(range(1, 13))
            out += bytes((i * 7) & 0xFF for i in range(128))
        return out
    if ty == 14:  # Q6_K: 256 weights in 210 bytes
        for b in range(0, len(xs), 256):
            out += bytes((i * 5) & 0xFF for i in range(128)) + bytes((i * 3) & 0xFF for i in range(64))
            out += bytes((i - 8) & 0xFF for i in range(16)) + f16_bits(0.01)
        return out
    raise ValueError(ty)


def byte_token(b):
    """GPT-2's byte -> printable-char map."""
    printable = lambda x: 33 <= x <= 126 or 0xA1 <= x <= 0xAC or x >= 0xAE
    if printable(b):
        return chr(b)
    return chr(256 + sum(1 for x in range(b) if not printable(x)))


MATRICES = ["embd", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]


def tiny_model(arch="llama", tokenizer="gpt2", types=None, layers=1):
    dim, heads, kv_heads, ffn, ctx = 32, 4, 2, 64, 64
    hd = dim // heads
    types = types or {}
    if tokenizer == "gpt2":
        tokens = ["<|endoftext|>", "<|im_end|>"] + [byte_token(b) for b in range(256)] + ["he"]
        ttypes = [3, 3] + [1] * 257
        tok_meta = [("tokenizer.ggml.merges", ARR, (STR, ["h e"])),
                    ("tokenizer.ggml.pre", STR, "smollm")]
    else:
        tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
        tokens += ["\u2581", "\u2581h", "e", "h", "\u2581he"]
        ttypes = [2, 3, 3] + [6] * 256 + [1] * 5
        tok_meta = [("tokenizer.ggml.scores", ARR, (F32, [0.0] * 259 + [-1.0, -2.0, -3.0, -4.0, -0.5])),
                    ("tokenizer.ggml.bos_token_id", U32, 1),
                    ("tokenizer.ggml.add_bos_token", BOOL, True),
                    ("tokenizer.ggml.add_space_prefix", BOOL, True)]
    vocab = len(tokens)
    p = arch + "."
    meta = [("general.architecture", STR, arch), ("general.name", STR, "tiny"),
            (p + "block_count", U32, layers), (p + "context_length", U32, ctx),
            (p + "embedding_length", U32, dim), (p + "feed_forward_length", U32, ffn),
            (p + "attention.head_count", U32, heads), (p + "attention.head_count_kv", U32, kv_heads),
            (p + "rope.freq_base", F32, 10000.0), (p + "attention.layer_norm_rms_epsilon", F32, 1e-5),
            ("tokenizer.ggml.model", STR, tokenizer), ("tokenizer.ggml.tokens", ARR, (STR, tokens)),
            ("tokenizer.ggml.token_type", ARR, (I32, ttypes)),
            ("tokenizer.ggml.eos_token_id", U32, 2 if tokenizer == "llama" else 1)] + tok_meta
    if arch == "gemma3":
        meta += [(p + "attention.sliding_window", U32, 16), (p + "attention.key_length", U32, hd),
                 (p + "attention.value_length", U32, hd)]
    ones = [1.0] * dim
    tensors = [("token_embd.weight", [dim, vocab], types.get("embd", 0), floats(dim * vocab, 0.37)),
               ("output_norm.weight", [dim], 0, ones)]
    for l in range(layers):
        s = 0.1 + 0.05 * l
        mats = [("attn_q", [dim, heads * hd]), ("attn_k", [dim, kv_heads * hd]),
                ("attn_v", [dim, kv_heads * hd]), ("attn_output", [heads * hd, dim]),
                ("ffn_gate", [dim, ffn]), ("ffn_up", [dim, ffn]), ("ffn_down", [ffn, dim])]
        tensors += [(f"blk.{l}.attn_norm.weight", [dim], 0, ones), (f"blk.{l}.ffn_norm.weight", [dim], 0, ones)]
        if arch == "gemma3":
            tensors += [(f"blk.{l}.attn_q_norm.weight", [hd], 0, [1.0] * hd),
                        (f"blk.{l}.attn_k_norm.weight", [hd], 0, [1.0] * hd),
                        (f"blk.{l}.post_attention_norm.weight", [dim], 0, ones),
                        (f"blk.{l}.post_ffw_norm.weight", [dim], 0, ones)]
        for i, (name, dims) in enumerate(mats):
            n = dims[0] * dims[1]
            tensors.append((f"blk.{l}.{name}.weight", dims, types.get(name, 0), floats(n, s + 0.01 * i)))
    return write_gguf(meta, [(n, d, t, quantize(t, x)) for n, d, t, x in tensors])


def tensor_zoo():
    """One tensor of every type the reader dequantizes, 256 weights each, and no model."""
    meta = [("general.architecture", STR, "llama"), ("general.alignment", U32, 32)]
    tensors = [(f"t{ty}", [32, 8], ty, quantize(ty, floats(256, 0.1 + ty))) for ty in (0, 1, 3, 6, 8, 12, 14)]
    return write_gguf(meta, tensors)


# --- dump -------------------------------------------------------------------------------

SEP = b"\n--qkindex-fuzz--\n"


def npy(descr, shape, payload):
    shape_s = f"({shape[0]},)" if len(shape) == 1 else "(" + ", ".join(map(str, shape)) + ")"
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_s}, }}"
    pad = (64 - (10 + len(header) + 1) % 64) % 64
    header = header + " " * pad + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + payload


def npy_f(descr, shape, seed):
    n = math.prod(shape)
    fmt = "<e" if descr == "<f2" else "<f"
    return npy(descr, shape, b"".join(struct.pack(fmt, x) for x in floats(n, seed)))


MANIFEST = (b'{"format": "qkindex-dump/1", "model": "tiny", "head_dim": 4, "n_layers": 2, '
            b'"n_q_heads": 4, "n_kv_heads": 2, "layers": [1], "n_prefill": 3, "n_decode": 2, '
            b'"rope_theta": 10000.0, "source": "fuzz seed"}')


def tiny_dump(ids_descr="<i8"):
    q = npy_f("<f4", [4, 3, 4], 0.3)
    k = npy_f("<f2", [2, 5, 4], 0.7)
    qdec = npy_f("<f4", [4, 2, 4], 1.1)
    kdec = npy_f("<f2", [2, 2, 4], 1.3)
    v = npy_f("<f2", [2, 5, 4], 1.7)
    vdec = npy_f("<f2", [2, 2, 4], 1.9)
    fmt = {"<i8": "<q", "<i4": "<i", "<u4": "<I"}[ids_descr]
    ids = npy(ids_descr, [3], b"".join(struct.pack(fmt, x) for x in (7, 8, 9)))
    return SEP.join([MANIFEST, q, k, qdec, kdec, v, vdec, ids])


def smollm2_dump(root):
    d = os.path.join(root, "data", "smollm2-8k-subset")
    manifest = open(os.path.join(d, "manifest.json"), "rb").read()
    parts = ["q", "k", "qdec", "kdec", "v", "vdec"]
    heads = [open(os.path.join(d, f"layer09.{p}.npy"), "rb").read()[:256] for p in parts]
    ids = open(os.path.join(d, "prompt_ids.npy"), "rb").read()[:256]
    return SEP.join([manifest] + heads + [ids])


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "fuzz/seeds"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    seeds = {
        "gguf/llama-gpt2-f32": tiny_model(types={"embd": 8}),
        "gguf/llama-gpt2-quant": tiny_model(types={"embd": 8, "attn_q": 3, "attn_k": 6, "attn_v": 1,
                                                   "attn_output": 8, "ffn_gate": 3, "ffn_up": 6}),
        "gguf/llama-spm": tiny_model(tokenizer="llama", types=dict.fromkeys(MATRICES, 8)),
        "gguf/gemma3-spm": tiny_model(arch="gemma3", tokenizer="llama", types=dict.fromkeys(MATRICES, 3)),
        "gguf/tensor-zoo": tensor_zoo(),
        "dump/tiny": tiny_dump(),
        "dump/tiny-files": b"F" + tiny_dump(),
        "dump/tiny-i32-ids": tiny_dump("<i4"),
        "dump/smollm2-manifest": smollm2_dump(root),
    }
    for name, data in seeds.items():
        path = os.path.join(out, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        print(f"{path}: {len(data)} bytes")


if __name__ == "__main__":
    main()
