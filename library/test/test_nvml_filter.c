/* The container's cut of NVML's listings (src/nvml_filter.c) against scripted listings: the
 * PIDs kept wherever the record holds them, a listing that grows between the calls, a driver
 * that answers an error or claims more records than it was given room for, and NVML's size
 * protocol towards the caller. */
#include <stddef.h>

#include "../src/nvml_filter.h"
#include "test_util.h"

/* A scripted listing: records of the given PIDs; it grows by `grow` records after each call
 * that found too little room (a process started between the calls); `fail` is answered
 * instead when set; `lie` adds that many to the count of a successful answer. */
struct script {
	unsigned int pids[256];
	unsigned int n, grow, calls;
	nvmlReturn_t fail;
	unsigned int lie;
};

static nvmlReturn_t fetch_samples(void *ctx, unsigned int *n, void *buf)
{
	struct script *s = ctx;
	s->calls++;
	if (s->fail != NVML_SUCCESS)
		return s->fail;
	if (*n < s->n) {
		*n = s->n;
		s->n += s->grow;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	nvmlProcessUtilizationInfo_v1_t *rec = buf;
	for (unsigned int i = 0; i < s->n; i++)
		rec[i] = (nvmlProcessUtilizationInfo_v1_t){ .timeStamp = 1000 + i, .pid = s->pids[i], .smUtil = i };
	*n = s->n + s->lie;
	return NVML_SUCCESS;
}

static struct vgpu_pids ours(void)
{
	static struct vgpu_pids p;
	const char text[] = "100007\n100003\n100200\n";
	CHECK(vgpu_pids_parse(text, sizeof(text) - 1, &p) == 0, "pids.config");
	return p;
}

static void test_keeps_ours_in_order(void)
{
	struct vgpu_pids p = ours();
	struct script s = { .n = 150, .grow = 7 };
	for (unsigned int i = 0; i < 256; i++)
		s.pids[i] = 200000 + i; /* neighbours */
	s.pids[3] = 100003;
	s.pids[90] = 100200;
	s.pids[149] = 100007;
	void *kept;
	unsigned int n;
	nvmlReturn_t r = vgpu_nvml_fetch_kept(fetch_samples, &s, sizeof(nvmlProcessUtilizationInfo_v1_t),
					      offsetof(nvmlProcessUtilizationInfo_v1_t, pid), &p, &kept, &n);
	CHECK_EQ_INT(r, NVML_SUCCESS);
	CHECK_EQ_INT(n, 3);
	CHECK(s.calls >= 2, "a listing of 150 fits no first buffer of 64: %u calls", s.calls);
	nvmlProcessUtilizationInfo_v1_t *k = kept;
	if (kept != NULL && n == 3) {
		CHECK(k[0].pid == 100003 && k[1].pid == 100200 && k[2].pid == 100007, "order: %u %u %u", k[0].pid,
		      k[1].pid, k[2].pid);
		CHECK(k[0].smUtil == 3 && k[1].smUtil == 90 && k[2].timeStamp == 1149, "records moved whole");
	}

	/* the caller's protocol: a NULL buffer and a short one ask the count, the right size gets them */
	nvmlProcessUtilizationInfo_v1_t out[4] = { 0 };
	unsigned int count = 0;
	CHECK_EQ_INT(vgpu_nvml_hand_out(kept, n, sizeof(out[0]), NULL, &count, VGPU_NVML_SAMPLES),
		     NVML_ERROR_INSUFFICIENT_SIZE);
	CHECK_EQ_INT(count, 3);
	count = 2;
	CHECK_EQ_INT(vgpu_nvml_hand_out(kept, n, sizeof(out[0]), out, &count, VGPU_NVML_SAMPLES),
		     NVML_ERROR_INSUFFICIENT_SIZE);
	CHECK_EQ_INT(count, 3);
	CHECK(out[0].pid == 0, "nothing written into a buffer too short");
	count = 4;
	CHECK_EQ_INT(vgpu_nvml_hand_out(kept, n, sizeof(out[0]), out, &count, VGPU_NVML_SAMPLES), NVML_SUCCESS);
	CHECK_EQ_INT(count, 3);
	CHECK(out[2].pid == 100007 && out[3].pid == 0, "three records handed out");
	/* a session list: a count of 0 is a question, answered NVML_SUCCESS */
	count = 0;
	CHECK_EQ_INT(vgpu_nvml_hand_out(kept, n, sizeof(out[0]), out, &count, VGPU_NVML_SESSIONS), NVML_SUCCESS);
	CHECK_EQ_INT(count, 3);
	count = 1;
	CHECK_EQ_INT(vgpu_nvml_hand_out(kept, n, sizeof(out[0]), out, &count, VGPU_NVML_SESSIONS),
		     NVML_ERROR_INSUFFICIENT_SIZE);
	CHECK_EQ_INT(count, 3);
	free(kept);
}

static void test_none_of_ours(void)
{
	struct vgpu_pids p = ours();
	struct script s = { .n = 5 };
	for (unsigned int i = 0; i < 5; i++)
		s.pids[i] = 300000 + i;
	s.pids[2] = 0; /* a record without a PID is nobody's */
	void *kept = (void *)&s;
	unsigned int n = 9;
	CHECK_EQ_INT(vgpu_nvml_fetch_kept(fetch_samples, &s, sizeof(nvmlProcessUtilizationInfo_v1_t),
					  offsetof(nvmlProcessUtilizationInfo_v1_t, pid), &p, &kept, &n),
		     NVML_SUCCESS);
	CHECK(kept == NULL && n == 0, "kept %p, %u", kept, n);
	unsigned int count = 64;
	nvmlProcessUtilizationInfo_v1_t out[1];
	CHECK_EQ_INT(vgpu_nvml_hand_out(kept, n, sizeof(out[0]), out, &count, VGPU_NVML_SAMPLES),
		     NVML_ERROR_NOT_FOUND);
	CHECK_EQ_INT(count, 0);
	count = 0;
	CHECK_EQ_INT(vgpu_nvml_hand_out(kept, n, sizeof(out[0]), NULL, &count, VGPU_NVML_LIST), NVML_SUCCESS);
	CHECK_EQ_INT(count, 0);
	count = 0;
	CHECK_EQ_INT(vgpu_nvml_hand_out(kept, n, sizeof(out[0]), out, &count, VGPU_NVML_SESSIONS), NVML_SUCCESS);
	CHECK_EQ_INT(count, 0);
}

static void test_driver_answers(void)
{
	struct vgpu_pids p = ours();
	void *kept;
	unsigned int n;
	/* an error is the caller's answer as it is */
	struct script s = { .n = 1, .pids = { 100003 }, .fail = NVML_ERROR_NOT_FOUND };
	CHECK_EQ_INT(vgpu_nvml_fetch_kept(fetch_samples, &s, sizeof(nvmlProcessUtilizationInfo_v1_t), 8, &p, &kept,
					  &n),
		     NVML_ERROR_NOT_FOUND);
	CHECK(kept == NULL && n == 0, "nothing kept on an error");
	/* a listing that grows faster than it can be read: given up, not looped on */
	struct script g = { .n = 100, .grow = 10000 };
	CHECK_EQ_INT(vgpu_nvml_fetch_kept(fetch_samples, &g, sizeof(nvmlProcessUtilizationInfo_v1_t), 8, &p, &kept,
					  &n),
		     NVML_ERROR_UNKNOWN);
	CHECK(g.calls <= 5 && kept == NULL, "%u calls", g.calls);
	/* a count past the room it was given is never read past the buffer (ASan would say) */
	struct script l = { .n = 2, .pids = { 100003, 100007 }, .lie = 1000 };
	CHECK_EQ_INT(vgpu_nvml_fetch_kept(fetch_samples, &l, sizeof(nvmlProcessUtilizationInfo_v1_t), 8, &p, &kept,
					  &n),
		     NVML_SUCCESS);
	CHECK_EQ_INT(n, 2);
	free(kept);
}

int main(void)
{
	test_keeps_ours_in_order();
	test_none_of_ours();
	test_driver_answers();
	return test_finish("test_nvml_filter");
}
