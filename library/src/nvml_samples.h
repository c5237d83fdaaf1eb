/* The container's share of the GPU from NVML's process-utilisation samples (pure: no NVML
 * call, testable on samples a simulation made). */
#ifndef VGPU_NVML_SAMPLES_H
#define VGPU_NVML_SAMPLES_H

#include <stdint.h>

#include "nvml_api.h"
#include "pids_config.h"

/* s[0..n) as nvmlDeviceGetProcessUtilization(lastSeenTimeStamp = last_seen_us) returned them:
 * one sample per process that ran in a sampling period, its busy share of that period. The
 * container's share over the whole time since last_seen_us is the sum of its processes'
 * samples divided by the sampling periods in that time, periods without a sample counting as
 * idle. The period is the smallest gap between the samples' timestamps; *period_us keeps it
 * between calls (0: none seen yet), for the calls whose new samples share one timestamp: a
 * container alone on its GPU that ran for one period after an idle spell has one sample, and
 * taking that sample for the whole spell overstated its share many-fold. Sets *newest_us to
 * the newest timestamp (of any process) and *util_pct (capped at 100); returns the time the
 * figure covers in microseconds, 0 when no sample is newer than last_seen_us. */
#define VGPU_NVML_MIN_PERIOD_US 10000ull /* shorter gaps between timestamps are one sampling */

uint64_t vgpu_util_from_samples(const nvmlProcessUtilizationSample_t *s, unsigned int n,
				const struct vgpu_pids *pids, uint64_t last_seen_us, uint64_t *newest_us,
				double *util_pct, uint64_t *period_us);

#endif
