"""Runs a notebook top to bottom, headless (nbclient, the current Python's kernel), from the
repository root, and writes it with its outputs: any cell's error fails the run.

    python scripts/run-notebook.py examples/retrieval_attention.ipynb OUT.ipynb
"""

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    nb = nbformat.read(src, as_version=4)
    repo = Path(__file__).resolve().parents[1]
    NotebookClient(nb, timeout=3600, kernel_name="python3",
                   resources={"metadata": {"path": str(repo)}}).execute()
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out)
    print(f"{src}: ran every cell; wrote {out}")


if __name__ == "__main__":
    main()
