/* A graph launch's cost (graph_blocks.c, graph_account.c): the blocks of a graph's kernels,
 * child graphs nested in it included, counted through a stub of the driver's graph queries;
 * what an executable is charged once recorded, forgotten, or never seen. */
#include <stdint.h>

#include "../src/graph_account.h"
#include "../src/graph_blocks.h"
#include "test_util.h"

/* The stub driver: node i of a graph is kind[i] (kernel: its grid; graph: the child's index). */
struct stub_node {
	CUgraphNodeType type;
	unsigned grid[3];
	int child;
};
struct stub_graph {
	int n;
	struct stub_node nodes[4];
};
static struct stub_graph graphs[24];
static int fail_params; /* the kernel query fails */

#define GRAPH(i) ((CUgraph)&graphs[i])

static struct stub_node *node_of(CUgraphNode n) { return (struct stub_node *)n; }

static CUresult get_nodes(CUgraph graph, CUgraphNode *out, size_t *count)
{
	struct stub_graph *g = (struct stub_graph *)graph;
	if (out == NULL) {
		*count = (size_t)g->n;
		return CUDA_SUCCESS;
	}
	size_t k = 0;
	for (; k < *count && k < (size_t)g->n; k++)
		out[k] = (CUgraphNode)&g->nodes[k];
	*count = k;
	return CUDA_SUCCESS;
}

static CUresult node_type(CUgraphNode node, CUgraphNodeType *type)
{
	*type = node_of(node)->type;
	return CUDA_SUCCESS;
}

static CUresult kernel_params(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS *p)
{
	if (fail_params)
		return CUDA_ERROR_INVALID_VALUE;
	p->gridDimX = node_of(node)->grid[0];
	p->gridDimY = node_of(node)->grid[1];
	p->gridDimZ = node_of(node)->grid[2];
	return CUDA_SUCCESS;
}

static CUresult child_graph(CUgraphNode node, CUgraph *graph)
{
	*graph = GRAPH(node_of(node)->child);
	return CUDA_SUCCESS;
}

static const struct vgpu_graph_queries q = { get_nodes, node_type, kernel_params, child_graph };

static void kernel(int g, unsigned x, unsigned y, unsigned z)
{
	graphs[g].nodes[graphs[g].n++] = (struct stub_node){ CU_GRAPH_NODE_TYPE_KERNEL, { x, y, z }, 0 };
}

static void other(int g, CUgraphNodeType type, int child)
{
	graphs[g].nodes[graphs[g].n++] = (struct stub_node){ type, { 0, 0, 0 }, child };
}

static uint64_t count(int g, int *rc)
{
	uint64_t blocks = 12345;
	*rc = vgpu_graph_count_blocks(&q, GRAPH(g), &blocks);
	return blocks;
}

static void test_nested(void)
{
	/* 0: a kernel of 2x3x4, a memcpy, a memset, child 1; 1: a kernel of 1000, child 2;
	 * 2: a kernel of 7, an empty node, a host node */
	kernel(0, 2, 3, 4);
	other(0, CU_GRAPH_NODE_TYPE_MEMCPY, 0);
	other(0, CU_GRAPH_NODE_TYPE_MEMSET, 0);
	other(0, CU_GRAPH_NODE_TYPE_GRAPH, 1);
	kernel(1, 1000, 1, 1);
	other(1, CU_GRAPH_NODE_TYPE_GRAPH, 2);
	kernel(2, 7, 1, 1);
	other(2, CU_GRAPH_NODE_TYPE_EMPTY, 0);
	other(2, CU_GRAPH_NODE_TYPE_HOST, 0);
	int rc;
	CHECK_EQ_U64(count(0, &rc), 24 + 1000 + 7);
	CHECK_EQ_INT(rc, 0);
	CHECK_EQ_U64(count(2, &rc), 7);
	/* an empty graph runs nothing */
	CHECK_EQ_U64(count(3, &rc), 0);
	CHECK_EQ_INT(rc, 0);
	/* a query that fails: nothing known, *blocks untouched */
	fail_params = 1;
	CHECK_EQ_U64(count(0, &rc), 12345);
	CHECK_EQ_INT(rc, -1);
	fail_params = 0;
}

static void test_depth_and_saturation(void)
{
	/* graphs 4..4+VGPU_GRAPH_MAX_DEPTH: each the child of the one before, the last a kernel */
	int first = 4, last = first + VGPU_GRAPH_MAX_DEPTH;
	for (int g = first; g < last; g++)
		other(g, CU_GRAPH_NODE_TYPE_GRAPH, g + 1);
	kernel(last, 5, 1, 1);
	int rc;
	CHECK_EQ_U64(count(first, &rc), 5); /* VGPU_GRAPH_MAX_DEPTH levels below the top */
	CHECK_EQ_INT(rc, 0);
	other(last + 1, CU_GRAPH_NODE_TYPE_GRAPH, first); /* one level more */
	count(last + 1, &rc);
	CHECK_EQ_INT(rc, -1);
	/* grids whose product and sum pass 2^64 saturate */
	int big = last + 2;
	kernel(big, 0xffffffffu, 0xffffffffu, 0xffffffffu);
	kernel(big, 1, 1, 1);
	CHECK_EQ_U64(count(big, &rc), UINT64_MAX);
	CHECK_EQ_INT(rc, 0);
}

static void test_exec_costs(void)
{
	CUgraphExec a = (CUgraphExec)0x1000, b = (CUgraphExec)0x2000, never = (CUgraphExec)0x3000;
	CHECK_EQ_U64(vgpu_graph_launch_cost(never, 1024), 1024); /* never counted: the fallback */
	CHECK_EQ_INT(vgpu_graph_cost_set(a, 100000000), 0);
	CHECK_EQ_INT(vgpu_graph_cost_set(b, 0), 0);
	CHECK_EQ_U64(vgpu_graph_launch_cost(a, 1024), 100000000);
	CHECK_EQ_U64(vgpu_graph_launch_cost(b, 1024), 1); /* a graph of no kernel: at least 1 */
	/* a handle handed out again: the new count replaces the old */
	CHECK_EQ_INT(vgpu_graph_cost_set(a, 42), 0);
	CHECK_EQ_U64(vgpu_graph_launch_cost(a, 1024), 42);
	vgpu_graph_cost_forget(a); /* cuGraphExecDestroy */
	CHECK_EQ_U64(vgpu_graph_launch_cost(a, 1024), 1024);
	CHECK_EQ_U64(vgpu_graph_launch_cost(b, 1024), 1);
	/* many executables, then a forked child's reset */
	for (uintptr_t i = 1; i <= 1000; i++)
		CHECK_EQ_INT(vgpu_graph_cost_set((CUgraphExec)(0x10000 + i * 16), i), 0);
	CHECK_EQ_U64(vgpu_graph_launch_cost((CUgraphExec)(0x10000 + 500 * 16), 1024), 500);
	vgpu_graph_reset();
	CHECK_EQ_U64(vgpu_graph_launch_cost(b, 1024), 1024);
}

int main(void)
{
	test_nested();
	test_depth_and_saturation();
	test_exec_costs();
	return test_finish("test_graph_blocks");
}
