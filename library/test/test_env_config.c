/* The env and limit parsers: table cases, then properties over generated input
 * (round trips, and random strings that must parse or be rejected without crashing). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../src/env_config.h"
#include "../src/pids_config.h"
#include "test_util.h"

struct kv { const char *k, *v; };
struct env { struct kv kv[64]; int n; };
static const char *env_get(const char *name, void *ctx)
{
	struct env *e = ctx;
	for (int i = 0; i < e->n; i++)
		if (strcmp(e->kv[i].k, name) == 0)
			return e->kv[i].v;
	return NULL;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }

static void test_mem_limit(void)
{
	const struct { const char *s; int ok; uint64_t v; } cases[] = {
		{ "4096m", 1, 4096ull << 20 }, { "4096M", 1, 4096ull << 20 }, { "1g", 1, 1ull << 30 },
		{ "512k", 1, 512ull << 10 }, { "1048576", 1, 1048576 }, { "0m", 0, 0 }, { "", 0, 0 },
		{ "m", 0, 0 }, { "-1m", 0, 0 }, { "1.5g", 0, 0 }, { " 12m", 0, 0 }, { "12m ", 0, 0 },
		{ "12mb", 0, 0 }, { "12x", 0, 0 }, { "18446744073709551615", 1, UINT64_MAX },
		{ "18446744073709551616", 0, 0 }, { "17592186044416m", 0, 0 }, { "17592186044415m", 1, 17592186044415ull << 20 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint64_t v = 0;
		int ok = vgpu_parse_mem_limit(cases[i].s, &v) == 0;
		CHECK(ok == cases[i].ok, "\"%s\": ok=%d", cases[i].s, ok);
		if (ok && cases[i].ok)
			CHECK(v == cases[i].v, "\"%s\" = %" PRIu64, cases[i].s, v);
	}
	for (int i = 0; i < 100000; i++) { /* round trip of the plugin's form */
		uint64_t mib = next() % (UINT64_MAX >> 20) + 1;
		char s[40];
		snprintf(s, sizeof(s), "%" PRIu64 "m", mib);
		uint64_t v = 0;
		CHECK(vgpu_parse_mem_limit(s, &v) == 0 && v == mib << 20, "%s", s);
	}
	const char alphabet[] = "0123456789mMgGkK -.x\t";
	for (int i = 0; i < 200000; i++) { /* random strings: accepted ones are exactly digits+suffix */
		char s[24];
		size_t n = next() % 22;
		for (size_t k = 0; k < n; k++)
			s[k] = alphabet[next() % (sizeof(alphabet) - 1)];
		s[n] = '\0';
		uint64_t v;
		if (vgpu_parse_mem_limit(s, &v) == 0) {
			size_t d = strspn(s, "0123456789");
			CHECK(d > 0 && (s[d] == '\0' || (strchr("mMgGkK", s[d]) && s[d + 1] == '\0')) && v > 0,
			      "accepted \"%s\"", s);
		}
	}
}

static void test_core_limit(void)
{
	for (int i = -5; i < 300; i++) {
		char s[16];
		snprintf(s, sizeof(s), "%d", i);
		int v = 0;
		int ok = vgpu_parse_core_limit(s, &v) == 0;
		CHECK(ok == (i >= 1 && i <= 100) && (!ok || v == i), "\"%s\"", s);
	}
	const char *bad[] = { "", "30%", " 30", "3 0", "0x1e", "+30", "30.0", "99999999999999999999" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int v;
		CHECK(vgpu_parse_core_limit(bad[i], &v) != 0, "\"%s\" accepted", bad[i]);
	}
}

static void test_config(void)
{
	char err[256];
	struct vgpu_config c;
	struct env e = { .n = 0 };
#define SET(k, v) (e.kv[e.n++] = (struct kv){ k, v })
	SET("MANAGER_VISIBLE_DEVICE_3", "GPU-aaaa");
	SET("CUDA_MEM_LIMIT_3", "4096m");
	SET("CUDA_CORE_LIMIT_3", "30");
	SET("CUDA_MEM_LIMIT_0", "1m");          /* index 0 has no device: ignored */
	SET("MANAGER_VISIBLE_DEVICE_5", "");    /* neutralised index */
	SET("CUDA_MEM_LIMIT_5", "garbage");
	SET("VGPU_POD_UID", "0b7a2c6e-1f7e-4c9e-9d2a-3f1e5b6c7d8e");
	SET("VGPU_CONTAINER_NAME", "app");
	CHECK(vgpu_config_parse(&c, env_get, &e, err, sizeof(err)) == 0, "parse: %s", err);
	CHECK_EQ_INT(c.ndevices, 1);
	CHECK(c.dev[3].present && c.dev[3].mem_limit == 4096ull << 20 && c.dev[3].core_limit == 30, "device 3");
	CHECK(!c.dev[0].present && c.dev[0].mem_limit == 0, "index 0 ignored");
	CHECK(c.any_limit && c.any_core_limit, "limits");
	CHECK(strcmp(c.container_name, "app") == 0, "identity");
	CHECK_EQ_INT(vgpu_config_find_uuid(&c, "gpu-AAAA"), 3);

	SET("MANAGER_VISIBLE_DEVICE_7", "GPU-AAAA");
	CHECK(vgpu_config_parse(&c, env_get, &e, err, sizeof(err)) != 0, "duplicate UUID accepted");
	CHECK_STR_CONTAINS(err, "appears under two indices (MANAGER_VISIBLE_DEVICE_3 and _7)");
	e.n--;
	SET("CUDA_CORE_LIMIT_3", "0");
	e.kv[2].v = "0";
	CHECK(vgpu_config_parse(&c, env_get, &e, err, sizeof(err)) != 0, "core 0 accepted");
	CHECK_STR_CONTAINS(err, "CUDA_CORE_LIMIT_3");
	e.kv[2].v = "100";
	e.kv[1].v = "4096";
	CHECK(vgpu_config_parse(&c, env_get, &e, err, sizeof(err)) == 0 && c.any_core_limit == 0, "100 = unlimited");

	/* property: random environments never crash; an accepted one has distinct UUIDs */
	static char vals[64][32];
	for (int round = 0; round < 20000; round++) {
		e.n = 0;
		int n = (int)(next() % 20);
		for (int i = 0; i < n && e.n < 60; i++) {
			static const char *keys[] = { "MANAGER_VISIBLE_DEVICE_", "CUDA_MEM_LIMIT_", "CUDA_CORE_LIMIT_" };
			static char names[64][40];
			snprintf(names[e.n], sizeof(names[0]), "%s%d", keys[next() % 3], (int)(next() % 18));
			snprintf(vals[e.n], sizeof(vals[0]), "%s%d%s", next() % 2 ? "GPU-" : "", (int)(next() % 4),
				 next() % 3 ? "m" : "");
			e.kv[e.n] = (struct kv){ names[e.n], vals[e.n] };
			e.n++;
		}
		if (vgpu_config_parse(&c, env_get, &e, err, sizeof(err)) == 0)
			for (int i = 0; i < VGPU_MAX_DEVICES; i++)
				for (int j = 0; j < i; j++)
					CHECK(!(c.dev[i].present && c.dev[j].present && strcasecmp(c.dev[i].uuid, c.dev[j].uuid) == 0),
					      "duplicate accepted");
	}
}

static void test_pids(void)
{
	struct vgpu_pids p;
	CHECK(vgpu_pids_parse("12\n100034\n7\n", 12, &p) == 0 && p.n == 3, "parse");
	CHECK(vgpu_pids_contains(&p, 7) && vgpu_pids_contains(&p, 100034) && !vgpu_pids_contains(&p, 8), "contains");
	const char *bad[] = { "12", "12\n\n", "a\n", "0\n", "-1\n", "12 \n", "99999999999\n" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		CHECK(vgpu_pids_parse(bad[i], strlen(bad[i]), &p) != 0, "\"%s\" accepted", bad[i]);
	CHECK(vgpu_pids_parse("", 0, &p) == 0 && p.n == 0, "empty");
}

/* Identity: the NRI pair is read only without a register UUID; on the per-claim path an
 * image's stale VGPU_POD_UID / VGPU_CONTAINER_NAME are ignored, even malformed or overlong. */
static void test_identity(void)
{
	char err[256];
	struct vgpu_config c;
	struct env e = { .n = 0 };
	static char long_uid[101];
	memset(long_uid, 'x', 100);
	SET("MANAGER_VISIBLE_DEVICE_0", "GPU-aaaa");
	SET("VGPU_POD_UID", "0b7a2c6e-1f7e-4c9e-9d2a-3f1e5b6c7d8e");
	SET("VGPU_CONTAINER_NAME", "app");
	CHECK(vgpu_config_parse(&c, env_get, &e, err, sizeof(err)) == 0, "NRI parse: %s", err);
	CHECK(strcmp(c.pod_uid, "0b7a2c6e-1f7e-4c9e-9d2a-3f1e5b6c7d8e") == 0 && strcmp(c.container_name, "app") == 0 &&
	      c.register_uuid[0] == '\0', "NRI identity");
	e.kv[1].v = long_uid;
	CHECK(vgpu_config_parse(&c, env_get, &e, err, sizeof(err)) != 0, "overlong pod UID accepted on the NRI path");
	CHECK_STR_CONTAINS(err, "VGPU_POD_UID is longer than 63 bytes");
	e.kv[2].v = "Not_A_DNS_Label";
	SET("MANAGER_CLIENT_REGISTER_UUID", "5f0c3a1e-8d2b-4e6f-9a1c-2b3d4e5f6a7b");
	CHECK(vgpu_config_parse(&c, env_get, &e, err, sizeof(err)) == 0, "per-claim parse: %s", err);
	CHECK(strcmp(c.register_uuid, "5f0c3a1e-8d2b-4e6f-9a1c-2b3d4e5f6a7b") == 0, "register UUID");
	CHECK(c.pod_uid[0] == '\0' && c.container_name[0] == '\0', "per-claim path read the image's pod/container env: "
	      "\"%s\" \"%s\"", c.pod_uid, c.container_name);
}

/* A reader takes LOCK_SH: while the writer holds LOCK_EX it waits, then reads the new list. */
static void test_pids_lock(void)
{
	char path[] = "/tmp/vgpu-pids.XXXXXX";
	int fd = mkstemp(path);
	CHECK(fd >= 0 && write(fd, "5\n", 2) == 2, "temp pids file");
	int ready[2];
	CHECK(pipe(ready) == 0, "pipe");
	pid_t w = fork();
	if (w == 0) {
		int f = open(path, O_WRONLY);
		if (f < 0 || flock(f, LOCK_EX) != 0 || write(ready[1], "L", 1) != 1)
			_exit(1);
		usleep(300000);
		if (pwrite(f, "6\n7\n", 4, 0) != 4 || ftruncate(f, 4) != 0)
			_exit(1);
		_exit(0); /* the lock goes with the process */
	}
	char b;
	CHECK(read(ready[0], &b, 1) == 1, "writer did not lock");
	struct vgpu_pids p;
	CHECK(vgpu_pids_read(path, &p) == 0, "read: %s", strerror(errno));
	CHECK(p.n == 2 && p.pid[0] == 6 && p.pid[1] == 7, "read under the writer's LOCK_EX: %zu pids, first %u", (size_t)p.n,
	      p.n ? p.pid[0] : 0);
	int st;
	waitpid(w, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "writer failed");
	close(fd);
	close(ready[0]);
	close(ready[1]);
	unlink(path);
}

int main(void)
{
	test_identity();
	test_pids_lock();
	test_mem_limit();
	test_core_limit();
	test_config();
	test_pids();
	return test_finish("env_config");
}
