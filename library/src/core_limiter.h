/* The launch hooks' gate: lets a launch through when the container's core bucket for the
 * device has tokens, waits (bounded) otherwise, and runs the controller once per period. When a
 * core limit applies it also signals a wake after an idle spell (core_wake.h) and follows a
 * change of the arbiter's allowance within VGPU_ALLOWANCE_CHECK_NS of launches (contract §16). */
#ifndef VGPU_CORE_LIMITER_H
#define VGPU_CORE_LIMITER_H

#include <stdatomic.h>
#include <stdint.h>

#include "cuda_api.h"
#include "runtime.h"

#define VGPU_CORE_CONTROL_NS 100000000ull /* controller period */
#define VGPU_GRAPH_LAUNCH_COST 1024u      /* a graph launch whose executable was never counted */
#define VGPU_ALLOWANCE_CHECK_NS 5000000ull /* the launch path looks at cores.allowance at most this often */

CUresult vgpu_core_gate_slow(uint64_t blocks, int gate);

/* Fast path: one relaxed load when no core limit applies. */
static inline CUresult vgpu_core_gate(uint64_t blocks)
{
	int gate = atomic_load_explicit(&vgpu_rt.launch_gate, memory_order_relaxed);
	if (__builtin_expect(gate == VGPU_GATE_OPEN, 1))
		return CUDA_SUCCESS;
	return vgpu_core_gate_slow(blocks, gate);
}

#endif
