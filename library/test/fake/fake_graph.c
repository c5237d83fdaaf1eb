/* TEST DOUBLE: CUDA graphs with memory allocation nodes, as far as their memory goes. A node
 * holds no memory of its own; instantiating a graph takes its allocation nodes' memory on
 * their devices, and it stays taken until the executable graph is destroyed, like the
 * driver's graph memory pool (launches and free nodes do not give it back to the device).
 * Handles are slots of fixed tables, the lowest free one handed out first: a destroyed
 * graph's or node's handle comes back for the next one, as a driver may hand it out again. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "fake_cuda.h"

#define FAKE_GRAPHS 64
#define FAKE_NODES 256
#define FAKE_EXECS 64
#define FAKE_EXEC_ALLOCS 16

struct fake_graph { int used; };
struct fake_node { int used, graph, dev, orig; uint64_t bytes; };
struct fake_exec { int used, n; uint64_t keys[FAKE_EXEC_ALLOCS]; };

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

static int new_node(int graph, int dev, uint64_t bytes, int orig)
{
	for (int i = 0; i < FAKE_NODES; i++)
		if (!nodes[i].used) {
			nodes[i] = (struct fake_node){ 1, graph, dev, orig, bytes };
			return i;
		}
	return -1;
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
	if (g >= 0 && (n = new_node(g, dev, params->bytesize, -1)) >= 0) {
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
	if (n >= 0)
		nodes[n].used = 0;
	pthread_mutex_unlock(&mu);
	return n >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuGraphDestroy(CUgraph graph)
{
	pthread_mutex_lock(&mu);
	int g = graph_slot(graph);
	if (g >= 0) {
		graphs[g].used = 0;
		for (int i = 0; i < FAKE_NODES; i++)
			if (nodes[i].used && nodes[i].graph == g)
				nodes[i].used = 0;
	}
	pthread_mutex_unlock(&mu);
	return g >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuGraphClone(CUgraph *clone, CUgraph original)
{
	if (clone == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	CUresult r = CUDA_SUCCESS;
	int o = graph_slot(original), c = o >= 0 ? new_graph() : -1;
	if (o < 0)
		r = CUDA_ERROR_INVALID_VALUE;
	else if (c < 0)
		r = CUDA_ERROR_OUT_OF_MEMORY;
	for (int i = 0; r == CUDA_SUCCESS && i < FAKE_NODES; i++)
		if (nodes[i].used && nodes[i].graph == o && new_node(c, nodes[i].dev, nodes[i].bytes, i) < 0)
			r = CUDA_ERROR_OUT_OF_MEMORY;
	if (r == CUDA_SUCCESS) {
		*clone = (CUgraph)&graphs[c];
	} else if (c >= 0) {
		graphs[c].used = 0;
		for (int i = 0; i < FAKE_NODES; i++)
			if (nodes[i].used && nodes[i].graph == c)
				nodes[i].used = 0;
	}
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
		struct fake_exec x = { 1, 0, { 0 } };
		r = CUDA_SUCCESS;
		for (int i = 0; i < FAKE_NODES && r == CUDA_SUCCESS; i++) {
			if (!nodes[i].used || nodes[i].graph != g)
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
