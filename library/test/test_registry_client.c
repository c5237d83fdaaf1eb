/* The registration client against the scripted test server: frame codec, which outcomes
 * are retried, the waits between attempts, the budget, final statuses. Waits are
 * taken on a simulated clock (sleep advances it), so the budget test is exact and fast;
 * one test uses the real clock for "connect refused until the server starts". */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../src/clock.h"
#include "../src/registry_client.h"
#include "server/scripted_registry.h"
#include "test_util.h"

struct sim { uint64_t now; uint32_t seed; };
static uint64_t sim_now(void *c) { return ((struct sim *)c)->now; }
static void sim_sleep(void *c, uint64_t ms) { ((struct sim *)c)->now += ms; }
static uint32_t sim_rand(void *c)
{
	struct sim *s = c;
	s->seed = s->seed * 1103515245u + 12345u;
	return s->seed >> 8;
}

static char dir[64], sock[128], logpath[160];

static enum reg_outcome run(const char *script, const struct reg_request *req, uint32_t budget,
			    struct reg_response *res, struct reg_attempt_log *log, char *detail)
{
	struct sim s = { 1000, 7 };
	struct reg_client_deps deps = { sim_now, sim_sleep, sim_rand, &s };
	pid_t srv = script ? scripted_registry_start(sock, script, NULL, 0, logpath) : -1;
	enum reg_outcome o = reg_register(sock, req, budget, &deps, res, log, detail, 1200);
	if (srv > 0)
		scripted_registry_stop(srv, sock);
	return o;
}

static void check_wait(uint64_t w, uint64_t base)
{
	CHECK(w >= base && w <= base + base / 4, "wait %llu ms outside [%llu, %llu]", (unsigned long long)w,
	      (unsigned long long)base, (unsigned long long)(base + base / 4));
}

static void test_codec(void)
{
	uint8_t buf[REG_HEADER_LEN + REG_MAX_BODY];
	size_t len;
	struct reg_request req = { .pod_uid = "0b7a2c6e-1f7e-4c9e-9d2a-3f1e5b6c7d8e", .container_name = "app",
				   .client_version = "libvgpu/test" };
	CHECK(reg_encode_request(&req, buf, sizeof(buf), &len) == 0, "encode");
	CHECK(memcmp(buf, "VGPR\x01\x01\x00\x00", 8) == 0, "header bytes");
	CHECK_EQ_U64(len, 12 + 3 + 36 + 3 + 3 + 3 + 12);
	CHECK_EQ_U64((unsigned)buf[8] << 24 | buf[9] << 16 | buf[10] << 8 | buf[11], len - 12);
	CHECK(buf[12] == 1 && buf[13] == 0 && buf[14] == 36, "first field is pod_uid, 36 bytes");
	/* an empty register_uuid is omitted (NRI path) */
	CHECK(memchr(buf + 12, 3, 1) == NULL, "no tag 3");
	char longname[80];
	memset(longname, 'a', sizeof(longname) - 1);
	longname[79] = '\0';
	struct reg_request bad = { .container_name = longname };
	CHECK(reg_encode_request(&bad, buf, sizeof(buf), &len) != 0, "over-long container name rejected");

	struct reg_response r;
	const uint8_t ok_body[] = { 0, 5, 2, 0, 4, 0, 0, 1, 0x2c, 9, 0, 2, 'x', 'y', 1, 0, 2, 'h', 'i' };
	CHECK(reg_decode_response_body(ok_body, sizeof(ok_body), &r) == 0, "decode BUSY with unknown tag");
	CHECK_EQ_INT(r.status, REG_STATUS_BUSY);
	CHECK(r.has_retry_after && r.retry_after_ms == 300, "retry_after %u", r.retry_after_ms);
	CHECK(strcmp(r.message, "hi") == 0, "message %s", r.message);
	const uint8_t repeated[] = { 0, 1, 1, 0, 1, 'a', 1, 0, 1, 'b' };
	CHECK(reg_decode_response_body(repeated, sizeof(repeated), &r) != 0, "repeated tag is invalid");
	const uint8_t truncated[] = { 0, 1, 1, 0, 9, 'a' };
	CHECK(reg_decode_response_body(truncated, sizeof(truncated), &r) != 0, "truncated field");
	const uint8_t short_retry[] = { 0, 1, 2, 0, 2, 0, 1 };
	CHECK(reg_decode_response_body(short_retry, sizeof(short_retry), &r) != 0, "retry_after must be u32");
	uint8_t hdr[12];
	int kind;
	uint32_t blen;
	reg_put_header(hdr, REG_KIND_RESPONSE, REG_MAX_BODY + 1);
	CHECK(reg_decode_header(hdr, &kind, &blen) != 0, "oversized frame rejected");
	reg_put_header(hdr, REG_KIND_RESPONSE, 2);
	hdr[4] = 2;
	CHECK(reg_decode_header(hdr, &kind, &blen) != 0, "version 2 rejected");

	/* property: random bodies never crash the decoder (ASan build), and decode stays in bounds */
	uint32_t seed = 12345;
	for (int i = 0; i < 20000; i++) {
		uint8_t body[64];
		size_t n = (seed = seed * 1664525u + 1013904223u) % sizeof(body);
		for (size_t k = 0; k < n; k++)
			body[k] = (uint8_t)((seed = seed * 1664525u + 1013904223u) >> 24) % 8;
		if (reg_decode_response_body(body, n, &r) == 0)
			CHECK(strlen(r.message) <= 1024, "message bounded");
	}
	/* property: the wait is base..base*1.25, base = max(retry_after or 100, 10) */
	for (uint32_t ra = 0; ra < 5000; ra += 7) {
		uint64_t base = ra < REG_MIN_WAIT_MS ? REG_MIN_WAIT_MS : ra;
		check_wait(reg_retry_wait_ms(1, ra, 0), base);
		check_wait(reg_retry_wait_ms(1, ra, 0xffffffffu), base);
		check_wait(reg_retry_wait_ms(1, ra, ra * 2654435761u), base);
	}
	check_wait(reg_retry_wait_ms(0, 0, 99), REG_DEFAULT_WAIT_MS);
}

static void test_retry_then_ok(void)
{
	struct reg_request req = { .pod_uid = "0b7a2c6e-1f7e-4c9e-9d2a-3f1e5b6c7d8e", .container_name = "app" };
	struct reg_response res;
	struct reg_attempt_log log;
	char detail[1200];
	enum reg_outcome o = run("RETRY:20,RETRY,BUSY:40,OK", &req, REG_BUDGET_MS, &res, &log, detail);
	CHECK_EQ_INT(o, REG_OUTCOME_OK);
	CHECK_EQ_INT(log.attempts, 4);
	CHECK_EQ_INT(log.nwaits, 3);
	check_wait(log.waits_ms[0], 20);
	check_wait(log.waits_ms[1], 100); /* RETRY without retry_after_ms */
	check_wait(log.waits_ms[2], 40);

	o = run("BUSY:0,OK", &req, REG_BUDGET_MS, &res, &log, detail);
	CHECK_EQ_INT(o, REG_OUTCOME_OK);
	check_wait(log.waits_ms[0], REG_MIN_WAIT_MS); /* at least 10 ms */

	/* A connection closed before a byte of an answer (a plugin killed with the request
	 * accepted) is retried like a failed connect: 100 ms plus up to a quarter. */
	o = run("CLOSE,CLOSE,OK", &req, REG_BUDGET_MS, &res, &log, detail);
	CHECK(o == REG_OUTCOME_OK, "outcome %d (%s)", o, detail);
	CHECK_EQ_INT(log.attempts, 3);
	CHECK_EQ_INT(log.dropped, 2);
	CHECK_EQ_INT(log.connect_failures, 0);
	check_wait(log.waits_ms[0], REG_DEFAULT_WAIT_MS);
	check_wait(log.waits_ms[1], REG_DEFAULT_WAIT_MS);
}

static void test_finals(void)
{
	struct reg_request req = { .register_uuid = "5f0c3a1e-8d2b-4e6f-9a1c-2b3d4e5f6a7b" };
	unlink(logpath);
	const struct { const char *script; int status; enum reg_outcome outcome; } cases[] = {
		{ "NOT_FOUND", REG_STATUS_NOT_FOUND, REG_OUTCOME_FINAL },
		{ "DENIED", REG_STATUS_DENIED, REG_OUTCOME_FINAL },
		{ "INVALID", REG_STATUS_INVALID, REG_OUTCOME_FINAL },
		{ "INTERNAL", REG_STATUS_INTERNAL, REG_OUTCOME_FINAL },
		{ "STATUS:42", 42, REG_OUTCOME_FINAL },
		{ "GARBAGE", -1, REG_OUTCOME_TRANSPORT },
		{ "RETRY:10,DENIED", REG_STATUS_DENIED, REG_OUTCOME_FINAL },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct reg_response res;
		struct reg_attempt_log log;
		char detail[1200];
		enum reg_outcome o = run(cases[i].script, &req, REG_BUDGET_MS, &res, &log, detail);
		CHECK(o == cases[i].outcome, "%s: outcome %d, want %d (%s)", cases[i].script, o, cases[i].outcome, detail);
		CHECK(res.status == cases[i].status, "%s: status %d", cases[i].script, res.status);
		CHECK_EQ_INT(log.attempts, strchr(cases[i].script, ',') ? 2 : 1);
		if (cases[i].status == REG_STATUS_DENIED)
			CHECK_STR_CONTAINS(detail, "DENIED: scripted answer");
	}
	/* the request carried the per-claim fields */
	FILE *f = fopen(logpath, "r");
	char line[512] = "";
	CHECK(f && fgets(line, sizeof(line), f), "server log");
	CHECK_STR_CONTAINS(line, "uuid=5f0c3a1e-8d2b-4e6f-9a1c-2b3d4e5f6a7b");
	CHECK_STR_CONTAINS(line, "pod= name=");
	if (f)
		fclose(f);
}

static void test_budget(void)
{
	struct reg_request req = { .pod_uid = "0b7a2c6e-1f7e-4c9e-9d2a-3f1e5b6c7d8e", .container_name = "app" };
	struct reg_response res;
	struct reg_attempt_log log;
	char detail[1200];
	/* The mechanism, on a budget of 10 s (the library's own, REG_BUDGET_MS, is longer: see
	 * test_registry_restart.c). RETRY forever at 3 s: attempts at ~0, ~3.x, ~6.x s; the next
	 * wait would cross 10 s */
	const uint32_t budget = 10000;
	enum reg_outcome o = run("RETRY:3000", &req, budget, &res, &log, detail);
	CHECK_EQ_INT(o, REG_OUTCOME_BUDGET);
	CHECK_EQ_INT(res.status, REG_STATUS_RETRY);
	uint64_t total = 0;
	for (unsigned i = 0; i < log.nwaits; i++)
		total += log.waits_ms[i];
	CHECK(total <= budget, "waited %llu ms, budget %u", (unsigned long long)total, budget);
	CHECK(log.attempts == 3 || log.attempts == 4, "attempts %u", log.attempts);
	CHECK_STR_CONTAINS(detail, "gave up");

	/* no server at all: failed connects are retried every 100-125 ms for 10 s */
	o = run(NULL, &req, budget, &res, &log, detail);
	CHECK_EQ_INT(o, REG_OUTCOME_BUDGET);
	CHECK(log.connect_failures == log.attempts && log.attempts >= 80 && log.attempts <= 101,
	      "connect attempts %u", log.attempts);
	CHECK_STR_CONTAINS(detail, "connect");

	/* a server that always closes unanswered: retried until the budget, then said so */
	o = run("CLOSE", &req, budget, &res, &log, detail);
	CHECK_EQ_INT(o, REG_OUTCOME_BUDGET);
	CHECK(log.dropped == log.attempts && log.attempts >= 80 && log.attempts <= 101, "dropped %u of %u attempts",
	      log.dropped, log.attempts);
	CHECK_STR_CONTAINS(detail, "closed the connection without a response");
	CHECK_STR_CONTAINS(detail, "gave up");
}

static void *late_server(void *arg)
{
	(void)arg;
	vgpu_sleep_ns(300000000ull);
	return (void *)(intptr_t)scripted_registry_start(sock, "OK", NULL, 0, NULL);
}

static void test_refused_then_ok(void)
{
	struct reg_request req = { .pod_uid = "0b7a2c6e-1f7e-4c9e-9d2a-3f1e5b6c7d8e", .container_name = "app" };
	struct reg_response res;
	struct reg_attempt_log log;
	char detail[1200];
	pthread_t t;
	unlink(sock);
	CHECK(pthread_create(&t, NULL, late_server, NULL) == 0, "thread");
	enum reg_outcome o = reg_register(sock, &req, REG_BUDGET_MS, NULL, &res, &log, detail, sizeof(detail));
	void *srv;
	pthread_join(t, &srv);
	scripted_registry_stop((pid_t)(intptr_t)srv, sock);
	CHECK_EQ_INT(o, REG_OUTCOME_OK);
	CHECK(log.connect_failures >= 1 && log.attempts == log.connect_failures + 1, "attempts %u, failed connects %u",
	      log.attempts, log.connect_failures);
	for (unsigned i = 0; i < log.nwaits; i++)
		check_wait(log.waits_ms[i], REG_DEFAULT_WAIT_MS);
}

int main(void)
{
	snprintf(dir, sizeof(dir), "/tmp/vgr.XXXXXX");
	if (mkdtemp(dir) == NULL)
		return 2;
	snprintf(sock, sizeof(sock), "%s/r.sock", dir);
	snprintf(logpath, sizeof(logpath), "%s/log", dir);
	test_codec();
	test_retry_then_ok();
	test_finals();
	test_budget();
	test_refused_then_ok();
	unlink(logpath);
	rmdir(dir);
	return test_finish("registry_client");
}
