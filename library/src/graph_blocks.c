#include "graph_blocks.h"

#include <stdlib.h>

static uint64_t add_sat(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static uint64_t mul_sat(uint64_t a, uint64_t b)
{
	return b != 0 && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

static int walk(const struct vgpu_graph_queries *q, CUgraph graph, int depth, uint64_t *blocks)
{
	if (depth > VGPU_GRAPH_MAX_DEPTH)
		return -1;
	size_t n = 0;
	if (q->get_nodes(graph, NULL, &n) != CUDA_SUCCESS)
		return -1;
	if (n == 0)
		return 0;
	CUgraphNode *nodes = malloc(n * sizeof(*nodes));
	if (nodes == NULL)
		return -1;
	size_t got = n;
	int rc = q->get_nodes(graph, nodes, &got) == CUDA_SUCCESS ? 0 : -1;
	if (got < n)
		n = got; /* the graph lost nodes meanwhile: count those the driver handed out */
	for (size_t i = 0; i < n && rc == 0; i++) {
		CUgraphNodeType type;
		if (q->node_type(nodes[i], &type) != CUDA_SUCCESS) {
			rc = -1;
		} else if (type == CU_GRAPH_NODE_TYPE_KERNEL) {
			CUDA_KERNEL_NODE_PARAMS p = { 0 };
			if (q->kernel_params(nodes[i], &p) != CUDA_SUCCESS)
				rc = -1;
			else
				*blocks = add_sat(*blocks, mul_sat(mul_sat(p.gridDimX, p.gridDimY), p.gridDimZ));
		} else if (type == CU_GRAPH_NODE_TYPE_GRAPH) {
			CUgraph child;
			rc = q->child_graph(nodes[i], &child) == CUDA_SUCCESS ? walk(q, child, depth + 1, blocks) : -1;
		}
	}
	free(nodes);
	return rc;
}

int vgpu_graph_count_blocks(const struct vgpu_graph_queries *q, CUgraph graph, uint64_t *blocks)
{
	uint64_t sum = 0;
	if (q->get_nodes == NULL || q->node_type == NULL || q->kernel_params == NULL || q->child_graph == NULL ||
	    walk(q, graph, 0, &sum) != 0)
		return -1;
	*blocks = sum;
	return 0;
}
