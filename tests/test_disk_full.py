"""A full disk during a checkpoint: exit 2, one line with sizes that make sense, the checkpoint before kept.
"""

from __future__ import annotations

import re
import subprocess

import pytest
from conftest import TINY, one_line, run_cli


@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint_exits_2_and_keeps_the_one_before(tmp_path):
    """Two ranks checkpoint every 2 steps onto a file system with room for one checkpoint and a half: the second
    cannot be written; the run stops with exit 2 and one line (the folder, bytes needed and free), and the first
    checkpoint is whole (a later run there with room resumes from it)."""
    args = [*TINY, "train.epochs=4", "checkpoint.every_steps=2", "checkpoint.keep=5", "metrics.tensorboard=false"]
    roomy = run_cli(*args, cwd=tmp_path / "roomy")
    assert roomy.returncode == 0, roomy.stderr
    first = sorted((tmp_path / "roomy" / "run" / "checkpoints").glob("step-*"))[0]
    pages = sum(-(-f.stat().st_size // 4096) for f in first.iterdir())
    checkpoints = tmp_path / "full" / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={int(pages * 1.5 + 2) * 4096},mode=0755", "tmpfs",
                              str(checkpoints)], capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a small file system here to fill: {mounted.stderr.strip()}")
    try:
        full = run_cli(*args, cwd=tmp_path / "full")
        assert full.returncode == 2, full.stdout + full.stderr
        line = one_line(full, "checkpoint error")
        assert re.search(rf"the checkpoint of step 4 does not fit in {checkpoints}: it needs about [\d.]+ [KMG]iB and "
                         rf"[\d.]+ [KMG]iB are free there \(the disk is full, or your quota\); the checkpoint "
                         rf"{checkpoints / 'step-000000002'} is intact\. HINT: free space there", line), line
        from hpcgnn.io import sha256_file
        from hpcgnn.rank.checkpoint import _manifest

        (kept,) = checkpoints.glob("step-*")
        manifest = _manifest(kept)
        assert manifest["step"] == 2 and all(sha256_file(kept / n) == h for n, h in manifest["files"].items())
        assert not [p for p in checkpoints.iterdir() if p.name.startswith(".")]  # no half-written one left
    finally:
        subprocess.run(["umount", str(checkpoints)], capture_output=True)
