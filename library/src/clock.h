#ifndef VGPU_CLOCK_H
#define VGPU_CLOCK_H

#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC is shared by all processes on the node: the core-limit bucket and the
 * registration budget both rely on that. vDSO-backed, no syscall. */
static inline uint64_t vgpu_now_ns(void)
{
	struct timespec ts;
	if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
		return 0;
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void vgpu_sleep_ns(uint64_t ns);

#endif
