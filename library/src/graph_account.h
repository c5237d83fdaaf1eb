/* The memory of CUDA graphs' allocation nodes: a record of every graph's allocation nodes
 * (graph, node, device, bytes), kept as the application adds, clones and destroys them, and
 * of what each executable graph was charged when it was instantiated (hooks_graph.c), and
 * the blocks each executable's launch is charged to the core limiter. */
#ifndef VGPU_GRAPH_ACCOUNT_H
#define VGPU_GRAPH_ACCOUNT_H

#include <stddef.h>
#include <stdint.h>

#include "cuda_api.h"

struct vgpu_graph_node {
	CUgraph graph;
	CUgraphNode node; /* NULL: a clone's node the driver could not name (kept until the graph goes) */
	int ordinal;      /* the CUDA ordinal of the node's memory, -1: the current context's */
	uint64_t bytes;
};

struct vgpu_graph_exec {
	CUgraphExec exec;
	int index; /* the config position the bytes are accounted on */
	uint64_t bytes;
};

/* Records a node. -1 when out of memory. */
int vgpu_graph_node_add(const struct vgpu_graph_node *n);
/* Takes the record of node out: 1 and the record if there was one. */
int vgpu_graph_node_take(CUgraphNode node, struct vgpu_graph_node *out);
/* Takes every node record of graph out: their count, the records in a malloc'ed *out (NULL
 * when none, or -1 and nothing taken when out of memory). */
long vgpu_graph_take_all(CUgraph graph, struct vgpu_graph_node **out);
/* Copies the node records of graph, as vgpu_graph_take_all without taking them out. */
long vgpu_graph_copy_all(CUgraph graph, struct vgpu_graph_node **out);
/* The bytes of graph's nodes per ordinal, up to max ordinals: their count, -1 past max. */
int vgpu_graph_bytes(CUgraph graph, int *ordinals, uint64_t *bytes, int max);

/* Records an executable graph's charge on one config position. -1 when out of memory. */
int vgpu_graph_exec_add(const struct vgpu_graph_exec *e);
/* Takes the charges of exec out, up to max: their count. */
int vgpu_graph_exec_take(CUgraphExec exec, struct vgpu_graph_exec *out, int max);

/* The core-limit cost of an executable graph's launch, in blocks (graph_blocks.h), recorded
 * at its instantiation. Set replaces what a handle the driver hands out again had: -1 when
 * out of memory (the executable then stays unknown). */
int vgpu_graph_cost_set(CUgraphExec exec, uint64_t blocks);
/* What a launch of exec costs: its recorded blocks, at least 1; fallback when it is unknown. */
uint64_t vgpu_graph_launch_cost(CUgraphExec exec, uint64_t fallback);
void vgpu_graph_cost_forget(CUgraphExec exec);

/* Forked child: the parent's graphs are not the child's. */
void vgpu_graph_reset(void);

#endif
