#include "core_limiter.h"

#include "clock.h"
#include "core_allowance.h"
#include "core_file.h"
#include "core_wake.h"
#include "log.h"
#include "nvml_usage.h"
#include "shm_guard.h"

static _Atomic(nvmlDevice_t) nvml_dev[VGPU_MAX_DEVICES];

/* When the core-limit file is truncated under the mapping (another process of the claim), this
 * process goes on with buckets of its own: its launches stay limited, no longer together with
 * the container's other processes. */
static struct core_bucket own_buckets[VGPU_MAX_DEVICES];
static _Atomic uint8_t own_rate_target[VGPU_MAX_DEVICES]; /* as core_file's rate_target */
static _Atomic int own_ready; /* 0 no, 1 being set up, 2 in use */

/* This process's own view of each GPU position: when it last launched there (0: never) and when
 * the launch path looks at the allowance file next. */
static struct {
	_Atomic uint64_t last_launch_ns;
	_Atomic uint64_t next_allowance_check_ns;
} seen[VGPU_MAX_DEVICES];

/* Per GPU position: the time the container has gone unmeasured (core_bucket_quiet_util), and
 * whether this process said that NVML cannot measure it. */
static struct core_quiet quiet[VGPU_MAX_DEVICES];
static _Atomic int said_unmeasured[VGPU_MAX_DEVICES];

static void use_own_buckets(void)
{
	int expected = 0;
	if (atomic_compare_exchange_strong(&own_ready, &expected, 1)) {
		uint64_t now = vgpu_now_ns();
		for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
			core_bucket_init(&own_buckets[i], now);
			atomic_store(&own_rate_target[i], 0); /* the initial rate is for no target */
		}
		__atomic_store_n(&vgpu_rt.buckets, own_buckets, __ATOMIC_RELEASE);
		atomic_store(&own_ready, 2);
		vgpu_log_error("the core-limit file was truncated while in use (by another process of the claim?): "
			       "this process limits its own launches from now on");
	}
	while (atomic_load(&own_ready) != 2)
		; /* another thread is setting them up: a few stores */
}

static int decide_gate(void)
{
	int m = vgpu_runtime_mode();
	int gate;
	if (m == VGPU_MODE_REFUSED)
		gate = VGPU_GATE_REFUSED;
	else if (m == VGPU_MODE_ENFORCE && vgpu_rt.cfg.any_core_limit && vgpu_rt.buckets != NULL)
		gate = VGPU_GATE_LIMITED;
	else
		gate = VGPU_GATE_OPEN;
	int expected = VGPU_GATE_UNKNOWN;
	if (!atomic_compare_exchange_strong(&vgpu_rt.launch_gate, &expected, gate))
		gate = expected;
	return gate;
}

/* The device's target, with the bucket made to follow a change of it: the target the shared
 * rate was set for is recorded beside it (rate_target), so each change is applied once for all
 * the container's processes, by whichever sees it first, and a process that starts later finds
 * the rate already right. */
static int follow_target(int index, struct core_bucket *b, _Atomic uint8_t *rate_target)
{
	int target = vgpu_core_target(index);
	if (target < 1 || target > 100)
		return target;
	uint8_t old = atomic_load_explicit(rate_target, memory_order_relaxed);
	if (old == target || !atomic_compare_exchange_strong(rate_target, &old, (uint8_t)target))
		return target; /* unchanged, or another thread or process applies the change */
	/* 0: nothing recorded yet (a new file, or one of an earlier build); over 100: forged by
	 * another process of the claim. Either way the rate is the controller's, for no known
	 * target: from now on it is for this one. */
	if (old >= 1 && old <= 100) {
		core_bucket_retarget(b, old, target);
		vgpu_log_debug("core limit on GPU %d: target %d%% -> %d%%", index, old, target);
	}
	return target;
}

/* At most once per VGPU_ALLOWANCE_CHECK_NS per GPU position and process, besides the control
 * step: the allowance follows the arbiter within milliseconds of launches. */
static void check_allowance(int index, struct core_bucket *b, _Atomic uint8_t *rate_target, uint64_t now)
{
	_Atomic uint64_t *next = &seen[index].next_allowance_check_ns;
	uint64_t due = atomic_load_explicit(next, memory_order_relaxed);
	if (now < due || !atomic_compare_exchange_strong(next, &due, now + VGPU_ALLOWANCE_CHECK_NS))
		return;
	follow_target(index, b, rate_target);
}

/* A launch on the GPU position after VGPU_WAKE_IDLE_NS without one there (or the process's
 * first) signals a wake; of several threads at that edge, the one that moves the stamp does. */
static void note_launch(int index, uint64_t now)
{
	_Atomic uint64_t *last = &seen[index].last_launch_ns;
	uint64_t prev = atomic_load_explicit(last, memory_order_relaxed);
	if (prev != 0 && (now <= prev || now - prev < VGPU_WAKE_IDLE_NS)) {
		if (now > prev)
			atomic_store_explicit(last, now, memory_order_relaxed);
		return;
	}
	if (atomic_compare_exchange_strong(last, &prev, now))
		vgpu_core_wake();
}

/* One controller step for the container (the caller won the election for this period). The
 * step measures only when NVML has samples newer than the last step's: the launches counted
 * since then are compared with the busy share of the time those samples cover. */
static void control(int index, struct core_bucket *b, _Atomic uint8_t *rate_target, uint64_t now)
{
	nvmlDevice_t dev = atomic_load(&nvml_dev[index]);
	if (dev == NULL) {
		dev = vgpu_nvml_device(vgpu_rt.cfg.dev[index].uuid);
		atomic_store(&nvml_dev[index], dev);
	}
	double util = -1;
	uint64_t prev = atomic_load(&b->util_seen_us), seen = prev, window = 0;
	vgpu_runtime_refresh_pids();
	int measured = dev != NULL && vgpu_nvml_container_util(dev, &vgpu_rt.pids, &seen, &util) == 0;
	if (measured && seen != prev) {
		atomic_store(&b->util_seen_us, seen);
		window = (seen - prev) * 1000;
		if (prev == 0)
			util = -1; /* the first samples cover an unknown past: baseline only */
	} else {
		/* nothing new measured: the rate stays, refill goes on by time; unless the
		 * container was never measured at all (core_bucket_quiet_util) */
		util = core_bucket_quiet_util(&quiet[index], prev, now, &window);
		if (util == 0 && !measured && !atomic_exchange(&said_unmeasured[index], 1))
			vgpu_log_warn("core limit on GPU %d: NVML gives no per-process utilisation here; the "
				      "limit cannot be measured, and launches are not held on a guess", index);
	}
	core_bucket_control(b, follow_target(index, b, rate_target), util, window);
}

/* Takes the launch's tokens, waiting for them at most core_bucket_max_wait_ns; runs the
 * controller when this caller wins the period's election, else looks at the allowance when it
 * is due. A launch held here has work: its wait counts as launching, not as idle. */
static CUresult wait_for_tokens(int index, struct core_bucket *b, _Atomic uint8_t *rate_target, uint64_t blocks,
				uint64_t now)
{
	uint64_t waited = 0;
	uint64_t max_wait = core_bucket_max_wait_ns(vgpu_rt.cfg.dev[index].core_limit);
	for (;;) {
		uint64_t due = atomic_load_explicit(&b->next_control_ns, memory_order_relaxed);
		if (now >= due && core_bucket_control_due(b, now, VGPU_CORE_CONTROL_NS))
			control(index, b, rate_target, now);
		else
			check_allowance(index, b, rate_target, now);
		uint64_t wait = core_bucket_take(b, blocks, now);
		if (wait == 0 || waited >= max_wait) {
			if (waited > 0)
				atomic_store_explicit(&seen[index].last_launch_ns, now, memory_order_relaxed);
			if (wait != 0) {
				core_bucket_let_through(b, blocks); /* counted for the controller */
				vgpu_log_debug("core limit: launch let through after %llu ms of waiting",
					       (unsigned long long)(waited / 1000000));
			}
			return CUDA_SUCCESS; /* never hold a launch forever */
		}
		vgpu_sleep_ns(wait);
		uint64_t after = vgpu_now_ns();
		waited += after - now;
		now = after;
	}
}

/* The container's shared bucket, inside a SIGBUS guard: a truncated core-limit file makes
 * this process use buckets of its own. */
static CUresult take_tokens(int index, uint64_t blocks, uint64_t now)
{
	struct core_bucket *all = __atomic_load_n(&vgpu_rt.buckets, __ATOMIC_ACQUIRE);
	if (all == own_buckets)
		return wait_for_tokens(index, &own_buckets[index], &own_rate_target[index], blocks, now);
	struct core_file *f = vgpu_core_file_of(all);
	struct vgpu_guard g;
	vgpu_guard_enter(&g, f, sizeof(*f));
	if (sigsetjmp(g.env, 0) != 0) {
		vgpu_guard_leave(&g);
		use_own_buckets();
		return wait_for_tokens(index, &own_buckets[index], &own_rate_target[index], blocks, vgpu_now_ns());
	}
	CUresult r = wait_for_tokens(index, &all[index], &f->rate_target[index], blocks, now);
	vgpu_guard_leave(&g);
	return r;
}

CUresult vgpu_core_gate_slow(uint64_t blocks, int gate)
{
	if (gate == VGPU_GATE_UNKNOWN)
		gate = decide_gate();
	if (gate == VGPU_GATE_OPEN)
		return CUDA_SUCCESS;
	if (gate == VGPU_GATE_REFUSED) {
		vgpu_runtime_report_refusal();
		return CUDA_ERROR_NOT_PERMITTED;
	}
	int index = vgpu_rt.only_index >= 0 ? vgpu_rt.only_index : vgpu_runtime_current_index();
	if (index < 0 || vgpu_rt.cfg.dev[index].core_limit >= VGPU_CORE_UNLIMITED)
		return CUDA_SUCCESS;
	uint64_t now = vgpu_now_ns();
	note_launch(index, now);
	return take_tokens(index, blocks == 0 ? 1 : blocks, now);
}
