#include "nvml_samples.h"

uint64_t vgpu_util_from_samples(const nvmlProcessUtilizationSample_t *s, unsigned int n,
				const struct vgpu_pids *pids, uint64_t last_seen_us, uint64_t *newest_us,
				double *util_pct, uint64_t *period_us)
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
		/* the closest other sampling time: a period. Timestamps closer than
		 * VGPU_NVML_MIN_PERIOD_US are one sampling time (CPU timestamps of one sampling
		 * may differ by microseconds between processes). */
		for (unsigned int j = 0; j < n; j++)
			if (s[j].timeStamp >= ts + VGPU_NVML_MIN_PERIOD_US && s[j].timeStamp - ts < period)
				period = s[j].timeStamp - ts;
		/* the previous call's newest sampling time is one too: calls come more often than
		 * samples (every 100 ms against 1/6 s), so most see a single new sampling time */
		if (last_seen_us != 0 && ts >= last_seen_us + VGPU_NVML_MIN_PERIOD_US && ts - last_seen_us < period)
			period = ts - last_seen_us;
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
	/* The smallest gap seen is the period: a call's own smallest gap may be several periods
	 * (idle ones between its sampling times), or there is none (one sampling time). */
	if (period != UINT64_MAX && (*period_us == 0 || period < *period_us))
		*period_us = period;
	else if (*period_us != 0)
		period = *period_us;
	if (period == UINT64_MAX || period > span)
		period = span; /* no period known: the one sample time covers the whole window */
	double periods = period > 0 ? (double)span / (double)period : 1;
	double util = sum / (periods < 1 ? 1 : periods);
	*util_pct = util > 100 ? 100 : util;
	return span;
}
