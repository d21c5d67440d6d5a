"""A seeded synthetic node-classification graph: communities, homophilous edges, noisy features.

Each class owns ``communities_per_class`` communities. A node sends about
``avg_degree / 2`` edges, each inside its own community with probability
``homophily`` and otherwise, with probability ``locality``, to a random node of
the source's region (a group of communities holding one of each class), else to
any node; edges are then made undirected. Regions give the graph the locality of
real graphs (most edges stay among nearby nodes, so partitioners find few cut
edges) without making labels more homophilous: a region is class-balanced. Features are a class centroid plus Gaussian noise strong enough
that a node's own features are a weak signal while the mean over its
neighbourhood is a strong one: a GNN clearly beats an MLP on this graph.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hpcgnn.config import DatasetConfig
from hpcgnn.data.graph import Graph
from hpcgnn.rng import generator

# Part of the cache key: bump it whenever a change here changes the graph a config produces.
GENERATOR_VERSION = 4  # 4: seeded through rng.derive_seed


def make_synthetic(cfg: DatasetConfig) -> Graph:
    g = generator(cfg.seed, "synthetic")
    n, c = cfg.num_nodes, cfg.num_classes
    num_comm = c * cfg.communities_per_class
    community = torch.randint(num_comm, (n,), generator=g)
    y = community % c

    half = max(cfg.avg_degree / 2.0, 0.5)
    by_comm = torch.argsort(community, stable=True)
    comm_size = torch.bincount(community, minlength=num_comm)
    comm_start = torch.cumsum(comm_size, 0) - comm_size
    # Region r: communities r*c .. r*c + c - 1, one per class, contiguous in by_comm.
    region_start = comm_start[::c]
    region_size = comm_size.view(-1, c).sum(1)
    if cfg.degree_exponent > 0:
        src, dst = _chung_lu_edges(cfg, g, community, by_comm, comm_start, comm_size, half)
    else:
        # Out-degree per node: a moderate (log-normal) tail around avg_degree / 2.
        sigma = 0.6
        mu = torch.log(torch.tensor(half)) - sigma**2 / 2
        out_deg = torch.exp(mu + sigma * torch.randn(n, generator=g)).round().long().clamp(min=1)
        src = torch.repeat_interleave(torch.arange(n), out_deg)
        # Targets: a random member of the source's community, of its region, or any node.
        sc = community[src]
        m = src.numel()
        inside = torch.rand(m, generator=g) < cfg.homophily
        local = torch.rand(m, generator=g) < cfg.locality
        start = torch.where(inside, comm_start[sc], torch.where(local, region_start[sc // c], 0))
        size = torch.where(inside, comm_size[sc], torch.where(local, region_size[sc // c], n))
        pick = (torch.rand(m, generator=g) * size).long().clamp(max=size - 1)
        dst = by_comm[start + pick]
    keep = src != dst
    src, dst = src[keep], dst[keep]
    edge_index = torch.cat([torch.stack([src, dst]), torch.stack([dst, src])], dim=1)

    # Features: class centroid (unit scale) plus noise, scaled back to unit variance.
    if cfg.centroids == "community":  # a centroid per community (link prediction: who links with whom)
        centroids = torch.randn(num_comm, cfg.num_features, generator=g)
        x = centroids[community] + cfg.feature_noise * torch.randn(n, cfg.num_features, generator=g)
    else:
        centroids = torch.randn(c, cfg.num_features, generator=g)
        x = centroids[y] + cfg.feature_noise * torch.randn(n, cfg.num_features, generator=g)
    x /= (1.0 + cfg.feature_noise**2) ** 0.5

    perm = torch.randperm(n, generator=g)
    n_train, n_val = int(cfg.train_fraction * n), int(cfg.val_fraction * n)
    train_idx, val_idx, test_idx = perm[:n_train], perm[n_train:n_train + n_val], perm[n_train + n_val:]
    return Graph.from_edge_index(edge_index, n, x, y, train_idx.sort().values, val_idx.sort().values,
                                 test_idx.sort().values, c)


def _chung_lu_edges(cfg: DatasetConfig, g: torch.Generator, community, by_comm, comm_start, comm_size,
                    half: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Heavy-tailed degrees: node weights follow a power law with exponent ``degree_exponent``;
    a node sends edges in proportion to its weight and receives them in proportion too
    (a Chung-Lu graph inside and across communities), so a few hubs carry many edges."""
    n = community.numel()
    alpha = cfg.degree_exponent
    u = torch.rand(n, generator=g, dtype=torch.float64)
    w = u.pow(-1.0 / (alpha - 1.0)).clamp(max=float(n) ** 0.5 * 10)  # Pareto(alpha - 1), capped at ~10 sqrt(n)
    expected = w * (half / w.mean())
    out_deg = torch.poisson(expected, generator=g).long().clamp(min=1)
    src = torch.repeat_interleave(torch.arange(n), out_deg)
    m = src.numel()
    # Targets proportional to weight: inverse-CDF search, globally or inside the source's community.
    w_sorted = w[by_comm]
    cum = torch.cumsum(w_sorted, 0)
    comm_lo = torch.cat([torch.zeros(1, dtype=cum.dtype), cum])[comm_start]
    comm_hi = cum[comm_start + comm_size - 1]
    sc = community[src]
    c = cfg.num_classes
    inside = torch.rand(m, generator=g) < cfg.homophily
    local = torch.rand(m, generator=g) < cfg.locality
    r = torch.rand(m, generator=g, dtype=torch.float64)
    region_lo, region_hi = comm_lo[(sc // c) * c], comm_hi[(sc // c) * c + c - 1]
    lo = torch.where(inside, comm_lo[sc], torch.where(local, region_lo, torch.zeros_like(r)))
    hi = torch.where(inside, comm_hi[sc], torch.where(local, region_hi, cum[-1].expand(m)))
    pos = torch.searchsorted(cum, lo + r * (hi - lo)).clamp(max=n - 1)
    return src, by_comm[pos]


def make_synthetic_typed(cfg: DatasetConfig):
    """A seeded typed graph where a paper's label is told by its relations, not by its features alone.

    Papers (the target type, ``num_nodes`` of them) have noisy class-centroid features; fields
    (``communities_per_class`` per class) and authors (half as many as papers) have none: they
    get the mean of their papers' features (``feature_rule``). A paper has two topics and three
    authors, each of its own class with probability ``homophily``, and cites ``avg_degree / 2``
    papers chosen with no regard to class. So the signal is in ``has_topic`` and ``writes``,
    outnumbered by ``cites``: a relational model weighs the relations apart, a homogeneous GNN
    with types erased averages the informative neighbours with the many uninformative ones, and
    an MLP on the paper's features sees the noise alone.
    """
    from hpcgnn.data.typed import TypedGraph

    g = generator(cfg.seed, "synthetic_typed")
    c, n = cfg.num_classes, cfg.num_nodes
    n_fields, n_authors = c * cfg.communities_per_class, max(n // 2, c)
    y = torch.randint(c, (n,), generator=g)
    author_class = torch.randint(c, (n_authors,), generator=g)

    def pick(klass: Tensor, pool_class: Tensor, per: int) -> Tensor:
        """``per`` members of the pool for each item: of the item's class with probability homophily."""
        by_class = [torch.nonzero(pool_class == k).squeeze(1) for k in range(c)]
        items = klass.repeat_interleave(per)
        same = torch.rand(items.numel(), generator=g) < cfg.homophily
        out = torch.randint(pool_class.numel(), (items.numel(),), generator=g)
        for k in range(c):
            mask = same & (items == k)
            members = by_class[k]
            out[mask] = members[torch.randint(members.numel(), (int(mask.sum()),), generator=g)]
        return out

    papers = torch.arange(n)
    topics = pick(y, torch.arange(n_fields) % c, 2)
    authors = pick(y, author_class, 3)
    per_cites = max(int(round(cfg.avg_degree / 2)), 1)
    cited = torch.randint(n, (n * per_cites,), generator=g)
    citing = papers.repeat_interleave(per_cites)
    keep = cited != citing
    centroids = torch.randn(c, cfg.num_features, generator=g)
    x = (centroids[y] + cfg.feature_noise * torch.randn(n, cfg.num_features, generator=g)) / (
        1.0 + cfg.feature_noise**2) ** 0.5
    perm = torch.randperm(n, generator=g)
    n_train, n_val = int(cfg.train_fraction * n), int(cfg.val_fraction * n)
    return TypedGraph.from_edges(
        {"paper": n, "author": n_authors, "field": n_fields},
        {("paper", "cites", "paper"): torch.stack([citing[keep], cited[keep]]),
         ("author", "writes", "paper"): torch.stack([authors, papers.repeat_interleave(3)]),
         ("paper", "has_topic", "field"): torch.stack([papers.repeat_interleave(2), topics])},
        {"paper": x}, "paper", y, perm[:n_train].sort().values, perm[n_train:n_train + n_val].sort().values,
        perm[n_train + n_val:].sort().values, c,
        feature_from={"author": ("paper", "rev_writes", "author"), "field": ("paper", "has_topic", "field")})
