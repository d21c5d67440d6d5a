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

from collections.abc import Callable

import torch
from torch import Tensor

from hpcgnn.config import DatasetConfig
from hpcgnn.data.graph import Graph
from hpcgnn.rng import generator

# Part of the cache key: bump it whenever a change here changes the graph a config produces.
GENERATOR_VERSION = 6  # 5: drawn in chunks of SOURCE_CHUNK sources (graphs up to that size are those of 4); 6: typed too


# Sources are generated this many at a time (part of the generator: a graph of at most this many
# nodes is drawn in one chunk, so it is the graph earlier versions drew in one go).
SOURCE_CHUNK = 1 << 18


def generate_synthetic(cfg: DatasetConfig, on_edges: Callable[[Tensor, Tensor], None],
                       on_features: Callable[[int, Tensor], None]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Draw the graph chunk by chunk: ``on_edges(src, dst)`` gets each chunk's edges, then the same
    reversed (duplicates possible), ``on_features(start, rows)`` each chunk of feature rows.
    Returns (y, train_idx, val_idx, test_idx). Memory: O(nodes) plus one chunk."""
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
    chung_lu = _ChungLu(cfg, g, community, by_comm, comm_start, comm_size, half) if cfg.degree_exponent > 0 else None
    for a in range(0, n, SOURCE_CHUNK):
        b = min(a + SOURCE_CHUNK, n)
        if chung_lu is not None:
            src, dst = chung_lu.edges(a, b)
        else:
            # Out-degree per node: a moderate (log-normal) tail around avg_degree / 2.
            sigma = 0.6
            mu = torch.log(torch.tensor(half)) - sigma**2 / 2
            out_deg = torch.exp(mu + sigma * torch.randn(b - a, generator=g)).round().long().clamp(min=1)
            src = torch.repeat_interleave(torch.arange(a, b), out_deg)
            # Targets: a random member of the source's community, of its region, or any node.
            sc = community[src]
            m = src.numel()
            inside = torch.rand(m, generator=g) < cfg.homophily
            local = torch.rand(m, generator=g) < cfg.locality
            start = torch.where(inside, comm_start[sc], torch.where(local, region_start[sc // c], 0))
            size = torch.where(inside, comm_size[sc], torch.where(local, region_size[sc // c], n))
            del sc
            pick = (torch.rand(m, generator=g) * size).long().clamp(max=size - 1)
            del inside, local, size
            dst = by_comm[start + pick]
            del start, pick
        keep = src != dst
        src, dst = src[keep], dst[keep]
        del keep
        on_edges(src, dst)  # (one direction at a time: a dense graph's chunk is large)
        on_edges(dst, src)
        del src, dst
    del by_comm, chung_lu

    # Features: class centroid (unit scale) plus noise, scaled back to unit variance.
    num_centroids = num_comm if cfg.centroids == "community" else c  # per community: who links with whom
    centroids = torch.randn(num_centroids, cfg.num_features, generator=g)
    owner = community if cfg.centroids == "community" else y
    for a in range(0, n, SOURCE_CHUNK):
        b = min(a + SOURCE_CHUNK, n)
        x = centroids[owner[a:b]] + cfg.feature_noise * torch.randn(b - a, cfg.num_features, generator=g)
        on_features(a, x / (1.0 + cfg.feature_noise**2) ** 0.5)

    perm = torch.randperm(n, generator=g)
    n_train, n_val = int(cfg.train_fraction * n), int(cfg.val_fraction * n)
    train_idx, val_idx, test_idx = perm[:n_train], perm[n_train:n_train + n_val], perm[n_train + n_val:]
    return y, train_idx.sort().values, val_idx.sort().values, test_idx.sort().values


def expected_edges(cfg: DatasetConfig) -> int:
    """About how many directed edges :func:`generate_synthetic` emits (before duplicates are removed)."""
    return int(cfg.num_nodes * max(cfg.avg_degree, 1.0) * 1.1) + 2 * cfg.num_nodes


def make_synthetic(cfg: DatasetConfig, allow_download: bool = False) -> Graph:
    """The synthetic graph in memory (small graphs, tests); ``prepare`` streams it to disk instead."""
    src, dst, xs = [], [], []
    y, train_idx, val_idx, test_idx = generate_synthetic(
        cfg, lambda s, d: (src.append(s), dst.append(d)), lambda start, x: xs.append(x))
    edge_index = torch.stack([torch.cat(src), torch.cat(dst)])
    return Graph.from_edge_index(edge_index, cfg.num_nodes, torch.cat(xs), y, train_idx, val_idx, test_idx,
                                 cfg.num_classes)


class _ChungLu:
    """Heavy-tailed degrees: node weights follow a power law with exponent ``degree_exponent``;
    a node sends edges in proportion to its weight and receives them in proportion too
    (a Chung-Lu graph inside and across communities), so a few hubs carry many edges."""

    def __init__(self, cfg: DatasetConfig, g: torch.Generator, community, by_comm, comm_start, comm_size,
                 half: float):
        n = community.numel()
        self.cfg, self.g, self.community, self.by_comm, self.n = cfg, g, community, by_comm, n
        alpha = cfg.degree_exponent
        u = torch.rand(n, generator=g, dtype=torch.float64)
        w = u.pow(-1.0 / (alpha - 1.0)).clamp(max=float(n) ** 0.5 * 10)  # Pareto(alpha - 1), capped at ~10 sqrt(n)
        self.expected = w * (half / w.mean())
        # Targets proportional to weight: inverse-CDF search, globally or inside the source's community.
        self.cum = torch.cumsum(w[by_comm], 0)
        self.comm_lo = torch.cat([torch.zeros(1, dtype=self.cum.dtype), self.cum])[comm_start]
        self.comm_hi = self.cum[comm_start + comm_size - 1]

    def edges(self, a: int, b: int) -> tuple[Tensor, Tensor]:
        cfg, g, c = self.cfg, self.g, self.cfg.num_classes
        out_deg = torch.poisson(self.expected[a:b], generator=g).long().clamp(min=1)
        src = torch.repeat_interleave(torch.arange(a, b), out_deg)
        m = src.numel()
        sc = self.community[src]
        inside = torch.rand(m, generator=g) < cfg.homophily
        local = torch.rand(m, generator=g) < cfg.locality
        r = torch.rand(m, generator=g, dtype=torch.float64)
        comm_lo, comm_hi = self.comm_lo, self.comm_hi
        region_lo, region_hi = comm_lo[(sc // c) * c], comm_hi[(sc // c) * c + c - 1]
        lo = torch.where(inside, comm_lo[sc], torch.where(local, region_lo, torch.zeros_like(r)))
        hi = torch.where(inside, comm_hi[sc], torch.where(local, region_hi, self.cum[-1].expand(m)))
        pos = torch.searchsorted(self.cum, lo + r * (hi - lo)).clamp(max=self.n - 1)
        return src, self.by_comm[pos]


TYPED_RELATIONS = [("paper", "cites", "paper"), ("author", "writes", "paper"), ("paper", "has_topic", "field")]
TYPED_FEATURES_FROM = {"author": ("paper", "rev_writes", "author"), "field": ("paper", "has_topic", "field")}


def typed_sizes(cfg: DatasetConfig) -> tuple[dict[str, int], dict[tuple[str, str, str], int]]:
    """The typed graph's node counts per type and the edges drawn per relation (before duplicates go)."""
    c, n = cfg.num_classes, cfg.num_nodes
    return ({"paper": n, "author": max(n // 2, c), "field": c * cfg.communities_per_class},
            dict(zip(TYPED_RELATIONS, (n * _cites_per_paper(cfg), 3 * n, 2 * n), strict=True)))


def _cites_per_paper(cfg: DatasetConfig) -> int:
    return max(int(round(cfg.avg_degree / 2)), 1)


def generate_synthetic_typed(cfg: DatasetConfig, on_edges: Callable[[tuple[str, str, str], Tensor, Tensor], None],
                             on_features: Callable[[int, Tensor], None]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """A seeded typed graph where a paper's label is told by its relations, not by its features alone.

    Papers (the target type, ``num_nodes`` of them) have noisy class-centroid features; fields
    (``communities_per_class`` per class) and authors (half as many as papers) have none: they
    get the mean of their papers' features (``feature_rule``). A paper has two topics and three
    authors, each of its own class with probability ``homophily``, and cites ``avg_degree / 2``
    papers chosen with no regard to class. So the signal is in ``has_topic`` and ``writes``,
    outnumbered by ``cites``: a relational model weighs the relations apart, a homogeneous GNN
    with types erased averages the informative neighbours with the many uninformative ones, and
    an MLP on the paper's features sees the noise alone.

    Drawn SOURCE_CHUNK papers at a time: ``on_edges(relation, src, dst)`` gets each chunk's edges of each
    relation (as drawn: reverses are the builder's), ``on_features(start, rows)`` each chunk of the papers'
    features. Returns (y, train_idx, val_idx, test_idx) of the papers. Memory: O(nodes) plus one chunk.
    """
    g = generator(cfg.seed, "synthetic_typed")
    c, n = cfg.num_classes, cfg.num_nodes
    sizes, _ = typed_sizes(cfg)
    n_fields, n_authors = sizes["field"], sizes["author"]
    y = torch.randint(c, (n,), generator=g)
    author_class = torch.randint(c, (n_authors,), generator=g)
    pools = {}

    def pick(klass: Tensor, pool: str, pool_class: Tensor, per: int) -> Tensor:
        """``per`` members of the pool for each item: of the item's class with probability homophily."""
        if pool not in pools:
            pools[pool] = [torch.nonzero(pool_class == k).squeeze(1) for k in range(c)]
        by_class = pools[pool]
        items = klass.repeat_interleave(per)
        same = torch.rand(items.numel(), generator=g) < cfg.homophily
        out = torch.randint(pool_class.numel(), (items.numel(),), generator=g)
        for k in range(c):
            mask = same & (items == k)
            members = by_class[k]
            out[mask] = members[torch.randint(members.numel(), (int(mask.sum()),), generator=g)]
        return out

    per_cites = _cites_per_paper(cfg)
    for a in range(0, n, SOURCE_CHUNK):
        b = min(a + SOURCE_CHUNK, n)
        papers = torch.arange(a, b)
        topics = pick(y[a:b], "field", torch.arange(n_fields) % c, 2)
        authors = pick(y[a:b], "author", author_class, 3)
        cited = torch.randint(n, ((b - a) * per_cites,), generator=g)
        citing = papers.repeat_interleave(per_cites)
        keep = cited != citing
        on_edges(("paper", "cites", "paper"), citing[keep], cited[keep])
        on_edges(("author", "writes", "paper"), authors, papers.repeat_interleave(3))
        on_edges(("paper", "has_topic", "field"), papers.repeat_interleave(2), topics)
    centroids = torch.randn(c, cfg.num_features, generator=g)
    for a in range(0, n, SOURCE_CHUNK):
        b = min(a + SOURCE_CHUNK, n)
        x = (centroids[y[a:b]] + cfg.feature_noise * torch.randn(b - a, cfg.num_features, generator=g)) / (
            1.0 + cfg.feature_noise**2) ** 0.5
        on_features(a, x)
    perm = torch.randperm(n, generator=g)
    n_train, n_val = int(cfg.train_fraction * n), int(cfg.val_fraction * n)
    return (y, perm[:n_train].sort().values, perm[n_train:n_train + n_val].sort().values,
            perm[n_train + n_val:].sort().values)


def make_synthetic_typed(cfg: DatasetConfig, allow_download: bool = False):
    """The typed synthetic graph in memory (small graphs, tests); ``prepare`` streams it to disk instead."""
    from hpcgnn.data.typed import TypedGraph

    edges: dict = {r: [] for r in TYPED_RELATIONS}
    xs: list[Tensor] = []
    y, train_idx, val_idx, test_idx = generate_synthetic_typed(
        cfg, lambda rel, s, d: edges[rel].append(torch.stack([s, d])), lambda start, x: xs.append(x))
    sizes, _ = typed_sizes(cfg)
    return TypedGraph.from_edges(sizes, {r: torch.cat(e, 1) for r, e in edges.items()}, {"paper": torch.cat(xs)},
                                 "paper", y, train_idx, val_idx, test_idx, cfg.num_classes,
                                 feature_from=TYPED_FEATURES_FROM)


def synthetic_typed_source(cfg: DatasetConfig, allow_download: bool = False):
    """The typed synthetic graph as :func:`~hpcgnn.data.prepare` streams it: drawn a chunk of papers at a time."""
    from hpcgnn.data.typed import TypedSource

    sizes, expected = typed_sizes(cfg)
    return TypedSource(sizes, TYPED_RELATIONS, expected, cfg.num_features, "paper", cfg.num_classes,
                       TYPED_FEATURES_FROM,
                       lambda w: generate_synthetic_typed(cfg, w.add, lambda a, x: w.write_features("paper", a, x)))
