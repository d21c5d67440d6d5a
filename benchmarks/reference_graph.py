"""What the reference scripts (dgl_sampler.py, pyg_sampler.py) share: their arguments and the prepared graph,
read with numpy alone (they run in environments of their own, without hpcgnn or the project's torch)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

FANOUTS, BATCH = (15, 10, 5), 1024  # hop 1 first, as benchmarks/common.py


def arguments(doc: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--edge-attr", type=Path, default=None, help="a .npy of each CSR edge's features (pyg_sampler.py)")
    return ap.parse_args()


def load(folder: Path) -> dict:
    """The prepared graph's arrays: ``rowptr``/``col`` (the CSR of in-edges), ``x`` (features, in memory;
    ``feature_dtype`` says how to view them), ``y``, ``train`` (training ids), ``num_nodes``."""
    meta = json.loads((folder / "meta.json").read_text())
    return {"rowptr": np.load(folder / "rowptr.npy"), "col": np.load(folder / "col.npy"),
            "x": np.ascontiguousarray(np.load(folder / "x.npy", mmap_mode="r")), "y": np.load(folder / "y.npy"),
            "train": np.load(folder / "train_idx.npy"), "num_nodes": int(meta["num_nodes"]),
            "feature_dtype": meta.get("feature_dtype")}
