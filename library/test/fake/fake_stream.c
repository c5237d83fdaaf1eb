/* TEST DOUBLE: streams as queues of work that run in order, as far as they can. What can hold
 * a stream up is a wait for a value in host memory (cuStreamWaitValue32, GEQ): the stream
 * does not advance past it until the value is reached, like a stream held by work that never
 * finishes. Behind it, stream-ordered frees (cuMemFreeAsync: the memory stays charged until
 * the free runs, as the driver keeps it) and event records (cuEventQuery answers
 * CUDA_ERROR_NOT_READY until the stream reaches them). A stream runs when it is given work
 * or asked about (query, synchronise, an event of it queried). NULL, CU_STREAM_LEGACY and
 * CU_STREAM_PER_THREAD are one default stream here, of the current context. A stream created
 * belongs to the context current at its creation, as the driver's do (cuStreamGetCtx). */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "fake_cuda.h"

enum op_kind { OP_WAIT, OP_FREE, OP_EVENT };
struct fake_event;
struct op {
	enum op_kind kind;
	const volatile uint32_t *addr; /* OP_WAIT */
	uint32_t value;                /* OP_WAIT */
	uint64_t key;                  /* OP_FREE */
	struct fake_event *event;      /* OP_EVENT */
};
struct fake_stream {
	struct op *ops;
	size_t head, n, cap;
	struct fake_stream *next; /* every stream, for cuCtxSynchronize */
	int ordinal;              /* the CUDA ordinal of its context's device */
};
struct fake_event {
	struct fake_stream *stream; /* the stream it was last recorded on */
	int pending;                /* recorded and not yet reached */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct fake_stream default_stream;
static struct fake_stream *streams = &default_stream;

static struct fake_stream *stream_of(CUstream s)
{
	if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
		return &default_stream;
	return (struct fake_stream *)s;
}

/* Under mu: runs the stream's work up to the first wait that is not yet satisfied. */
static void run(struct fake_stream *st)
{
	while (st->head < st->n) {
		struct op *o = &st->ops[st->head];
		if (o->kind == OP_WAIT && __atomic_load_n(o->addr, __ATOMIC_ACQUIRE) < o->value)
			return;
		if (o->kind == OP_FREE)
			fake_free_key(o->key);
		else if (o->kind == OP_EVENT && o->event->stream == st)
			o->event->pending = 0;
		st->head++;
	}
	st->head = st->n = 0;
}

static CUresult enqueue(struct fake_stream *st, struct op o)
{
	if (st->n == st->cap) {
		size_t ncap = st->cap ? st->cap * 2 : 64;
		struct op *n = realloc(st->ops, ncap * sizeof(*n));
		if (n == NULL)
			return CUDA_ERROR_OUT_OF_MEMORY;
		st->ops = n;
		st->cap = ncap;
	}
	st->ops[st->n++] = o;
	run(st);
	return CUDA_SUCCESS;
}

void fake_streams_drain(void)
{
	pthread_mutex_lock(&mu);
	for (struct fake_stream *st = streams; st != NULL; st = st->next)
		run(st);
	pthread_mutex_unlock(&mu);
}

API CUresult cuStreamCreate(CUstream *stream, unsigned int flags)
{
	(void)flags;
	if (!fake_initialised())
		return CUDA_ERROR_NOT_INITIALIZED;
	if (fake_current_ordinal() < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	struct fake_stream *st = calloc(1, sizeof(*st));
	if (st == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	st->ordinal = fake_current_ordinal();
	pthread_mutex_lock(&mu);
	st->next = streams;
	streams = st;
	pthread_mutex_unlock(&mu);
	*stream = (CUstream)st;
	return CUDA_SUCCESS;
}

int fake_stream_ordinal(CUstream stream)
{
	if (stream == NULL || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD)
		return fake_current_ordinal();
	return ((struct fake_stream *)stream)->ordinal;
}

API CUresult cuStreamGetCtx(CUstream stream, CUcontext *ctx)
{
	if (!fake_initialised())
		return CUDA_ERROR_NOT_INITIALIZED;
	int ordinal = fake_stream_ordinal(stream);
	if (ordinal < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	*ctx = (CUcontext)(uintptr_t)(ordinal + 1);
	return CUDA_SUCCESS;
}

API CUresult cuStreamQuery(CUstream stream)
{
	pthread_mutex_lock(&mu);
	struct fake_stream *st = stream_of(stream);
	run(st);
	CUresult r = st->head < st->n ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
	pthread_mutex_unlock(&mu);
	return r;
}

API CUresult cuStreamSynchronize(CUstream stream)
{
	while (cuStreamQuery(stream) == CUDA_ERROR_NOT_READY) {
		struct timespec ts = { 0, 1000000 };
		nanosleep(&ts, NULL);
	}
	return CUDA_SUCCESS;
}

API CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus *status)
{
	(void)stream;
	*status = CU_STREAM_CAPTURE_STATUS_NONE; /* the fake does not capture graphs */
	return CUDA_SUCCESS;
}

API CUresult cuStreamWaitValue32(CUstream stream, CUdeviceptr addr, uint32_t value, unsigned int flags)
{
	if (flags != CU_STREAM_WAIT_VALUE_GEQ || addr == 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	CUresult r = enqueue(stream_of(stream),
			     (struct op){ .kind = OP_WAIT, .addr = (const volatile uint32_t *)(uintptr_t)addr, .value = value });
	pthread_mutex_unlock(&mu);
	return r;
}

static CUresult free_async(CUdeviceptr dptr, CUstream stream)
{
	if (!fake_initialised())
		return CUDA_ERROR_NOT_INITIALIZED;
	pthread_mutex_lock(&mu);
	struct fake_alloc *a = fake_alloc_find(dptr);
	CUresult r = CUDA_ERROR_INVALID_VALUE;
	if (a != NULL && !a->freeing) {
		a->freeing = 1;
		r = enqueue(stream_of(stream), (struct op){ .kind = OP_FREE, .key = dptr });
	}
	pthread_mutex_unlock(&mu);
	return r;
}

API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s) { return free_async(dptr, s); }
/* Baseline for the benchmark: the same function under a name libvgpu does not hook. */
API CUresult fake_cuMemFreeAsync(CUdeviceptr dptr, CUstream s) { return free_async(dptr, s); }
API CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s) { return free_async(dptr, s); }

API CUresult cuEventCreate(CUevent *event, unsigned int flags)
{
	(void)flags;
	if (!fake_initialised())
		return CUDA_ERROR_NOT_INITIALIZED;
	struct fake_event *e = calloc(1, sizeof(*e));
	if (e == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*event = (CUevent)e;
	return CUDA_SUCCESS;
}

API CUresult cuEventRecord(CUevent event, CUstream stream)
{
	if (event == NULL)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&mu);
	struct fake_event *e = (struct fake_event *)event;
	e->stream = stream_of(stream);
	e->pending = 1;
	CUresult r = enqueue(e->stream, (struct op){ .kind = OP_EVENT, .event = e });
	pthread_mutex_unlock(&mu);
	return r;
}

API CUresult cuEventQuery(CUevent event)
{
	if (event == NULL)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&mu);
	struct fake_event *e = (struct fake_event *)event;
	if (e->pending)
		run(e->stream);
	CUresult r = e->pending ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
	pthread_mutex_unlock(&mu);
	return r;
}

/* An event destroyed while its record is queued: the record stays in the queue, harmlessly
 * (it is kept, never freed, like every stream here). */
API CUresult cuEventDestroy_v2(CUevent event)
{
	if (event == NULL)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&mu);
	struct fake_event *e = (struct fake_event *)event;
	e->stream = NULL; /* a queued record of it no longer marks it */
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}
