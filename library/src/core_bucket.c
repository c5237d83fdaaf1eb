#include "core_bucket.h"

#include <math.h>

void core_bucket_init(struct core_bucket *b, uint64_t now_ns)
{
	atomic_store(&b->rate, VGPU_CORE_INITIAL_RATE);
	atomic_store(&b->tokens, (int64_t)(VGPU_CORE_INITIAL_RATE * VGPU_CORE_BURST_NS / 1000000000ull));
	atomic_store(&b->last_refill_ns, now_ns);
	atomic_store(&b->next_control_ns, 0);
	atomic_store(&b->spent, 0);
	atomic_store(&b->throttled, 0);
	atomic_store(&b->integral, 0);
	atomic_store(&b->util_seen_us, 0);
	atomic_store(&b->launches, 0);
	atomic_store(&b->acc_busy_us, 0);
	atomic_store(&b->acc_window_ns, 0);
	atomic_store(&b->stale_steps, 0);
	for (int i = 0; i < 4; i++)
		b->reserved[i] = 0;
}

static void refill(struct core_bucket *b, uint64_t now_ns)
{
	uint64_t last = atomic_load_explicit(&b->last_refill_ns, memory_order_relaxed);
	if (now_ns <= last + 20000) /* at most one refill per 20 us keeps the hot path to loads */
		return;
	if (!atomic_compare_exchange_strong(&b->last_refill_ns, &last, now_ns))
		return; /* another thread or process refilled */
	uint64_t rate = atomic_load_explicit(&b->rate, memory_order_relaxed);
	uint64_t dt = now_ns - last;
	/* The whole elapsed time pays a debt (a process waiting on a long kernel launches
	 * nothing); the bucket then holds at most VGPU_CORE_BURST_NS of refill. */
	if (dt > 100 * VGPU_CORE_MAX_WAIT_NS)
		dt = 100 * VGPU_CORE_MAX_WAIT_NS;
	int64_t cap = (int64_t)(rate * VGPU_CORE_BURST_NS / 1000000000ull) + 1;
	double room = (double)cap - (double)atomic_load_explicit(&b->tokens, memory_order_relaxed);
	double want = (double)rate * (double)dt / 1e9;
	int64_t add = (int64_t)(want < room ? want : room > 0 ? room : 0);
	int64_t t = atomic_fetch_add(&b->tokens, add) + add;
	if (t > cap)
		atomic_fetch_sub(&b->tokens, t - cap);
}

uint64_t core_bucket_take(struct core_bucket *b, uint64_t cost, uint64_t now_ns)
{
	refill(b, now_ns);
	int64_t before = atomic_fetch_sub_explicit(&b->tokens, (int64_t)cost, memory_order_relaxed);
	if (before > 0) {
		atomic_fetch_add_explicit(&b->spent, cost, memory_order_relaxed);
		atomic_fetch_add_explicit(&b->launches, 1, memory_order_relaxed);
		return 0;
	}
	atomic_fetch_add_explicit(&b->tokens, (int64_t)cost, memory_order_relaxed);
	atomic_fetch_add_explicit(&b->throttled, 1, memory_order_relaxed);
	uint64_t rate = atomic_load_explicit(&b->rate, memory_order_relaxed);
	uint64_t deficit = (uint64_t)(1 - before);
	uint64_t wait = deficit * 1000000000ull / (rate ? rate : 1);
	if (wait < 50000)
		wait = 50000;
	if (wait > 10000000)
		wait = 10000000;
	return wait;
}

int core_bucket_control_due(struct core_bucket *b, uint64_t now_ns, uint64_t period_ns)
{
	uint64_t due = atomic_load_explicit(&b->next_control_ns, memory_order_relaxed);
	if (now_ns < due)
		return 0;
	return atomic_compare_exchange_strong(&b->next_control_ns, &due, now_ns + period_ns);
}

/* Whether a share is so far above its goal that the direction of the change is sure: above
 * goal + max(20, min(goal, (100 - goal) / 2)) points. It is there because the GPU time a block
 * stands for grew many-fold (the workload changed shape), not by noise. */
static int far_above(double util, double goal)
{
	double up = (100 - goal) / 2;
	double far = goal < up ? goal : up;
	return util > goal + (far > 20 ? far : 20);
}

/* Whether the window gathered since the last rate change is worth a change. Launches are
 * counted when they are made, their GPU time is sampled over the following kernel time, up to
 * 167 ms later and read 50 ms after that: a window of a few launches pairs the blocks of one
 * with the busy time of another (a 500 ms GEMM launched just before a window's end is all
 * blocks and no busy time). So the window grows until it holds VGPU_CORE_WINDOW_LAUNCHES
 * launches, which makes that pairing error at most one launch in that many, or
 * VGPU_CORE_WINDOW_MAX_NS; a share far above its goal acts on its first launch. */
static int window_ready(uint64_t launches, uint64_t window_ns, double util_pct, double goal)
{
	if (launches >= VGPU_CORE_WINDOW_LAUNCHES || window_ns >= VGPU_CORE_WINDOW_MAX_NS)
		return 1;
	return launches > 0 && far_above(util_pct, goal);
}

/* The share the controller aims at: the target corrected by half the integral, within
 * [target / 2, 100]. */
static double goal_of(double target, double integral)
{
	double goal = target + 0.5 * integral;
	if (goal < target * 0.5)
		goal = target * 0.5;
	return goal > 100 ? 100 : goal;
}

/* Forgets the launches and the measurements gathered since the last rate change. */
static void drop_window(struct core_bucket *b)
{
	atomic_store(&b->spent, 0);
	atomic_store(&b->throttled, 0);
	atomic_store(&b->launches, 0);
	atomic_store(&b->acc_window_ns, 0);
	atomic_store(&b->acc_busy_us, 0);
}

void core_bucket_control(struct core_bucket *b, int target_pct, double util_pct, uint64_t window_ns)
{
	if (util_pct < 0 || window_ns == 0)
		return; /* no measurement: keep the rate and the counts; refill goes on by time */
	uint64_t stale = atomic_load(&b->stale_steps);
	if (stale > VGPU_CORE_STALE_STEPS) {
		atomic_store(&b->stale_steps, 0); /* forged by a process of the claim: nothing to drop */
	} else if (stale > 0 && atomic_compare_exchange_strong(&b->stale_steps, &stale, stale - 1)) {
		drop_window(b); /* measured before a retarget: dropped, the window starts after it */
		return;
	}
	if (util_pct > 100)
		util_pct = 100;
	uint64_t acc_window = atomic_fetch_add(&b->acc_window_ns, window_ns) + window_ns;
	uint64_t busy_add = (uint64_t)(util_pct * (double)window_ns / 1e5); /* pp * ns / 100 / 1000 */
	uint64_t acc_busy = atomic_fetch_add(&b->acc_busy_us, busy_add) + busy_add;
	/* The bucket is in a file the container's processes can write: a gathered window that
	 * wrapped, or more busy time than time, is the container's own harm, never a NaN here. */
	if (acc_window < window_ns || acc_window > 100 * VGPU_CORE_WINDOW_MAX_NS || acc_busy > acc_window / 1000) {
		atomic_store(&b->acc_window_ns, window_ns);
		atomic_store(&b->acc_busy_us, busy_add);
		acc_window = window_ns;
		acc_busy = busy_add;
	}
	double window_s = (double)acc_window / 1e9;
	double util = (double)acc_busy / 1e4 / window_s; /* busy us / window us * 100 */
	double target = target_pct;

	double integral = (double)atomic_load(&b->integral) / 1e6;
	double goal = goal_of(target, integral);
	if (!window_ready(atomic_load(&b->launches), acc_window, util, goal))
		return; /* gather more: the counts and the busy time go on adding up */

	uint64_t spent = atomic_exchange(&b->spent, 0);
	uint64_t throttled = atomic_exchange(&b->throttled, 0);
	atomic_store(&b->launches, 0);
	atomic_fetch_sub(&b->acc_window_ns, acc_window);
	atomic_fetch_sub(&b->acc_busy_us, acc_busy);
	uint64_t loaded = atomic_load(&b->rate);
	double rate = (double)loaded;

	/* Integral of the error (pp * s), bounded so that a long idle period cannot wind it up;
	 * a window weighs at most 0.2 s, so that one long gathered window does not swing it.
	 * Integrate only near the target: large errors (start-up, load changes) are the
	 * feed-forward's job, and winding the integral up there would overshoot afterwards. */
	if ((throttled > 0 || util > target) && fabs(target - util) < 10)
		integral += (target - util) * (window_s < 0.2 ? window_s : 0.2);
	if (integral > 30)
		integral = 30;
	if (integral < -30)
		integral = -30;
	atomic_store(&b->integral, (int64_t)(integral * 1e6));
	goal = goal_of(target, integral);

	double next = rate;
	double spent_rate = (double)spent / window_s;
	if (util >= 0.5 && spent > 0) {
		/* feed-forward: the rate that would have produced the goal in this window */
		double ideal = spent_rate * goal / util;
		if (throttled == 0 && ideal > rate)
			ideal = rate; /* not limited by us: the workload, not the rate, set u */
		/* A window of a second or more is long against the measurement's lag (a sample is
		 * read up to 217 ms after the work it covers); a share far above its goal moves in a
		 * sure direction; at a saturated GPU (99 % and more) the measured share is a lower
		 * bound of the demand, so the ideal rate an upper bound of the right one: the step
		 * goes all the way there (at most 4-fold). Otherwise it goes halfway in log space, a
		 * quarter within 30 % of the goal: a full step on a lagging measurement oscillates. */
		if (window_s >= 1.0 || far_above(util, goal) || util >= 99)
			next = ideal;
		else if (fabs(util - goal) < 0.3 * goal)
			/* near the goal: a quarter, damping the swing a lagging sample sets up (two
			 * square roots: pow is GLIBC_2.29, newer than the images' glibc 2.28) */
			next = sqrt(rate * sqrt(rate * ideal));
		else
			next = sqrt(rate * ideal);
	} else if (throttled > 0 && util < 0.5) {
		next = rate * 2; /* throttled yet nothing measured as busy: the rate is far too low */
	} /* busy but nothing launched in the window: the work of earlier launches, rate kept */
	if (next < rate / 4)
		next = rate / 4;
	if (next > rate * 4)
		next = rate * 4;
	if (next < VGPU_CORE_MIN_RATE)
		next = VGPU_CORE_MIN_RATE;
	if (next > (double)VGPU_CORE_MAX_RATE)
		next = (double)VGPU_CORE_MAX_RATE;
	/* A retarget meanwhile (another thread or process saw the allowance change) wins: its rate
	 * is for the new target, this step's for the old one. */
	atomic_compare_exchange_strong(&b->rate, &loaded, (uint64_t)next);
}

void core_bucket_let_through(struct core_bucket *b, uint64_t cost)
{
	atomic_fetch_add_explicit(&b->spent, cost, memory_order_relaxed);
	atomic_fetch_add_explicit(&b->launches, 1, memory_order_relaxed);
}

static double clamp_rate(double r)
{
	if (r < VGPU_CORE_MIN_RATE)
		return VGPU_CORE_MIN_RATE;
	if (r > (double)VGPU_CORE_MAX_RATE)
		return (double)VGPU_CORE_MAX_RATE;
	return r;
}

void core_bucket_retarget(struct core_bucket *b, int old_pct, int new_pct)
{
	if (old_pct < 1 || new_pct < 1 || old_pct == new_pct)
		return;
	double f = (double)new_pct / (double)old_pct;
	uint64_t rate = atomic_load(&b->rate);
	while (!atomic_compare_exchange_weak(&b->rate, &rate, (uint64_t)clamp_rate((double)rate * f)))
		;
	/* The integral is a correction in points of the old target: the same share of the new one. */
	int64_t integral = atomic_load(&b->integral);
	while (!atomic_compare_exchange_weak(&b->integral, &integral, (int64_t)((double)integral * f)))
		;
	drop_window(b);
	atomic_store(&b->stale_steps, VGPU_CORE_STALE_STEPS);
	/* Tokens above the new rate's capacity (a burst at the old rate) are cut to it by the next
	 * refill, at most 20 us later. */
}

uint64_t core_bucket_max_wait_ns(int target_pct)
{
	if (target_pct < 1)
		target_pct = 1;
	if (target_pct > 100)
		target_pct = 100;
	return VGPU_CORE_MAX_WAIT_NS * 100 / (uint64_t)target_pct;
}

double core_bucket_quiet_util(struct core_quiet *q, uint64_t util_seen_us, uint64_t now_ns, uint64_t *window_ns)
{
	*window_ns = 0;
	if (util_seen_us != 0) {
		atomic_store_explicit(&q->first_ns, 0, memory_order_relaxed);
		return -1;
	}
	uint64_t first = atomic_load_explicit(&q->first_ns, memory_order_relaxed);
	if (first == 0 || now_ns < first) {
		atomic_store_explicit(&q->first_ns, now_ns, memory_order_relaxed);
		atomic_store_explicit(&q->last_ns, now_ns, memory_order_relaxed);
		return -1;
	}
	uint64_t last = atomic_load_explicit(&q->last_ns, memory_order_relaxed);
	if (now_ns - first < VGPU_CORE_QUIET_NS || now_ns <= last)
		return -1;
	atomic_store_explicit(&q->last_ns, now_ns, memory_order_relaxed);
	*window_ns = now_ns - last;
	return 0;
}
