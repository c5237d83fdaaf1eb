/* libvgpu-test.so preloaded into real processes over the fake driver and the scripted
 * registry: what an application in a vGPU container sees. One ctest per scenario:
 *   test_preload <routes|refusal|untouched|interposer|exact|sigkill|reconcile|prodlib|corelimit> */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fake/fake_state.h"
#include "server/scripted_registry.h"
#include "test_util.h"

#define PID_OFFSET 100000u
#define MiB (1024ull * 1024ull)

struct root {
	char dir[64], sock[128], pids[160], log[160], state[160];
	pid_t server;
};

struct run {
	int status;
	char out[65536], err[65536];
};

static void mkdir_p(const char *base, const char *rel)
{
	char path[256];
	snprintf(path, sizeof(path), "%s%s", base, rel);
	for (char *p = path + strlen(base) + 1; *p; p++) {
		if (*p == '/') {
			*p = '\0';
			mkdir(path, 0755);
			*p = '/';
		}
	}
	if (mkdir(path, 0755) != 0 && errno != EEXIST)
		perror(path);
}

/* A container's view: registry socket, config dir, the two per-container directories. */
static void root_setup(struct root *r, const char *script)
{
	snprintf(r->dir, sizeof(r->dir), "/tmp/vgp.XXXXXX");
	if (mkdtemp(r->dir) == NULL)
		exit(2);
	mkdir_p(r->dir, "/etc/vgpu-dra/registry");
	mkdir_p(r->dir, "/etc/vgpu-dra/config");
	mkdir_p(r->dir, "/tmp/.vgpu_lock");
	mkdir_p(r->dir, "/tmp/.vmem_node");
	snprintf(r->sock, sizeof(r->sock), "%s/etc/vgpu-dra/registry/registry.sock", r->dir);
	snprintf(r->pids, sizeof(r->pids), "%s/etc/vgpu-dra/config/pids.config", r->dir);
	snprintf(r->log, sizeof(r->log), "%s/registry.log", r->dir);
	snprintf(r->state, sizeof(r->state), "%s/fake.state", r->dir);
	r->server = script ? scripted_registry_start(r->sock, script, r->pids, PID_OFFSET, r->log) : -1;
}

static void root_teardown(struct root *r)
{
	if (r->server > 0)
		scripted_registry_stop(r->server, r->sock);
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", r->dir);
	if (strncmp(r->dir, "/tmp/vgp.", 9) == 0 && system(cmd) != 0)
		fprintf(stderr, "cleanup of %s failed\n", r->dir);
}

static const char *base_env[] = {
	"LD_LIBRARY_PATH=" FAKE_DIR,
	"FAKE_PID_OFFSET=100000",
	"MANAGER_VISIBLE_DEVICE_0=" FAKE_DEFAULT_UUID,
	"CUDA_MEM_LIMIT_0=256m",
	"VGPU_POD_UID=0b7a2c6e-1f7e-4c9e-9d2a-3f1e5b6c7d8e",
	"VGPU_CONTAINER_NAME=app",
	"ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0",
	"PATH=/usr/bin:/bin",
	NULL,
};

/* env = base + root paths + preload, then extra ("K=V" sets, "K" removes). */
static char **build_env(struct root *r, const char *preload, const char *const *extra)
{
	static char buf[64][512];
	static char *env[65];
	int n = 0;
	for (int i = 0; base_env[i]; i++)
		snprintf(buf[n++], 512, "%s", base_env[i]);
	snprintf(buf[n++], 512, "FAKE_GPU_STATE=%s", r->state);
	snprintf(buf[n++], 512, "VGPU_TEST_ROOT=%s", r->dir);
	snprintf(buf[n++], 512, "LD_PRELOAD=%s", preload);
	for (int i = 0; extra && extra[i]; i++) {
		const char *eq = strchr(extra[i], '=');
		size_t klen = eq ? (size_t)(eq - extra[i]) : strlen(extra[i]);
		int found = 0;
		for (int k = 0; k < n; k++) {
			if (strncmp(buf[k], extra[i], klen) == 0 && buf[k][klen] == '=') {
				if (eq)
					snprintf(buf[k], 512, "%s", extra[i]);
				else
					buf[k][0] = '\0';
				found = 1;
			}
		}
		if (!found && eq)
			snprintf(buf[n++], 512, "%s", extra[i]);
	}
	int m = 0;
	for (int k = 0; k < n; k++)
		if (buf[k][0])
			env[m++] = buf[k];
	env[m] = NULL;
	return env;
}

static pid_t spawn(struct root *r, const char *preload, char *const argv[], const char *const *extra, const char *tag)
{
	char **env = build_env(r, preload, extra);
	char out[256], err[256];
	snprintf(out, sizeof(out), "%s/%s.out", r->dir, tag);
	snprintf(err, sizeof(err), "%s/%s.err", r->dir, tag);
	pid_t pid = fork();
	if (pid == 0) {
		int o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644), e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0)
			_exit(126);
		execve(argv[0], argv, env);
		_exit(127);
	}
	return pid;
}

static void slurp(const char *path, char *buf, size_t cap)
{
	buf[0] = '\0';
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return;
	ssize_t n = read(fd, buf, cap - 1);
	buf[n > 0 ? n : 0] = '\0';
	close(fd);
}

static void collect(struct root *r, const char *tag, struct run *res)
{
	char path[256];
	snprintf(path, sizeof(path), "%s/%s.out", r->dir, tag);
	slurp(path, res->out, sizeof(res->out));
	snprintf(path, sizeof(path), "%s/%s.err", r->dir, tag);
	slurp(path, res->err, sizeof(res->err));
}

static void run(struct root *r, const char *preload, char *const argv[], const char *const *extra, struct run *res)
{
	static int seq;
	char tag[32];
	snprintf(tag, sizeof(tag), "run%d", seq++);
	pid_t pid = spawn(r, preload, argv, extra, tag);
	int st = 0;
	if (waitpid(pid, &st, 0) != pid)
		st = -1;
	res->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
	collect(r, tag, res);
}

#define PROBE(...) ((char *const[]){ PROBE_BIN, __VA_ARGS__, NULL })

static int count_lines(const char *path)
{
	char buf[8192];
	slurp(path, buf, sizeof(buf));
	int n = 0;
	for (char *p = buf; *p; p++)
		n += *p == '\n';
	return n;
}

/* ---------------------------------------------------------------------------------- */

static void test_routes(void)
{
	const char *routes[] = { "linked", "dlsym", "default", "next", "oldsym", "procaddr" };
	struct root r;
	root_setup(&r, "OK");
	for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
		struct run res;
		run(&r, LIBVGPU_TEST, PROBE("routes", (char *)routes[i]), NULL, &res);
		CHECK(res.status == 0 && strstr(res.out, "routes ok"), "route %s: exit %d\n%s%s", routes[i], res.status,
		      res.out, res.err);
		CHECK(res.err[0] == '\0', "route %s wrote to stderr: %s", routes[i], res.err);
	}
	root_teardown(&r);
}

struct refusal_case {
	const char *name;
	const char *script;        /* registry behaviour */
	const char *remove_dir;    /* container dir to remove, relative to the root */
	const char *env[6];
	const char *message;       /* what the user reads on stderr */
};

static void test_refusal(void)
{
	const struct refusal_case cases[] = {
		{ "memory ledger dir missing", "OK", "/tmp/.vmem_node", { NULL },
		  "/tmp/.vmem_node is missing: the container was created without its vGPU directories" },
		{ "core dir missing", "OK", "/tmp/.vgpu_lock", { NULL }, "/tmp/.vgpu_lock is missing" },
		{ "no identity", "OK", NULL, { "VGPU_POD_UID", "VGPU_CONTAINER_NAME", NULL },
		  "no registration identity" },
		{ "registry denies", "DENIED", NULL, { NULL },
		  "registration with the node's vGPU registry failed: DENIED: scripted answer" },
		{ "registry not found", "NOT_FOUND", NULL, { "MANAGER_CLIENT_REGISTER_UUID=5f0c3a1e-8d2b-4e6f-9a1c-2b3d4e5f6a7b", NULL },
		  "failed: NOT_FOUND" },
		{ "duplicate uuid", "OK", NULL, { "MANAGER_VISIBLE_DEVICE_4=" FAKE_DEFAULT_UUID, NULL },
		  "appears under two indices (MANAGER_VISIBLE_DEVICE_0 and _4)" },
		{ "unlisted gpu", "OK", NULL, { "FAKE_GPU_DEVICES=" FAKE_DEFAULT_UUID ":16384,GPU-99999999-2222-3333-4444-555555555555:8192", NULL },
		  "CUDA device 1 (GPU-99999999-2222-3333-4444-555555555555) is visible but no MANAGER_VISIBLE_DEVICE_<i> names it" },
		{ "malformed limit", "OK", NULL, { "CUDA_MEM_LIMIT_0=4096x", NULL }, "CUDA_MEM_LIMIT_0=\"4096x\" is not a memory size" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct refusal_case *c = &cases[i];
		struct root r;
		root_setup(&r, c->script);
		if (c->remove_dir) {
			char path[256];
			snprintf(path, sizeof(path), "%s%s", r.dir, c->remove_dir);
			rmdir(path);
		}
		struct run res;
		run(&r, LIBVGPU_TEST, PROBE("init"), c->env, &res);
		CHECK(res.status == 0, "%s: the application must keep running (exit %d)", c->name, res.status);
		CHECK_STR_CONTAINS(res.out, "cuInit=800");
		CHECK_STR_CONTAINS(res.err, "refusing to run CUDA without the container's vGPU limits");
		CHECK_STR_CONTAINS(res.err, c->message);
		if (strcmp(c->name, "unlisted gpu") != 0) {
			CHECK_STR_CONTAINS(res.out, "nvmlInit=4");
		}
		CHECK(strstr(res.out, "cuMemAlloc=0") == NULL && strstr(res.out, "cuLaunchKernel=0") == NULL,
		      "%s: a refused process must not allocate or launch: %s", c->name, res.out);
		/* said once, not per call */
		const char *first = strstr(res.err, "refusing");
		CHECK(first && strstr(first + 1, "refusing") == NULL, "%s: message repeated:\n%s", c->name, res.err);
		root_teardown(&r);
	}
	/* devices without limits: no registration, nothing refused, nothing changed */
	struct root r;
	root_setup(&r, "DENIED");
	struct run res;
	const char *env[] = { "CUDA_MEM_LIMIT_0", NULL };
	run(&r, LIBVGPU_TEST, PROBE("init"), env, &res);
	CHECK_STR_CONTAINS(res.out, "cuInit=0");
	CHECK_STR_CONTAINS(res.out, "cuMemAlloc=0");
	CHECK(res.err[0] == '\0', "unlimited: stderr %s", res.err);
	CHECK_EQ_INT(count_lines(r.log), 0);
	root_teardown(&r);
}

static void test_untouched(void)
{
	struct root r;
	root_setup(&r, "OK");
	struct run res;
	run(&r, LIBVGPU_TEST, ((char *const[]){ NOCUDA_BIN, NULL }), NULL, &res);
	CHECK(res.status == 0 && strstr(res.out, "nocuda ok"), "nocuda: exit %d %s %s", res.status, res.out, res.err);
	CHECK(res.err[0] == '\0', "stderr: %s", res.err);
	run(&r, LIBVGPU_TEST, ((char *const[]){ "/bin/sh", "-c", "echo shell ok", NULL }), NULL, &res);
	CHECK(res.status == 0 && strstr(res.out, "shell ok") && res.err[0] == '\0', "sh: %d %s %s", res.status, res.out,
	      res.err);
	/* no registration, no ledger, no bucket: the library did nothing at all */
	CHECK_EQ_INT(count_lines(r.log), 0);
	char path[256];
	snprintf(path, sizeof(path), "%s/tmp/.vmem_node/ledger.v1", r.dir);
	CHECK(access(path, F_OK) != 0, "ledger created by a process that never used CUDA");
	root_teardown(&r);
}

static void test_interposer(void)
{
	const char *orders[] = { LIBVGPU_TEST " " INTERPOSER_LIB, INTERPOSER_LIB " " LIBVGPU_TEST };
	for (int i = 0; i < 2; i++) {
		struct root r;
		root_setup(&r, "OK");
		struct run res;
		run(&r, orders[i], ((char *const[]){ INTERPOSER_APP, NULL }), NULL, &res);
		CHECK(res.status == 0, "order %d: exit %d\n%s%s", i, res.status, res.out, res.err);
		CHECK_STR_CONTAINS(res.out, "time ok");
		CHECK_STR_CONTAINS(res.out, "next time in interposer");
		CHECK_STR_CONTAINS(res.out, "alloc over limit = 2");
		CHECK_STR_CONTAINS(res.out, "alloc within limit = 0");
		CHECK_STR_CONTAINS(res.out, i == 0 ? "interposer calls 1" : "interposer calls 3");
		root_teardown(&r);
	}
}

static struct fake_state *map_fake(struct root *r)
{
	int fd = open(r->state, O_RDONLY);
	if (fd < 0)
		return NULL;
	void *p = mmap(NULL, sizeof(struct fake_state), PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	return p == MAP_FAILED ? NULL : p;
}

static int wait_lines(struct root *r, const char *tags[], int n, const char *word, int *sum)
{
	for (int tries = 0; tries < 3000; tries++) {
		int done = 0;
		*sum = 0;
		for (int i = 0; i < n; i++) {
			char path[256], buf[4096];
			snprintf(path, sizeof(path), "%s/%s.out", r->dir, tags[i]);
			slurp(path, buf, sizeof(buf));
			char *at = strstr(buf, word);
			if (at) {
				done++;
				*sum += atoi(at + strlen(word));
			}
		}
		if (done == n)
			return 0;
		usleep(10000);
	}
	return -1;
}

static void touch(struct root *r, const char *name)
{
	char path[256];
	snprintf(path, sizeof(path), "%s/%s", r->dir, name);
	int fd = open(path, O_WRONLY | O_CREAT, 0644);
	if (fd >= 0)
		close(fd);
}

static void test_exact(void)
{
	enum { N = 6 };
	const uint64_t limit_mib = 256, chunk_mib = 4, chunks = limit_mib / chunk_mib;
	struct root r;
	root_setup(&r, "OK");
	const char *tags[N] = { "f0", "f1", "f2", "f3", "f4", "f5" };
	pid_t kids[N];
	for (int i = 0; i < N; i++)
		kids[i] = spawn(&r, LIBVGPU_TEST, PROBE("fill", "4", r.dir), NULL, tags[i]);
	int sum;
	CHECK(wait_lines(&r, tags, N, "filled ", &sum) == 0, "fill did not finish");
	CHECK(sum == (int)chunks, "%d processes filled %d chunks of %llu MiB, the limit holds %llu", N, sum,
	      (unsigned long long)chunk_mib, (unsigned long long)chunks);
	touch(&r, "free");
	int freed;
	CHECK(wait_lines(&r, tags, N, "freed ", &freed) == 0, "free did not finish");
	touch(&r, "refill");
	int again;
	CHECK(wait_lines(&r, tags, N, "refilled ", &again) == 0, "refill did not finish");
	CHECK(again == freed, "after freeing %d chunks, %d could be allocated again (0 false OOM)", freed, again);
	struct fake_state *fs = map_fake(&r);
	CHECK(fs != NULL, "fake state");
	if (fs) {
		CHECK(fs->peak[0] <= limit_mib * MiB, "device usage peaked %llu bytes over the limit",
		      (unsigned long long)(fs->peak[0] - limit_mib * MiB));
		CHECK(fs->peak[0] == limit_mib * MiB, "the whole limit was used: peak %llu", (unsigned long long)fs->peak[0]);
		printf("exact: %d processes, %llu MiB limit: peak %llu bytes, 0 over; refilled %d/%d\n", N,
		       (unsigned long long)limit_mib, (unsigned long long)fs->peak[0], again, freed);
	}
	/* what the container sees while full */
	struct run res;
	run(&r, LIBVGPU_TEST, PROBE("info"), NULL, &res);
	CHECK_STR_CONTAINS(res.out, "cuMemGetInfo=0 free=0 total=268435456");
	CHECK_STR_CONTAINS(res.out, "cuDeviceTotalMem=268435456");
	CHECK_STR_CONTAINS(res.out, "nvmlMemory=0 free=0 total=268435456 used=268435456");
	/* NVML lists the container's processes that hold memory, by host PID (pids.config),
	 * and together they hold exactly the limit */
	char *list = strstr(res.out, "nvmlProcesses=0 count=");
	CHECK(list != NULL, "process list: %s", res.out);
	unsigned long long listed = 0;
	int nlisted = 0;
	for (char *p = list ? strstr(list, "pids=") + 5 : NULL; p && *p && *p != '\n';) {
		unsigned pid = (unsigned)strtoul(p, &p, 10);
		if (*p != ':')
			break;
		listed += strtoull(p + 1, &p, 10);
		nlisted++;
		int ours = 0;
		for (int i = 0; i < N; i++)
			ours |= pid == (unsigned)kids[i] + PID_OFFSET;
		CHECK(ours, "NVML listed pid %u, not one of the container's processes (+%u)", pid, PID_OFFSET);
		while (*p == ' ')
			p++;
	}
	CHECK(nlisted >= 1 && listed == limit_mib * MiB, "listed %d processes holding %llu bytes", nlisted, listed);
	touch(&r, "done");
	for (int i = 0; i < N; i++)
		waitpid(kids[i], NULL, 0);
	if (fs)
		munmap(fs, sizeof(*fs));
	root_teardown(&r);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void test_sigkill(void)
{
	struct root r;
	root_setup(&r, "OK");
	const char *tag[] = { "holder" };
	pid_t holder = spawn(&r, LIBVGPU_TEST, PROBE("hold", "200"), NULL, tag[0]);
	int dummy;
	CHECK(wait_lines(&r, tag, 1, "held", &dummy) == 0, "holder did not allocate");
	struct run res;
	run(&r, LIBVGPU_TEST, PROBE("alloc", "100"), NULL, &res);
	CHECK_STR_CONTAINS(res.out, "alloc 100 MiB = 2"); /* 200 held: 100 more is over 256 */
	kill(holder, SIGKILL);
	waitpid(holder, NULL, 0);
	double t0 = now_s();
	run(&r, LIBVGPU_TEST, PROBE("alloc", "256"), NULL, &res);
	CHECK_STR_CONTAINS(res.out, "alloc 256 MiB = 0");
	printf("sigkill: the whole limit was allocatable %.0f ms after the holder was killed\n", (now_s() - t0) * 1e3);
	root_teardown(&r);
}

static void test_reconcile(void)
{
	struct root r;
	root_setup(&r, "OK");
	struct run res;
	const char *env[] = { "FAKE_CTX_OVERHEAD=67108864", NULL }; /* a 64 MiB context the hooks never see */
	run(&r, LIBVGPU_TEST, PROBE("info"), env, &res);
	CHECK_STR_CONTAINS(res.out, "cuMemGetInfo=0 free=201326592 total=268435456");
	run(&r, LIBVGPU_TEST, PROBE("alloc", "200", "192"), env, &res);
	CHECK_STR_CONTAINS(res.out, "alloc 200 MiB = 2");
	CHECK_STR_CONTAINS(res.out, "alloc 192 MiB = 0");
	root_teardown(&r);
}

static void test_prodlib(void)
{
	/* the shipped library ignores VGPU_TEST_ROOT: with a complete test root it still looks
	 * at the real container paths, which do not exist here, and refuses */
	struct root r;
	root_setup(&r, "OK");
	struct run res;
	run(&r, LIBVGPU_PROD, PROBE("init"), NULL, &res);
	CHECK_STR_CONTAINS(res.out, "cuInit=800");
	CHECK_STR_CONTAINS(res.err, "refusing to run CUDA");
	CHECK(strstr(res.err, r.dir) == NULL, "production library used the test root: %s", res.err);
	CHECK_EQ_INT(count_lines(r.log), 0);
	root_teardown(&r);
}

static void test_corelimit(void)
{
	struct root r;
	root_setup(&r, "OK");
	struct run res;
	const char *env[] = { "CUDA_CORE_LIMIT_0=30", "FAKE_NS_PER_BLOCK=1000", NULL };
	run(&r, LIBVGPU_TEST, PROBE("launch", "3", "1000"), env, &res);
	struct fake_state *fs = map_fake(&r);
	double elapsed = 0;
	char *at = strstr(res.out, "elapsed=");
	if (at)
		elapsed = atof(at + 8);
	CHECK(res.status == 0 && fs && elapsed > 0, "launch run: %d %s %s", res.status, res.out, res.err);
	if (fs && elapsed > 0) {
		double util = 100.0 * (double)fs->busy_total_ns[0] / (elapsed * 1e9);
		printf("corelimit: limit 30%%, fake GPU busy %.1f%% over %.1f s (wall clock, informational)\n", util, elapsed);
		CHECK(util < 80, "a 30%% core limit left the GPU %.0f%% busy: launches were not throttled", util);
		munmap(fs, sizeof(*fs));
	}
	root_teardown(&r);
}

int main(int argc, char **argv)
{
	static const struct test_case tests[] = {
		{ "routes", test_routes }, { "refusal", test_refusal }, { "untouched", test_untouched },
		{ "interposer", test_interposer }, { "exact", test_exact }, { "sigkill", test_sigkill },
		{ "reconcile", test_reconcile }, { "prodlib", test_prodlib }, { "corelimit", test_corelimit },
	};
	return test_dispatch(argc, argv, "preload_", tests, sizeof(tests) / sizeof(tests[0]));
}
