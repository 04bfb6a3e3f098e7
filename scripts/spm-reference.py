#!/usr/bin/env python3
"""Independent SentencePiece segmentation of texts with a GGUF file's `llama` (SPM) vocabulary, for
driver/tests/spm_reference.rs.

Builds a SentencePiece ModelProto (BPE, byte fallback, identity normalizer, whitespace escaped as
U+2581, no dummy prefix) from `tokenizer.ggml.tokens/scores/token_type` and lets Google's
`sentencepiece` library encode each text: an implementation that shares no code with the driver.

    python3 -m pip install gguf sentencepiece protobuf
    python3 scripts/spm-reference.py models/gemma-3-270m-q4_k_m.gguf TEXT... > driver/tests/fixtures/gemma3-spm.json
"""
import json
import sys

import sentencepiece as spm
from gguf import GGUFReader
from sentencepiece import sentencepiece_model_pb2 as pb


def build_model(path):
    r = GGUFReader(path)
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    scores = r.fields["tokenizer.ggml.scores"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    m = pb.ModelProto()
    m.trainer_spec.model_type = pb.TrainerSpec.BPE
    m.trainer_spec.byte_fallback = True
    m.trainer_spec.vocab_size = len(tokens)
    m.trainer_spec.unk_id = int(r.fields["tokenizer.ggml.unknown_token_id"].contents())
    m.trainer_spec.bos_id = int(r.fields["tokenizer.ggml.bos_token_id"].contents())
    m.trainer_spec.eos_id = int(r.fields["tokenizer.ggml.eos_token_id"].contents())
    m.trainer_spec.pad_id = int(r.fields["tokenizer.ggml.padding_token_id"].contents())
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = False
    m.normalizer_spec.remove_extra_whitespaces = False
    m.normalizer_spec.escape_whitespaces = True
    # GGUF token types are SentencePiece's piece types (1 normal, 2 unknown, 3 control,
    # 4 user-defined, 5 unused, 6 byte). SentencePiece matches user-defined symbols in the
    # normalized text, where spaces are already U+2581: store their spaces that way (the GGUF,
    # like Hugging Face's added tokens, spells them as raw spaces matched before escaping).
    for tok, score, ty in zip(tokens, scores, types):
        p = m.pieces.add()
        p.piece = tok.replace(" ", "\u2581") if ty == 4 else tok
        p.score = float(score)
        p.type = int(ty)
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(m.SerializeToString())
    return sp


def main(path, texts):
    sp = build_model(path)
    out = {"file": path.split("/")[-1], "bos": 2, "texts": []}
    for t in texts:
        text = open(t, encoding="utf-8").read()
        out["texts"].append({"path": t, "ids": sp.encode(text)})
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
