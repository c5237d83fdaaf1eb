/* Stream-ordered frees the driver has not run yet. cuMemFreeAsync only queues the free: the
 * driver has the memory back when the stream reaches it, which may be much later, or never
 * (a stream held by work that does not end). Its bytes stay charged until then.
 *
 * How the library knows: right after the free it records an event on the same stream (from a
 * per-process pool, in the current context); the free has run once the event has. The queue
 * is looked at, without waiting, before every reservation and memory-info answer (one
 * cuEventQuery per stream that has frees queued: events of one stream complete in order).
 * A reservation that does not fit while frees are queued on its GPU waits for them, at most
 * VGPU_FREE_WAIT_NS, before it is refused: the application's next allocation usually finds
 * the GPU past its last free.
 *
 * A free queued during stream capture is a graph's free node of a graph allocation, charged
 * when it was captured: given back at once, as before. When no event can be recorded (a
 * stream of another context than the current one), the free waits for its stream. */
#ifndef VGPU_FREE_QUEUE_H
#define VGPU_FREE_QUEUE_H

#include <stdint.h>

#include "cuda_api.h"

#define VGPU_FREE_WAIT_NS 1000000000ull

/* After a successful cuMemFreeAsync of bytes accounted on a config position. */
void vgpu_free_queue_add(CUstream stream, int index, uint64_t bytes);

/* Gives back the bytes of the queued frees that have run. Never waits. */
void vgpu_free_queue_poll(void);

/* Waits until a free queued on index has run (1: bytes came back) or until deadline_ns
 * (CLOCK_MONOTONIC), or returns at once when none is queued there (0). */
int vgpu_free_queue_wait(int index, uint64_t deadline_ns);

/* Forked child: the parent's queue and events are not the child's. */
void vgpu_free_queue_reset(void);

#endif
