"""``python -m hpcgnn.partition [overrides]``: partition a dataset ahead of training.

    python -m hpcgnn.partition dataset=ogbn-products graph.num_parts=4 graph.method=metis
    python -m hpcgnn.partition dataset=ogbn-products graph.num_parts=4 +cluster=mycluster
    python -m hpcgnn.partition dataset=ogbn-papers100M graph.num_parts=16 graph.method=lp +cluster=mycluster cluster.nodes=4

Without a cluster it runs here; with ``+cluster=NAME`` it runs as a job on the cluster: one task
(a node with memory enough for METIS), or with ``graph.method=lp`` one task on each of
``cluster.nodes`` nodes, each reading its share of the edges (the parts are the same for the
same task count). Does nothing but print the report when
the parts are already there. ``graph.num_parts=0`` means one part per rank of the job
the same overrides would launch.
"""

from __future__ import annotations

import sys
import time

from hpcgnn.env import full_error
from hpcgnn.errors import UserError, report


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    from hpcgnn.submit.compose import compose

    try:
        overrides = list(argv)
        if not any(a.startswith(("run_dir=", "hydra.run.dir=")) for a in overrides):
            overrides.append(f"hydra.run.dir=outputs/partition-{time.strftime('%Y%m%d-%H%M%S')}")
        cfg = compose(overrides).cfg
        if cfg.cluster is None:
            import logging

            from hpcgnn.io import stop_cleanly_on_sigterm
            from hpcgnn.partition import run_partition

            # progress of a long partitioning (lp's levels, passes) on stderr
            logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")

            with stop_cleanly_on_sigterm("partition"):
                run_partition(cfg.dataset, cfg.graph, cfg.graph.parts_for(cfg.world_size))
            return 0
        from hpcgnn.submit.partition_job import submit_partition, wait_partition

        job = submit_partition(cfg)
        return wait_partition(job, cfg) if cfg.launch.wait is not False else 0
    except UserError as exc:
        return report(exc, full_error())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
