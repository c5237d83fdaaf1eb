/* What a CUDA graph launch costs the core limiter: the blocks of the graph's kernels, counted
 * once when the graph is instantiated, through the driver's own queries of the graph. */
#ifndef VGPU_GRAPH_BLOCKS_H
#define VGPU_GRAPH_BLOCKS_H

#include <stdint.h>

#include "cuda_api.h"

#define VGPU_GRAPH_MAX_DEPTH 16 /* child graphs nested deeper than this: the walk fails */

/* The driver's graph queries the walk uses (the real ones in hooks_graph.c, stubs in tests). */
struct vgpu_graph_queries {
	CUresult (*get_nodes)(CUgraph graph, CUgraphNode *nodes, size_t *count);
	CUresult (*node_type)(CUgraphNode node, CUgraphNodeType *type);
	CUresult (*kernel_params)(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS *params);
	CUresult (*child_graph)(CUgraphNode node, CUgraph *graph);
};

/* The blocks one launch of graph runs: a kernel node's gridDimX * gridDimY * gridDimZ, a child
 * graph's own sum, every other node 0 (copies and memsets run on copy engines or as the
 * driver's small kernels; a conditional node's body may run any number of times, it is not
 * entered); saturating at UINT64_MAX. 0 and *blocks when the walk
 * succeeded, -1 (nothing known) when a query failed, memory ran out or child graphs nest
 * deeper than VGPU_GRAPH_MAX_DEPTH. */
int vgpu_graph_count_blocks(const struct vgpu_graph_queries *q, CUgraph graph, uint64_t *blocks);

#endif
