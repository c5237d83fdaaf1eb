#include "free_queue.h"

#include <stdatomic.h>
#include <stdlib.h>

#include "clock.h"
#include "hook_table.h"
#include "hooks.h"
#include "log.h"
#include "mem_account.h"
#include "spinlock.h"

#define BLOCKED_MAX 32   /* streams remembered as not yet at their head free, per look */
#define POLL_AT_ADD 64   /* a queue this long is looked at when a free is added, too */
#define SPARES_MAX 1024  /* completed events kept for reuse */

struct queued {
	CUevent event;   /* recorded on stream right after the free */
	CUcontext ctx;   /* the event's */
	CUstream stream;
	int index;
	uint64_t bytes;
};

struct spare {
	CUevent event;
	CUcontext ctx;
};

static struct queued *queue;
static size_t nqueued, capqueued;
static struct spare *spares;
static size_t nspares, capspares;
static _Atomic size_t pending; /* nqueued, for a look without the lock */
static vgpu_spinlock lock = VGPU_SPINLOCK_INIT;

static int grow(void **array, size_t *cap, size_t elem)
{
	size_t ncap = *cap ? *cap * 2 : 64;
	void *n = realloc(*array, ncap * elem);
	if (n == NULL)
		return -1;
	*array = n;
	*cap = ncap;
	return 0;
}

static void destroy_event(CUevent e)
{
	if (USED(cuEventDestroy_v2) != NULL && USED(cuEventDestroy_v2)(e) != CUDA_SUCCESS)
		vgpu_log_debug("cuEventDestroy of a stream-ordered free's event failed");
}

/* Under the lock: an event of ctx, a spare or a new one; NULL if none can be made. */
static CUevent take_event(CUcontext ctx)
{
	for (size_t i = nspares; i-- > 0;) {
		if (spares[i].ctx == ctx) {
			CUevent e = spares[i].event;
			spares[i] = spares[--nspares];
			return e;
		}
	}
	CUevent e;
	if (USED(cuEventCreate) == NULL || USED(cuEventCreate)(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
		return NULL;
	return e;
}

/* Under the lock: an event whose last record completed is kept for reuse. */
static void keep_event(CUevent e, CUcontext ctx)
{
	if (nspares < SPARES_MAX && (nspares < capspares || grow((void **)&spares, &capspares, sizeof(*spares)) == 0))
		spares[nspares++] = (struct spare){ e, ctx };
	else
		destroy_event(e);
}

/* Under the lock: a record that fails with a spare may mean its context was destroyed and
 * made again at the same address: its spares go. */
static void drop_spares(CUcontext ctx)
{
	for (size_t i = nspares; i-- > 0;) {
		if (spares[i].ctx == ctx) {
			destroy_event(spares[i].event);
			spares[i] = spares[--nspares];
		}
	}
}

/* Under the lock: gives back what has run. Events of one stream complete in order, so once
 * a stream's oldest queued free has not run, its later ones are not asked about. */
static void poll_locked(void)
{
	CUstream blocked[BLOCKED_MAX];
	int nblocked = 0;
	size_t kept = 0;
	for (size_t i = 0; i < nqueued; i++) {
		struct queued q = queue[i];
		int held = 0;
		for (int b = 0; b < nblocked && !held; b++)
			held = blocked[b] == q.stream;
		if (!held) {
			CUresult r = USED(cuEventQuery) != NULL ? USED(cuEventQuery)(q.event) : CUDA_ERROR_NOT_READY;
			if (r != CUDA_ERROR_NOT_READY) {
				/* run, or an error: the context was destroyed, and its memory with it */
				vgpu_mem_credit(q.index, q.bytes);
				if (r == CUDA_SUCCESS)
					keep_event(q.event, q.ctx);
				else
					destroy_event(q.event);
				continue;
			}
			if (nblocked < BLOCKED_MAX)
				blocked[nblocked++] = q.stream;
		}
		queue[kept++] = q;
	}
	nqueued = kept;
	atomic_store_explicit(&pending, kept, memory_order_release);
}

void vgpu_free_queue_poll(void)
{
	if (atomic_load_explicit(&pending, memory_order_acquire) == 0)
		return;
	vgpu_spin_lock(&lock);
	poll_locked();
	vgpu_spin_unlock(&lock);
}

/* Under the lock: records an event after the free. 0 when queued. */
static int enqueue_locked(CUstream stream, CUcontext ctx, int index, uint64_t bytes)
{
	if (USED(cuEventRecord) == NULL ||
	    (nqueued == capqueued && grow((void **)&queue, &capqueued, sizeof(*queue)) != 0))
		return -1;
	for (int attempt = 0; attempt < 2; attempt++) {
		CUevent e = take_event(ctx);
		if (e == NULL)
			return -1;
		if (USED(cuEventRecord)(e, stream) == CUDA_SUCCESS) {
			queue[nqueued++] = (struct queued){ e, ctx, stream, index, bytes };
			atomic_store_explicit(&pending, nqueued, memory_order_release);
			return 0;
		}
		destroy_event(e);
		drop_spares(ctx);
	}
	return -1; /* a new event of the current context cannot be recorded there: another context's stream */
}

void vgpu_free_queue_add(CUstream stream, int index, uint64_t bytes)
{
	CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
	if (USED(cuStreamIsCapturing) != NULL && USED(cuStreamIsCapturing)(stream, &capture) == CUDA_SUCCESS &&
	    capture != CU_STREAM_CAPTURE_STATUS_NONE) {
		vgpu_mem_credit(index, bytes); /* a graph's free node, of a graph allocation charged at capture */
		return;
	}
	CUcontext ctx = NULL;
	if (USED(cuCtxGetCurrent) == NULL || USED(cuCtxGetCurrent)(&ctx) != CUDA_SUCCESS)
		ctx = NULL;
	int queued = -1;
	if (ctx != NULL) {
		vgpu_spin_lock(&lock);
		queued = enqueue_locked(stream, ctx, index, bytes);
		if (queued == 0 && nqueued >= POLL_AT_ADD)
			poll_locked();
		vgpu_spin_unlock(&lock);
	}
	if (queued == 0)
		return;
	/* no event to tell: the stream itself says when the free has run */
	if (USED(cuStreamSynchronize) == NULL || USED(cuStreamSynchronize)(stream) != CUDA_SUCCESS) {
		vgpu_log_error("cannot tell when a stream-ordered free runs: its %llu bytes stay counted until exit",
			       (unsigned long long)bytes);
		return;
	}
	vgpu_mem_credit(index, bytes);
}

static size_t queued_on(int index)
{
	size_t n = 0;
	for (size_t i = 0; i < nqueued; i++)
		n += queue[i].index == index;
	return n;
}

int vgpu_free_queue_wait(int index, uint64_t deadline_ns)
{
	uint64_t nap = 20000;
	for (;;) {
		if (atomic_load_explicit(&pending, memory_order_acquire) == 0)
			return 0;
		vgpu_spin_lock(&lock);
		size_t before = queued_on(index);
		if (before > 0)
			poll_locked();
		size_t after = queued_on(index);
		vgpu_spin_unlock(&lock);
		if (after < before)
			return 1;
		if (before == 0 || vgpu_now_ns() >= deadline_ns)
			return 0;
		vgpu_sleep_ns(nap);
		if (nap < 2000000)
			nap *= 2;
	}
}

void vgpu_free_queue_reset(void)
{
	vgpu_spin_reset(&lock);
	nqueued = 0;
	nspares = 0;
	atomic_store(&pending, 0);
}
