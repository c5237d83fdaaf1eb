/* CUDA graphs' memory allocation nodes (cuGraphAddMemAllocNode): the driver takes their
 * memory for the executable graph, at instantiation or first launch, and keeps it in the
 * device's graph memory pool across launches (a free node hands it back to that pool, not to
 * the device) until the executable is destroyed. So the charge belongs to the executable:
 *
 *  - the graph's allocation nodes are recorded as they are added (their bytes and device),
 *    copied with cuGraphClone (each clone's node found with cuGraphNodeFindInClone) and
 *    forgotten with cuGraphDestroyNode and cuGraphDestroy (graph_account.h);
 *  - every instantiation reserves the bytes of the graph's nodes per device before the driver
 *    is called, refused with CUDA_ERROR_OUT_OF_MEMORY past the memory limit;
 *  - cuGraphExecDestroy gives them back once the driver destroyed the executable.
 *
 * cuDeviceGraphMemTrim gives nothing back: it returns only memory no live executable needs,
 * and each live executable keeps its charge because its next launch takes its memory again.
 * Physical memory the driver shares between the executables of different graphs is charged
 * to each: an upper bound. Memory a graph allocates and does not free stays
 * allocated after cuGraphExecDestroy; from then on only the NVML reconciliation sees it.
 *
 * Each successful instantiation also counts the blocks of the graph's kernels, walking the
 * graph and its child graphs with the driver's queries (graph_blocks.h); every launch of the
 * executable is charged them (hooks_launch.c) until cuGraphExecDestroy forgets them. An
 * executable instantiated by a route the library does not see, or whose walk failed, is
 * charged VGPU_GRAPH_LAUNCH_COST. Known limit: cuGraphExecKernelNodeSetParams,
 * cuGraphExecUpdate and cuGraphExecChildGraphNodeSetParams change an executable's grids
 * without a new count; the executable keeps the count of the graph it was instantiated from. */
#include <stdlib.h>

#include "core_limiter.h"
#include "graph_account.h"
#include "graph_blocks.h"
#include "hook_table.h"
#include "hooks.h"
#include "log.h"
#include "mem_account.h"

#define REAL_OR_FAIL(var, name)                 \
	__typeof__(&name) var = REAL(name);     \
	if (var == NULL)                        \
		return CUDA_ERROR_NOT_FOUND

#define GRAPH_MAX_DEVICES 64

CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
				CUDA_MEM_ALLOC_NODE_PARAMS *params)
{
	REAL_OR_FAIL(real, cuGraphAddMemAllocNode);
	CUresult r = real(node, graph, deps, ndeps, params);
	if (r != CUDA_SUCCESS || node == NULL || params == NULL)
		return r;
	struct vgpu_graph_node n = {
		.graph = graph,
		.node = *node,
		.ordinal = params->poolProps.location.type == CU_MEM_LOCATION_TYPE_DEVICE ? params->poolProps.location.id
											  : -1,
		.bytes = params->bytesize,
	};
	if (vgpu_graph_node_add(&n) == 0)
		return r;
	/* unrecorded, the node's memory would escape the limit: take it out again */
	__typeof__(&cuGraphDestroyNode) destroy = REAL(cuGraphDestroyNode);
	if (destroy == NULL || destroy(*node) != CUDA_SUCCESS)
		vgpu_log_error("out of memory recording a graph's allocation node of %llu bytes: it is not counted",
			       (unsigned long long)n.bytes);
	return CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuGraphDestroyNode(CUgraphNode node)
{
	REAL_OR_FAIL(real, cuGraphDestroyNode);
	struct vgpu_graph_node n;
	int ours = vgpu_graph_node_take(node, &n);
	CUresult r = real(node);
	if (ours && r != CUDA_SUCCESS && vgpu_graph_node_add(&n) != 0)
		vgpu_log_error("out of memory keeping a graph's allocation node: it is not counted");
	return r;
}

CUresult cuGraphDestroy(CUgraph graph)
{
	REAL_OR_FAIL(real, cuGraphDestroy);
	struct vgpu_graph_node *taken;
	long n = vgpu_graph_take_all(graph, &taken);
	CUresult r = real(graph);
	if (r != CUDA_SUCCESS)
		for (long i = 0; i < n; i++)
			if (vgpu_graph_node_add(&taken[i]) != 0)
				vgpu_log_error("out of memory keeping a graph's allocation node: it is not counted");
	free(taken);
	return r;
}

CUresult cuGraphClone(CUgraph *clone, CUgraph original)
{
	REAL_OR_FAIL(real, cuGraphClone);
	CUresult r = real(clone, original);
	if (r != CUDA_SUCCESS || clone == NULL)
		return r;
	struct vgpu_graph_node *orig;
	long n = vgpu_graph_copy_all(original, &orig);
	__typeof__(&cuGraphNodeFindInClone) find = USED(cuGraphNodeFindInClone);
	int failed = n < 0;
	for (long i = 0; i < n && !failed; i++) {
		struct vgpu_graph_node c = orig[i];
		c.graph = *clone;
		if (find == NULL || find(&c.node, orig[i].node, *clone) != CUDA_SUCCESS)
			c.node = NULL; /* still charged with the clone; only cuGraphDestroy forgets it */
		failed = vgpu_graph_node_add(&c) != 0;
	}
	free(orig);
	if (!failed)
		return r;
	/* a clone whose nodes are not all recorded would escape the limit */
	__typeof__(&cuGraphDestroy) destroy = REAL(cuGraphDestroy);
	struct vgpu_graph_node *partial;
	long k = vgpu_graph_take_all(*clone, &partial);
	free(partial);
	if (k < 0 || destroy == NULL || destroy(*clone) != CUDA_SUCCESS)
		vgpu_log_error("out of memory recording a graph clone's allocation nodes: they are not all counted");
	return CUDA_ERROR_OUT_OF_MEMORY;
}

/* --- instantiation: the graph's allocation nodes are charged to the executable -------------- */

struct graph_charge {
	int n;
	struct vgpu_mem_op op[GRAPH_MAX_DEVICES];
};

static CUresult charge_begin(CUgraph graph, struct graph_charge *c)
{
	int ordinals[GRAPH_MAX_DEVICES];
	uint64_t bytes[GRAPH_MAX_DEVICES];
	c->n = 0;
	int n = vgpu_graph_bytes(graph, ordinals, bytes, GRAPH_MAX_DEVICES);
	if (n < 0)
		return CUDA_ERROR_OUT_OF_MEMORY; /* more devices than any machine holds */
	for (int i = 0; i < n; i++) {
		CUresult r = vgpu_mem_reserve(ordinals[i], bytes[i], &c->op[i]);
		if (r != CUDA_SUCCESS) {
			for (int j = 0; j < i; j++)
				vgpu_mem_commit(&c->op[j], r, VGPU_ALLOC_PTR, 0); /* gives each back */
			return r;
		}
		c->n = i + 1;
	}
	return CUDA_SUCCESS;
}

static void charge_end(const struct graph_charge *c, CUresult r, CUgraphExec *exec)
{
	for (int i = 0; i < c->n; i++) {
		const struct vgpu_mem_op *op = &c->op[i];
		if (r != CUDA_SUCCESS || exec == NULL) {
			vgpu_mem_commit(op, CUDA_ERROR_UNKNOWN, VGPU_ALLOC_PTR, 0);
			continue;
		}
		struct vgpu_graph_exec e = { .exec = *exec, .index = op->index, .bytes = op->reserved };
		if (op->index >= 0 && vgpu_graph_exec_add(&e) != 0)
			vgpu_log_error("out of memory recording a graph's charge: its %llu bytes stay counted until exit",
				       (unsigned long long)op->reserved);
	}
}

static CUresult kernel_params(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS *params)
{
	/* the _v2 layout from CUDA 12.0; an older driver's original one fills its prefix */
	__typeof__(&cuGraphKernelNodeGetParams_v2) v2 = USED(cuGraphKernelNodeGetParams_v2);
	if (v2 != NULL)
		return v2(node, params);
	__typeof__(&cuGraphKernelNodeGetParams) v1 = USED(cuGraphKernelNodeGetParams);
	return v1 != NULL ? v1(node, params) : CUDA_ERROR_NOT_FOUND;
}

/* The launch cost of a new executable: its graph's blocks, or nothing known (the fallback). */
static void count_blocks(CUresult r, CUgraph graph, CUgraphExec *exec)
{
	if (r != CUDA_SUCCESS || exec == NULL)
		return;
	struct vgpu_graph_queries q = {
		.get_nodes = USED(cuGraphGetNodes),
		.node_type = USED(cuGraphNodeGetType),
		.kernel_params = kernel_params,
		.child_graph = USED(cuGraphChildGraphNodeGetGraph),
	};
	uint64_t blocks;
	if (vgpu_graph_count_blocks(&q, graph, &blocks) == 0 && vgpu_graph_cost_set(*exec, blocks) == 0)
		return;
	vgpu_log_debug("could not count a graph's kernels: its launches cost %u blocks", VGPU_GRAPH_LAUNCH_COST);
	vgpu_graph_cost_forget(*exec); /* what a handle handed out again had is not this graph's */
}

#define INSTANTIATE_HOOK(name, args, ...)                  \
	CUresult name args                                 \
	{                                                  \
		REAL_OR_FAIL(real, name);                  \
		struct graph_charge c;                     \
		CUresult r = charge_begin(graph, &c);      \
		if (r != CUDA_SUCCESS)                     \
			return r;                          \
		r = real(__VA_ARGS__);                     \
		charge_end(&c, r, exec);                   \
		count_blocks(r, graph, exec);              \
		return r;                                  \
	}

INSTANTIATE_HOOK(cuGraphInstantiate,
		 (CUgraphExec * exec, CUgraph graph, CUgraphNode *err_node, char *log, size_t log_size), exec, graph,
		 err_node, log, log_size)
INSTANTIATE_HOOK(cuGraphInstantiate_v2,
		 (CUgraphExec * exec, CUgraph graph, CUgraphNode *err_node, char *log, size_t log_size), exec, graph,
		 err_node, log, log_size)
INSTANTIATE_HOOK(cuGraphInstantiateWithFlags, (CUgraphExec * exec, CUgraph graph, unsigned long long flags), exec,
		 graph, flags)
INSTANTIATE_HOOK(cuGraphInstantiateWithParams,
		 (CUgraphExec * exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS *params), exec, graph, params)
INSTANTIATE_HOOK(cuGraphInstantiateWithParams_ptsz,
		 (CUgraphExec * exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS *params), exec, graph, params)

CUresult cuGraphExecDestroy(CUgraphExec exec)
{
	REAL_OR_FAIL(real, cuGraphExecDestroy);
	struct vgpu_graph_exec held[GRAPH_MAX_DEVICES];
	int n = vgpu_graph_exec_take(exec, held, GRAPH_MAX_DEVICES);
	CUresult r = real(exec);
	if (r == CUDA_SUCCESS)
		vgpu_graph_cost_forget(exec);
	for (int i = 0; i < n; i++) {
		if (r == CUDA_SUCCESS)
			vgpu_mem_credit(held[i].index, held[i].bytes);
		else if (vgpu_graph_exec_add(&held[i]) != 0)
			vgpu_log_error("out of memory keeping a graph's charge: its %llu bytes stay counted until exit",
				       (unsigned long long)held[i].bytes);
	}
	return r;
}
