/* A simulated GPU shared by several containers, for closed-loop tests of the core limit.
 *
 * The GPU runs one context (process) at a time: the driver time-slices between the contexts
 * that have work (round robin, SIM_TIMESLICE_NS each), and a context runs its queued kernels
 * in order. Each container's processes queue kernels through the real bucket and controller
 * (core_bucket.c), elected and windowed as core_limiter.c does, held at most
 * core_bucket_max_wait_ns. NVML is modelled as the driver reports process utilisation: every
 * SIM_NVML_PERIOD_NS one sample per process that ran (its busy share of the window, whole
 * percent), readable SIM_NVML_DELAY_NS after the window ends, returned by "newer than
 * lastSeenTimeStamp" and summed per container as nvml_usage.c does.
 *
 * Simulated time on a fixed tick, seeded random numbers: every run is deterministic. */
#ifndef VGPU_SIM_GPU_H
#define VGPU_SIM_GPU_H

#include <stdint.h>

#include "../src/core_bucket.h"

#define SIM_TICK_NS 10000ull             /* the GPU advances in 10 us steps */
#define SIM_TIMESLICE_NS 2000000ull      /* driver time slice between contexts */
#define SIM_NVML_PERIOD_NS 166666667ull  /* process utilisation sampling period (1/6 s) */
#define SIM_NVML_DELAY_NS 50000000ull    /* a sample is readable this long after its window */
#define SIM_CONTROL_NS 100000000ull      /* VGPU_CORE_CONTROL_NS */
#define SIM_LAUNCH_CPU_NS 5000ull        /* CPU time of one launch call */
#define SIM_BIN_NS 1000000ull            /* busy time is recorded in 1 ms bins */
#define SIM_MAX_SECONDS 62
#define SIM_NBINS (SIM_MAX_SECONDS * 1000)
#define SIM_MAX_PROCS 8
#define SIM_MAX_CONTAINERS 2
#define SIM_QUEUE 256                    /* kernels a context may have queued */

/* What a process launches next: n kernels of dur_ns each, charged blocks as one launch (a
 * graph is many kernels charged once), then synchronize or not. */
struct sim_launch {
	uint64_t blocks;
	int nkernels;
	uint64_t kernel_ns;
	int sync;
	uint64_t think_ns; /* CPU time before the next launch */
};

struct sim_proc;
typedef void (*sim_workload_fn)(struct sim_proc *p, uint64_t now_ns, struct sim_launch *next);

struct sim_proc {
	int container;
	unsigned int pid;
	sim_workload_fn workload;
	uint64_t rng;
	int arg; /* the workload's parameter */
	/* simulator state */
	uint64_t queue[SIM_QUEUE]; /* remaining ns of each queued kernel */
	int qhead, qlen;
	uint64_t next_ns;       /* when the process acts next; UINT64_MAX: waits for the GPU */
	int syncing, have_next;
	struct sim_launch next;
	uint64_t held_since_ns; /* 0, or when the pending launch was first refused */
	uint64_t completed;     /* kernels finished */
	uint64_t window_busy_ns;
};

struct sim_container {
	struct core_bucket bucket;
	int target_pct;
	int rate_target;       /* the target the rate was set for (core_file.h's rate_target) */
	uint64_t last_seen_us; /* what core_limiter.c keeps in the bucket */
	uint64_t period_us;    /* the NVML sampling period nvml_usage.c learnt */
	struct core_quiet quiet; /* core_limiter.c's per-process view of a never-measured bucket */
	double busy[SIM_NBINS]; /* ns of GPU time per 1 ms bin */
};

struct sim_sample {
	unsigned int pid;
	unsigned int sm_util;
	uint64_t ts_us;
};

#define SIM_SAMPLES 4096

struct sim_gpu {
	uint64_t now_ns;
	int nprocs, ncontainers;
	struct sim_proc proc[SIM_MAX_PROCS];
	struct sim_container ctr[SIM_MAX_CONTAINERS];
	int running;            /* process whose context holds the GPU, -1 none */
	uint64_t slice_left_ns;
	uint64_t next_window_ns;
	struct sim_sample samples[SIM_SAMPLES];
	uint64_t nsamples;
};

double sim_frand(uint64_t *rng);

/* A fresh GPU at time 0; containers with their core limits. */
void sim_gpu_init(struct sim_gpu *g, int ncontainers, const int *target_pct);
/* Adds a process of container c running workload (returns it for the workload's state). */
struct sim_proc *sim_gpu_add_proc(struct sim_gpu *g, int c, sim_workload_fn workload, int arg, uint64_t seed);
/* Runs until until_ns. The caller may change targets or workloads between calls. */
void sim_gpu_run(struct sim_gpu *g, uint64_t until_ns);

/* Container c's GPU share (percent) over [from, to). */
double sim_util(const struct sim_gpu *g, int c, uint64_t from_ns, uint64_t to_ns);

#endif
