#include "nvml_samples.h"

uint64_t vgpu_util_from_samples(const nvmlProcessUtilizationSample_t *s, unsigned int n,
				const struct vgpu_pids *pids, uint64_t last_seen_us, uint64_t *newest_us,
				double *util_pct)
{
	uint64_t newest = last_seen_us, oldest = UINT64_MAX, period = UINT64_MAX;
	double sum = 0;
	for (unsigned int i = 0; i < n; i++) {
		uint64_t ts = s[i].timeStamp;
		if (ts <= last_seen_us)
			continue;
		if (ts > newest)
			newest = ts;
		if (ts < oldest)
			oldest = ts;
		for (unsigned int j = 0; j < n; j++) /* the closest other timestamp: a period */
			if (s[j].timeStamp > ts && s[j].timeStamp - ts < period)
				period = s[j].timeStamp - ts;
		if (s[i].pid != 0 && vgpu_pids_contains(pids, s[i].pid))
			sum += s[i].smUtil;
	}
	*newest_us = newest;
	*util_pct = 0;
	if (newest == last_seen_us)
		return 0;
	/* The time covered: from the previous newest sample, or one period before the oldest
	 * new one when there was none. */
	uint64_t from = last_seen_us;
	if (from == 0)
		from = period != UINT64_MAX && oldest > period ? oldest - period : 0;
	uint64_t span = newest - from;
	if (period == UINT64_MAX || period > span)
		period = span; /* one sample time in the window: it covers the whole window */
	double periods = period > 0 ? (double)span / (double)period : 1;
	double util = sum / (periods < 1 ? 1 : periods);
	*util_pct = util > 100 ? 100 : util;
	return span;
}
