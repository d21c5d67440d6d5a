"""Batch slots and server counts checked against shared memory, the node's memory and the ranks before anything
is taken.
"""

from __future__ import annotations

import re

import pytest
from conftest import one_line, run_cli

from hpcgnn.errors import ConfigError


def test_batch_slots_are_bounded_by_shared_memory_and_the_nodes_memory():
    from conftest import make_config

    from hpcgnn.checks import check_slots

    cfg = make_config("train.prefetch=2000", "train.sampler_procs=1", "launch.procs=1")
    with pytest.raises(ConfigError, match=r"train.prefetch=2000 with train.sampler_procs=1: 2000 shared-memory slots "
                                          r"of 64 MiB per rank take 250.0 GiB for 2 rank\(s\) on this machine, but "
                                          r"/dev/shm has 22.0 GiB free. HINT: lower train.prefetch"):
        check_slots(cfg, 2, 22 * 2**30, 2**40, "this machine")
    with pytest.raises(ConfigError, match=r"take 125.0 GiB for 1 rank\(s\) on a node of c, more than 50% of its 128.0 "
                                          r"GiB of memory"):
        check_slots(cfg, 1, None, 128 * 2**30, "a node of c")
    check_slots(make_config("train.sampler_procs=1", "launch.procs=1"), 2, 2**30, 8 * 2**30, "this machine")
    served = make_config("train.prefetch=400", "launch.sampler_servers=2")
    with pytest.raises(ConfigError, match=r"train.prefetch=400 with 2 sampler server\(s\): 800 batch slots of 64 MiB "
                                          r"per rank"):
        check_slots(served, 2, None, 64 * 2**30, "this machine")


@pytest.mark.slow
def test_a_prefetch_that_cannot_fit_is_refused_before_anything_starts(tmp_path):
    res = run_cli("train.prefetch=20000", "train.sampler_procs=1", "launch.procs=1", cwd=tmp_path, timeout=60)
    assert res.returncode == 2 and "starting" not in res.stdout, res.stdout + res.stderr
    assert re.search(r"20000 shared-memory slots of 64 MiB per rank take 1250.0 GiB for 1 rank\(s\) on this machine, "
                     r"but /dev/shm has [\d.]+ GiB free", one_line(res, "config error"))


def test_server_counts_are_checked_against_ranks_and_sampler_processes():
    from conftest import make_config

    with pytest.raises(ConfigError, match=r"3 sampler servers for 1 rank\(s\) on a partitioned graph: .* HINT: at most "
                                          r"1 sampler server"):
        make_config("launch.procs=1", "launch.sampler_servers=3", "graph=partitioned")
    with pytest.raises(ConfigError, match=r"train.sampler_procs=1 with 1 sampler server\(s\): the servers make every "
                                          r"training batch.* HINT: set train.sampler_procs=0"):
        make_config("train.sampler_procs=1", "launch.sampler_servers=1")
    with pytest.raises(ConfigError, match=r"launch.sampler_servers=-1 must be 0 \(none\) or more"):
        make_config("launch.sampler_servers=-1")
    with pytest.raises(ConfigError, match=r"4 sampler servers for 2 rank\(s\) on a partitioned graph"):
        make_config("+cluster=devcluster", "cluster.nodes=1", "cluster.tasks_per_node=2", "cluster.samplers.nodes=2",
                    "cluster.samplers.tasks_per_node=2", "graph=partitioned")
    make_config("launch.procs=2", "launch.sampler_servers=3")  # a whole graph: every trainer reads every server
