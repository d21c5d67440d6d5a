"""`python -m hpcgnn cluster init NAME`: parsing what sinfo prints into a cluster file."""

from __future__ import annotations

import pytest
from conftest import make_config

from hpcgnn.submit.cluster import init, parse_gpus, parse_sinfo, parse_time_min

SINFO = """gpu*|4|64|512000|gpu:a100:4(S:0-1)|2-00:00:00|g[001-004]
gpu*|2|128|1024000|gpu:a100:4(S:0-1),shard:8|2-00:00:00|g[005-006]
cpu|10|48|192000|(null)|12:00:00|c[01-10]
"""


@pytest.mark.parametrize("gres, gpus", [("(null)", 0), ("gpu:4", 4), ("gpu:a100:8(S:0-1)", 8),
                                        ("gpu:a100:4,shard:8", 4), ("gpu:a100:2,gpu:v100:2", 4)])
def test_gpus_from_gres(gres, gpus):
    assert parse_gpus(gres) == gpus


@pytest.mark.parametrize("limit, minutes", [("infinite", None), ("30", 30), ("12:00:00", 720),
                                            ("2-00:00:00", 2880), ("1-06:30:00", 1830), ("10:30", 11)])
def test_time_limits(limit, minutes):
    assert parse_time_min(limit) == minutes


def test_partitions_from_sinfo():
    gpu, cpu = parse_sinfo(SINFO)
    assert (gpu.name, gpu.default, gpu.nodes, gpu.cpus, gpu.mem_mb, gpu.gpus) == ("gpu", True, 6, 64, 512000, 4)
    assert (cpu.name, cpu.default, cpu.nodes, cpu.gpus, cpu.time_min) == ("cpu", False, 10, 0, 720)


def test_init_writes_a_cluster_file_hydra_composes(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCGNN_CONFIG_DIR", str(tmp_path))
    path = init("big", None, tmp_path / "cluster", sinfo=SINFO)
    cfg = make_config("+cluster=big").cluster
    assert (cfg.partition, cfg.nodes, cfg.tasks_per_node, cfg.gpus_per_node, cfg.cpus_per_task) == ("gpu", 2, 4, 4, 16)
    assert cfg.mem_gb == 450 and cfg.time_min == 1440 and cfg.executor == "slurm"
    init("small", "cpu", tmp_path / "cluster", sinfo=SINFO)
    c = make_config("+cluster=small").cluster
    assert (c.partition, c.tasks_per_node, c.gpus_per_node, c.cpus_per_task, c.time_min) == ("cpu", 1, 0, 48, 720)
    with pytest.raises(FileExistsError, match="pass --force"):
        init("big", None, tmp_path / "cluster", sinfo=SINFO)
    with pytest.raises(ValueError, match="no partition 'gpux'; sinfo lists: gpu, cpu"):
        init("other", "gpux", tmp_path / "cluster", sinfo=SINFO)
    assert path.read_text().startswith("# Written by `python -m hpcgnn cluster init big`")
