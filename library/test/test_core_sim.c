/* Closed-loop simulation of the core limit: the real bucket and controller (core_bucket.c)
 * against a simulated GPU that runs kernels one after another, measured the way NVML
 * reports process utilisation (busy share of each sampling window). Simulated time, fixed
 * seeds: deterministic, so the accuracy figure can be asserted (mean error <= 2 pp). */
#include <math.h>
#include <stdint.h>

#include "../src/core_bucket.h"
#include "test_util.h"

#define SIM_SECONDS 60
#define WARMUP_SECONDS 5
#define BIN_NS 1000000ull /* 1 ms bins of busy time */
#define NBINS (SIM_SECONDS * 1000 + 1000)
#define MAX_PROCS 4
#define QUEUE_DEPTH 8
#define CONTROL_NS 100000000ull

struct sim_proc {
	uint64_t next_try;
	uint64_t dur_ns, blocks; /* mean kernel */
	double jitter;           /* kernel size varies by +-jitter */
	uint64_t pending_end[QUEUE_DEPTH];
	int npending;
};

static double busy[NBINS];
static uint64_t rng = 88172645463325252ull;
static double frand(void)
{
	rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
	return (double)(rng >> 11) / 9007199254740992.0;
}

static void add_busy(uint64_t s, uint64_t e)
{
	while (s < e) {
		uint64_t bin = s / BIN_NS;
		uint64_t bin_end = (bin + 1) * BIN_NS;
		uint64_t seg_end = e < bin_end ? e : bin_end;
		if (bin < NBINS)
			busy[bin] += (double)(seg_end - s);
		s = seg_end;
	}
}

static double util_pct(uint64_t from, uint64_t to)
{
	double b = 0;
	for (uint64_t i = from / BIN_NS; i < to / BIN_NS && i < NBINS; i++)
		b += busy[i];
	return 100.0 * b / (double)(to - from);
}

/* Returns the mean utilisation after warm-up. noise_pp: measurement noise of NVML. */
static double run(int target, struct sim_proc *procs, int nprocs, double noise_pp, double *worst_window)
{
	struct core_bucket b;
	memset(busy, 0, sizeof(busy));
	core_bucket_init(&b, 0);
	uint64_t gpu_free = 0, last_control = 0;
	const uint64_t end = (uint64_t)SIM_SECONDS * 1000000000ull;
	*worst_window = 0;
	for (;;) {
		int p = 0;
		for (int i = 1; i < nprocs; i++)
			if (procs[i].next_try < procs[p].next_try)
				p = i;
		struct sim_proc *sp = &procs[p];
		uint64_t t = sp->next_try;
		if (t >= end)
			break;
		while (last_control + CONTROL_NS <= t) {
			uint64_t now = last_control + CONTROL_NS;
			if (core_bucket_control_due(&b, now, CONTROL_NS)) {
				double u = util_pct(last_control, now) + noise_pp * (2 * frand() - 1);
				if (u < 0)
					u = 0;
				core_bucket_control(&b, target, u, now - last_control);
				if (now > (uint64_t)WARMUP_SECONDS * 1000000000ull) {
					double err = fabs(util_pct(now - 1000000000ull, now) - target);
					if (err > *worst_window)
						*worst_window = err;
				}
			}
			last_control = now;
		}
		/* retire finished kernels of this process */
		int k = 0;
		for (int i = 0; i < sp->npending; i++)
			if (sp->pending_end[i] > t)
				sp->pending_end[k++] = sp->pending_end[i];
		sp->npending = k;
		if (sp->npending == QUEUE_DEPTH) { /* launch queue full: block until one finishes */
			uint64_t first = UINT64_MAX;
			for (int i = 0; i < sp->npending; i++)
				if (sp->pending_end[i] < first)
					first = sp->pending_end[i];
			sp->next_try = first;
			continue;
		}
		double scale = 1.0 + sp->jitter * (2 * frand() - 1);
		uint64_t blocks = (uint64_t)((double)sp->blocks * scale) + 1;
		uint64_t wait = core_bucket_take(&b, blocks, t);
		if (wait != 0) {
			sp->next_try = t + wait;
			continue;
		}
		uint64_t dur = (uint64_t)((double)sp->dur_ns * scale);
		uint64_t start = gpu_free > t ? gpu_free : t;
		gpu_free = start + dur;
		add_busy(start, gpu_free);
		sp->pending_end[sp->npending++] = gpu_free;
		sp->next_try = t + 5000; /* CPU cost of one launch */
	}
	return util_pct((uint64_t)WARMUP_SECONDS * 1000000000ull, end);
}

struct scenario {
	const char *name;
	int nprocs;
	struct sim_proc procs[MAX_PROCS];
	double noise_pp;
};

/* An allowance change (contract §16): what the controller keeps for the target is scaled by
 * new / old at once, within the rate's bounds; no change, or a target outside 1-100, none. */
static void test_retarget(void)
{
	const struct {
		uint64_t rate;
		int64_t integral;
		int old_pct, new_pct;
		uint64_t want_rate;
		int64_t want_integral;
	} cases[] = {
		{ 200000, 4000000, 30, 15, 100000, 2000000 },  /* halved */
		{ 100000, -3000000, 15, 45, 300000, -9000000 }, /* tripled, a negative correction too */
		{ 200000, 4000000, 30, 30, 200000, 4000000 },  /* unchanged */
		{ 100, 0, 100, 1, VGPU_CORE_MIN_RATE, 0 },      /* never under the floor */
		{ 200000, 4000000, 0, 50, 200000, 4000000 },    /* no old target: nothing to scale */
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct core_bucket b;
		core_bucket_init(&b, 0);
		atomic_store(&b.rate, cases[i].rate);
		atomic_store(&b.integral, cases[i].integral);
		core_bucket_retarget(&b, cases[i].old_pct, cases[i].new_pct);
		CHECK(atomic_load(&b.rate) == cases[i].want_rate && atomic_load(&b.integral) == cases[i].want_integral,
		      "retarget %d -> %d: rate %llu integral %lld, want %llu %lld", cases[i].old_pct, cases[i].new_pct,
		      (unsigned long long)atomic_load(&b.rate), (long long)atomic_load(&b.integral),
		      (unsigned long long)cases[i].want_rate, (long long)cases[i].want_integral);
	}
}

/* The controller's window: measurements of a window with fewer than VGPU_CORE_WINDOW_LAUNCHES
 * launches add up instead of moving the rate (their blocks and their busy time are seldom the
 * same launches'), unless the share is far above its goal; a launch let through after its
 * longest wait counts for the window; at 5 s the window is taken whatever it holds. */
static void test_window(void)
{
	struct core_bucket b;
	core_bucket_init(&b, 0);
	uint64_t rate = atomic_load(&b.rate);
	CHECK(core_bucket_take(&b, 1000, 1000) == 0, "the first launch goes");
	core_bucket_control(&b, 30, 45, 166666667);
	CHECK_EQ_U64(atomic_load(&b.rate), rate);
	CHECK_EQ_U64(atomic_load(&b.launches), 1);
	CHECK(atomic_load(&b.acc_window_ns) == 166666667, "window gathered: %llu ns",
	      (unsigned long long)atomic_load(&b.acc_window_ns));
	for (int i = 0; i < 6; i++)
		core_bucket_let_through(&b, 1000);
	core_bucket_control(&b, 30, 15, 166666667);
	CHECK_EQ_U64(atomic_load(&b.rate), rate);
	CHECK_EQ_U64(atomic_load(&b.spent), 7000);
	core_bucket_let_through(&b, 1000); /* the 8th launch of the window */
	core_bucket_control(&b, 30, 30, 166666667);
	/* 8,000 blocks in 0.5 s at 30 % share: the goal (30 %) is met at 16,000 blocks/s; a
	 * half-second window at the goal moves a quarter of the way there in log space */
	uint64_t want = (uint64_t)(pow((double)rate, 0.75) * pow(16000.0, 0.25));
	CHECK(atomic_load(&b.rate) + 2 >= want && atomic_load(&b.rate) <= want + 2, "rate %llu, want %llu",
	      (unsigned long long)atomic_load(&b.rate), (unsigned long long)want);
	CHECK(atomic_load(&b.launches) == 0 && atomic_load(&b.spent) == 0 && atomic_load(&b.acc_window_ns) == 0 &&
		      atomic_load(&b.acc_busy_us) == 0,
	      "the window starts again after a change");

	/* far above the goal: the first launch is enough, and the step goes all the way (at
	 * most 4-fold): 1,000 blocks in 0.1 s at 90 % against a goal of 30 % */
	core_bucket_init(&b, 0);
	atomic_store(&b.rate, 40000);
	CHECK(core_bucket_take(&b, 1000, 1000) == 0, "a launch goes");
	core_bucket_control(&b, 30, 90, 100000000);
	CHECK_EQ_U64(atomic_load(&b.rate), 10000);

	/* a retarget drops the window and the next VGPU_CORE_STALE_STEPS measured steps: their
	 * samples are of the time before it */
	core_bucket_init(&b, 0);
	atomic_store(&b.rate, 40000);
	for (int i = 0; i < 8; i++)
		core_bucket_let_through(&b, 1000);
	core_bucket_retarget(&b, 30, 60);
	CHECK_EQ_U64(atomic_load(&b.rate), 80000);
	CHECK(atomic_load(&b.spent) == 0 && atomic_load(&b.launches) == 0, "the window is dropped at a retarget");
	for (uint64_t i = 0; i < VGPU_CORE_STALE_STEPS; i++) {
		core_bucket_let_through(&b, 1000);
		core_bucket_control(&b, 60, 99, 166666667);
		CHECK(atomic_load(&b.rate) == 80000 && atomic_load(&b.acc_window_ns) == 0,
		      "measured step %llu after the retarget moved the rate to %llu", (unsigned long long)i + 1,
		      (unsigned long long)atomic_load(&b.rate));
	}
	for (int i = 0; i < 8; i++)
		core_bucket_let_through(&b, 1000);
	core_bucket_control(&b, 60, 99, 166666667);
	CHECK(atomic_load(&b.rate) < 80000, "the step after them measures again (rate %llu)",
	      (unsigned long long)atomic_load(&b.rate));

	/* forged by another process of the claim (the file is the container's to write): a window
	 * that wraps, or more busy time than time, starts again from this measurement */
	core_bucket_init(&b, 0);
	atomic_store(&b.rate, 40000);
	atomic_store(&b.acc_window_ns, UINT64_MAX - 5);
	atomic_store(&b.acc_busy_us, UINT64_MAX / 2);
	atomic_store(&b.launches, 1000);
	atomic_store(&b.spent, 4000);
	core_bucket_control(&b, 30, 30, 100000000);
	CHECK(atomic_load(&b.rate) >= 10000 && atomic_load(&b.rate) <= 160000, "rate %llu after a forged window",
	      (unsigned long long)atomic_load(&b.rate));
	CHECK_EQ_U64(atomic_load(&b.acc_window_ns), 0);

	/* a forged count of steps to drop drops none: the step measures */
	core_bucket_init(&b, 0);
	atomic_store(&b.stale_steps, 1000);
	CHECK(core_bucket_take(&b, 1000, 1000) == 0, "a launch goes");
	core_bucket_control(&b, 30, 30, 100000000);
	CHECK(atomic_load(&b.stale_steps) == 0 && atomic_load(&b.acc_window_ns) == 100000000,
	      "forged stale steps: %llu left, window %llu ns", (unsigned long long)atomic_load(&b.stale_steps),
	      (unsigned long long)atomic_load(&b.acc_window_ns));

	/* 5 s with one launch: taken */
	core_bucket_init(&b, 0);
	CHECK(core_bucket_take(&b, 1000, 1000) == 0, "a launch goes");
	for (int i = 0; i < 30; i++)
		core_bucket_control(&b, 30, 5, 166666667);
	CHECK(atomic_load(&b.acc_window_ns) < 5000000000ull, "a 5 s window is taken (%llu ns gathered)",
	      (unsigned long long)atomic_load(&b.acc_window_ns));
}

/* Launches of 1-block kernels that take no GPU time the driver samples, tried every 500 ns
 * for 5 s while NVML never has a sample of the container (quiet) or while the caller feeds no
 * measurement at all (quiet = 0): how many went through in the last second. */
static uint64_t unmeasured_launches(int quiet)
{
	struct core_bucket b;
	struct core_quiet q = { 0 };
	const uint64_t t0 = 1000000000ull, end = t0 + 5000000000ull;
	core_bucket_init(&b, t0);
	uint64_t last_second = 0, next_try = t0;
	for (uint64_t step = t0 + CONTROL_NS; step <= end; step += CONTROL_NS) {
		for (; next_try < step; next_try += 500) {
			if (core_bucket_take(&b, 1, next_try) == 0 && next_try >= end - 1000000000ull)
				last_second++;
		}
		if (!core_bucket_control_due(&b, step, CONTROL_NS))
			continue;
		uint64_t window = 0;
		double u = quiet ? core_bucket_quiet_util(&q, atomic_load(&b.util_seen_us), step, &window) : -1;
		core_bucket_control(&b, 50, u, window);
	}
	return last_second;
}

/* A container whose work NVML never samples is not held at the initial rate forever: after
 * VGPU_CORE_QUIET_NS without a sample the held launches raise the rate until none is held. A
 * bucket measured once is never quiet: the gap is measured when the next sample comes. */
static void test_unmeasured(void)
{
	uint64_t held = unmeasured_launches(0), quiet = unmeasured_launches(1);
	CHECK(held <= VGPU_CORE_INITIAL_RATE * 11 / 10, "without the quiet rule: %llu launches in 1 s",
	      (unsigned long long)held);
	CHECK(quiet >= 1900000, "a never-measured container got %llu of 2,000,000 launches in its 5th second "
	      "(the initial rate allows %llu)", (unsigned long long)quiet, (unsigned long long)VGPU_CORE_INITIAL_RATE);

	struct core_quiet q = { 0 };
	uint64_t w;
	CHECK(core_bucket_quiet_util(&q, 0, 1000, &w) < 0, "the first unmeasured step measures nothing");
	CHECK(core_bucket_quiet_util(&q, 0, 1000 + VGPU_CORE_QUIET_NS - 1, &w) < 0, "quiet before 1 s");
	CHECK(core_bucket_quiet_util(&q, 0, 1000 + VGPU_CORE_QUIET_NS, &w) == 0 && w == VGPU_CORE_QUIET_NS,
	      "after 1 s of no sample: 0 %% over the second, window %llu", (unsigned long long)w);
	CHECK(core_bucket_quiet_util(&q, 0, 1000 + VGPU_CORE_QUIET_NS + CONTROL_NS, &w) == 0 && w == CONTROL_NS,
	      "then each step measures its own window, %llu", (unsigned long long)w);
	CHECK(core_bucket_quiet_util(&q, 12345, 1000 + 5 * VGPU_CORE_QUIET_NS, &w) < 0 && w == 0,
	      "a bucket measured once is not quiet");
	CHECK(core_bucket_quiet_util(&q, 0, 1000 + 5 * VGPU_CORE_QUIET_NS + 1, &w) < 0,
	      "a quiet spell starts again from its first step");
}

int main(void)
{
	test_unmeasured();
	test_retarget();
	test_window();
	const struct scenario scenarios[] = {
		{ "1 process, 1 ms kernels", 1, { { .dur_ns = 1000000, .blocks = 1000 } }, 0 },
		{ "1 process, 0.1-1.9 ms kernels", 1, { { .dur_ns = 1000000, .blocks = 1000, .jitter = 0.9 } }, 0 },
		{ "3 processes, mixed kernels, noisy NVML", 3,
		  { { .dur_ns = 200000, .blocks = 80, .jitter = 0.5 },
		    { .dur_ns = 2000000, .blocks = 4000, .jitter = 0.5 },
		    { .dur_ns = 50000, .blocks = 64, .jitter = 0.2 } },
		  3.0 },
		{ "1 process, tiny 20 us kernels", 1, { { .dur_ns = 20000, .blocks = 16 } }, 1.0 },
	};
	const int targets[] = { 30, 60 };
	double sum_err = 0;
	int n = 0;
	for (size_t t = 0; t < sizeof(targets) / sizeof(targets[0]); t++) {
		for (size_t s = 0; s < sizeof(scenarios) / sizeof(scenarios[0]); s++) {
			struct scenario sc = scenarios[s];
			double worst;
			double mean = run(targets[t], sc.procs, sc.nprocs, sc.noise_pp, &worst);
			double err = fabs(mean - targets[t]);
			printf("core limit %d%%: %-40s mean utilisation %6.2f%% (error %.2f pp, worst 1 s window %.1f pp)\n",
			       targets[t], sc.name, mean, err, worst);
			CHECK(err <= 2.0, "target %d, %s: mean error %.2f pp > 2 pp", targets[t], sc.name, err);
			sum_err += err;
			n++;
		}
	}
	printf("core limit accuracy: mean error over %d runs %.2f pp\n", n, sum_err / n);
	return test_finish("core_sim");
}
