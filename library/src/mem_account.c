#include "mem_account.h"

#include <stdatomic.h>

#include "clock.h"
#include "free_queue.h"
#include "log.h"
#include "nvml_usage.h"
#include "runtime.h"

#define RECONCILE_ALLOC_NS 1000000000ull /* NVML at most once a second from the alloc path */
#define RECONCILE_VIEW_NS 100000000ull

static _Atomic(nvmlDevice_t) nvml_dev[VGPU_MAX_DEVICES];
static _Atomic uint64_t reconcile_due; /* bit i: GPU position i reconciles at its next look */

void vgpu_mem_reconcile_next(void)
{
	if (vgpu_runtime_mode() != VGPU_MODE_ENFORCE)
		return;
	int index = vgpu_rt.only_index >= 0 ? vgpu_rt.only_index : vgpu_runtime_current_index();
	if (index >= 0 && index < 64)
		atomic_fetch_or(&reconcile_due, 1ull << index);
}

/* Counts what NVML sees of the container that the hooks do not (contexts, the driver's own
 * allocations): the ledger keeps max(0, NVML's per-process total - hooked bytes). */
static void maybe_reconcile(int index, uint64_t interval_ns)
{
	if (vgpu_ledger_usable(&vgpu_rt.ledger) != 0)
		return; /* said when it became unusable; reservations are refused */
	uint64_t now = vgpu_now_ns();
	uint64_t bit = index < 64 ? 1ull << index : 0;
	int due = (atomic_load_explicit(&reconcile_due, memory_order_relaxed) & bit) != 0;
	uint64_t last = vgpu_ledger_reconciled_ns(&vgpu_rt.ledger, index);
	if (!due && last != 0 && now - last < interval_ns)
		return;
	if (due)
		atomic_fetch_and(&reconcile_due, ~bit);
	nvmlDevice_t dev = atomic_load(&nvml_dev[index]);
	if (dev == NULL) {
		dev = vgpu_nvml_device(vgpu_rt.cfg.dev[index].uuid);
		if (dev == NULL)
			return;
		atomic_store(&nvml_dev[index], dev);
	}
	vgpu_runtime_refresh_pids();
	uint64_t bytes;
	if (vgpu_nvml_container_memory(dev, &vgpu_rt.pids, &bytes) != 0)
		return;
	if (vgpu_ledger_reconcile(&vgpu_rt.ledger, index, bytes, now) != 0)
		vgpu_log_warn("cannot record NVML's usage in the memory ledger");
}

CUresult vgpu_mem_reserve(int ordinal, uint64_t bytes, struct vgpu_mem_op *op)
{
	op->index = -1;
	op->reserved = 0;
	int m = vgpu_runtime_mode();
	if (m == VGPU_MODE_ENFORCE)
		m = vgpu_runtime_map_cuda();
	if (m == VGPU_MODE_REFUSED) {
		vgpu_runtime_report_refusal();
		return CUDA_ERROR_NOT_PERMITTED;
	}
	if (m != VGPU_MODE_ENFORCE)
		return CUDA_SUCCESS;
	int index = ordinal >= 0 ? vgpu_runtime_index_of_ordinal(ordinal) : vgpu_runtime_current_index();
	if (index < 0)
		return CUDA_SUCCESS; /* no current context: the driver fails the call itself */
	uint64_t limit = vgpu_rt.cfg.dev[index].mem_limit;
	if (limit == 0)
		return CUDA_SUCCESS;
	maybe_reconcile(index, RECONCILE_ALLOC_NS);
	vgpu_free_queue_poll();
	int r = vgpu_ledger_reserve(&vgpu_rt.ledger, index, bytes, limit);
	/* over the limit while frees are queued on the GPU: the stream usually gets there soon */
	for (uint64_t deadline = 0; r == 1;) {
		if (deadline == 0)
			deadline = vgpu_now_ns() + VGPU_FREE_WAIT_NS;
		if (!vgpu_free_queue_wait(index, deadline))
			break;
		r = vgpu_ledger_reserve(&vgpu_rt.ledger, index, bytes, limit);
	}
	if (r == 1)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (r != 0)
		return CUDA_ERROR_UNKNOWN; /* cannot account: refuse rather than run unlimited */
	op->index = index;
	op->reserved = bytes;
	return CUDA_SUCCESS;
}

void vgpu_mem_commit(const struct vgpu_mem_op *op, CUresult result, enum vgpu_alloc_kind kind, uint64_t key)
{
	if (op->index < 0)
		return;
	if (result != CUDA_SUCCESS) {
		if (vgpu_ledger_release(&vgpu_rt.ledger, op->index, op->reserved) != 0)
			vgpu_log_error("cannot give %llu bytes back to the memory ledger",
				       (unsigned long long)op->reserved);
		return;
	}
	struct vgpu_alloc a = { .bytes = op->reserved, .dev = op->index, .refs = kind == VGPU_ALLOC_VMM_HANDLE };
	if (vgpu_alloc_map_put(kind, key, &a) != 0)
		vgpu_log_error("out of memory recording an allocation: its %llu bytes stay counted until exit",
			       (unsigned long long)op->reserved);
}

CUresult vgpu_mem_grow(struct vgpu_mem_op *op, uint64_t actual)
{
	if (op->index < 0 || actual <= op->reserved)
		return CUDA_SUCCESS;
	uint64_t extra = actual - op->reserved;
	int r = vgpu_ledger_reserve(&vgpu_rt.ledger, op->index, extra, vgpu_rt.cfg.dev[op->index].mem_limit);
	if (r != 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	op->reserved = actual;
	return CUDA_SUCCESS;
}

int vgpu_mem_enforcing(void)
{
	return atomic_load_explicit(&vgpu_rt.mode, memory_order_acquire) == VGPU_MODE_ENFORCE;
}

void vgpu_mem_credit(int index, uint64_t bytes)
{
	if (vgpu_ledger_release(&vgpu_rt.ledger, index, bytes) != 0)
		vgpu_log_error("cannot give %llu bytes back to the memory ledger", (unsigned long long)bytes);
}

int vgpu_mem_free_begin(enum vgpu_alloc_kind kind, uint64_t key, struct vgpu_alloc *a)
{
	/* not ours: allocated before the hooks saw it, or unlimited */
	return vgpu_mem_enforcing() && vgpu_alloc_map_take(kind, key, a);
}

void vgpu_mem_free_end(enum vgpu_alloc_kind kind, uint64_t key, const struct vgpu_alloc *a, CUresult result)
{
	if (result == CUDA_SUCCESS)
		vgpu_mem_credit(a->dev, a->bytes);
	else if (vgpu_alloc_map_put(kind, key, a) != 0)
		vgpu_log_error("out of memory recording an allocation: its %llu bytes stay counted until exit",
			       (unsigned long long)a->bytes);
}

int vgpu_mem_view(int index, uint64_t *limit, uint64_t *used)
{
	if (index < 0 || atomic_load(&vgpu_rt.mode) != VGPU_MODE_ENFORCE || vgpu_rt.cfg.dev[index].mem_limit == 0)
		return -1;
	maybe_reconcile(index, RECONCILE_VIEW_NS);
	vgpu_free_queue_poll();
	uint64_t hooked;
	if (vgpu_ledger_usage(&vgpu_rt.ledger, index, &hooked, used) != 0)
		return -1;
	*limit = vgpu_rt.cfg.dev[index].mem_limit;
	return 0;
}

void vgpu_mem_clamp(uint64_t limit, uint64_t used, uint64_t *free, uint64_t *total)
{
	uint64_t t = limit < *total ? limit : *total;
	uint64_t f = used < t ? t - used : 0;
	if (f > *free)
		f = *free;
	*total = t;
	*free = f;
}
