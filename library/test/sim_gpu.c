#include "sim_gpu.h"

#include <string.h>

#include "../src/nvml_samples.h"

double sim_frand(uint64_t *rng)
{
	uint64_t x = *rng;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	*rng = x;
	return (double)(x >> 11) / 9007199254740992.0;
}

void sim_gpu_init(struct sim_gpu *g, int ncontainers, const int *target_pct)
{
	memset(g, 0, sizeof(*g));
	g->ncontainers = ncontainers;
	g->running = -1;
	g->next_window_ns = SIM_NVML_PERIOD_NS;
	for (int c = 0; c < ncontainers; c++) {
		core_bucket_init(&g->ctr[c].bucket, 0);
		g->ctr[c].target_pct = target_pct[c];
		g->ctr[c].rate_target = 0; /* as a new core-limit file: the first target is recorded unscaled */
	}
}

struct sim_proc *sim_gpu_add_proc(struct sim_gpu *g, int c, sim_workload_fn workload, int arg, uint64_t seed)
{
	struct sim_proc *p = &g->proc[g->nprocs];
	memset(p, 0, sizeof(*p));
	p->container = c;
	p->pid = 1000u + (unsigned int)g->nprocs;
	p->workload = workload;
	p->arg = arg;
	p->rng = seed | 1;
	p->next_ns = g->now_ns;
	g->nprocs++;
	return p;
}

/* core_limiter.c's measurement: NVML's samples newer than the last step's, the container's
 * share computed by the library's own vgpu_util_from_samples. Returns -1 when nothing new
 * was measured or the first samples only set the baseline; *window_ns the time covered. */
static double nvml_container_util(struct sim_gpu *g, struct sim_container *ct, int c, uint64_t *window_ns)
{
	static nvmlProcessUtilizationSample_t s[SIM_SAMPLES];
	static struct vgpu_pids pids;
	pids.n = 0;
	for (int i = 0; i < g->nprocs; i++)
		if (g->proc[i].container == c)
			pids.pid[pids.n++] = g->proc[i].pid;
	unsigned int n = 0;
	for (uint64_t k = g->nsamples > SIM_SAMPLES ? g->nsamples - SIM_SAMPLES : 0; k < g->nsamples; k++) {
		const struct sim_sample *x = &g->samples[k % SIM_SAMPLES];
		if (x->ts_us * 1000 + SIM_NVML_DELAY_NS > g->now_ns || x->ts_us <= ct->last_seen_us)
			continue;
		s[n++] = (nvmlProcessUtilizationSample_t){ .pid = x->pid, .timeStamp = x->ts_us, .smUtil = x->sm_util };
	}
	uint64_t prev = ct->last_seen_us, seen = prev;
	double util = 0;
	vgpu_util_from_samples(s, n, &pids, prev, &seen, &util, &ct->period_us);
	if (seen == prev)
		return -1;
	ct->last_seen_us = seen;
	*window_ns = (seen - prev) * 1000;
	return prev == 0 ? -1 : util;
}

/* The launch path of core_limiter.c for one attempt: the period's election and control step,
 * then the bucket. Returns 1 when the launch goes. */
static int gate(struct sim_gpu *g, struct sim_proc *p, uint64_t *retry_ns)
{
	struct sim_container *ct = &g->ctr[p->container];
	struct core_bucket *b = &ct->bucket;
	uint64_t now = g->now_ns;
	/* core_limiter.c's follow_target: a changed target scales the rate at once */
	if (ct->rate_target != ct->target_pct) {
		if (ct->rate_target >= 1 && ct->rate_target <= 100 && ct->target_pct >= 1 && ct->target_pct <= 100)
			core_bucket_retarget(b, ct->rate_target, ct->target_pct);
		ct->rate_target = ct->target_pct;
	}
	uint64_t due = atomic_load(&b->next_control_ns);
	if (now >= due && core_bucket_control_due(b, now, SIM_CONTROL_NS)) {
		uint64_t window = 0;
		double u = nvml_container_util(g, ct, p->container, &window);
		if (u < 0)
			u = core_bucket_quiet_util(&ct->quiet, ct->last_seen_us, now, &window);
		core_bucket_control(b, ct->target_pct, u, u < 0 ? 0 : window);
	}
	if (ct->target_pct >= 100)
		return 1;
	uint64_t wait = core_bucket_take(b, p->next.blocks, now);
	if (wait == 0) {
		p->held_since_ns = 0;
		return 1;
	}
	if (p->held_since_ns == 0)
		p->held_since_ns = now;
	if (now - p->held_since_ns >= core_bucket_max_wait_ns(ct->target_pct)) {
		p->held_since_ns = 0;
		core_bucket_let_through(b, p->next.blocks);
		return 1; /* never held longer: let through uncharged, as core_limiter.c does */
	}
	*retry_ns = wait;
	return 0;
}

static void proc_act(struct sim_gpu *g, struct sim_proc *p)
{
	if (p->syncing) {
		if (p->qlen > 0) {
			p->next_ns = UINT64_MAX;
			return;
		}
		p->syncing = 0;
	}
	if (!p->have_next) {
		p->workload(p, g->now_ns, &p->next);
		p->have_next = 1;
	}
	if (p->qlen + p->next.nkernels > SIM_QUEUE) {
		p->next_ns = UINT64_MAX; /* the launch blocks until the queue drains */
		return;
	}
	uint64_t retry = 0;
	if (!gate(g, p, &retry)) {
		p->next_ns = g->now_ns + retry;
		return;
	}
	for (int k = 0; k < p->next.nkernels; k++)
		p->queue[(p->qhead + p->qlen++) % SIM_QUEUE] = p->next.kernel_ns;
	p->have_next = 0;
	p->syncing = p->next.sync;
	p->next_ns = g->now_ns + SIM_LAUNCH_CPU_NS + p->next.think_ns;
}

static void pick_context(struct sim_gpu *g)
{
	if (g->running >= 0 && g->proc[g->running].qlen > 0 && g->slice_left_ns > 0)
		return;
	int start = g->running < 0 ? 0 : g->running + 1;
	g->running = -1;
	for (int i = 0; i < g->nprocs; i++) {
		int j = (start + i) % g->nprocs;
		if (g->proc[j].qlen > 0) {
			g->running = j;
			g->slice_left_ns = SIM_TIMESLICE_NS;
			return;
		}
	}
}

static void add_busy(struct sim_gpu *g, struct sim_proc *p, uint64_t from, uint64_t ns)
{
	p->window_busy_ns += ns;
	uint64_t bin = from / SIM_BIN_NS;
	if (bin < SIM_NBINS)
		g->ctr[p->container].busy[bin] += (double)ns;
}

/* One tick of the GPU: the running context's kernels progress, finished ones wake their process. */
static void gpu_tick(struct sim_gpu *g)
{
	uint64_t left = SIM_TICK_NS, t = g->now_ns;
	while (left > 0) {
		pick_context(g);
		if (g->running < 0)
			return;
		struct sim_proc *p = &g->proc[g->running];
		uint64_t *k = &p->queue[p->qhead];
		uint64_t step = *k < left ? *k : left;
		if (step > g->slice_left_ns)
			step = g->slice_left_ns;
		*k -= step;
		g->slice_left_ns -= step;
		add_busy(g, p, t, step);
		t += step;
		left -= step;
		if (*k == 0) {
			p->qhead = (p->qhead + 1) % SIM_QUEUE;
			p->qlen--;
			p->completed++;
			if (p->next_ns == UINT64_MAX)
				p->next_ns = t;
		}
	}
}

static void nvml_sample(struct sim_gpu *g)
{
	for (int i = 0; i < g->nprocs; i++) {
		struct sim_proc *p = &g->proc[i];
		if (p->window_busy_ns == 0)
			continue; /* NVML lists the processes that ran */
		struct sim_sample *s = &g->samples[g->nsamples++ % SIM_SAMPLES];
		s->pid = p->pid;
		s->sm_util = (unsigned int)((200 * p->window_busy_ns / SIM_NVML_PERIOD_NS + 1) / 2); /* whole percent */
		s->ts_us = g->next_window_ns / 1000;
		p->window_busy_ns = 0;
	}
	g->next_window_ns += SIM_NVML_PERIOD_NS;
}

void sim_gpu_run(struct sim_gpu *g, uint64_t until_ns)
{
	while (g->now_ns < until_ns) {
		for (int i = 0; i < g->nprocs; i++)
			while (g->proc[i].next_ns <= g->now_ns)
				proc_act(g, &g->proc[i]);
		gpu_tick(g);
		g->now_ns += SIM_TICK_NS;
		if (g->now_ns >= g->next_window_ns)
			nvml_sample(g);
	}
}

double sim_util(const struct sim_gpu *g, int c, uint64_t from_ns, uint64_t to_ns)
{
	double b = 0;
	for (uint64_t i = from_ns / SIM_BIN_NS; i < to_ns / SIM_BIN_NS && i < SIM_NBINS; i++)
		b += g->ctr[c].busy[i];
	return 100.0 * b / (double)(to_ns - from_ns);
}
