"""Models: hpcgnn's registry over torch_geometric.nn and a user's own, one GNN layer per sampling hop.

- ``gnn.py``: the homogeneous models by name (sage, gcn, gat, gin, mlp) and what each one's batches need;
- ``typed.py``: the typed graphs' models (rgcn, sage per relation, mlp);
- ``node.py``: a node classifier for any graph, and a batch's logits and labels;
- ``link.py``: link prediction's encoder and decoder; ``edge.py``: an edge task's (``task=edge``);
- ``custom.py``: a user's own model by ``_target_``; ``aggregation.py``: sorted-CSR aggregation on the CPU;
- ``saved.py``: the trained model's files, and a plain PyG file to take elsewhere.
"""

from hpcgnn.models.edge import EdgeModel, build_edge_model, build_typed_edge_model, decoder_reads_edges
from hpcgnn.models.gnn import (
           MLPBaseline,
           batch_transform,
           build_model,
           edge_features_read,
           forward_batch,
           gcn_norm,
           reads_edge_features,
           uses_edges,
)
from hpcgnn.models.link import DECODERS, LinkModel, build_link_model, forward_pairs
from hpcgnn.models.node import build_node_model, node_logits_and_labels
from hpcgnn.models.typed import (
           RGCN,
           TypedMLP,
           TypedSAGE,
           build_typed_model,
           forward_typed_batch,
)

__all__ = ["DECODERS", "RGCN", "EdgeModel", "LinkModel", "MLPBaseline", "TypedMLP",
           "TypedSAGE", "batch_transform", "build_edge_model", "build_typed_edge_model", "build_link_model", "build_model", "build_node_model", "build_typed_model", "decoder_reads_edges",
           "edge_features_read",
           "forward_batch", "forward_pairs", "gcn_norm", "forward_typed_batch", "node_logits_and_labels", "reads_edge_features",
           "uses_edges"]
