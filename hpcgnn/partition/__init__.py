"""Graph partitions as a cached, checked artifact.

A partition of a prepared graph into K parts lives next to the prepared graph, in
``<dataset cache>/parts/<method>-k<K>-s<seed>[-train]/``::

    META.json        format version, dataset fingerprint, K, method, seed, the report,
                     and a sha256 of every file below
    node_part.npy    int16 [num_nodes] (int32 from 32768 parts): the part that owns each node
    node_local.npy   int32 [num_nodes]: the node's row inside its part
    degree.npy       int32 [num_nodes]: every node's in-degree (ranks pick hot remote nodes by it)
    part_<i>/        nodes.npy (owned global ids, sorted), rowptr.npy + col.npy (the owned
                     nodes' full in-adjacency, global ids), x.npy, y.npy, and the owned
                     train_idx/val_idx/test_idx (global ids); a typed graph's parts also hold,
                     per relation, rowptr__<rel>.npy + col__<rel>.npy: the in-adjacency of the
                     part's nodes of the relation's target type (sources in their type's own ids)

A typed graph is partitioned as its homogeneous view (types one after another in the id space),
with every node type balanced across parts as well as the training nodes; META.json records the
types and each part's count of every type.

The files, in the order a partition is made and used:

- ``compute.py``: :func:`compute_parts`, the node -> part map, METIS (pymetis, fixed seed: byte-identical
  across runs), lp (``multilevel.py``) or random, balancing training nodes as well as nodes; its memory;
- ``report.py``: :func:`partition_report`, the cut and balance recorded in META.json;
- ``write.py``: :func:`write_parts`, the parts' files;
- ``cache.py``: :func:`ensure_parts`, partition unless the artifact is there (reuse costs a file stat);
- ``parts.py``: :func:`open_parts`, verify checksums, K and the dataset, then memory-map a rank's parts;
- ``job.py``: :func:`run_partition_task`, partitioning as a job of its own (``hpcgnn partition``).
"""

from hpcgnn.partition.cache import ensure_parts, parts_folder, parts_ready, read_meta
from hpcgnn.partition.compute import (
           check_partition_memory,
           compute_parts,
           partition_memory,
           rebalance,
           seed_weight,
)
from hpcgnn.partition.job import run_partition, run_partition_task
from hpcgnn.partition.parts import Parts, TypedParts, open_parts
from hpcgnn.partition.report import format_report, partition_report

__all__ = ["Parts", "TypedParts", "check_partition_memory", "compute_parts", "ensure_parts", "format_report",
           "open_parts", "partition_memory", "partition_report", "parts_folder", "parts_ready", "read_meta",
           "rebalance", "run_partition", "run_partition_task", "seed_weight"]
