/* TEST DOUBLE: CUDA graphs with memory allocation nodes, kernel nodes and child graph nodes.
 * An allocation node holds no memory of its own; instantiating a graph takes its allocation
 * nodes' memory on their devices, and it stays taken until the executable graph is destroyed,
 * like the driver's graph memory pool (launches and free nodes do not give it back to the
 * device). A child graph node holds a copy of the graph it was given, as the driver's does. A
 * launch of an executable occupies the fake GPU for the blocks of its kernels, child graphs'
 * included, as that many blocks of cuLaunchKernel would (fake_launch).
 * Handles are slots of fixed tables, the lowest free one handed out first: a destroyed
 * graph's or node's handle comes back for the next one, as a driver may hand it out again. */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fake_cuda.h"

#define FAKE_GRAPHS 64
#define FAKE_NODES (1 << 18) /* graphs of 10^5 kernels, and a copy of one as a child graph */
#define FAKE_EXECS 64
#define FAKE_EXEC_ALLOCS 16

struct fake_graph { int used; };
struct fake_node {
	int used, graph, type, dev, orig;
	int child;         /* CU_GRAPH_NODE_TYPE_GRAPH: the slot of the node's own copy */
	unsigned grid[3];  /* CU_GRAPH_NODE_TYPE_KERNEL */
	uint64_t bytes;    /* CU_GRAPH_NODE_TYPE_MEM_ALLOC */
};
struct fake_exec { int used, n; uint64_t blocks; uint64_t keys[FAKE_EXEC_ALLOCS]; };

static struct fake_graph graphs[FAKE_GRAPHS];
static struct fake_node nodes[FAKE_NODES];
static struct fake_exec execs[FAKE_EXECS];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static int graph_slot(CUgraph g)
{
	uintptr_t p = (uintptr_t)g, base = (uintptr_t)graphs;
	if (p < base || p >= base + sizeof(graphs) || (p - base) % sizeof(graphs[0]) != 0)
		return -1;
	int i = (int)((p - base) / sizeof(graphs[0]));
	return graphs[i].used ? i : -1;
}

static int node_slot(CUgraphNode n)
{
	uintptr_t p = (uintptr_t)n, base = (uintptr_t)nodes;
	if (p < base || p >= base + sizeof(nodes) || (p - base) % sizeof(nodes[0]) != 0)
		return -1;
	int i = (int)((p - base) / sizeof(nodes[0]));
	return nodes[i].used ? i : -1;
}

static int exec_slot(CUgraphExec e)
{
	uintptr_t p = (uintptr_t)e, base = (uintptr_t)execs;
	if (p < base || p >= base + sizeof(execs) || (p - base) % sizeof(execs[0]) != 0)
		return -1;
	int i = (int)((p - base) / sizeof(execs[0]));
	return execs[i].used ? i : -1;
}

static int new_graph(void)
{
	for (int i = 0; i < FAKE_GRAPHS; i++)
		if (!graphs[i].used) {
			graphs[i].used = 1;
			return i;
		}
	return -1;
}

static int free_hint; /* no free node slot below it */

static int new_node(const struct fake_node *n, int graph, int orig)
{
	for (int i = free_hint; i < FAKE_NODES; i++)
		if (!nodes[i].used) {
			nodes[i] = *n;
			nodes[i].used = 1;
			nodes[i].graph = graph;
			nodes[i].orig = orig;
			free_hint = i + 1;
			return i;
		}
	return -1;
}

static void free_node(int i)
{
	nodes[i].used = 0;
	if (i < free_hint)
		free_hint = i;
}

/* Destroys graph g, its nodes and its child graph nodes' copies. */
static void destroy_graph(int g)
{
	graphs[g].used = 0;
	for (int i = 0; i < FAKE_NODES; i++)
		if (nodes[i].used && nodes[i].graph == g) {
			if (nodes[i].type == CU_GRAPH_NODE_TYPE_GRAPH)
				destroy_graph(nodes[i].child);
			free_node(i);
		}
}

/* A copy of graph o (its child graphs copied too): the new slot, -1 when out of slots. Each
 * node of the copy remembers its original (orig) for cuGraphNodeFindInClone. */
static int clone_graph(int o)
{
	int c = new_graph();
	for (int i = 0; c >= 0 && i < FAKE_NODES; i++) {
		if (!nodes[i].used || nodes[i].graph != o)
			continue;
		struct fake_node n = nodes[i];
		if (n.type == CU_GRAPH_NODE_TYPE_GRAPH && (n.child = clone_graph(n.child)) < 0) {
			destroy_graph(c);
			return -1;
		}
		if (new_node(&n, c, i) < 0) {
			if (n.type == CU_GRAPH_NODE_TYPE_GRAPH)
				destroy_graph(n.child);
			destroy_graph(c);
			return -1;
		}
	}
	return c;
}

static uint64_t graph_blocks(int g)
{
	uint64_t sum = 0;
	for (int i = 0; i < FAKE_NODES; i++) {
		if (!nodes[i].used || nodes[i].graph != g)
			continue;
		if (nodes[i].type == CU_GRAPH_NODE_TYPE_KERNEL)
			sum += (uint64_t)nodes[i].grid[0] * nodes[i].grid[1] * nodes[i].grid[2];
		else if (nodes[i].type == CU_GRAPH_NODE_TYPE_GRAPH)
			sum += graph_blocks(nodes[i].child);
	}
	return sum;
}

API CUresult cuGraphCreate(CUgraph *graph, unsigned int flags)
{
	if (!fake_initialised())
		return CUDA_ERROR_NOT_INITIALIZED;
	if (graph == NULL || flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	int g = new_graph();
	if (g >= 0)
		*graph = (CUgraph)&graphs[g];
	pthread_mutex_unlock(&mu);
	return g >= 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

API CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
				    CUDA_MEM_ALLOC_NODE_PARAMS *params)
{
	(void)deps;
	(void)ndeps;
	if (!fake_initialised())
		return CUDA_ERROR_NOT_INITIALIZED;
	if (node == NULL || params == NULL || params->bytesize == 0 ||
	    params->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return CUDA_ERROR_INVALID_VALUE;
	int dev = fake_device_of(params->poolProps.location.id);
	if (dev < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&mu);
	int g = graph_slot(graph), n = -1;
	struct fake_node a = { .type = CU_GRAPH_NODE_TYPE_MEM_ALLOC, .dev = dev, .bytes = params->bytesize };
	if (g >= 0 && (n = new_node(&a, g, -1)) >= 0) {
		*node = (CUgraphNode)&nodes[n];
		params->dptr = 0x7e0000000000ull + ((uint64_t)n << 32); /* an address no allocation has */
	}
	pthread_mutex_unlock(&mu);
	return g < 0 ? CUDA_ERROR_INVALID_VALUE : n < 0 ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
}

API CUresult cuGraphDestroyNode(CUgraphNode node)
{
	pthread_mutex_lock(&mu);
	int n = node_slot(node);
	if (n >= 0) {
		if (nodes[n].type == CU_GRAPH_NODE_TYPE_GRAPH)
			destroy_graph(nodes[n].child);
		free_node(n);
	}
	pthread_mutex_unlock(&mu);
	return n >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuGraphDestroy(CUgraph graph)
{
	pthread_mutex_lock(&mu);
	int g = graph_slot(graph);
	if (g >= 0)
		destroy_graph(g);
	pthread_mutex_unlock(&mu);
	return g >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuGraphClone(CUgraph *clone, CUgraph original)
{
	if (clone == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	CUresult r = CUDA_SUCCESS;
	int o = graph_slot(original), c = o >= 0 ? clone_graph(o) : -1;
	if (o < 0)
		r = CUDA_ERROR_INVALID_VALUE;
	else if (c < 0)
		r = CUDA_ERROR_OUT_OF_MEMORY;
	else
		*clone = (CUgraph)&graphs[c];
	pthread_mutex_unlock(&mu);
	return r;
}

API CUresult cuGraphNodeFindInClone(CUgraphNode *clone_node, CUgraphNode original_node, CUgraph clone)
{
	pthread_mutex_lock(&mu);
	int o = node_slot(original_node), c = graph_slot(clone), found = -1;
	for (int i = 0; o >= 0 && c >= 0 && i < FAKE_NODES && found < 0; i++)
		if (nodes[i].used && nodes[i].graph == c && nodes[i].orig == o)
			found = i;
	if (found >= 0 && clone_node != NULL)
		*clone_node = (CUgraphNode)&nodes[found];
	pthread_mutex_unlock(&mu);
	return found >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Takes the memory of the graph's allocation nodes for a new executable. */
static CUresult instantiate(CUgraphExec *exec, CUgraph graph)
{
	if (!fake_initialised())
		return CUDA_ERROR_NOT_INITIALIZED;
	if (exec == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	int g = graph_slot(graph), e = -1;
	CUresult r = g < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_OUT_OF_MEMORY;
	for (int i = 0; g >= 0 && i < FAKE_EXECS && e < 0; i++)
		if (!execs[i].used)
			e = i;
	if (e >= 0) {
		struct fake_exec x = { 1, 0, graph_blocks(g), { 0 } };
		r = CUDA_SUCCESS;
		for (int i = 0; i < FAKE_NODES && r == CUDA_SUCCESS; i++) {
			if (!nodes[i].used || nodes[i].graph != g || nodes[i].type != CU_GRAPH_NODE_TYPE_MEM_ALLOC)
				continue;
			uint64_t key;
			if (x.n == FAKE_EXEC_ALLOCS)
				r = CUDA_ERROR_NOT_SUPPORTED; /* more than this double holds */
			else if ((r = fake_alloc_on(nodes[i].dev, nodes[i].bytes, &key, 0)) == CUDA_SUCCESS)
				x.keys[x.n++] = key;
		}
		if (r == CUDA_SUCCESS) {
			execs[e] = x;
			*exec = (CUgraphExec)&execs[e];
		} else {
			for (int k = 0; k < x.n; k++)
				fake_free_key(x.keys[k]);
		}
	}
	pthread_mutex_unlock(&mu);
	return r;
}

API CUresult cuGraphInstantiate(CUgraphExec *exec, CUgraph graph, CUgraphNode *err_node, char *log, size_t log_size)
{
	(void)err_node;
	if (log != NULL && log_size > 0)
		log[0] = '\0';
	return instantiate(exec, graph);
}

API CUresult cuGraphInstantiate_v2(CUgraphExec *exec, CUgraph graph, CUgraphNode *err_node, char *log,
				   size_t log_size)
{
	return cuGraphInstantiate(exec, graph, err_node, log, log_size);
}

API CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags)
{
	(void)flags;
	return instantiate(exec, graph);
}

API CUresult cuGraphInstantiateWithParams(CUgraphExec *exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
	if (params == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = instantiate(exec, graph);
	params->result_out = r == CUDA_SUCCESS ? 0 : 1; /* CUDA_GRAPH_INSTANTIATE_SUCCESS / _ERROR */
	params->hErrNode_out = NULL;
	return r;
}

API CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *exec, CUgraph graph,
					       CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
	return cuGraphInstantiateWithParams(exec, graph, params);
}

API CUresult cuGraphExecDestroy(CUgraphExec exec)
{
	pthread_mutex_lock(&mu);
	int e = exec_slot(exec);
	if (e >= 0) {
		for (int k = 0; k < execs[e].n; k++)
			fake_free_key(execs[e].keys[k]);
		execs[e].used = 0;
	}
	pthread_mutex_unlock(&mu);
	return e >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* --- kernel and child graph nodes, the queries of a graph, launches -------------------------- */

API CUresult cuGraphAddKernelNode_v2(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
				     const CUDA_KERNEL_NODE_PARAMS *params)
{
	(void)deps;
	(void)ndeps;
	if (node == NULL || params == NULL || params->gridDimX == 0 || params->gridDimY == 0 || params->gridDimZ == 0)
		return CUDA_ERROR_INVALID_VALUE;
	struct fake_node k = { .type = CU_GRAPH_NODE_TYPE_KERNEL, .dev = -1,
			       .grid = { params->gridDimX, params->gridDimY, params->gridDimZ } };
	pthread_mutex_lock(&mu);
	int g = graph_slot(graph), n = g >= 0 ? new_node(&k, g, -1) : -1;
	if (n >= 0)
		*node = (CUgraphNode)&nodes[n];
	pthread_mutex_unlock(&mu);
	return g < 0 ? CUDA_ERROR_INVALID_VALUE : n < 0 ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
}

/* The original layout is the _v2 one's prefix: the fake reads only the grid. */
API CUresult cuGraphAddKernelNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
				  const CUDA_KERNEL_NODE_PARAMS *params)
{
	return cuGraphAddKernelNode_v2(node, graph, deps, ndeps, params);
}

API CUresult cuGraphAddChildGraphNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
				      CUgraph child)
{
	(void)deps;
	(void)ndeps;
	if (node == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	int g = graph_slot(graph), o = graph_slot(child), n = -1;
	CUresult r = g < 0 || o < 0 || g == o ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_OUT_OF_MEMORY;
	struct fake_node c = { .type = CU_GRAPH_NODE_TYPE_GRAPH, .dev = -1 };
	if (r == CUDA_ERROR_OUT_OF_MEMORY && (c.child = clone_graph(o)) >= 0) {
		if ((n = new_node(&c, g, -1)) >= 0) {
			*node = (CUgraphNode)&nodes[n];
			r = CUDA_SUCCESS;
		} else {
			destroy_graph(c.child);
		}
	}
	pthread_mutex_unlock(&mu);
	return r;
}

API CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode node, CUgraph *graph)
{
	pthread_mutex_lock(&mu);
	int n = node_slot(node);
	int ok = n >= 0 && nodes[n].type == CU_GRAPH_NODE_TYPE_GRAPH && graph != NULL;
	if (ok)
		*graph = (CUgraph)&graphs[nodes[n].child];
	pthread_mutex_unlock(&mu);
	return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuGraphGetNodes(CUgraph graph, CUgraphNode *out, size_t *count)
{
	if (count == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	int g = graph_slot(graph);
	size_t k = 0;
	for (int i = 0; g >= 0 && i < FAKE_NODES; i++) {
		if (!nodes[i].used || nodes[i].graph != g)
			continue;
		if (out != NULL && k < *count)
			out[k] = (CUgraphNode)&nodes[i];
		k++;
	}
	/* with an array: how many it holds now (the driver's rule); without: how many there are */
	if (out == NULL || k < *count)
		*count = k;
	pthread_mutex_unlock(&mu);
	return g >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuGraphNodeGetType(CUgraphNode node, CUgraphNodeType *type)
{
	pthread_mutex_lock(&mu);
	int n = node_slot(node);
	if (n >= 0 && type != NULL)
		*type = nodes[n].type;
	pthread_mutex_unlock(&mu);
	return n >= 0 && type != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult kernel_params(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS *params, size_t size)
{
	pthread_mutex_lock(&mu);
	int n = node_slot(node);
	int ok = n >= 0 && nodes[n].type == CU_GRAPH_NODE_TYPE_KERNEL && params != NULL;
	if (ok) {
		CUDA_KERNEL_NODE_PARAMS p = { 0 };
		p.gridDimX = nodes[n].grid[0];
		p.gridDimY = nodes[n].grid[1];
		p.gridDimZ = nodes[n].grid[2];
		p.blockDimX = p.blockDimY = p.blockDimZ = 1;
		memcpy(params, &p, size); /* the original layout: the prefix only */
	}
	pthread_mutex_unlock(&mu);
	return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuGraphKernelNodeGetParams(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS *params)
{
	return kernel_params(node, params, offsetof(CUDA_KERNEL_NODE_PARAMS, kern));
}

API CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS *params)
{
	return kernel_params(node, params, sizeof(*params));
}

/* A launch of an unknown executable is refused, as the driver's is. */
static CUresult graph_launch(CUgraphExec exec)
{
	pthread_mutex_lock(&mu);
	int e = exec_slot(exec);
	uint64_t blocks = e >= 0 ? execs[e].blocks : 0;
	pthread_mutex_unlock(&mu);
	return e >= 0 ? fake_launch(blocks) : CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream)
{
	(void)stream;
	return graph_launch(exec);
}

API CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream)
{
	(void)stream;
	return graph_launch(exec);
}
