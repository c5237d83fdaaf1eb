#include "core_limiter.h"

#include "clock.h"
#include "log.h"
#include "nvml_usage.h"

static _Atomic(nvmlDevice_t) nvml_dev[VGPU_MAX_DEVICES];

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

/* One controller step for the container (the caller won the election for this period). */
static void control(int index, struct core_bucket *b, uint64_t window_ns)
{
	nvmlDevice_t dev = atomic_load(&nvml_dev[index]);
	if (dev == NULL) {
		dev = vgpu_nvml_device(vgpu_rt.cfg.dev[index].uuid);
		atomic_store(&nvml_dev[index], dev);
	}
	double util = -1;
	uint64_t prev = atomic_load(&b->util_seen_us), seen = prev;
	vgpu_runtime_refresh_pids();
	if (dev != NULL && vgpu_nvml_container_util(dev, &vgpu_rt.pids, &seen, &util) == 0) {
		if (seen != prev)
			atomic_store(&b->util_seen_us, seen);
		if (prev == 0 && seen != 0)
			util = -1; /* the first samples cover an unknown past: baseline only */
	} else {
		util = -1; /* no measurement: the rate stays, refill goes on by time */
	}
	core_bucket_control(b, vgpu_rt.cfg.dev[index].core_limit, util, window_ns);
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
	struct core_bucket *b = &vgpu_rt.buckets[index];
	if (blocks == 0)
		blocks = 1;
	uint64_t now = vgpu_now_ns(), waited = 0;
	for (;;) {
		uint64_t due = atomic_load_explicit(&b->next_control_ns, memory_order_relaxed);
		if (now >= due && core_bucket_control_due(b, now, VGPU_CORE_CONTROL_NS)) {
			uint64_t window = due == 0 || now - (due - VGPU_CORE_CONTROL_NS) > 10 * VGPU_CORE_CONTROL_NS
						  ? VGPU_CORE_CONTROL_NS
						  : now - (due - VGPU_CORE_CONTROL_NS);
			control(index, b, window);
		}
		uint64_t wait = core_bucket_take(b, blocks, now);
		if (wait == 0)
			return CUDA_SUCCESS;
		if (waited >= VGPU_CORE_MAX_WAIT_NS) {
			vgpu_log_debug("core limit: launch let through after %llu ms of waiting",
				       (unsigned long long)(waited / 1000000));
			return CUDA_SUCCESS; /* never hold a launch forever */
		}
		vgpu_sleep_ns(wait);
		uint64_t after = vgpu_now_ns();
		waited += after - now;
		now = after;
	}
}
