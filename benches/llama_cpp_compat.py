"""llama-cpp-python as the benches use it: without ggml's extra weight buffers (repacking), whose
AMX matmul crashed (SIGSEGV in `ggml_backend_amx_mul_mat`) on the AMX host of 2026-12-07, where
the kernel had not granted the process the AMX tile state. Import this before constructing a
`Llama`; the weights are then used in their GGUF layout, as on hosts without AMX."""
import llama_cpp
import llama_cpp.llama

_default_params = llama_cpp.llama_model_default_params


def _params():
    p = _default_params()
    p.use_extra_bufts = False
    return p


llama_cpp.llama_model_default_params = _params
llama_cpp.llama.llama_cpp.llama_model_default_params = _params
