/* libvgpu-test.so preloaded into real processes over the fake driver and the scripted
 * registry: what an application in a vGPU container sees. Each container root gets the
 * vgpu.config the plugin would write, and the env the plugin injects (which the library
 * must not trust). One ctest per scenario:
 *   test_preload <routes|refusal|untouched|interposer|exact|sigkill|reconcile|prodlib|corelimit|
 *                 envignored|noconfig|forgedconfig|index16|pidns|crashcreate|fork|stdin|vmm|asyncfree|
 *                 ledgerlock|truncate|wake|allowance|arrays|graphs|ctxlimits|modules|devicecount|legacylaunch|graphcost|nvmlneighbours|pools> */
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../src/nvml_api.h"
#include "fake/fake_state.h"
#include "server/scripted_registry.h"
#include "test_util.h"

#define PID_OFFSET 100000u
#define MiB (1024ull * 1024ull)
#define POD_UID "0b7a2c6e-1f7e-4c9e-9d2a-3f1e5b6c7d8e"
#define OTHER_POD_UID "7d3e1f0a-2b4c-4d5e-8f6a-9b0c1d2e3f4a"
#define REGISTER_UUID "5f0c3a1e-8d2b-4e6f-9a1c-2b3d4e5f6a7b"
#define OTHER_UUID "GPU-99999999-2222-3333-4444-555555555555"

/* vgpu.config as the plugin writes it for the NRI path (contract §4): the header, then gpu
 * lines <nvml index> <uuid> <memory bytes> <core percent>. */
#define CFG_NRI "# vgpu.config written by the test\nversion 1\nclaim c1a2b3c4-d5e6-4f70-8192-a3b4c5d6e7f8\n" \
		"pod " POD_UID "\ncontainer app\n"
#define CFG_GPU0(mem, core) "gpu 0 " FAKE_DEFAULT_UUID " " #mem " " #core "\n"
#define CFG_256 CFG_NRI CFG_GPU0(268435456, 0)

struct root {
	char dir[64], sock[128], pids[160], log[160], state[160], config[160];
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

static void write_file(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text) || close(fd) != 0) {
		perror(path);
		exit(2);
	}
}

/* A container's view: registry socket, config dir with vgpu.config (none when config is
 * NULL), the two per-container directories. */
static void root_setup_config(struct root *r, const char *script, const char *config)
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
	snprintf(r->config, sizeof(r->config), "%s/etc/vgpu-dra/config/vgpu.config", r->dir);
	if (config != NULL)
		write_file(r->config, config);
	r->server = script ? scripted_registry_start(r->sock, script, r->pids, PID_OFFSET, r->log) : -1;
}

/* The default container: one GPU limited to 256 MiB, NRI identity. */
static void root_setup(struct root *r, const char *script)
{
	root_setup_config(r, script, CFG_256);
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

/* The env the plugin injects next to the file (contract §3-4), consistent with CFG_256. */
static const char *base_env[] = {
	"LD_LIBRARY_PATH=" FAKE_DIR,
	"FAKE_PID_OFFSET=100000",
	"MANAGER_VISIBLE_DEVICE_0=" FAKE_DEFAULT_UUID,
	"CUDA_MEM_LIMIT_0=256m",
	"CUDA_CORE_LIMIT_0=",
	"MANAGER_CLIENT_REGISTER_UUID=",
	"VGPU_POD_UID=" POD_UID,
	"VGPU_CONTAINER_NAME=app",
	"ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0",
	"PATH=/usr/bin:/bin",
	NULL,
};

/* env = base + root paths + preload, then extra ("K=V" sets, "K" removes). */
static char **build_env(struct root *r, const char *preload, const char *const *extra)
{
	static char buf[64][2048];
	static char *env[65];
	int n = 0;
	for (int i = 0; base_env[i]; i++)
		snprintf(buf[n++], 2048, "%s", base_env[i]);
	snprintf(buf[n++], 2048, "FAKE_GPU_STATE=%s", r->state);
	snprintf(buf[n++], 2048, "VGPU_TEST_ROOT=%s", r->dir);
	snprintf(buf[n++], 2048, "LD_PRELOAD=%s", preload);
	for (int i = 0; extra && extra[i]; i++) {
		const char *eq = strchr(extra[i], '=');
		size_t klen = eq ? (size_t)(eq - extra[i]) : strlen(extra[i]);
		int found = 0;
		for (int k = 0; k < n; k++) {
			if (strncmp(buf[k], extra[i], klen) == 0 && buf[k][klen] == '=') {
				if (eq)
					snprintf(buf[k], 2048, "%s", extra[i]);
				else
					buf[k][0] = '\0';
				found = 1;
			}
		}
		if (!found && eq)
			snprintf(buf[n++], 2048, "%s", extra[i]);
	}
	int m = 0;
	for (int k = 0; k < n; k++)
		if (buf[k][0])
			env[m++] = buf[k];
	env[m] = NULL;
	return env;
}

/* Starts argv with the container's env, stdout/stderr to <tag>.out/.err. With pidns it runs
 * in a PID namespace of its own, as PID 1 there (like a container's first process): the
 * forked child unshares, forks the program and passes its exit status on; *target is the
 * program's PID as this test sees it (what to SIGKILL). */
static pid_t spawn_in(struct root *r, const char *preload, char *const argv[], const char *const *extra,
		      const char *tag, int pidns, pid_t *target)
{
	char **env = build_env(r, preload, extra);
	char out[256], err[256];
	snprintf(out, sizeof(out), "%s/%s.out", r->dir, tag);
	snprintf(err, sizeof(err), "%s/%s.err", r->dir, tag);
	int tell[2];
	if (pipe(tell) != 0)
		return -1;
	pid_t pid = fork();
	if (pid == 0) {
		close(tell[0]);
		int o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644), e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0)
			_exit(126);
		pid_t self = getpid();
		if (pidns) {
			if (unshare(CLONE_NEWPID) != 0) {
				fprintf(stderr, "unshare(CLONE_NEWPID): %s\n", strerror(errno));
				_exit(125);
			}
			pid_t inner = fork();
			if (inner < 0)
				_exit(125);
			if (inner > 0) {
				if (write(tell[1], &inner, sizeof(inner)) != sizeof(inner))
					_exit(125);
				int st;
				if (waitpid(inner, &st, 0) != inner)
					_exit(125);
				if (WIFSIGNALED(st))
					raise(WTERMSIG(st) == SIGKILL ? SIGKILL : SIGTERM);
				_exit(WIFEXITED(st) ? WEXITSTATUS(st) : 125);
			}
			/* the program dies with its parent (the test kills the program itself) */
			if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
				_exit(125);
		} else if (write(tell[1], &self, sizeof(self)) != sizeof(self)) {
			_exit(125);
		}
		close(tell[1]);
		execve(argv[0], argv, env);
		_exit(127);
	}
	close(tell[1]);
	pid_t prog = -1;
	if (pid < 0 || read(tell[0], &prog, sizeof(prog)) != sizeof(prog))
		prog = -1;
	close(tell[0]);
	if (target != NULL)
		*target = prog;
	return pid;
}

static pid_t spawn(struct root *r, const char *preload, char *const argv[], const char *const *extra, const char *tag)
{
	return spawn_in(r, preload, argv, extra, tag, 0, NULL);
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

static void finish(struct root *r, pid_t pid, const char *tag, struct run *res)
{
	int st = 0;
	if (waitpid(pid, &st, 0) != pid)
		st = -1;
	res->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
	collect(r, tag, res);
}

static void run_in(struct root *r, const char *preload, char *const argv[], const char *const *extra, int pidns,
		   struct run *res)
{
	static int seq;
	char tag[32];
	snprintf(tag, sizeof(tag), "run%d", seq++);
	pid_t pid = spawn_in(r, preload, argv, extra, tag, pidns, NULL);
	finish(r, pid, tag, res);
}

static void run(struct root *r, const char *preload, char *const argv[], const char *const *extra, struct run *res)
{
	run_in(r, preload, argv, extra, 0, res);
}

#define PROBE(...) ((char *const[]){ PROBE_BIN, __VA_ARGS__, NULL })

/* Files in a container directory whose name starts with prefix. */
static int count_files(struct root *r, const char *rel, const char *prefix)
{
	char path[256];
	snprintf(path, sizeof(path), "%s%s", r->dir, rel);
	DIR *d = opendir(path);
	if (d == NULL)
		return -1;
	int n = 0;
	for (struct dirent *e; (e = readdir(d)) != NULL;)
		n += e->d_name[0] != '.' && strncmp(e->d_name, prefix, strlen(prefix)) == 0;
	closedir(d);
	return n;
}

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
	const char *routes[] = { "linked", "dlsym", "default", "next", "oldsym", "vsymdefault", "vsymnext",
				 "procaddr" };
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
	const char *config;        /* vgpu.config; NULL: the default (256 MiB, NRI identity) */
	const char *env[6];
	const char *message;       /* what the user reads on stderr */
};

#define CFG_17_GPUS                                                                                  \
	"gpu 0 " FAKE_DEFAULT_UUID " 268435456 0\n"                                                  \
	"gpu 1 GPU-00000001-0000-0000-0000-000000000000 0 0\ngpu 2 GPU-00000002-0000-0000-0000-000000000000 0 0\n" \
	"gpu 3 GPU-00000003-0000-0000-0000-000000000000 0 0\ngpu 4 GPU-00000004-0000-0000-0000-000000000000 0 0\n" \
	"gpu 5 GPU-00000005-0000-0000-0000-000000000000 0 0\ngpu 6 GPU-00000006-0000-0000-0000-000000000000 0 0\n" \
	"gpu 7 GPU-00000007-0000-0000-0000-000000000000 0 0\ngpu 8 GPU-00000008-0000-0000-0000-000000000000 0 0\n" \
	"gpu 9 GPU-00000009-0000-0000-0000-000000000000 0 0\ngpu 10 GPU-00000010-0000-0000-0000-000000000000 0 0\n" \
	"gpu 11 GPU-00000011-0000-0000-0000-000000000000 0 0\ngpu 12 GPU-00000012-0000-0000-0000-000000000000 0 0\n" \
	"gpu 13 GPU-00000013-0000-0000-0000-000000000000 0 0\ngpu 14 GPU-00000014-0000-0000-0000-000000000000 0 0\n" \
	"gpu 15 GPU-00000015-0000-0000-0000-000000000000 0 0\ngpu 16 GPU-00000016-0000-0000-0000-000000000000 0 0\n"

static void test_refusal(void)
{
	const struct refusal_case cases[] = {
		{ "memory ledger dir missing", "OK", "/tmp/.vmem_node", NULL, { NULL },
		  "/tmp/.vmem_node is missing: the container was created without its vGPU directories" },
		{ "core dir missing", "OK", "/tmp/.vgpu_lock", NULL, { NULL }, "/tmp/.vgpu_lock is missing" },
		{ "no identity", "OK", NULL, "version 1\n" CFG_GPU0(268435456, 0), { NULL },
		  "vgpu.config names no registration identity" },
		{ "registry denies", "DENIED", NULL, NULL, { NULL },
		  "registration with the node's vGPU registry failed: DENIED: scripted answer" },
		{ "registry not found", "NOT_FOUND", NULL, "version 1\nregister " REGISTER_UUID "\n" CFG_GPU0(268435456, 0),
		  { "MANAGER_CLIENT_REGISTER_UUID=" REGISTER_UUID, NULL }, "failed: NOT_FOUND" },
		{ "duplicate uuid", "OK", NULL, CFG_256 "gpu 4 " FAKE_DEFAULT_UUID " 0 0\n", { NULL },
		  "line 7: GPU " FAKE_DEFAULT_UUID " is listed twice (also on line 6)" },
		{ "duplicate index", "OK", NULL, CFG_256 "gpu 0 " OTHER_UUID " 0 0\n", { NULL },
		  "line 7: NVML index 0 is listed twice (also on line 6)" },
		{ "unlisted gpu", "OK", NULL, NULL, { "FAKE_GPU_DEVICES=" FAKE_DEFAULT_UUID ":16384," OTHER_UUID ":8192", NULL },
		  "CUDA device 1 (" OTHER_UUID ") is visible but vgpu.config has no gpu line for it" },
		{ "no gpu line", "OK", NULL, "version 1\n", { "MANAGER_VISIBLE_DEVICE_0", "CUDA_MEM_LIMIT_0", NULL },
		  "CUDA device 0 (" FAKE_DEFAULT_UUID ") is visible but vgpu.config has no gpu line for it" },
		{ "malformed limit", "OK", NULL, CFG_NRI CFG_GPU0(4096m, 0), { NULL },
		  "line 6: the memory limit \"4096m\" is not a number of bytes" },
		{ "core over 100", "OK", NULL, CFG_NRI CFG_GPU0(0, 101), { NULL },
		  "line 6: the core limit \"101\" is not a percentage 0-100" },
		{ "other version", "OK", NULL, "# a newer plugin\nversion 2\n" CFG_GPU0(268435456, 0), { NULL },
		  "has version 2; this library reads version 1" },
		{ "17 gpu lines", "OK", NULL, CFG_NRI CFG_17_GPUS, { NULL }, "line 22: more than 16 gpu lines" },
		{ "pod twice", "OK", NULL, CFG_256 "pod " OTHER_POD_UID "\n", { NULL }, "line 7: pod appears twice" },
		{ "no newline at the end", "OK", NULL,
		  "version 1\npod " POD_UID "\ncontainer app\ngpu 0 " FAKE_DEFAULT_UUID " 268435456 0",
		  { NULL }, "line 4 does not end with a newline" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct refusal_case *c = &cases[i];
		struct root r;
		root_setup_config(&r, c->script, c->config ? c->config : CFG_256);
		if (c->remove_dir) {
			char path[256];
			snprintf(path, sizeof(path), "%s%s", r.dir, c->remove_dir);
			rmdir(path);
		}
		struct run res;
		run(&r, LIBVGPU_TEST, PROBE("init"), c->env, &res);
		CHECK(res.status == 0, "%s: the application must keep running (exit %d)", c->name, res.status);
		CHECK(strstr(res.out, "cuInit=800") != NULL, "%s: %s", c->name, res.out);
		CHECK_STR_CONTAINS(res.err, "refusing to run CUDA without the container's vGPU limits");
		CHECK(strstr(res.err, c->message) != NULL, "%s: stderr \"%s\" does not say \"%s\"", c->name, res.err,
		      c->message);
		if (strcmp(c->name, "unlisted gpu") != 0 && strcmp(c->name, "no gpu line") != 0) {
			CHECK_STR_CONTAINS(res.out, "nvmlInit=4");
		}
		CHECK(strstr(res.out, "cuMemAlloc=0") == NULL && strstr(res.out, "cuLaunchKernel=0") == NULL,
		      "%s: a refused process must not allocate or launch: %s", c->name, res.out);
		/* said once, not per call */
		const char *first = strstr(res.err, "refusing");
		CHECK(first && strstr(first + 1, "refusing") == NULL, "%s: message repeated:\n%s", c->name, res.err);
		root_teardown(&r);
	}
	/* GPUs without limits (an admin-access container): no registration, nothing refused,
	 * nothing changed, nothing said */
	const char *unlimited[] = { CFG_NRI CFG_GPU0(0, 0), CFG_NRI CFG_GPU0(0, 100) };
	for (size_t i = 0; i < sizeof(unlimited) / sizeof(unlimited[0]); i++) {
		struct root r;
		root_setup_config(&r, "DENIED", unlimited[i]);
		struct run res;
		const char *env[] = { "CUDA_MEM_LIMIT_0", NULL };
		run(&r, LIBVGPU_TEST, PROBE("init"), env, &res);
		CHECK(strstr(res.out, "cuInit=0") && strstr(res.out, "cuMemAlloc=0"), "unlimited config %zu: %s", i, res.out);
		CHECK(res.err[0] == '\0', "unlimited config %zu: stderr %s", i, res.err);
		CHECK_EQ_INT(count_lines(r.log), 0);
		root_teardown(&r);
	}
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
	CHECK_EQ_INT(count_files(&r, "/tmp/.vmem_node", ""), 0); /* no ledger */
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
	root_setup_config(&r, "OK", CFG_NRI CFG_GPU0(268435456, 30));
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

/* The wake signal (contract §16): on a GPU with a core limit, the process's first launch writes
 * core.wake (mode 0666, whatever the umask), launches back to back do not, a graph launch after
 * an idle spell does. A GPU without a core limit has no allowance to wake: nothing is written. */
static void test_wake(void)
{
	struct root r;
	root_setup_config(&r, "OK", CFG_NRI CFG_GPU0(268435456, 30));
	struct run res;
	const char *env[] = { "CUDA_CORE_LIMIT_0=30", "FAKE_NS_PER_BLOCK=0", NULL };
	run(&r, LIBVGPU_TEST, PROBE("wake", r.dir), env, &res);
	CHECK(res.status == 0, "wake run: %d %s %s", res.status, res.out, res.err);
	CHECK_STR_CONTAINS(res.out, "first written size=1");
	CHECK_STR_CONTAINS(res.out, "burst unwritten");
	CHECK_STR_CONTAINS(res.out, "idle-graph written");
	char path[256];
	snprintf(path, sizeof(path), "%s/tmp/.vgpu_lock/core.wake", r.dir);
	struct stat st;
	CHECK(stat(path, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0777) == 0666 && st.st_size == 1,
	      "core.wake: mode %o size %lld", (unsigned)st.st_mode, (long long)st.st_size);
	root_teardown(&r);

	root_setup(&r, "OK"); /* a memory limit only */
	run(&r, LIBVGPU_TEST, PROBE("wake", r.dir), NULL, &res);
	CHECK(res.status == 0, "wake run without a core limit: %d %s %s", res.status, res.out, res.err);
	CHECK_STR_CONTAINS(res.out, "first missing");
	CHECK_STR_CONTAINS(res.out, "idle-graph missing");
	root_teardown(&r);
}

/* The value after "<line> rate=" and "target=" in the probe's output, or 0. */
static void rate_line(const char *out, const char *line, unsigned long long *rate, unsigned *target)
{
	char key[32];
	snprintf(key, sizeof(key), "%s rate=", line);
	const char *at = strstr(out, key);
	*rate = 0, *target = 0;
	if (at != NULL && sscanf(at + strlen(key), "%llu target=%u", rate, target) != 2)
		*rate = 0, *target = 0;
}

/* Following an allowance quickly (contract §16): a launch VGPU_ALLOWANCE_CHECK_NS after the
 * file changed scales the container's shared rate by new / old, without waiting for a control
 * step; the change is applied once, so a later process of the container finds the rate right and
 * scales it only at the next change. */
static void test_allowance(void)
{
	struct root r;
	root_setup_config(&r, "OK", CFG_NRI CFG_GPU0(268435456, 30));
	const char *env[] = { "CUDA_CORE_LIMIT_0=30", "FAKE_NS_PER_BLOCK=0", NULL };
	struct {
		int pct;
		unsigned before_target;
	} steps[] = { { 15, 30 }, { 30, 15 }, { 60, 30 } };
	unsigned long long last = 0;
	for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
		char pct[8];
		snprintf(pct, sizeof(pct), "%d", steps[i].pct);
		struct run res;
		run(&r, LIBVGPU_TEST, PROBE("follow", r.dir, FAKE_DEFAULT_UUID, pct), env, &res);
		unsigned long long before, after;
		unsigned bt, at;
		rate_line(res.out, "before", &before, &bt);
		rate_line(res.out, "after", &after, &at);
		CHECK(res.status == 0 && before > 0 && after > 0, "follow %d: %d %s %s", steps[i].pct, res.status, res.out,
		      res.err);
		CHECK(bt == steps[i].before_target, "follow %d: the rate was recorded for %u%%, want %u%%: %s", steps[i].pct,
		      bt, steps[i].before_target, res.out);
		CHECK(last == 0 || before == last, "follow %d: a new process found the rate at %llu, the last left %llu "
		      "(a change applied twice?)", steps[i].pct, before, last);
		unsigned long long want = (unsigned long long)((double)before * steps[i].pct / steps[i].before_target);
		CHECK(after == want && at == (unsigned)steps[i].pct,
		      "follow %d: rate %llu -> %llu (want %llu), target %u: %s", steps[i].pct, before, after, want, at, res.out);
		last = after;
	}
	root_teardown(&r);
}

/* The last registration the scripted registry logged names the file's identity. */
static void expect_registered_as(struct root *r, const char *what, const char *identity)
{
	char log[16384];
	slurp(r->log, log, sizeof(log));
	char *line = log;
	for (char *p = log; (p = strchr(p, '\n')) != NULL && p[1] != '\0'; p++)
		line = p + 1;
	CHECK(log[0] != '\0' && strstr(line, identity) != NULL, "%s: registered as \"%s\", want %s", what, line, identity);
}

/* Blanking, unsetting or rewriting each variable the library used to trust changes nothing:
 * allocation past the file's limit is still CUDA_ERROR_OUT_OF_MEMORY (2), the process
 * registers with the file's identity, and a set value that differs is named once on stderr. */
static void test_envignored(void)
{
	static const struct { const char *env[4]; const char *warned; } cases[] = {
		{ { "CUDA_MEM_LIMIT_0=", NULL }, "CUDA_MEM_LIMIT_0" },
		{ { "CUDA_MEM_LIMIT_0", NULL }, NULL },
		{ { "CUDA_MEM_LIMIT_0=16384m", NULL }, "CUDA_MEM_LIMIT_0" },
		{ { "MANAGER_VISIBLE_DEVICE_0=", NULL }, "MANAGER_VISIBLE_DEVICE_0" },
		{ { "MANAGER_VISIBLE_DEVICE_0", NULL }, NULL },
		{ { "MANAGER_VISIBLE_DEVICE_0=" OTHER_UUID, NULL }, "MANAGER_VISIBLE_DEVICE_0" },
		{ { "MANAGER_VISIBLE_DEVICE_0=", "MANAGER_VISIBLE_DEVICE_5=" FAKE_DEFAULT_UUID, "CUDA_MEM_LIMIT_5=16384m", NULL },
		  "MANAGER_VISIBLE_DEVICE_5" },
		{ { "VGPU_POD_UID=", NULL }, "VGPU_POD_UID" },
		{ { "VGPU_POD_UID", NULL }, NULL },
		{ { "VGPU_POD_UID=" OTHER_POD_UID, NULL }, "VGPU_POD_UID" },
		{ { "VGPU_CONTAINER_NAME=", NULL }, "VGPU_CONTAINER_NAME" },
		{ { "VGPU_CONTAINER_NAME", NULL }, NULL },
		{ { "VGPU_CONTAINER_NAME=other", NULL }, "VGPU_CONTAINER_NAME" },
		{ { "MANAGER_CLIENT_REGISTER_UUID=" REGISTER_UUID, NULL }, "MANAGER_CLIENT_REGISTER_UUID" },
	};
	struct root r;
	root_setup(&r, "OK");
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char what[160];
		snprintf(what, sizeof(what), "%s%s", cases[i].env[0], cases[i].env[1] ? ", ..." : "");
		struct run res;
		run(&r, LIBVGPU_TEST, PROBE("alloc", "200", "57"), cases[i].env, &res);
		CHECK(strstr(res.out, "alloc 200 MiB = 0") && strstr(res.out, "alloc 57 MiB = 2"),
		      "%s: the file's 256 MiB limit must hold: %s%s", what, res.out, res.err);
		expect_registered_as(&r, what, "pod=" POD_UID " name=app uuid= ");
		if (cases[i].warned != NULL) {
			CHECK(strstr(res.err, cases[i].warned) && strstr(res.err, "ignored"), "%s: stderr \"%s\" does not name %s",
			      what, res.err, cases[i].warned);
			const char *first = strstr(res.err, "libvgpu");
			CHECK(first && strstr(first + 1, "libvgpu") == NULL, "%s: more than one line:\n%s", what, res.err);
		} else {
			CHECK(res.err[0] == '\0', "%s: an unset variable is not a difference: %s", what, res.err);
		}
	}
	root_teardown(&r);

	/* the core limit: blanked, unset or raised to 100 in the env, launches stay throttled */
	static const char *const core_env[][3] = {
		{ "CUDA_CORE_LIMIT_0=", "FAKE_NS_PER_BLOCK=1000", NULL },
		{ "CUDA_CORE_LIMIT_0", "FAKE_NS_PER_BLOCK=1000", NULL },
		{ "CUDA_CORE_LIMIT_0=100", "FAKE_NS_PER_BLOCK=1000", NULL },
	};
	for (size_t i = 0; i < sizeof(core_env) / sizeof(core_env[0]); i++) {
		root_setup_config(&r, "OK", CFG_NRI CFG_GPU0(268435456, 30));
		struct run res;
		run(&r, LIBVGPU_TEST, PROBE("launch", "2", "1000"), core_env[i], &res);
		struct fake_state *fs = map_fake(&r);
		char *at = strstr(res.out, "elapsed=");
		double elapsed = at ? atof(at + 8) : 0;
		CHECK(res.status == 0 && fs && elapsed > 0, "%s: launch run: %d %s %s", core_env[i][0], res.status, res.out,
		      res.err);
		if (fs && elapsed > 0) {
			double util = 100.0 * (double)fs->busy_total_ns[0] / (elapsed * 1e9);
			CHECK(util < 80, "%s: the file's 30%% core limit left the GPU %.0f%% busy", core_env[i][0], util);
		}
		if (fs)
			munmap(fs, sizeof(*fs));
		root_teardown(&r);
	}
}

/* No vgpu.config: the container was created without its configuration. Whatever the env
 * says (the plugin's limits, or nothing at all), CUDA and NVML are refused. */
static void test_noconfig(void)
{
	static const char *const envs[][5] = {
		{ NULL },
		{ "CUDA_MEM_LIMIT_0", "MANAGER_VISIBLE_DEVICE_0", "VGPU_POD_UID", "VGPU_CONTAINER_NAME", NULL },
	};
	for (size_t i = 0; i < sizeof(envs) / sizeof(envs[0]); i++) {
		struct root r;
		root_setup_config(&r, "OK", NULL);
		struct run res;
		run(&r, LIBVGPU_TEST, PROBE("init"), envs[i], &res);
		CHECK(res.status == 0, "env %zu: the application must keep running (exit %d)", i, res.status);
		CHECK(strstr(res.out, "cuInit=800") && strstr(res.out, "nvmlInit=4") && !strstr(res.out, "cuMemAlloc=0"),
		      "env %zu: %s", i, res.out);
		CHECK_STR_CONTAINS(res.err, "refusing to run CUDA without the container's vGPU limits");
		CHECK_STR_CONTAINS(res.err, "/etc/vgpu-dra/config/vgpu.config is missing: the container was created without "
					    "its vGPU configuration");
		CHECK_EQ_INT(count_lines(r.log), 0);
		root_teardown(&r);
	}
}

/* A vgpu.config that is not on the node's read-only mount (a tenant renamed /etc/vgpu-dra and
 * planted its own directory): the shipped library refuses it, as it refuses a missing one. The
 * test library checks only with VGPU_TEST_CONFIG_MOUNT set (the suite's configs are in ordinary
 * directories); test_config proves the check against real read-only mounts. */
static void test_forgedconfig(void)
{
	struct root r;
	root_setup_config(&r, "OK", CFG_256);
	struct run res;
	const char *const env[] = { "VGPU_TEST_CONFIG_MOUNT=1", NULL };
	run(&r, LIBVGPU_TEST, PROBE("init"), env, &res);
	CHECK(res.status == 0, "the application must keep running (exit %d)", res.status);
	CHECK(strstr(res.out, "cuInit=800") && strstr(res.out, "nvmlInit=4") && !strstr(res.out, "cuMemAlloc=0"), "%s",
	      res.out);
	CHECK_STR_CONTAINS(res.err, "refusing to run CUDA without the container's vGPU limits");
	CHECK_STR_CONTAINS(res.err, "/etc/vgpu-dra/config/vgpu.config is on a writable file system, not the node's "
				    "read-only mount at");
	CHECK_EQ_INT(count_lines(r.log), 0);
	root_teardown(&r);
}

/* GPUs at NVML index 16 and above are limited: CUDA devices are matched by UUID to the
 * file's gpu lines, and the per-device state is kept by line, not by index. */
static void test_index16(void)
{
	char devices[2048] = "FAKE_GPU_DEVICES=";
	char uuid[18][48];
	for (int i = 0; i < 18; i++) {
		snprintf(uuid[i], sizeof(uuid[i]), "GPU-%08d-2222-3333-4444-555555555555", i);
		snprintf(devices + strlen(devices), sizeof(devices) - strlen(devices), "%s%s:16384", i ? "," : "", uuid[i]);
	}
	/* one GPU, the host's index 16, as a container sees it: CUDA device 0 */
	char cfg[1024], mgr[96];
	snprintf(cfg, sizeof(cfg), CFG_NRI "gpu 16 %s 268435456 0\n", uuid[16]);
	snprintf(mgr, sizeof(mgr), "MANAGER_VISIBLE_DEVICE_16=%s", uuid[16]);
	const char *env1[] = { devices, "CUDA_VISIBLE_DEVICES=16", "MANAGER_VISIBLE_DEVICE_0", "CUDA_MEM_LIMIT_0", mgr,
			       "CUDA_MEM_LIMIT_16=256m", NULL };
	struct root r;
	root_setup_config(&r, "OK", cfg);
	struct run res;
	run(&r, LIBVGPU_TEST, PROBE("alloc", "200", "57"), env1, &res);
	CHECK(strstr(res.out, "alloc 200 MiB = 0") && strstr(res.out, "alloc 57 MiB = 2"), "GPU 16: %s%s", res.out, res.err);
	run(&r, LIBVGPU_TEST, PROBE("info"), env1, &res);
	CHECK_STR_CONTAINS(res.out, "cuMemGetInfo=0 free=268435456 total=268435456");
	root_teardown(&r);

	/* two GPUs, 3 (512 MiB) and 17 (256 MiB), listed in that order, seen by CUDA as 17, 3 */
	snprintf(cfg, sizeof(cfg), CFG_NRI "gpu 3 %s 536870912 0\ngpu 17 %s 268435456 0\n", uuid[3], uuid[17]);
	const char *env2[] = { devices, "CUDA_VISIBLE_DEVICES=17,3", "MANAGER_VISIBLE_DEVICE_0", "CUDA_MEM_LIMIT_0", NULL };
	root_setup_config(&r, "OK", cfg);
	run(&r, LIBVGPU_TEST, PROBE("alloc", "200", "57"), env2, &res);
	CHECK(strstr(res.out, "alloc 200 MiB = 0") && strstr(res.out, "alloc 57 MiB = 2"), "GPU 17 as CUDA 0: %s%s",
	      res.out, res.err);
	root_teardown(&r);
}

/* Two containers of one claim (per-claim path) share the ledger but not a PID namespace:
 * each process here is PID 1 in a namespace of its own. Together they stay within the limit,
 * and a SIGKILLed one's usage is reclaimed. */
static void test_pidns(void)
{
	if (geteuid() != 0) {
		CHECK(0, "separate PID namespaces need root (unshare(CLONE_NEWPID))");
		return;
	}
	struct root r;
	root_setup(&r, "OK");
	pid_t holder;
	const char *tag[] = { "nsholder" };
	pid_t outer = spawn_in(&r, LIBVGPU_TEST, PROBE("hold", "200"), NULL, tag[0], 1, &holder);
	int dummy;
	CHECK(outer > 0 && holder > 0 && wait_lines(&r, tag, 1, "held", &dummy) == 0, "holder did not allocate");
	struct run res;
	collect(&r, tag[0], &res);
	CHECK(strstr(res.out, "pid 1\n") && strstr(res.out, "alloc 200 MiB = 0"), "holder: %s%s", res.out, res.err);
	run_in(&r, LIBVGPU_TEST, PROBE("alloc", "100", "56"), NULL, 1, &res);
	CHECK_STR_CONTAINS(res.out, "pid 1\n"); /* the same PID number as the holder */
	CHECK_STR_CONTAINS(res.out, "alloc 100 MiB = 2"); /* 200 held by the other namespace: over 256 */
	CHECK_STR_CONTAINS(res.out, "alloc 56 MiB = 0");  /* exactly the rest */
	CHECK(kill(holder, SIGKILL) == 0, "kill the holder: %s", strerror(errno));
	int st;
	CHECK(waitpid(outer, &st, 0) == outer && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "holder status %d", st);
	run_in(&r, LIBVGPU_TEST, PROBE("alloc", "256"), NULL, 1, &res);
	CHECK(strstr(res.out, "alloc 256 MiB = 0"), "the killed holder's 200 MiB were not reclaimed: %s%s", res.out, res.err);
	root_teardown(&r);
}

/* SIGKILL at each step of creating the ledger and the core-limit file (test hook
 * VGPU_TEST_CRASH_AT=<file>:<step>, libvgpu-test.so only): the next process still gets a
 * working ledger and limit, and the creation's temporary files do not pile up. */
static void test_crashcreate(void)
{
	static const char *const files[] = { "ledger.v2", "core.v3" };
	static const char *const steps[] = { "created", "sized", "initialised", "linked" };
	for (size_t f = 0; f < 2; f++) {
		for (size_t k = 0; k < 4; k++) {
			struct root r;
			root_setup_config(&r, "OK", CFG_NRI CFG_GPU0(268435456, 50));
			char at[64], what[64];
			snprintf(at, sizeof(at), "VGPU_TEST_CRASH_AT=%s:%s", files[f], steps[k]);
			snprintf(what, sizeof(what), "%s:%s", files[f], steps[k]);
			const char *env[] = { at, NULL };
			struct run res;
			run(&r, LIBVGPU_TEST, PROBE("alloc", "200"), env, &res);
			CHECK(res.status == 128 + SIGKILL, "%s: the creating process was not killed there (exit %d)", what,
			      res.status);
			run(&r, LIBVGPU_TEST, PROBE("alloc", "200", "57"), NULL, &res);
			CHECK(strstr(res.out, "alloc 200 MiB = 0") && strstr(res.out, "alloc 57 MiB = 2"),
			      "%s: the next process: %s%s", what, res.out, res.err);
			const char *dir = f == 0 ? "/tmp/.vmem_node" : "/tmp/.vgpu_lock";
			char tmp_prefix[64];
			snprintf(tmp_prefix, sizeof(tmp_prefix), "%s.tmp", files[f]);
			if (k < 3) /* killed before the link: the next creator removed the leftover */
				CHECK(count_files(&r, dir, tmp_prefix) == 0, "%s: temporary files left in %s", what, dir);
			CHECK_EQ_INT(count_files(&r, dir, files[f]) - count_files(&r, dir, tmp_prefix), 1);
			root_teardown(&r);
		}
	}
}

/* A forked child takes a slot of its own: what it held is given back when it exits, and the
 * parent's own reservation is untouched. */
static void test_fork(void)
{
	struct root r;
	root_setup(&r, "OK");
	struct run res;
	run(&r, LIBVGPU_TEST, PROBE("fork", "100", "100", "156"), NULL, &res);
	CHECK_STR_CONTAINS(res.out, "parent alloc 100 MiB = 0");
	CHECK_STR_CONTAINS(res.out, "child alloc 100 MiB = 0");
	CHECK_STR_CONTAINS(res.out, "parent alloc 156 MiB = 0");
	run(&r, LIBVGPU_TEST, PROBE("fork", "200", "100", "57"), NULL, &res);
	CHECK_STR_CONTAINS(res.out, "child alloc 100 MiB = 2"); /* the parent's 200 count in the child */
	CHECK_STR_CONTAINS(res.out, "parent alloc 57 MiB = 2");
	root_teardown(&r);
}

/* The application's descriptors are its own: stdin still reads what it was given after the
 * library registered and opened its files (it used to close descriptor 0 on the first call). */
static void test_stdin(void)
{
	struct root r;
	root_setup(&r, "OK");
	struct run res;
	run(&r, LIBVGPU_TEST, ((char *const[]){ "/bin/sh", "-c", "echo hello | " PROBE_BIN " stdin", NULL }), NULL, &res);
	CHECK_STR_CONTAINS(res.out, "alloc = 0");
	CHECK_STR_CONTAINS(res.out, "stdin: hello\n");
	root_teardown(&r);
}

/* The virtual memory API: the driver frees a handle's memory when its last reference and its
 * last mapping are gone. The CUDA Programming Guide releases the handle right after mapping
 * it; in a loop that must stop at the limit (it used to run until the device was full: the
 * release gave the bytes back while they stayed mapped). */
static void test_vmm(void)
{
	struct root r;
	root_setup(&r, "OK");
	struct run res;
	run(&r, LIBVGPU_TEST, PROBE("vmm", "16", "64"), NULL, &res);
	CHECK_STR_CONTAINS(res.out, "vmm mapped 16 x 16 MiB, then 2\n"); /* 256 MiB: cuMemCreate refused */
	CHECK_STR_CONTAINS(res.out, "alloc 16 MiB = 2");                  /* full while mapped */
	CHECK_STR_CONTAINS(res.out, "unmapped 16\n");
	CHECK_STR_CONTAINS(res.out, "after unmap alloc 256 MiB = 0");     /* the last unmap gives back */
	struct fake_state *fs = map_fake(&r);
	CHECK(fs != NULL && fs->peak[0] <= 256 * MiB, "the device held %llu MiB for a 256 MiB limit",
	      fs ? (unsigned long long)(fs->peak[0] / MiB) : 0ull);
	if (fs)
		munmap(fs, sizeof(*fs));

	/* references: a retained handle and a second mapping keep the memory charged */
	run(&r, LIBVGPU_TEST, PROBE("vmmrefs", "200"), NULL, &res);
	CHECK(strstr(res.out, "retain = 0") && strstr(res.out, "release = 0") && strstr(res.out, "unmap = 0"), "%s%s",
	      res.out, res.err);
	CHECK_STR_CONTAINS(res.out, "retained, released once, unmapped: alloc 200 MiB = 2");
	CHECK_STR_CONTAINS(res.out, "both references released: alloc 200 MiB = 0");
	CHECK_STR_CONTAINS(res.out, "mapped twice, released, one unmapped: alloc 200 MiB = 2");
	CHECK_STR_CONTAINS(res.out, "both mappings gone: alloc 200 MiB = 0");
	fs = map_fake(&r);
	CHECK(fs != NULL && fs->peak[0] <= 256 * MiB, "the device held %llu MiB for a 256 MiB limit",
	      fs ? (unsigned long long)(fs->peak[0] / MiB) : 0ull);
	if (fs)
		munmap(fs, sizeof(*fs));
	root_teardown(&r);
}

/* A stream-ordered free runs when its stream reaches it, and only then does the driver have the
 * memory back: queued behind work that does not end, its bytes stay charged (they used to be
 * given back when the free was queued), and come back once the stream has gone past it. */
static void test_asyncfree(void)
{
	static const char *const variants[] = { "stream", "ptsz" };
	for (size_t i = 0; i < 2; i++) {
		struct root r;
		root_setup(&r, "OK");
		struct run res;
		run(&r, LIBVGPU_TEST, PROBE("asyncfree", "200", (char *)variants[i]), NULL, &res);
		CHECK(strstr(res.out, "allocAsync 200 MiB = 0") && strstr(res.out, "freeAsync = 0"), "%s: %s%s", variants[i],
		      res.out, res.err);
		CHECK(strstr(res.out, "free queued, stream held: alloc 200 MiB = 2"), "%s: %s", variants[i], res.out);
		CHECK(strstr(res.out, "stream let go: alloc 200 MiB = 0"), "%s: %s", variants[i], res.out);
		struct fake_state *fs = map_fake(&r);
		CHECK(fs != NULL && fs->peak[0] <= 256 * MiB, "%s: the device held %llu MiB for a 256 MiB limit", variants[i],
		      fs ? (unsigned long long)(fs->peak[0] / MiB) : 0ull);
		if (fs)
			munmap(fs, sizeof(*fs));
		root_teardown(&r);
	}
}

/* Two GPUs, GPU 0 limited to 256 MiB and GPU 1 to 1 GiB, GPU 1's context current: what is
 * allocated on GPU 0 counts against GPU 0's limit, however the allocation names GPU 0 (a pool
 * of its, created or the default or current one, by device or by location; a stream of its
 * context; with no context current at all); a pool libvgpu never saw created is refused until
 * it is set as a device's pool; GPU 1's default stream counts against GPU 1. */
#define GPU1_UUID "GPU-22222222-2222-3333-4444-555555555555"
static void test_pools(void)
{
	static const char *const on_gpu0[] = {
		"pool created", "pool created ptsz", "pool default", "pool current", "async stream", "async stream ptsz",
		"no context async", "no context pool", "pool set", "async stream, set pool",
	};
	static const char *const vias[] = { "device", "location" };
	const char *env[] = { "FAKE_GPU_DEVICES=" FAKE_DEFAULT_UUID ":16384," GPU1_UUID ":16384",
			      "MANAGER_VISIBLE_DEVICE_1=" GPU1_UUID, "CUDA_MEM_LIMIT_1=1024m", NULL };
	for (size_t v = 0; v < 2; v++) {
		struct root r;
		root_setup_config(&r, "OK", CFG_NRI CFG_GPU0(268435456, 0) "gpu 1 " GPU1_UUID " 1073741824 0\n");
		struct run res;
		run(&r, LIBVGPU_TEST, PROBE("pools", (char *)vias[v]), env, &res);
		CHECK(res.status == 0, "pools %s: exit %d\n%s%s", vias[v], res.status, res.out, res.err);
		for (size_t i = 0; i < sizeof(on_gpu0) / sizeof(on_gpu0[0]); i++) {
			char want[2][96];
			snprintf(want[0], sizeof(want[0]), "%s first = 0\n", on_gpu0[i]);
			snprintf(want[1], sizeof(want[1]), "%s second = 2\n", on_gpu0[i]);
			for (int k = 0; k < 2; k++)
				CHECK(strstr(res.out, want[k]) != NULL, "%s: want \"%s\" in\n%s%s", vias[v], want[k], res.out,
				      res.err);
		}
		CHECK_STR_CONTAINS(res.out, "unknown pool = 801\n"); /* CUDA_ERROR_NOT_SUPPORTED */
		CHECK_STR_CONTAINS(res.err, "a memory pool the library did not see created");
		CHECK_STR_CONTAINS(res.out, "set unknown pool = 0\n");
		CHECK_STR_CONTAINS(res.out, "destroy = 0\n");
		CHECK_STR_CONTAINS(res.out, "gpu 1 default stream 900 MiB = 0\n");
		CHECK_STR_CONTAINS(res.out, "gpu 1 default stream 200 MiB = 2\n");
		struct fake_state *fs = map_fake(&r);
		CHECK(fs != NULL && fs->peak[0] <= 256 * MiB && fs->peak[1] <= 1024 * MiB,
		      "%s: the devices held %llu and %llu MiB for limits of 256 and 1024 MiB", vias[v],
		      fs ? (unsigned long long)(fs->peak[0] / MiB) : 0ull, fs ? (unsigned long long)(fs->peak[1] / MiB) : 0ull);
		if (fs)
			munmap(fs, sizeof(*fs));
		root_teardown(&r);
	}
}

/* What the device held at most: the limit must hold on the device, not only in the ledger. */
static void check_peak(struct root *r, const char *what)
{
	struct fake_state *fs = map_fake(r);
	CHECK(fs != NULL && fs->peak[0] <= 256 * MiB, "%s: the device held %llu MiB for a 256 MiB limit", what,
	      fs ? (unsigned long long)(fs->peak[0] / MiB) : 0ull);
	if (fs)
		munmap(fs, sizeof(*fs));
}

/* CUDA arrays (cudaMallocArray, textures) take device memory: over the limit they are refused,
 * while one is held the rest of the limit is what is left, and destroying it gives it back. */
static void test_arrays(void)
{
	static const char *const variants[] = { "2d", "2d_v1", "3d", "3d_v1", "mipmapped" };
	struct root r;
	root_setup(&r, "OK");
	struct run res;
	run(&r, LIBVGPU_TEST, PROBE("arrays"), NULL, &res);
	CHECK(res.status == 0, "arrays: exit %d\n%s%s", res.status, res.out, res.err);
	for (size_t i = 0; i < sizeof(variants) / sizeof(variants[0]); i++) {
		const char *v = variants[i];
		char want[4][96];
		snprintf(want[0], sizeof(want[0]), "%s over the limit = 2\n", v);
		snprintf(want[1], sizeof(want[1]), "%s half = 0\n", v);
		snprintf(want[2], sizeof(want[2]), "%s held: alloc 200 MiB = 2\n", v);
		snprintf(want[3], sizeof(want[3]), "%s destroyed: alloc 200 MiB = 0\n", v);
		for (int k = 0; k < 4; k++)
			CHECK(strstr(res.out, want[k]) != NULL, "%s: want \"%s\" in\n%s%s", v, want[k], res.out, res.err);
	}
	check_peak(&r, "arrays");
	root_teardown(&r);
}

/* Graphs' memory allocation nodes are charged to the executable graph: through every
 * instantiation entry point, over the limit it is refused; while an executable of half the
 * limit lives the rest is what is left, and cuGraphExecDestroy gives it back. A destroyed node
 * or graph is not charged (the fake hands the graph's handle out again); a clone carries its
 * nodes. */
static void test_graphs(void)
{
	static const char *const vias[] = { "plain", "v2", "flags", "params", "params_ptsz", "procaddr11", "procaddr12" };
	static const char *const want[] = {
		"node destroy = 0\n", "node destroyed: instantiate = 0\n",
		"graph handle reused = 1\n", "graph destroyed: instantiate = 0\n",
		"clone = 0\n", "find in clone = 0\n", "clone over the limit = 2\n",
		"clone node destroy = 0\n", "clone node destroyed: instantiate = 0\n",
		"clone half = 0\n", "clone held: alloc 200 MiB = 2\n", "clone destroyed: alloc 200 MiB = 0\n",
	};
	struct root r;
	root_setup(&r, "OK");
	struct run res;
	run(&r, LIBVGPU_TEST, PROBE("graphs"), NULL, &res);
	CHECK(res.status == 0, "graphs: exit %d\n%s%s", res.status, res.out, res.err);
	for (size_t i = 0; i < sizeof(vias) / sizeof(vias[0]); i++) {
		const char *v = vias[i];
		char w[5][96];
		snprintf(w[0], sizeof(w[0]), "%s over the limit = 2\n", v);
		snprintf(w[1], sizeof(w[1]), "%s half = 0\n", v);
		snprintf(w[2], sizeof(w[2]), "%s held: alloc 200 MiB = 2\n", v);
		snprintf(w[3], sizeof(w[3]), "%s exec destroy = 0\n", v);
		snprintf(w[4], sizeof(w[4]), "%s destroyed: alloc 200 MiB = 0\n", v);
		for (int k = 0; k < 5; k++)
			CHECK(strstr(res.out, w[k]) != NULL, "%s: want \"%s\" in\n%s%s", v, w[k], res.out, res.err);
	}
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		CHECK(strstr(res.out, want[i]) != NULL, "want \"%s\" in\n%s%s", want[i], res.out, res.err);
	check_peak(&r, "graphs");
	root_teardown(&r);
}

/* cuCtxSetLimit: the device heap is charged its size, the stack its size per resident thread
 * (the fake device holds 16 x 2048); past the limit the call is refused, a smaller value later
 * gives the difference back. */
static void test_ctxlimits(void)
{
	static const char *const want[] = {
		"set heap 512 MiB = 2\n", "heap 512 MiB: alloc 200 MiB = 0\n",
		"set heap 128 MiB = 0\n", "heap 128 MiB: alloc 200 MiB = 2\n",
		"set heap 16 MiB = 0\n", "heap 16 MiB: alloc 200 MiB = 0\n",
		"set stack 16 KiB = 2\n", /* 512 MiB of stacks */
		"set stack 4 KiB = 0\n", "stack 4 KiB: alloc 200 MiB = 2\n", /* 128 MiB + the heap */
		"set stack 1 KiB = 0\n", "stack 1 KiB: alloc 200 MiB = 0\n", /* 32 MiB + 16 MiB + 200 MiB */
	};
	struct root r;
	root_setup(&r, "OK");
	struct run res;
	run(&r, LIBVGPU_TEST, PROBE("limits"), NULL, &res);
	CHECK(res.status == 0, "limits: exit %d\n%s%s", res.status, res.out, res.err);
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		CHECK(strstr(res.out, want[i]) != NULL, "want \"%s\" in\n%s%s", want[i], res.out, res.err);
	check_peak(&r, "limits");
	root_teardown(&r);
}

/* Every device CUDA counts must be matched to a gpu line: a driver that counts 80 (past the 64
 * the library maps) or one whose UUID it cannot give is refused, never run unaccounted. */
static void test_devicecount(void)
{
	static const char *const counts[] = { "FAKE_DEVICE_COUNT=80", "FAKE_DEVICE_COUNT=2" };
	static const char *const want[] = { "CUDA sees 80 devices, more than the 64 the library maps",
					    "cuDeviceGetUuid(1) failed with 101: the device cannot be matched to a gpu line" };
	for (int i = 0; i < 2; i++) {
		struct root r;
		root_setup(&r, "OK");
		struct run res;
		const char *env[] = { counts[i], NULL };
		run(&r, LIBVGPU_TEST, PROBE("alloc", "300"), env, &res);
		CHECK(strstr(res.out, "cuInit=800") != NULL && strstr(res.out, "alloc 300 MiB = 0") == NULL,
		      "%s: want CUDA refused (800):\n%s%s", counts[i], res.out, res.err);
		CHECK_STR_CONTAINS(res.err, want[i]);
		check_peak(&r, counts[i]);
		root_teardown(&r);
	}
}

/* A module's globals take device memory the library cannot size from the image: NVML's figure
 * is read at the next allocation after a load, so 200 MiB of globals count against a 256 MiB
 * limit at once (not up to a second later), and an unload gives them back at once. Every load
 * entry point, modules and libraries. */
static void test_modules(void)
{
	static const char *const vias[] = { "data", "dataex", "fatbinary", "file", "library", "libraryfile" };
	struct root r;
	root_setup(&r, "OK");
	struct run res;
	run(&r, LIBVGPU_TEST, PROBE("modules"), NULL, &res);
	CHECK(res.status == 0, "modules: exit %d\n%s%s", res.status, res.out, res.err);
	CHECK(strstr(res.out, "alloc 16 MiB = 0\n") != NULL, "%s%s", res.out, res.err);
	for (size_t i = 0; i < sizeof(vias) / sizeof(vias[0]); i++) {
		const char *v = vias[i];
		char want[4][96];
		snprintf(want[0], sizeof(want[0]), "%s load = 0\n", v);
		snprintf(want[1], sizeof(want[1]), "%s loaded: alloc 200 MiB = 2\n", v);
		snprintf(want[2], sizeof(want[2]), "%s unload = 0\n", v);
		snprintf(want[3], sizeof(want[3]), "%s unloaded: alloc 200 MiB = 0\n", v);
		for (int k = 0; k < 4; k++)
			CHECK(strstr(res.out, want[k]) != NULL, "%s: want \"%s\" in\n%s%s", v, want[k], res.out, res.err);
	}
	check_peak(&r, "modules");
	root_teardown(&r);
}

/* The legacy launch entry points are throttled like cuLaunchKernel (see corelimit). */
static void test_legacylaunch(void)
{
	static const struct { const char *via, *blocks, *ns_per_block; } cases[] = {
		{ "grid", "1000", "FAKE_NS_PER_BLOCK=1000" },
		{ "gridasync", "1000", "FAKE_NS_PER_BLOCK=1000" },
		{ "legacy", "1", "FAKE_NS_PER_BLOCK=1000000" }, /* cuLaunch runs one block */
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct root r;
		root_setup_config(&r, "OK", CFG_NRI CFG_GPU0(268435456, 30));
		struct run res;
		const char *env[] = { "CUDA_CORE_LIMIT_0=30", cases[i].ns_per_block, NULL };
		run(&r, LIBVGPU_TEST, PROBE("launch", "2", (char *)cases[i].blocks, (char *)cases[i].via), env, &res);
		struct fake_state *fs = map_fake(&r);
		double elapsed = 0;
		char *at = strstr(res.out, "elapsed=");
		if (at)
			elapsed = atof(at + 8);
		CHECK(res.status == 0 && fs && elapsed > 0, "%s: %d %s %s", cases[i].via, res.status, res.out, res.err);
		if (fs && elapsed > 0) {
			double util = 100.0 * (double)fs->busy_total_ns[0] / (elapsed * 1e9);
			printf("legacylaunch %s: limit 30%%, fake GPU busy %.1f%% over %.1f s (informational)\n", cases[i].via,
			       util, elapsed);
			CHECK(util < 80, "%s: a 30%% core limit left the GPU %.0f%% busy: launches were not throttled",
			      cases[i].via, util);
		}
		if (fs)
			munmap(fs, sizeof(*fs));
		root_teardown(&r);
	}
}

/* A graph launch is charged the blocks of its kernels (counted at instantiation), not a fixed
 * cost: a graph of 10^5 kernels of 1,000 blocks (0.1 s of the fake GPU at 1 ns a block),
 * launched back to back under a 30% core limit, is held to the limit from its second launch.
 * Charged a fixed 1,024 blocks, its six launches would fit in the bucket's first 10,000
 * tokens and keep the GPU busy all along. Flat, and inside a parent graph's child graph node. */
static void test_graphcost(void)
{
	static const char *shapes[] = { "flat", "child" };
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
		struct root r;
		root_setup_config(&r, "OK", CFG_NRI CFG_GPU0(268435456, 30));
		struct run res;
		const char *env[] = { "CUDA_CORE_LIMIT_0=30", "FAKE_NS_PER_BLOCK=250", NULL };
		run(&r, LIBVGPU_TEST, PROBE("graphlaunch", "100000", "4", "6", (char *)shapes[i]), env, &res);
		struct fake_state *fs = map_fake(&r);
		double elapsed = 0;
		char *at = strstr(res.out, "elapsed=");
		if (at)
			elapsed = atof(at + 8);
		CHECK(res.status == 0 && fs && elapsed > 0, "%s: %d %s %s", shapes[i], res.status, res.out, res.err);
		CHECK_STR_CONTAINS(res.out, "exec destroy = 0");
		if (fs && elapsed > 0) {
			double busy_s = (double)fs->busy_total_ns[0] / 1e9;
			double util = 100.0 * busy_s / elapsed;
			printf("graphcost %s: limit 30%%, fake GPU busy %.2f s over %.2f s of launches = %.1f%% (informational)\n",
			       shapes[i], busy_s, elapsed, util);
			/* six launches of 10^8 blocks (the child shape: one block more) */
			CHECK(fs->busy_total_ns[0] >= 600000000ull, "%s: the fake GPU ran %.2f s, not the graph's six launches",
			      shapes[i], busy_s);
			CHECK(util < 80, "%s: a 30%% core limit left the GPU %.0f%% busy: graph launches were not throttled",
			      shapes[i], util);
		}
		if (fs)
			munmap(fs, sizeof(*fs));
		root_teardown(&r);
	}
}

/* finish, but a program still running after limit_s is a hang: killed and reported. */
static void finish_within(struct root *r, pid_t pid, const char *tag, int limit_s, struct run *res)
{
	for (int i = 0; i < limit_s * 100; i++) {
		int st;
		pid_t w = waitpid(pid, &st, WNOHANG);
		if (w == pid) {
			res->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
			collect(r, tag, res);
			return;
		}
		usleep(10000);
	}
	kill(pid, SIGKILL);
	finish(r, pid, tag, res);
	CHECK(0, "%s still ran after %d s: it hung", tag, limit_s);
}

static int ledger_lock(struct root *r, short type)
{
	char path[256];
	snprintf(path, sizeof(path), "%s/tmp/.vmem_node/ledger.v2", r->dir);
	static int fd = -1;
	if (fd < 0)
		fd = open(path, O_RDWR);
	struct flock fl = { .l_type = type, .l_whence = SEEK_SET, .l_start = 0, .l_len = 352 /* the header */ };
	int rc = fd >= 0 ? fcntl(fd, F_OFD_SETLK, &fl) : -1;
	if (type == F_UNLCK && fd >= 0) {
		close(fd);
		fd = -1;
	}
	return rc;
}

/* Another process of the claim holds the ledger's header lock and never lets go: the
 * application's allocation is refused with a reason after a bounded wait, it does not hang. */
static void test_ledgerlock(void)
{
	struct root r;
	root_setup(&r, "OK");
	struct run res;
	run(&r, LIBVGPU_TEST, PROBE("alloc", "10"), NULL, &res); /* the ledger exists */
	CHECK_STR_CONTAINS(res.out, "alloc 10 MiB = 0");
	CHECK(ledger_lock(&r, F_WRLCK) == 0, "lock the ledger's header: %s", strerror(errno));
	pid_t pid = spawn(&r, LIBVGPU_TEST, PROBE("alloc", "100"), NULL, "locked");
	finish_within(&r, pid, "locked", 60, &res);
	CHECK(res.status == 0, "exit %d: %s", res.status, res.err);
	CHECK_STR_CONTAINS(res.out, "alloc 100 MiB = 999");
	CHECK_STR_CONTAINS(res.err, "tmp/.vmem_node/ledger.v2 has been locked by another process for more than 5 s");
	ledger_lock(&r, F_UNLCK);
	run(&r, LIBVGPU_TEST, PROBE("alloc", "100"), NULL, &res);
	CHECK_STR_CONTAINS(res.out, "alloc 100 MiB = 0");
	root_teardown(&r);
}

static int wait_exists(struct root *r, const char *rel)
{
	char path[256];
	snprintf(path, sizeof(path), "%s%s", r->dir, rel);
	for (int i = 0; i < 3000; i++, usleep(10000))
		if (access(path, F_OK) == 0)
			return 0;
	return -1;
}

/* Another process of the claim truncates the shared files while an application uses them: it
 * used to die of SIGBUS at its next allocation, free or launch. Now the ledger refuses what
 * needs it, saying why, and the launches go on limited by the process's own buckets. */
static void test_truncate(void)
{
	struct root r;
	root_setup(&r, "OK");
	const char *tags[] = { "trunc" };
	pid_t pid = spawn(&r, LIBVGPU_TEST, PROBE("fill", "4", r.dir), NULL, tags[0]);
	int n;
	CHECK(wait_lines(&r, tags, 1, "filled ", &n) == 0 && n == 64, "fill: %d chunks", n);
	char path[256];
	snprintf(path, sizeof(path), "%s/tmp/.vmem_node/ledger.v2", r.dir);
	CHECK(truncate(path, 0) == 0, "truncate %s", path);
	touch(&r, "free");
	CHECK(wait_lines(&r, tags, 1, "freed ", &n) == 0, "free did not finish");
	touch(&r, "refill");
	CHECK(wait_lines(&r, tags, 1, "refilled ", &n) == 0 && n == 0, "refilled %d after the truncation", n);
	touch(&r, "done");
	struct run res;
	finish_within(&r, pid, tags[0], 60, &res);
	CHECK(res.status == 0, "the application was killed (exit %d): %s", res.status, res.err);
	CHECK_STR_CONTAINS(res.err, "tmp/.vmem_node/ledger.v2 was truncated while in use");
	struct fake_state *fs = map_fake(&r);
	CHECK(fs != NULL && fs->peak[0] <= 256 * MiB, "the device held %llu MiB for a 256 MiB limit",
	      fs ? (unsigned long long)(fs->peak[0] / MiB) : 0ull);
	if (fs)
		munmap(fs, sizeof(*fs));
	root_teardown(&r);

	root_setup_config(&r, "OK", CFG_NRI CFG_GPU0(268435456, 30));
	const char *env[] = { "CUDA_CORE_LIMIT_0=30", "FAKE_NS_PER_BLOCK=1000", NULL };
	pid = spawn(&r, LIBVGPU_TEST, PROBE("launch", "3", "1000"), env, "coretrunc");
	CHECK(wait_exists(&r, "/tmp/.vgpu_lock/core.v3") == 0, "no core-limit file");
	snprintf(path, sizeof(path), "%s/tmp/.vgpu_lock/core.v3", r.dir);
	CHECK(truncate(path, 0) == 0, "truncate %s", path);
	finish_within(&r, pid, "coretrunc", 60, &res);
	CHECK(res.status == 0 && strstr(res.out, "launches="), "the application was killed (exit %d): %s%s", res.status,
	      res.out, res.err);
	CHECK_STR_CONTAINS(res.err, "the core-limit file was truncated while in use");
	fs = map_fake(&r);
	char *at = strstr(res.out, "elapsed=");
	double elapsed = at ? atof(at + 8) : 0;
	if (fs && elapsed > 0) {
		double util = 100.0 * (double)fs->busy_total_ns[0] / (elapsed * 1e9);
		CHECK(util < 80, "a 30%% core limit left the GPU %.0f%% busy after the truncation", util);
	}
	if (fs)
		munmap(fs, sizeof(*fs));
	root_teardown(&r);
}

/* One line of "vgpu_probe nvmlviews": every listing of it shows exactly the PIDs in want
 * (want_n of them; 0 for none) with NVML's size protocol, and never the neighbour. */
static void check_view(const char *out, const char *call, const unsigned *want, int want_n, unsigned neighbour,
		       int empty_ret, int query_ret)
{
	char key[48];
	snprintf(key, sizeof(key), "\n%s query=", call);
	const char *at = strstr(out, key);
	CHECK(at != NULL, "no %s line: %s", call, out);
	if (at == NULL)
		return;
	at += strlen(key) - strlen("query=");
	int rq, rs, rl;
	unsigned q, sm, n;
	CHECK(sscanf(at, "query=%d/%u small=%d/%u list=%d/%u", &rq, &q, &rs, &sm, &rl, &n) == 6, "%s: %.200s", call,
	      at);
	const char *pids = strstr(at, "pids=");
	const char *eol = strchr(at, '\n');
	CHECK(pids != NULL && eol != NULL && pids < eol, "%s: %.200s", call, at);
	if (pids == NULL || eol == NULL)
		return;
	int listed = 0, saw_neighbour = 0, all_wanted = 1;
	for (const char *p = pids + 5; p < eol;) {
		char *end;
		unsigned pid = (unsigned)strtoul(p, &end, 10);
		if (end == p)
			break;
		listed++;
		saw_neighbour |= pid == neighbour;
		int wanted = 0;
		for (int k = 0; k < want_n; k++)
			wanted |= pid == want[k];
		all_wanted &= wanted;
		p = end;
		while (*p == ' ')
			p++;
	}
	CHECK(!saw_neighbour, "%s showed the neighbour's PID %u: %.200s", call, neighbour, at);
	CHECK(all_wanted && listed == want_n, "%s listed %d PIDs, want %d of the container's: %.200s", call, listed,
	      want_n, at);
	if (want_n == 0) {
		/* nothing of the container's: the empty answer every way it is asked */
		CHECK(rq == empty_ret && q == 0 && rs == empty_ret && sm == 0 && rl == empty_ret && n == 0,
		      "%s with nothing of the container's: %.200s", call, at);
		return;
	}
	/* a NULL buffer and a buffer of 0 records ask for the count: the container's only */
	CHECK(rq == query_ret && q == (unsigned)want_n, "%s NULL query: %.200s", call, at);
	CHECK(rs == query_ret && sm == (unsigned)want_n, "%s buffer of 0: %.200s", call, at);
	CHECK(rl == NVML_SUCCESS && n == (unsigned)want_n, "%s list: %.200s", call, at);
}

static const char *const process_views[] = {
	"compute_v1", "compute_v2", "compute_v3", "graphics_v1", "graphics_v2", "graphics_v3", "mps_v1", "mps_v2",
	"mps_v3", "accounting_pids", "details_mode0", "details_mode1", "details_mode2",
};
static const char *const session_views[] = { "encoder_sessions", "fbc_sessions" };
static const char *const sample_views[] = { "samples", "util_info" };

/* A neighbour on the same GPU (a process of no container of this claim: never registered,
 * not in pids.config) holds memory and keeps launching. Every NVML listing of processes, of
 * their samples, sessions and accounting shows the container only its own; the same probe
 * without the library sees the neighbour everywhere (the fake lists it: the checks can fail). */
static void test_nvmlneighbours(void)
{
	struct root r;
	root_setup(&r, "OK");
	const char *tag[] = { "neighbour" };
	const char *bare[] = { "LD_PRELOAD", NULL };
	pid_t nb = spawn(&r, "", PROBE("busy", "16"), bare, tag[0]);
	int dummy;
	CHECK(wait_lines(&r, tag, 1, "busy", &dummy) == 0, "the neighbour did not start");
	unsigned neighbour = (unsigned)nb + PID_OFFSET;
	char arg[16];
	snprintf(arg, sizeof(arg), "%u", neighbour);

	/* without a launch first: a process of the container that ran stays in pids.config and in
	 * the samples of the next second */
	for (int launch = 0; launch <= 1; launch++) {
		struct run res;
		run(&r, LIBVGPU_TEST, PROBE("nvmlviews", arg, launch ? "1" : "0"), NULL, &res);
		CHECK(res.status == 0, "nvmlviews %d: exit %d %s %s", launch, res.status, res.out, res.err);
		const char *at = strstr(res.out, "pid ");
		unsigned self = at ? (unsigned)atoi(at + 4) + PID_OFFSET : 0;
		for (size_t i = 0; i < sizeof(process_views) / sizeof(process_views[0]); i++)
			check_view(res.out, process_views[i], &self, 1, neighbour, NVML_SUCCESS,
				   NVML_ERROR_INSUFFICIENT_SIZE);
		/* sessions: a count of 0 is NVML's question, answered NVML_SUCCESS */
		for (size_t i = 0; i < sizeof(session_views) / sizeof(session_views[0]); i++)
			check_view(res.out, session_views[i], &self, 1, neighbour, NVML_SUCCESS, NVML_SUCCESS);
		/* samples: its own launch, or none of the container's (NVML's "no sample" answer) */
		for (size_t i = 0; i < sizeof(sample_views) / sizeof(sample_views[0]); i++)
			check_view(res.out, sample_views[i], &self, launch, neighbour, NVML_ERROR_NOT_FOUND,
				   NVML_ERROR_INSUFFICIENT_SIZE);
		CHECK_STR_CONTAINS(res.out, "stats_neighbour=6"); /* NVML_ERROR_NOT_FOUND */
		CHECK_STR_CONTAINS(res.out, "stats_own=0");
	}

	/* the control: without the library the neighbour is in every listing (its samples only if
	 * it launched in the last second: asked again a few times on a machine too loaded for that) */
	struct run res;
	const char *every[sizeof(process_views) / sizeof(process_views[0]) + 4];
	size_t nviews = 0;
	for (size_t i = 0; i < sizeof(process_views) / sizeof(process_views[0]); i++)
		every[nviews++] = process_views[i];
	for (size_t i = 0; i < 2; i++) {
		every[nviews++] = session_views[i];
		every[nviews++] = sample_views[i];
	}
	const char *missing = NULL;
	for (int attempt = 0; attempt < 5; attempt++) {
		run(&r, "", PROBE("nvmlviews", arg, "1"), bare, &res);
		missing = NULL;
		for (size_t i = 0; i < nviews && missing == NULL; i++) {
			const char *call = every[i];
			char key[64], want[24];
			snprintf(key, sizeof(key), "\n%s query=", call);
			snprintf(want, sizeof(want), " %u ", neighbour);
			const char *at = strstr(res.out, key);
			const char *eol = at ? strchr(at + 1, '\n') : NULL;
			const char *hit = at ? strstr(at, want) : NULL;
			if (hit == NULL || eol == NULL || hit > eol)
				missing = call;
		}
		if (missing == NULL)
			break;
	}
	CHECK(res.status == 0, "nvmlviews without the library: exit %d %s %s", res.status, res.out, res.err);
	CHECK(missing == NULL, "the fake did not list the neighbour in %s: %s", missing ? missing : "", res.out);
	CHECK_STR_CONTAINS(res.out, "stats_neighbour=0");
	kill(nb, SIGKILL);
	waitpid(nb, NULL, 0);
	root_teardown(&r);
}

int main(int argc, char **argv)
{
	static const struct test_case tests[] = {
		{ "routes", test_routes }, { "refusal", test_refusal }, { "untouched", test_untouched },
		{ "interposer", test_interposer }, { "exact", test_exact }, { "sigkill", test_sigkill },
		{ "reconcile", test_reconcile }, { "prodlib", test_prodlib }, { "corelimit", test_corelimit },
		{ "envignored", test_envignored }, { "noconfig", test_noconfig }, { "forgedconfig", test_forgedconfig }, { "index16", test_index16 },
		{ "pidns", test_pidns }, { "crashcreate", test_crashcreate }, { "fork", test_fork }, { "stdin", test_stdin },
		{ "vmm", test_vmm }, { "asyncfree", test_asyncfree },
		{ "ledgerlock", test_ledgerlock }, { "truncate", test_truncate }, { "wake", test_wake },
		{ "allowance", test_allowance }, { "arrays", test_arrays }, { "graphs", test_graphs }, { "ctxlimits", test_ctxlimits }, { "modules", test_modules },
		{ "devicecount", test_devicecount },
		{ "legacylaunch", test_legacylaunch }, { "graphcost", test_graphcost }, { "nvmlneighbours", test_nvmlneighbours },
		{ "pools", test_pools },
	};
	return test_dispatch(argc, argv, "preload_", tests, sizeof(tests) / sizeof(tests[0]));
}
