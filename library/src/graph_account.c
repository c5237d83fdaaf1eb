#include "graph_account.h"

#include <stdlib.h>
#include <string.h>

#include "spinlock.h"

/* Unordered arrays, searched linearly: a process holds few graphs and executables. Nodes and
 * charges are read only by a graph's construction, instantiation and destruction; the costs
 * by graph launches too, and only when a core limit applies (hooks_launch.c). */
static struct vgpu_graph_node *nodes;
static size_t nnodes, capnodes;
static struct vgpu_graph_exec *execs;
static size_t nexecs, capexecs;
struct graph_cost {
	CUgraphExec exec;
	uint64_t blocks;
};
static struct graph_cost *costs;
static size_t ncosts, capcosts;
static vgpu_spinlock lock = VGPU_SPINLOCK_INIT;

static int reserve(void **arr, size_t *cap, size_t n, size_t size)
{
	if (n < *cap)
		return 0;
	size_t ncap = *cap ? *cap * 2 : 64;
	void *p = realloc(*arr, ncap * size);
	if (p == NULL)
		return -1;
	*arr = p;
	*cap = ncap;
	return 0;
}

int vgpu_graph_node_add(const struct vgpu_graph_node *n)
{
	int rc = 0;
	vgpu_spin_lock(&lock);
	if (reserve((void **)&nodes, &capnodes, nnodes, sizeof(*nodes)) != 0)
		rc = -1;
	else
		nodes[nnodes++] = *n;
	vgpu_spin_unlock(&lock);
	return rc;
}

int vgpu_graph_node_take(CUgraphNode node, struct vgpu_graph_node *out)
{
	int found = 0;
	vgpu_spin_lock(&lock);
	for (size_t i = 0; i < nnodes; i++) {
		if (nodes[i].node == node && node != NULL) {
			*out = nodes[i];
			nodes[i] = nodes[--nnodes];
			found = 1;
			break;
		}
	}
	vgpu_spin_unlock(&lock);
	return found;
}

static long collect(CUgraph graph, struct vgpu_graph_node **out, int take)
{
	*out = NULL;
	vgpu_spin_lock(&lock);
	size_t n = 0;
	for (size_t i = 0; i < nnodes; i++)
		n += nodes[i].graph == graph;
	if (n == 0) {
		vgpu_spin_unlock(&lock);
		return 0;
	}
	struct vgpu_graph_node *copy = malloc(n * sizeof(*copy));
	if (copy == NULL) {
		vgpu_spin_unlock(&lock);
		return -1;
	}
	size_t k = 0;
	for (size_t i = 0; i < nnodes;) {
		if (nodes[i].graph != graph) {
			i++;
			continue;
		}
		copy[k++] = nodes[i];
		if (take)
			nodes[i] = nodes[--nnodes]; /* look at i again: it holds the last record now */
		else
			i++;
	}
	vgpu_spin_unlock(&lock);
	*out = copy;
	return (long)n;
}

long vgpu_graph_take_all(CUgraph graph, struct vgpu_graph_node **out)
{
	return collect(graph, out, 1);
}

long vgpu_graph_copy_all(CUgraph graph, struct vgpu_graph_node **out)
{
	return collect(graph, out, 0);
}

int vgpu_graph_bytes(CUgraph graph, int *ordinals, uint64_t *bytes, int max)
{
	int n = 0;
	vgpu_spin_lock(&lock);
	for (size_t i = 0; i < nnodes && n >= 0; i++) {
		if (nodes[i].graph != graph || nodes[i].bytes == 0)
			continue;
		int k = 0;
		while (k < n && ordinals[k] != nodes[i].ordinal)
			k++;
		if (k == n) {
			if (n == max) {
				n = -1;
				break;
			}
			ordinals[n] = nodes[i].ordinal;
			bytes[n++] = 0;
		}
		bytes[k] = bytes[k] > UINT64_MAX - nodes[i].bytes ? UINT64_MAX : bytes[k] + nodes[i].bytes;
	}
	vgpu_spin_unlock(&lock);
	return n;
}

int vgpu_graph_exec_add(const struct vgpu_graph_exec *e)
{
	int rc = 0;
	vgpu_spin_lock(&lock);
	if (reserve((void **)&execs, &capexecs, nexecs, sizeof(*execs)) != 0)
		rc = -1;
	else
		execs[nexecs++] = *e;
	vgpu_spin_unlock(&lock);
	return rc;
}

int vgpu_graph_exec_take(CUgraphExec exec, struct vgpu_graph_exec *out, int max)
{
	int n = 0;
	vgpu_spin_lock(&lock);
	for (size_t i = 0; i < nexecs && n < max;) {
		if (execs[i].exec != exec) {
			i++;
			continue;
		}
		out[n++] = execs[i];
		execs[i] = execs[--nexecs];
	}
	vgpu_spin_unlock(&lock);
	return n;
}

int vgpu_graph_cost_set(CUgraphExec exec, uint64_t blocks)
{
	int rc = 0;
	vgpu_spin_lock(&lock);
	size_t i = 0;
	while (i < ncosts && costs[i].exec != exec)
		i++;
	if (i == ncosts && reserve((void **)&costs, &capcosts, ncosts, sizeof(*costs)) != 0)
		rc = -1;
	else if (i == ncosts)
		ncosts++;
	if (rc == 0)
		costs[i] = (struct graph_cost){ exec, blocks };
	vgpu_spin_unlock(&lock);
	return rc;
}

uint64_t vgpu_graph_launch_cost(CUgraphExec exec, uint64_t fallback)
{
	uint64_t blocks = fallback;
	vgpu_spin_lock(&lock);
	for (size_t i = 0; i < ncosts; i++) {
		if (costs[i].exec == exec) {
			blocks = costs[i].blocks == 0 ? 1 : costs[i].blocks;
			break;
		}
	}
	vgpu_spin_unlock(&lock);
	return blocks;
}

void vgpu_graph_cost_forget(CUgraphExec exec)
{
	vgpu_spin_lock(&lock);
	for (size_t i = 0; i < ncosts; i++) {
		if (costs[i].exec == exec) {
			costs[i] = costs[--ncosts];
			break;
		}
	}
	vgpu_spin_unlock(&lock);
}

void vgpu_graph_reset(void)
{
	vgpu_spin_reset(&lock);
	nnodes = 0;
	nexecs = 0;
	ncosts = 0;
}
