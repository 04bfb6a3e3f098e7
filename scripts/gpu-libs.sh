#!/usr/bin/env bash
# Sourced by the GPU check scripts: puts the CUDA libraries on LD_LIBRARY_PATH.
# CUDA libraries: the driver from the system; NVRTC and cuBLAS from the toolkit or PyTorch's wheels.
libdirs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && libdirs="$libdirs:$d"
done
pylibs="$(python3 - <<'PY' 2>/dev/null
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
dirs = set()
for r in roots:
    for pat in ("nvidia/*/lib", "nvidia/cu13/lib", "torch/lib"):
        for d in glob.glob(os.path.join(r, pat)):
            if glob.glob(os.path.join(d, "libnvrtc.so*")) or glob.glob(os.path.join(d, "libcublas.so*")):
                dirs.add(d)
print(":".join(sorted(dirs)))
PY
)"
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}${libdirs}${pylibs:+:$pylibs}"
