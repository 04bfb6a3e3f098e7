"""Shared fixtures: small seeded OOD-like data and the bundled real dump subset."""

from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
SUBSET = REPO / "data" / "smollm2-8k-subset"


def ood_data(n=2000, m=400, b=32, d=32, seed=0):
    """Keys and queries from different distributions (queries shifted and scaled), f32."""
    rng = np.random.default_rng(seed)
    keys = rng.standard_normal((n, d)).astype(np.float32)
    shift = rng.standard_normal(d).astype(np.float32) * 2.0
    train = (rng.standard_normal((m, d)) * 0.7 + shift).astype(np.float32)
    test = (rng.standard_normal((b, d)) * 0.7 + shift).astype(np.float32)
    return keys, train, test


def brute_topk(queries, keys, k):
    """numpy reference: ids and scores of the k largest inner products, best first."""
    s = np.asarray(queries, np.float64) @ np.asarray(keys, np.float64).T
    ids = np.argsort(-s, axis=-1, kind="stable")[..., :k]
    return ids, np.take_along_axis(s, ids, axis=-1)


@pytest.fixture(scope="session")
def data():
    return ood_data()


@pytest.fixture(scope="session")
def attention_index(data):
    import qkindex

    keys, train, _ = data
    return qkindex.AttentionIndex.build(keys, train, kq=50, max_degree=24)


@pytest.fixture(scope="session")
def subset():
    if not (SUBSET / "manifest.json").is_file():
        pytest.skip(f"bundled dump subset not found at {SUBSET}")
    return SUBSET


MODEL = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3 = REPO / "models" / "gemma-3-270m-q4_k_m.gguf"


def need(module: str):
    """Imports an optional test dependency: skips with the reason where it is missing, fails
    when the environment variable ``CI`` is set (CI installs it)."""
    import importlib
    import os

    try:
        return importlib.import_module(module)
    except ImportError as e:
        msg = f"{module} is not installed ({e}); scripts/test.sh installs it"
        if os.environ.get("CI"):
            pytest.fail(f"CI: {msg}")
        # Test modules call it at import time: the whole module is skipped then.
        pytest.skip(msg, allow_module_level=True)


def _gguf_model(path: Path, name: str):
    """A model through transformers from one of our GGUF files (no hub), float32, eval mode;
    skips without the file or the packages (fails where ``CI`` is set)."""
    import os

    need("torch")
    need("transformers")
    need("gguf")
    if not path.is_file():
        msg = f"{path} not found (scripts/get-model.sh --model {name} fetches it)"
        if os.environ.get("CI"):
            pytest.fail(f"CI: {msg}")
        pytest.skip(msg)
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct (Llama family)."""
    return _gguf_model(MODEL, "smollm2-135m")


@pytest.fixture(scope="session")
def gemma3():
    """Gemma 3 270M (sliding-window and global layers, QK norms)."""
    return _gguf_model(GEMMA3, "gemma3-270m")
