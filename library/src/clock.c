#include "clock.h"

#include <errno.h>

void vgpu_sleep_ns(uint64_t ns)
{
	struct timespec req = { .tv_sec = (time_t)(ns / 1000000000ull),
				.tv_nsec = (long)(ns % 1000000000ull) };
	struct timespec rem;
	while (nanosleep(&req, &rem) != 0 && errno == EINTR)
		req = rem;
}
