/* The container's share from NVML's process-utilisation samples (src/nvml_samples.c), on
 * samples as the driver gives them: one per process that ran in a sampling period, none for a
 * period in which it did not run. A container alone on its GPU that ran one period after an
 * idle spell has a single sample in the call: its share over the spell is that sample over
 * the spell's periods, once the period is known from an earlier call. */
#include <math.h>

#include "../src/nvml_samples.h"
#include "test_util.h"

#define P 166667ull /* the driver's sampling period, us */

static struct vgpu_pids pids_of(unsigned int a, unsigned int b)
{
	struct vgpu_pids p = { .n = 2, .pid = { a, b } };
	return p;
}

static nvmlProcessUtilizationSample_t sample(unsigned int pid, uint64_t ts, unsigned int sm)
{
	return (nvmlProcessUtilizationSample_t){ .pid = pid, .timeStamp = ts, .smUtil = sm };
}

#define CHECK_NEAR(got, want) CHECK(fabs((got) - (want)) < 0.01, "%s = %.3f, want %.3f", #got, (got), (want))

/* Busy periods in a row: the period is learnt, the share is the mean of the samples. */
static void test_contiguous(void)
{
	struct vgpu_pids pids = pids_of(10, 11);
	uint64_t t0 = 5000000, period = 0, newest = 0;
	double util = -1;
	nvmlProcessUtilizationSample_t s[] = { sample(10, t0 + P, 60), sample(10, t0 + 2 * P, 40),
					       sample(10, t0 + 3 * P, 20) };
	uint64_t span = vgpu_util_from_samples(s, 3, &pids, t0, &newest, &util, &period);
	CHECK_EQ_U64(span, 3 * P);
	CHECK_EQ_U64(newest, t0 + 3 * P);
	CHECK_EQ_U64(period, P);
	CHECK_NEAR(util, 40.0);
}

/* One sample after five idle periods: 90 % of one period in six is 15 %, not 90 %. */
static void test_single_sample_after_idle(void)
{
	struct vgpu_pids pids = pids_of(10, 11);
	uint64_t t0 = 5000000, period = P, newest = 0;
	double util = -1;
	nvmlProcessUtilizationSample_t s[] = { sample(10, t0 + 6 * P, 90) };
	uint64_t span = vgpu_util_from_samples(s, 1, &pids, t0, &newest, &util, &period);
	CHECK_EQ_U64(span, 6 * P);
	CHECK_NEAR(util, 15.0);
	CHECK_EQ_U64(period, P); /* kept */

	/* With no period seen yet, the one sampling time covers the window (nothing better known),
	 * and the gap since the previous sampling time bounds the period. */
	period = 0;
	vgpu_util_from_samples(s, 1, &pids, t0, &newest, &util, &period);
	CHECK_NEAR(util, 90.0);
	CHECK_EQ_U64(period, 6 * P);
}

/* Calls come more often than samples (every 100 ms against 1/6 s): each sees one new sampling
 * time, and the period is learnt from the gap to the previous call's newest. */
static void test_period_across_calls(void)
{
	struct vgpu_pids pids = pids_of(10, 11);
	uint64_t t0 = 5000000, period = 0, newest = 0;
	double util = -1;
	nvmlProcessUtilizationSample_t a[] = { sample(10, t0 + P, 50) };
	vgpu_util_from_samples(a, 1, &pids, t0, &newest, &util, &period);
	CHECK_EQ_U64(period, P);
	/* then four idle periods and one busy one: 50 % of one period in five */
	nvmlProcessUtilizationSample_t b[] = { sample(10, t0 + 6 * P, 50) };
	uint64_t span = vgpu_util_from_samples(b, 1, &pids, newest, &newest, &util, &period);
	CHECK_EQ_U64(span, 5 * P);
	CHECK_NEAR(util, 10.0);
	CHECK_EQ_U64(period, P);
}

/* Two processes of the container sampled at CPU timestamps microseconds apart are one sampling
 * time: their samples add up, and no microsecond period is learnt. */
static void test_one_sampling_two_timestamps(void)
{
	struct vgpu_pids pids = pids_of(10, 11);
	uint64_t t0 = 5000000, period = P, newest = 0;
	double util = -1;
	nvmlProcessUtilizationSample_t s[] = { sample(10, t0 + P, 30), sample(11, t0 + P + 7, 25) };
	vgpu_util_from_samples(s, 2, &pids, t0, &newest, &util, &period);
	CHECK_EQ_U64(period, P);
	CHECK_NEAR(util, 55.0);
	CHECK_EQ_U64(newest, t0 + P + 7);
}

/* A neighbour's samples set the sampling times but not the container's share; a gap of two
 * periods between the only two sampling times is not taken for the period once one is known. */
static void test_neighbour_and_gaps(void)
{
	struct vgpu_pids pids = pids_of(10, 11);
	uint64_t t0 = 5000000, period = P, newest = 0;
	double util = -1;
	nvmlProcessUtilizationSample_t s[] = { sample(99, t0 + 2 * P, 100), sample(10, t0 + 4 * P, 80) };
	uint64_t span = vgpu_util_from_samples(s, 2, &pids, t0, &newest, &util, &period);
	CHECK_EQ_U64(span, 4 * P);
	CHECK_EQ_U64(period, P);
	CHECK_NEAR(util, 20.0);

	/* Nothing newer than last_seen: no figure, the period untouched. */
	span = vgpu_util_from_samples(s, 2, &pids, t0 + 4 * P, &newest, &util, &period);
	CHECK_EQ_U64(span, 0);
	CHECK_EQ_U64(newest, t0 + 4 * P);
	CHECK_EQ_U64(period, P);
}

int main(void)
{
	test_contiguous();
	test_single_sample_after_idle();
	test_period_across_calls();
	test_one_sampling_two_timestamps();
	test_neighbour_and_gaps();
	return test_finish("nvml_samples");
}
