/* The core limit on a shared GPU (sim_gpu.h), on the workload shapes that break limiters: one
 * large synchronous kernel per step, CUDA graphs (many kernels charged as one launch), many
 * small asynchronous kernels from 4 processes of one container, and a workload that changes
 * shape every 3 s; at limits 10, 30, 50 and 90. Per shape and limit: the error of the mean
 * GPU share over 55 s (asserted <= 2 pp), the worst 1 s window, and the settle time after a
 * change of limit or load (p99 over the run's changes). Two containers limited to 10 and 90
 * on one GPU complete fixed-size kernels in the ratio 1:9 within +-10 %.
 *
 * Asserted: the mean error of shapes (a), (b) and (c) and the 10:90 ratio. Shape (d) and
 * every settle time are printed with PASS/MISS but not asserted: they miss today (see
 * docs/performance.md) and become assertions when the controller meets them.
 * Deterministic (simulated time, fixed seeds). `test_core_shared_sim` asserts; with the
 * argument "bench" it prints the same figures as make bench-library's table. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "sim_gpu.h"
#include "test_util.h"

#define S_NS 1000000000ull
#define MS_NS 1000000ull
#define RUN_NS (60 * S_NS)
#define WARMUP_NS (5 * S_NS)
#define PHASE_NS (6 * S_NS) /* the limit changes every 6 s in the settle run */
#define SHAPE_NS (3 * S_NS) /* the changing workload changes shape every 3 s */
#define SETTLE_TOL_PP 5.0
#define GRAPH_LAUNCH_COST 1024 /* VGPU_GRAPH_LAUNCH_COST (core_limiter.h) */

static uint64_t uniform_ns(struct sim_proc *p, uint64_t lo, uint64_t hi)
{
	return lo + (uint64_t)(sim_frand(&p->rng) * (double)(hi - lo));
}

/* (a) a GEMM of 50-500 ms, then cudaDeviceSynchronize; its grid grows with its work. */
static void sync_gemm(struct sim_proc *p, uint64_t now, struct sim_launch *l)
{
	(void)now;
	uint64_t d = uniform_ns(p, 50 * MS_NS, 500 * MS_NS);
	*l = (struct sim_launch){ .blocks = d / 62500, .nkernels = 1, .kernel_ns = d, .sync = 1, .think_ns = MS_NS };
}

/* (b) a CUDA graph of 100 kernels of 100 us, then a synchronize. */
static void graph(struct sim_proc *p, uint64_t now, struct sim_launch *l)
{
	(void)p;
	(void)now;
	*l = (struct sim_launch){ .blocks = GRAPH_LAUNCH_COST, .nkernels = 100, .kernel_ns = 100000, .sync = 1,
				  .think_ns = 200000 };
}

/* (c) small asynchronous kernels of 50-350 us (one process of four). */
static void small_async(struct sim_proc *p, uint64_t now, struct sim_launch *l)
{
	(void)now;
	uint64_t d = uniform_ns(p, 50000, 350000);
	*l = (struct sim_launch){ .blocks = d / 1562 + 1, .nkernels = 1, .kernel_ns = d, .think_ns = 10000 };
}

/* 2 ms kernels, asynchronous. */
static void medium_async(struct sim_proc *p, uint64_t now, struct sim_launch *l)
{
	(void)p;
	(void)now;
	*l = (struct sim_launch){ .blocks = 256, .nkernels = 1, .kernel_ns = 2 * MS_NS, .think_ns = 10000 };
}

/* (d) small asynchronous kernels, graphs, 100 ms synchronous GEMMs and 2 ms kernels in turn,
 * 3 s each: the GPU time a block stands for changes 40-fold at each change. */
static void changing(struct sim_proc *p, uint64_t now, struct sim_launch *l)
{
	switch ((now / SHAPE_NS) % 4) {
	case 0:
		small_async(p, now, l);
		break;
	case 1:
		graph(p, now, l);
		break;
	case 2:
		*l = (struct sim_launch){ .blocks = 1600, .nkernels = 1, .kernel_ns = 100 * MS_NS, .sync = 1,
					  .think_ns = MS_NS };
		break;
	default:
		medium_async(p, now, l);
	}
}

/* A fixed-size kernel: the unit of work the 10:90 pair counts. */
static void fixed_1ms(struct sim_proc *p, uint64_t now, struct sim_launch *l)
{
	(void)p;
	(void)now;
	*l = (struct sim_launch){ .blocks = 128, .nkernels = 1, .kernel_ns = MS_NS, .think_ns = 10000 };
}

struct shape {
	const char *name;
	sim_workload_fn workload;
	int nprocs;
	int load_changes; /* the workload changes shape every SHAPE_NS */
	int asserted;     /* the mean error is asserted (the others are reported, still MISS) */
};

static const struct shape shapes[] = {
	{ "(a) sync GEMM 50-500 ms", sync_gemm, 1, 0, 1 },
	{ "(b) CUDA graph, 100 kernels", graph, 1, 0, 1 },
	{ "(c) 4 processes, small async", small_async, 4, 0, 1 },
	{ "(d) shape changes every 3 s", changing, 1, 1, 0 },
};
static const int targets[] = { 10, 30, 50, 90 };

static struct sim_gpu gpu; /* 1 MB of busy bins: static */

static void setup(const struct shape *s, int target, uint64_t seed)
{
	sim_gpu_init(&gpu, 1, &target);
	for (int i = 0; i < s->nprocs; i++)
		sim_gpu_add_proc(&gpu, 0, s->workload, 0, seed + 7919u * (uint64_t)i);
}

struct figures {
	double mean_err, worst_1s, settle_p99_ms;
	int settle_events;
};

static void accuracy(const struct shape *s, int target, struct figures *f)
{
	setup(s, target, 0x9e3779b97f4a7c15ull);
	sim_gpu_run(&gpu, RUN_NS);
	f->mean_err = fabs(sim_util(&gpu, 0, WARMUP_NS, RUN_NS) - target);
	f->worst_1s = 0;
	for (uint64_t t = WARMUP_NS; t + S_NS <= RUN_NS; t += 100 * MS_NS) {
		double e = fabs(sim_util(&gpu, 0, t, t + S_NS) - target);
		if (e > f->worst_1s)
			f->worst_1s = e;
	}
}

/* The window a share is judged on after a change: 250 ms, or two kernel cycles at the limit
 * where one kernel is longer (a 100 ms kernel at 10 % runs once a second). */
static uint64_t judge_window(const struct shape *s, int target, uint64_t t0)
{
	uint64_t longest = 0;
	if (s->workload == sync_gemm)
		longest = 500 * MS_NS;
	else if (s->workload == changing && (t0 / SHAPE_NS) % 4 == 2)
		longest = 100 * MS_NS;
	uint64_t w = 2 * longest * 100 / (uint64_t)target;
	return w > 250 * MS_NS ? w : 250 * MS_NS;
}

/* Time from t0 until every window of the phase [t0, t1) starting later is within the
 * tolerance of target; the whole phase when it never settles. */
static uint64_t settle_ns(const struct shape *s, int target, uint64_t t0, uint64_t t1)
{
	uint64_t w = judge_window(s, target, t0);
	uint64_t settled = t1 - t0;
	for (uint64_t t = t0; t + w <= t1; t += 10 * MS_NS) {
		int ok = fabs(sim_util(&gpu, 0, t, t + w) - target) <= SETTLE_TOL_PP;
		if (!ok)
			settled = t1 - t0;
		else if (settled == t1 - t0)
			settled = t - t0;
	}
	return settled;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* The limit alternates between target and another every PHASE_NS; the changing workload also
 * changes shape in between: each change is an event. */
static void settle(const struct shape *s, int target, struct figures *f)
{
	int other = target <= 50 ? target + 40 : target - 40;
	uint64_t step = s->load_changes ? SHAPE_NS : PHASE_NS;
	uint64_t events[64];
	int n = 0;
	setup(s, target, 0x2545f4914f6cdd1dull);
	for (uint64_t t0 = 0; t0 < RUN_NS; t0 += step) {
		int phase_target = (t0 / PHASE_NS) % 2 ? other : target;
		gpu.ctr[0].target_pct = phase_target;
		sim_gpu_run(&gpu, t0 + step);
		if (t0 >= WARMUP_NS)
			events[n++] = settle_ns(s, phase_target, t0, t0 + step);
	}
	qsort(events, (size_t)n, sizeof(events[0]), cmp_u64);
	int at = (int)ceil(0.99 * n) - 1;
	f->settle_p99_ms = (double)events[at] / 1e6;
	f->settle_events = n;
}

/* Two containers limited to 10 and 90, each saturating with fixed 1 ms kernels: the ratio of
 * the kernels they completed after warm-up. */
static double pair_ratio(double *low_pct, double *high_pct)
{
	const int t[] = { 10, 90 };
	sim_gpu_init(&gpu, 2, t);
	struct sim_proc *lo = sim_gpu_add_proc(&gpu, 0, fixed_1ms, 0, 11);
	struct sim_proc *hi = sim_gpu_add_proc(&gpu, 1, fixed_1ms, 0, 13);
	sim_gpu_run(&gpu, WARMUP_NS);
	uint64_t lo0 = lo->completed, hi0 = hi->completed;
	sim_gpu_run(&gpu, RUN_NS);
	*low_pct = sim_util(&gpu, 0, WARMUP_NS, RUN_NS);
	*high_pct = sim_util(&gpu, 1, WARMUP_NS, RUN_NS);
	return (double)(hi->completed - hi0) / (double)(lo->completed - lo0);
}

static const char *verdict(int ok)
{
	return ok ? "PASS" : "MISS";
}

int main(int argc, char **argv)
{
	int bench = argc == 2 && strcmp(argv[1], "bench") == 0;
	printf("core limit on a shared GPU (simulation: %llu ms time slices, NVML samples every %.0f ms read "
	       "%llu ms late, 60 s per run)\n",
	       SIM_TIMESLICE_NS / MS_NS, (double)SIM_NVML_PERIOD_NS / 1e6, SIM_NVML_DELAY_NS / MS_NS);
	printf("%-32s %6s %12s %12s %14s %6s\n", "shape", "limit", "mean err pp", "worst 1 s pp", "settle p99 ms",
	       "");
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		for (size_t t = 0; t < sizeof(targets) / sizeof(targets[0]); t++) {
			struct figures f;
			accuracy(&shapes[s], targets[t], &f);
			settle(&shapes[s], targets[t], &f);
			int ok_err = f.mean_err <= 2.0, ok_settle = f.settle_p99_ms <= 300;
			printf("%-32s %5d%% %8.2f %4s %12.1f %9.0f %4s (%d changes)\n", shapes[s].name, targets[t],
			       f.mean_err, verdict(ok_err), f.worst_1s, f.settle_p99_ms, verdict(ok_settle),
			       f.settle_events);
			if (!bench && shapes[s].asserted) {
				CHECK(ok_err, "%s at %d%%: mean error %.2f pp > 2 pp", shapes[s].name, targets[t],
				      f.mean_err);
			}
		}
	}
	double lo, hi;
	double ratio = pair_ratio(&lo, &hi);
	int ok_ratio = ratio >= 9 * 0.9 && ratio <= 9 * 1.1;
	printf("two containers at 10%% and 90%%: GPU share %.1f%% / %.1f%%, completed 1 ms kernels 1:%.2f "
	       "(target 1:9 +-10 %%) %s\n",
	       lo, hi, ratio, verdict(ok_ratio));
	if (!bench)
		CHECK(ok_ratio, "10:90 pair completed 1:%.2f, want 1:8.1-9.9", ratio);
	return bench ? 0 : test_finish("core_shared_sim");
}
