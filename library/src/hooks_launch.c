/* Kernel launch hooks: each launch passes the core-limit gate, charged its block count. */
#include "core_limiter.h"
#include "graph_account.h"
#include "hook_table.h"
#include "hooks.h"

#define REAL_OR_FAIL(var, name)                 \
	__typeof__(&name) var = REAL(name);     \
	if (var == NULL)                        \
		return CUDA_ERROR_NOT_FOUND

static inline uint64_t grid_blocks(unsigned int gx, unsigned int gy, unsigned int gz)
{
	return (uint64_t)gx * gy * gz;
}

#define LAUNCH_HOOK(name)                                                                             \
	CUresult name(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,    \
		      unsigned int by, unsigned int bz, unsigned int shmem, CUstream stream, void **params, \
		      void **extra)                                                                        \
	{                                                                                                  \
		REAL_OR_FAIL(real, name);                                                                  \
		CUresult r = vgpu_core_gate(grid_blocks(gx, gy, gz));                                      \
		if (r != CUDA_SUCCESS)                                                                     \
			return r;                                                                          \
		return real(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);                      \
	}

LAUNCH_HOOK(cuLaunchKernel)
LAUNCH_HOOK(cuLaunchKernel_ptsz)

/* The legacy launches (before CUDA 4.0, still exported): cuLaunch runs one block, the grid
 * variants width x height blocks. A width or height below 1 is refused by the driver; it is
 * charged as 1 here. */
static inline uint64_t legacy_blocks(int w, int h)
{
	return (uint64_t)(w > 0 ? w : 1) * (uint64_t)(h > 0 ? h : 1);
}

CUresult cuLaunch(CUfunction f)
{
	REAL_OR_FAIL(real, cuLaunch);
	CUresult r = vgpu_core_gate(1);
	if (r != CUDA_SUCCESS)
		return r;
	return real(f);
}

CUresult cuLaunchGrid(CUfunction f, int grid_width, int grid_height)
{
	REAL_OR_FAIL(real, cuLaunchGrid);
	CUresult r = vgpu_core_gate(legacy_blocks(grid_width, grid_height));
	if (r != CUDA_SUCCESS)
		return r;
	return real(f, grid_width, grid_height);
}

CUresult cuLaunchGridAsync(CUfunction f, int grid_width, int grid_height, CUstream stream)
{
	REAL_OR_FAIL(real, cuLaunchGridAsync);
	CUresult r = vgpu_core_gate(legacy_blocks(grid_width, grid_height));
	if (r != CUDA_SUCCESS)
		return r;
	return real(f, grid_width, grid_height, stream);
}

#define COOP_HOOK(name)                                                                               \
	CUresult name(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,    \
		      unsigned int by, unsigned int bz, unsigned int shmem, CUstream stream, void **params) \
	{                                                                                                  \
		REAL_OR_FAIL(real, name);                                                                  \
		CUresult r = vgpu_core_gate(grid_blocks(gx, gy, gz));                                      \
		if (r != CUDA_SUCCESS)                                                                     \
			return r;                                                                          \
		return real(f, gx, gy, gz, bx, by, bz, shmem, stream, params);                             \
	}

COOP_HOOK(cuLaunchCooperativeKernel)
COOP_HOOK(cuLaunchCooperativeKernel_ptsz)

#define EX_HOOK(name)                                                                                  \
	CUresult name(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)             \
	{                                                                                                  \
		REAL_OR_FAIL(real, name);                                                                  \
		uint64_t blocks = config ? grid_blocks(config->gridDimX, config->gridDimY, config->gridDimZ) : 1; \
		CUresult r = vgpu_core_gate(blocks);                                                       \
		if (r != CUDA_SUCCESS)                                                                     \
			return r;                                                                          \
		return real(config, f, params, extra);                                                     \
	}

EX_HOOK(cuLaunchKernelEx)
EX_HOOK(cuLaunchKernelEx_ptsz)

/* A graph launch costs the blocks of the executable's kernels, counted at its instantiation
 * (hooks_graph.c), at least 1; an executable never counted, VGPU_GRAPH_LAUNCH_COST. The
 * record is looked up only when a core limit may apply: with the gate open a graph launch is
 * the same relaxed load as a kernel launch. */
#define GRAPH_HOOK(name)                                                                     \
	CUresult name(CUgraphExec exec, CUstream stream)                                     \
	{                                                                                    \
		REAL_OR_FAIL(real, name);                                                    \
		int gate = atomic_load_explicit(&vgpu_rt.launch_gate, memory_order_relaxed); \
		if (__builtin_expect(gate != VGPU_GATE_OPEN, 0)) {                           \
			uint64_t blocks = vgpu_graph_launch_cost(exec, VGPU_GRAPH_LAUNCH_COST); \
			CUresult r = vgpu_core_gate(blocks);                                 \
			if (r != CUDA_SUCCESS)                                               \
				return r;                                                    \
		}                                                                            \
		return real(exec, stream);                                                   \
	}

GRAPH_HOOK(cuGraphLaunch)
GRAPH_HOOK(cuGraphLaunch_ptsz)
