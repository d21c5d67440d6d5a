/* A batch of whole graphs from a store of many (hpcgnn/data/graphs.py): graph g's nodes are rows
 * node_ptr[g]..node_ptr[g+1] of x, its edges rows edge_ptr[g]..edge_ptr[g+1] of edges (int32 pairs, each end a
 * node's place within its graph) and of edge_attr. The batch's i-th graph, ids[i], lands at rows out_nodes[i] of
 * out_x and out_edges[i] of the edge arrays (the caller's running sums of the graphs' sizes): its rows copied whole,
 * its edges' ends shifted by out_nodes[i] into edge_index ([2, E] int64: sources, then destinations), batch[] of its
 * nodes set to i. Chunks of graphs to a thread; what a chunk writes depends on the chunk alone. */
#include "kernels.h"

struct graphs {
    const char *x, *attr;
    const int32_t *edges;
    const int64_t *node_ptr, *edge_ptr, *ids, *out_nodes, *out_edges;
    int64_t x_bytes, attr_bytes, n, total_edges, chunks;
    char *out_x, *out_attr;
    int64_t *edge_index, *batch;
};

static void graphs_chunk(void *ctx, int64_t c) {
    const struct graphs *k = (const struct graphs *)ctx;
    const int64_t lo = chunk_start(k->n, k->chunks, c), hi = chunk_start(k->n, k->chunks, c + 1);
    for (int64_t i = lo; i < hi; i++) {
        if (i + 1 < hi) { /* the next graph's rows asked for while this one's are copied */
            const int64_t g1 = k->ids[i + 1];
            PREFETCH(k->x + k->node_ptr[g1] * k->x_bytes);
            PREFETCH(k->edges + 2 * k->edge_ptr[g1]);
        }
        const int64_t g = k->ids[i];
        const int64_t first = k->node_ptr[g], nodes = k->node_ptr[g + 1] - first;
        const int64_t e0 = k->edge_ptr[g], edges = k->edge_ptr[g + 1] - e0;
        const int64_t at = k->out_nodes[i], et = k->out_edges[i];
        memcpy(k->out_x + at * k->x_bytes, k->x + first * k->x_bytes, (size_t)(nodes * k->x_bytes));
        for (int64_t v = 0; v < nodes; v++) k->batch[at + v] = i;
        const int32_t *e = k->edges + 2 * e0;
        int64_t *src = k->edge_index + et, *dst = k->edge_index + k->total_edges + et;
        for (int64_t j = 0; j < edges; j++) {
            src[j] = at + e[2 * j];
            dst[j] = at + e[2 * j + 1];
        }
        if (k->attr_bytes)
            memcpy(k->out_attr + et * k->attr_bytes, k->attr + e0 * k->attr_bytes, (size_t)(edges * k->attr_bytes));
    }
}

void hpcgnn_assemble_graphs(const void *x, int64_t x_bytes, const void *edges, const void *attr, int64_t attr_bytes,
                            const int64_t *node_ptr, const int64_t *edge_ptr, const int64_t *ids, int64_t n,
                            const int64_t *out_nodes, const int64_t *out_edges, int64_t total_edges, void *out_x,
                            int64_t *edge_index, void *out_attr, int64_t *batch, int64_t chunks, int threads) {
    struct graphs k = {(const char *)x, (const char *)attr, (const int32_t *)edges, node_ptr, edge_ptr, ids,
                       out_nodes, out_edges, x_bytes, attr_bytes, n, total_edges, chunks, (char *)out_x,
                       (char *)out_attr, edge_index, batch};
    parallel_chunks(threads, chunks, graphs_chunk, &k);
}
