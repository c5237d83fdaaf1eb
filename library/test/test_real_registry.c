/* libvgpu-test.so preloaded into the probe (over the fake driver) registers against the
 * project's REAL Go registry server: test/registryserver, which runs pkg/registry with its
 * targets read from a JSON file (re-read on every lookup, so a test flips "synced" or adds
 * a target by renaming a new file over it). What is asserted is what a user sees: the
 * probe's return codes and stderr, and the pids.config the server wrote.
 * One ctest per scenario:
 *   test_real_registry <nri|perclaim|retry|not_found|restart|missing_dir|ledger>
 * The per-claim path decides the caller's pod by its cgroup alone, so that scenario
 * creates a real pod-like cgroup (as root, like the Go registry tests) and starts the
 * probe inside it. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fake/fake_state.h"
#include "test_util.h"

#define POD_UID "0b7a2c6e-1f7e-4c9e-9d2a-3f1e5b6c7d8e"
#define OTHER_POD_UID "7d3e1f0a-2b4c-4d5e-8f6a-9b0c1d2e3f4a"
#define REGISTER_UUID "5f0c3a1e-8d2b-4e6f-9a1c-2b3d4e5f6a7b"
#define CLAIM_UID "c1a2b3c4-d5e6-4f70-8192-a3b4c5d6e7f8"
#define GPU_LINE "gpu 0 " FAKE_DEFAULT_UUID " 268435456 0\n" /* 256 MiB */
/* vgpu.config as the plugin writes it (contract §4), per path */
#define CONFIG_NRI "version 1\nclaim " CLAIM_UID "\npod " POD_UID "\ncontainer app\n" GPU_LINE
#define CONFIG_PERCLAIM "version 1\nclaim " CLAIM_UID "\nregister " REGISTER_UUID "\n" GPU_LINE

struct root {
	char dir[64], sock[128], config[128], pids[160], vgpu_config[160], targets[128], server_log[128];
	pid_t server;
	int lifeline; /* write end of the server's stdin: closing it ends the server */
};

struct run {
	int status;
	pid_t pid;
	double seconds;
	char out[16384], err[16384];
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void mkdir_p(const char *path)
{
	char p[256];
	snprintf(p, sizeof(p), "%s", path);
	for (char *s = p + 1; *s; s++) {
		if (*s == '/') {
			*s = '\0';
			mkdir(p, 0755);
			*s = '/';
		}
	}
	if (mkdir(p, 0755) != 0 && errno != EEXIST)
		perror(p);
}

static void slurp(const char *path, char *buf, size_t cap)
{
	buf[0] = '\0';
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return;
	size_t got = 0;
	ssize_t n;
	while (got < cap - 1 && (n = read(fd, buf + got, cap - 1 - got)) > 0)
		got += (size_t)n;
	buf[got] = '\0';
	close(fd);
}

static int count(const char *hay, const char *needle)
{
	int n = 0;
	for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle))
		n++;
	return n;
}

static void write_file(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text) || close(fd) != 0) {
		perror(path);
		exit(2);
	}
}

/* A container's view of the node (VGPU_TEST_ROOT): the registry directory, the config
 * directory with vgpu.config, the two per-container directories. */
static void root_setup(struct root *r, const char *vgpu_config)
{
	memset(r, 0, sizeof(*r));
	r->server = -1;
	r->lifeline = -1;
	snprintf(r->dir, sizeof(r->dir), "/tmp/vgr.XXXXXX");
	if (mkdtemp(r->dir) == NULL) {
		perror("mkdtemp");
		exit(2);
	}
	char p[256];
	snprintf(p, sizeof(p), "%s/etc/vgpu-dra/registry", r->dir);
	mkdir_p(p);
	snprintf(r->config, sizeof(r->config), "%s/etc/vgpu-dra/config", r->dir);
	mkdir_p(r->config);
	snprintf(p, sizeof(p), "%s/tmp/.vgpu_lock", r->dir);
	mkdir_p(p);
	snprintf(p, sizeof(p), "%s/tmp/.vmem_node", r->dir);
	mkdir_p(p);
	snprintf(r->sock, sizeof(r->sock), "%s/etc/vgpu-dra/registry/registry.sock", r->dir);
	snprintf(r->pids, sizeof(r->pids), "%s/pids.config", r->config);
	snprintf(r->vgpu_config, sizeof(r->vgpu_config), "%s/vgpu.config", r->config);
	write_file(r->vgpu_config, vgpu_config);
	snprintf(r->targets, sizeof(r->targets), "%s/targets.json", r->dir);
	snprintf(r->server_log, sizeof(r->server_log), "%s/server.log", r->dir);
}

/* Writes the targets file the way a test must change it under a running server: a new
 * file renamed over the old one. */
static void write_targets(struct root *r, const char *json)
{
	char tmp[160];
	snprintf(tmp, sizeof(tmp), "%s.tmp", r->targets);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0 || write(fd, json, strlen(json)) != (ssize_t)strlen(json) || close(fd) != 0 ||
	    rename(tmp, r->targets) != 0) {
		perror(tmp);
		exit(2);
	}
}

/* The NRI path's one container: (POD_UID, app), configDir, cgroup of the test process
 * (the server's parent), so every probe this test starts passes the peer check. */
static void nri_targets(struct root *r, int synced, const char *config_dir)
{
	char json[1024];
	snprintf(json, sizeof(json),
		 "{\"synced\": %s, \"containers\": [{\"podUID\": \"" POD_UID "\", \"containerName\": \"app\", "
		 "\"configDir\": \"%s\", \"cgroupOf\": \"parent\"}]}",
		 synced ? "true" : "false", config_dir);
	write_targets(r, json);
}

/* Starts the real server and waits for its READY line. Registrations are logged at -v=2. */
static int server_start(struct root *r)
{
	int in[2], out[2];
	if (pipe(in) != 0 || pipe(out) != 0)
		return -1;
	pid_t pid = fork();
	if (pid == 0) {
		int log = open(r->server_log, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (log < 0 || dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0 || dup2(log, 2) < 0)
			_exit(126);
		close(in[1]);
		close(out[0]);
		execl(REGISTRYSERVER_BIN, REGISTRYSERVER_BIN, "--socket", r->sock, "--targets", r->targets,
		      "--stdin-lifeline", "-v=2", (char *)NULL);
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	fcntl(in[1], F_SETFD, FD_CLOEXEC);
	r->server = pid;
	r->lifeline = in[1];
	char line[512];
	size_t got = 0;
	double deadline = now_s() + 30;
	while (now_s() < deadline && got < sizeof(line) - 1) {
		struct pollfd p = { .fd = out[0], .events = POLLIN };
		if (poll(&p, 1, 200) <= 0)
			continue;
		ssize_t n = read(out[0], line + got, sizeof(line) - 1 - got);
		if (n <= 0)
			break;
		got += (size_t)n;
		line[got] = '\0';
		if (strchr(line, '\n') != NULL)
			break;
	}
	line[got] = '\0';
	close(out[0]);
	char want[200];
	snprintf(want, sizeof(want), "READY %s\n", r->sock);
	if (strcmp(line, want) != 0) {
		char log[8192];
		slurp(r->server_log, log, sizeof(log));
		fprintf(stderr, "the registry server did not get ready: stdout \"%s\"\n%s\n", line, log);
		return -1;
	}
	return 0;
}

static void server_stop(struct root *r)
{
	if (r->server <= 0)
		return;
	close(r->lifeline);
	r->lifeline = -1;
	for (int i = 0; i < 500; i++) {
		if (waitpid(r->server, NULL, WNOHANG) == r->server) {
			r->server = -1;
			return;
		}
		usleep(10000);
	}
	fprintf(stderr, "the registry server ignored its lifeline: killed\n");
	kill(r->server, SIGKILL);
	waitpid(r->server, NULL, 0);
	r->server = -1;
}

static void root_teardown(struct root *r)
{
	server_stop(r);
	if (test_failures) {
		char log[16384];
		slurp(r->server_log, log, sizeof(log));
		fprintf(stderr, "--- registry server log ---\n%s---\n", log);
	}
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", r->dir);
	if (strncmp(r->dir, "/tmp/vgr.", 9) == 0 && system(cmd) != 0)
		fprintf(stderr, "cleanup of %s failed\n", r->dir);
}

static const char *base_env[] = {
	"LD_LIBRARY_PATH=" FAKE_DIR,
	"FAKE_PID_OFFSET=0", /* the fake NVML reports real PIDs: those the server lists */
	"MANAGER_VISIBLE_DEVICE_0=" FAKE_DEFAULT_UUID, /* what the plugin injects next to the file */
	"CUDA_MEM_LIMIT_0=256m",
	"ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0",
	"PATH=/usr/bin:/bin",
	NULL,
};

/* Starts the probe with the test library preloaded; extra env is appended (identity).
 * cgroup_procs: a cgroup.procs file the child joins before exec, or NULL. */
static pid_t spawn(struct root *r, char *const argv[], const char *const *extra, const char *cgroup_procs,
		   const char *tag)
{
	static char buf[32][512];
	char *env[33];
	int n = 0;
	for (int i = 0; base_env[i]; i++)
		snprintf(buf[n++], 512, "%s", base_env[i]);
	snprintf(buf[n++], 512, "FAKE_GPU_STATE=%s/fake.state", r->dir);
	snprintf(buf[n++], 512, "VGPU_TEST_ROOT=%s", r->dir);
	snprintf(buf[n++], 512, "LD_PRELOAD=%s", LIBVGPU_TEST);
	for (int i = 0; extra && extra[i] && n < 32; i++)
		snprintf(buf[n++], 512, "%s", extra[i]);
	for (int i = 0; i < n; i++)
		env[i] = buf[i];
	env[n] = NULL;
	char out[256], err[256];
	snprintf(out, sizeof(out), "%s/%s.out", r->dir, tag);
	snprintf(err, sizeof(err), "%s/%s.err", r->dir, tag);
	pid_t pid = fork();
	if (pid == 0) {
		int o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644), e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0)
			_exit(126);
		if (cgroup_procs != NULL) {
			char self[32];
			int len = snprintf(self, sizeof(self), "%d\n", (int)getpid());
			int fd = open(cgroup_procs, O_WRONLY);
			if (fd < 0 || write(fd, self, (size_t)len) != len) {
				fprintf(stderr, "cannot join %s: %s\n", cgroup_procs, strerror(errno));
				_exit(125);
			}
			close(fd);
		}
		execve(argv[0], argv, env);
		_exit(127);
	}
	return pid;
}

static void finish(struct root *r, pid_t pid, const char *tag, double t0, struct run *res)
{
	int st = 0;
	if (waitpid(pid, &st, 0) != pid)
		st = -1;
	res->seconds = now_s() - t0;
	res->pid = pid;
	res->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
	char path[256];
	snprintf(path, sizeof(path), "%s/%s.out", r->dir, tag);
	slurp(path, res->out, sizeof(res->out));
	snprintf(path, sizeof(path), "%s/%s.err", r->dir, tag);
	slurp(path, res->err, sizeof(res->err));
}

static void run(struct root *r, char *const argv[], const char *const *extra, const char *cgroup_procs,
		struct run *res)
{
	static int seq;
	char tag[32];
	snprintf(tag, sizeof(tag), "run%d", seq++);
	double t0 = now_s();
	pid_t pid = spawn(r, argv, extra, cgroup_procs, tag);
	finish(r, pid, tag, t0, res);
}

#define PROBE(...) ((char *const[]){ PROBE_BIN, __VA_ARGS__, NULL })
static const char *const nri_identity[] = { "VGPU_POD_UID=" POD_UID, "VGPU_CONTAINER_NAME=app", NULL };

/* The user's view of a process that registered and runs under its 256 MiB limit. */
static void expect_enforced(const char *what, const struct run *res)
{
	CHECK(res->status == 0, "%s: exit %d\n%s%s", what, res->status, res->out, res->err);
	CHECK_STR_CONTAINS(res->out, "alloc 200 MiB = 0");
	CHECK_STR_CONTAINS(res->out, "alloc 100 MiB = 2"); /* 300 MiB is over the limit: out of memory */
	CHECK(res->err[0] == '\0', "%s: stderr: %s", what, res->err);
}

/* The user's view of a refused process: cuInit 800, NVML no permission, one line on
 * stderr, the process still running (exit 0 from the probe). */
static void expect_refused(const char *what, const struct run *res, const char *message)
{
	CHECK(res->status == 0, "%s: the application must keep running (exit %d)\n%s", what, res->status, res->err);
	CHECK_STR_CONTAINS(res->out, "cuInit=800");
	CHECK_STR_CONTAINS(res->out, "nvmlInit=4");
	CHECK(strstr(res->out, "cuMemAlloc=0") == NULL, "%s: a refused process allocated: %s", what, res->out);
	CHECK_STR_CONTAINS(res->err, "refusing to run CUDA without the container's vGPU limits");
	CHECK_STR_CONTAINS(res->err, message);
}

/* pids.config as contract §6 says: decimal, ascending, one per line, each ending in \n,
 * mode 0644. Returns the number of PIDs, -1 if malformed; *has says whether pid is listed. */
static int check_pids_file(const char *path, pid_t pid, int *has)
{
	char buf[65536];
	struct stat st;
	*has = 0;
	CHECK(stat(path, &st) == 0, "pids.config %s: %s", path, strerror(errno));
	CHECK((st.st_mode & 07777) == 0644, "pids.config mode %o", (unsigned)(st.st_mode & 07777));
	slurp(path, buf, sizeof(buf));
	int n = 0;
	long prev = 0;
	for (char *p = buf; *p;) {
		char *end;
		long v = strtol(p, &end, 10);
		if (end == p || *end != '\n' || v <= prev) {
			CHECK(0, "pids.config is not ascending decimal lines: \"%s\"", buf);
			return -1;
		}
		*has |= v == (long)pid;
		prev = v;
		n++;
		p = end + 1;
	}
	return n;
}

/* ---------------------------------------------------------------------------------- */

/* NRI path: VGPU_POD_UID + VGPU_CONTAINER_NAME → OK; the server writes pids.config, the
 * library reads it, and allocation works within the limit. */
static void test_nri(void)
{
	struct root r;
	root_setup(&r, CONFIG_NRI);
	nri_targets(&r, 1, r.config);
	CHECK(server_start(&r) == 0, "server start");
	struct run res;
	run(&r, PROBE("alloc", "200", "100"), nri_identity, NULL, &res);
	expect_enforced("NRI path", &res);
	int has;
	int n = check_pids_file(r.pids, res.pid, &has);
	CHECK(n >= 2 && has, "pids.config lists %d PIDs, the probe (%d) %s", n, (int)res.pid, has ? "among them" : "missing");
	server_stop(&r);
	char log[65536];
	slurp(r.server_log, log, sizeof(log));
	CHECK_EQ_INT(count(log, "\"Registration\""), 1);
	CHECK_STR_CONTAINS(log, "status=\"OK\" pod=\"" POD_UID "\" container=\"app\"");
	CHECK_STR_CONTAINS(log, "clientVersion=\"libvgpu/");
	printf("nri: registered and enforced in %.0f ms; pids.config lists %d PIDs\n", res.seconds * 1e3, n);
	root_teardown(&r);
}

/* Where the server takes its cgroups from (contract §5): v1 pids where mounted, else v2. */
static int cgroup_mount(char *mount, size_t len)
{
	FILE *f = fopen("/proc/self/mountinfo", "r");
	char line[1024], v2[256] = "";
	int found = 0;
	while (f && !found && fgets(line, sizeof(line), f)) {
		char root[256], mp[256], fstype[64], opts[512];
		const char *sep = strstr(line, " - ");
		if (sep == NULL || sscanf(line, "%*s %*s %*s %255s %255s", root, mp) != 2 ||
		    sscanf(sep + 3, "%63s %*s %511s", fstype, opts) != 2 || strcmp(root, "/") != 0)
			continue;
		char o[520];
		snprintf(o, sizeof(o), ",%s,", opts);
		if (strcmp(fstype, "cgroup") == 0 && strstr(o, ",pids,") != NULL) {
			snprintf(mount, len, "%s", mp);
			found = 1;
		} else if (strcmp(fstype, "cgroup2") == 0 && v2[0] == '\0') {
			snprintf(v2, sizeof(v2), "%s", mp);
		}
	}
	if (f)
		fclose(f);
	if (!found && v2[0] != '\0') {
		snprintf(mount, len, "%s", v2);
		found = 1;
	}
	return found ? 0 : -1;
}

/* Per-claim path: MANAGER_CLIENT_REGISTER_UUID → OK for a caller in a container cgroup of
 * a pod the claim is reserved for. The image's stale VGPU_POD_UID / VGPU_CONTAINER_NAME
 * (malformed here) must not be sent: the server would answer INVALID. */
static void test_perclaim(void)
{
	if (geteuid() != 0) {
		CHECK(0, "the per-claim test creates a cgroup and needs root (as the Go registry tests do)");
		return;
	}
	char mount[256], top[320], ctr[512], procs[560];
	if (cgroup_mount(mount, sizeof(mount)) != 0) {
		CHECK(0, "no cgroup v1 pids or v2 hierarchy mounted with root / in /proc/self/mountinfo");
		return;
	}
	snprintf(top, sizeof(top), "%s/vgpu-libtest.%d", mount, (int)getpid());
	snprintf(ctr, sizeof(ctr), "%s/pod%s/ctr", top, POD_UID);
	snprintf(procs, sizeof(procs), "%s/cgroup.procs", ctr);
	mkdir_p(ctr);
	CHECK(access(procs, W_OK) == 0, "cannot create the cgroup %s: %s", ctr, strerror(errno));

	struct root r;
	root_setup(&r, CONFIG_PERCLAIM);
	char json[1024];
	const char *claim_fmt = "{\"synced\": true, \"claims\": [{\"registerUUID\": \"" REGISTER_UUID "\", "
				"\"claimUID\": \"" CLAIM_UID "\", \"reservedFor\": [\"%s\"], \"configDir\": \"%s\"}]}";
	snprintf(json, sizeof(json), claim_fmt, POD_UID, r.config);
	write_targets(&r, json);
	CHECK(server_start(&r) == 0, "server start");
	const char *const stale[] = { "MANAGER_CLIENT_REGISTER_UUID=" REGISTER_UUID, "VGPU_POD_UID=stale-pod-uid-from-the-image",
				      "VGPU_CONTAINER_NAME=Stale_Name", NULL };
	struct run res;
	run(&r, PROBE("alloc", "200", "100"), stale, procs, &res);
	expect_enforced("per-claim path", &res);
	char pids[256], want[32];
	slurp(r.pids, pids, sizeof(pids));
	snprintf(want, sizeof(want), "%d\n", (int)res.pid);
	CHECK(strcmp(pids, want) == 0, "pids.config \"%s\", want exactly the probe's PID \"%s\"", pids, want);

	/* a claim not reserved for the caller's pod: DENIED, with the server's reason */
	snprintf(json, sizeof(json), claim_fmt, OTHER_POD_UID, r.config);
	write_targets(&r, json);
	run(&r, PROBE("init"), stale, procs, &res);
	expect_refused("claim of another pod", &res,
		       "registration with the node's vGPU registry failed: DENIED: the claim is not reserved for the "
		       "caller's pod " POD_UID);
	server_stop(&r);
	char log[65536];
	slurp(r.server_log, log, sizeof(log));
	CHECK_EQ_INT(count(log, "\"Registration\""), 2);
	/* tags 3 and 4 only: no pod_uid, no container_name on the wire */
	CHECK_STR_CONTAINS(log, "status=\"OK\" pod=\"\" container=\"\" registerUUID=\"" REGISTER_UUID "\"");
	CHECK(strstr(log, "INVALID") == NULL && strstr(log, "Stale") == NULL, "the image's identity reached the server");
	if (rmdir(ctr) != 0 || (snprintf(ctr, sizeof(ctr), "%s/pod%s", top, POD_UID), rmdir(ctr)) != 0 || rmdir(top) != 0)
		fprintf(stderr, "cleanup of the cgroup %s failed: %s\n", top, strerror(errno));
	root_teardown(&r);
}

/* RETRY: the server starts unsynced (a miss is RETRY) and is synced after ~1 s; the
 * library retries and succeeds within its budget (contract §5). */
static void test_retry(void)
{
	struct root r;
	root_setup(&r, CONFIG_NRI);
	write_targets(&r, "{\"synced\": false}");
	CHECK(server_start(&r) == 0, "server start");
	double t0 = now_s();
	pid_t pid = spawn(&r, PROBE("alloc", "200", "100"), nri_identity, NULL, "retry");
	usleep(1000000);
	nri_targets(&r, 1, r.config);
	double flipped = now_s() - t0;
	struct run res;
	finish(&r, pid, "retry", t0, &res);
	expect_enforced("after RETRY", &res);
	CHECK(res.seconds >= flipped && res.seconds < 10, "registered after %.2f s (synced at %.2f s)", res.seconds, flipped);
	server_stop(&r);
	char log[65536];
	slurp(r.server_log, log, sizeof(log));
	int retries = count(log, "status=\"RETRY\""), oks = count(log, "status=\"OK\"");
	/* ~1 s at 100–125 ms a wait: about 8; at least 2 however slow the probe starts */
	CHECK(retries >= 2 && oks == 1, "server answered %d RETRY and %d OK", retries, oks);
	CHECK_STR_CONTAINS(log, "not synchronized with the runtime yet");
	printf("retry: %d RETRY answers, then OK at %.2f s (synced at %.2f s)\n", retries, res.seconds, flipped);
	root_teardown(&r);
}

/* NOT_FOUND is final: refused at once, with the server's reason, never exit(). */
static void test_not_found(void)
{
	struct root r;
	root_setup(&r, CONFIG_NRI);
	write_targets(&r, "{\"synced\": true}");
	CHECK(server_start(&r) == 0, "server start");
	struct run res;
	run(&r, PROBE("init"), nri_identity, NULL, &res);
	expect_refused("NOT_FOUND", &res,
		       "registration with the node's vGPU registry failed: NOT_FOUND: no vGPU container \"app\" in pod " POD_UID);
	CHECK(res.seconds < 2, "a final answer took %.2f s: it was retried", res.seconds);
	const char *first = strstr(res.err, "refusing");
	CHECK(first && strstr(first + 1, "refusing") == NULL, "refusal said more than once:\n%s", res.err);
	CHECK(access(r.pids, F_OK) != 0, "pids.config written for an unknown container");
	server_stop(&r);
	char log[65536];
	slurp(r.server_log, log, sizeof(log));
	CHECK_EQ_INT(count(log, "\"Registration\""), 1);
	root_teardown(&r);
}

/* The plugin restarting: no socket for the first ~1 s, then the server starts; the failed
 * connects are retried and the registration succeeds. */
static void test_restart(void)
{
	struct root r;
	root_setup(&r, CONFIG_NRI);
	nri_targets(&r, 1, r.config);
	double t0 = now_s();
	pid_t pid = spawn(&r, PROBE("alloc", "200", "100"), nri_identity, NULL, "restart");
	usleep(1000000);
	CHECK(access(r.sock, F_OK) != 0, "the socket exists before the server started");
	CHECK(waitpid(pid, NULL, WNOHANG) == 0, "the probe gave up while the socket was missing");
	double started = now_s() - t0;
	CHECK(server_start(&r) == 0, "server start");
	struct run res;
	finish(&r, pid, "restart", t0, &res);
	expect_enforced("after the plugin restarted", &res);
	CHECK(res.seconds >= started && res.seconds < 10, "registered after %.2f s (server up at %.2f s)", res.seconds,
	      started);
	server_stop(&r);
	char log[65536];
	slurp(r.server_log, log, sizeof(log));
	CHECK_EQ_INT(count(log, "status=\"OK\""), 1);
	printf("restart: socket missing for %.2f s, registered at %.2f s\n", started, res.seconds);
	root_teardown(&r);
}

/* Refusal when a directory is missing: the container's config directory (refused before
 * any registration: vgpu.config is not there either), and the server-side config directory
 * of the target (the server cannot write pids.config: INTERNAL, final). */
static void test_missing_dir(void)
{
	struct root r;
	root_setup(&r, CONFIG_NRI);
	nri_targets(&r, 1, r.config);
	CHECK(server_start(&r) == 0, "server start");
	CHECK(unlink(r.vgpu_config) == 0 && rmdir(r.config) == 0, "rmdir %s", r.config);
	struct run res;
	run(&r, PROBE("init"), nri_identity, NULL, &res);
	char msg[256];
	snprintf(msg, sizeof(msg), "the vGPU config directory %s is missing: the container was created without its vGPU "
		 "configuration", r.config);
	expect_refused("container config dir missing", &res, msg);
	char log[65536];
	slurp(r.server_log, log, sizeof(log));
	CHECK(count(log, "\"Registration\"") == 0, "registered without a config directory:\n%s", log);

	mkdir_p(r.config);
	write_file(r.vgpu_config, CONFIG_NRI);
	char gone[200];
	snprintf(gone, sizeof(gone), "%s/no-such-dir", r.dir);
	nri_targets(&r, 1, gone);
	run(&r, PROBE("init"), nri_identity, NULL, &res);
	expect_refused("target's config dir missing", &res,
		       "registration with the node's vGPU registry failed: INTERNAL: writing pids.config failed");
	CHECK(access(r.pids, F_OK) != 0, "pids.config appeared in the container");
	root_teardown(&r);
}

/* Runs the plugin's Go reader of the ledger (test/ledgerdump over pkg/usage) on dir. */
static void ledgerdump(const char *dir, char *out, size_t cap)
{
	char cmd[512];
	snprintf(cmd, sizeof(cmd), "%s %s 2>&1", LEDGERDUMP_BIN, dir);
	out[0] = '\0';
	FILE *p = popen(cmd, "r");
	if (p == NULL) {
		CHECK(0, "popen %s: %s", cmd, strerror(errno));
		return;
	}
	size_t got = fread(out, 1, cap - 1, p);
	out[got] = '\0';
	CHECK(pclose(p) == 0, "ledgerdump %s failed: %s", dir, out);
}

/* The layouts of the C writer and the plugin's Go reader agree (the Go side also compares
 * every offset with library/test/ledger_layout.c): a process that holds 200 MiB under its
 * 256 MiB limit and was refused 100 MiB more reads as such, and once it is SIGKILLed its slot
 * no longer counts, by the same OFD-lock liveness the library uses. */
static void test_ledger(void)
{
	struct root r;
	root_setup(&r, CONFIG_NRI);
	nri_targets(&r, 1, r.config);
	CHECK(server_start(&r) == 0, "server start");
	pid_t pid = spawn(&r, PROBE("hold", "200", "100"), nri_identity, NULL, "hold");
	char path[256], held[4096] = "";
	snprintf(path, sizeof(path), "%s/hold.out", r.dir);
	for (double deadline = now_s() + 30; now_s() < deadline && strstr(held, "held\n") == NULL; usleep(10000))
		slurp(path, held, sizeof(held));
	CHECK_STR_CONTAINS(held, "alloc 200 MiB = 0\nalloc 100 MiB = 2\nheld\n");
	char vmem[160], out[4096];
	snprintf(vmem, sizeof(vmem), "%s/tmp/.vmem_node", r.dir);
	ledgerdump(vmem, out, sizeof(out));
	CHECK_STR_CONTAINS(out, "used 0 209715200\nused 1 0\n");
	CHECK_STR_CONTAINS(out, "refused 1\nprocesses 1\n");
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	ledgerdump(vmem, out, sizeof(out));
	CHECK_STR_CONTAINS(out, "used 0 0\n");
	CHECK_STR_CONTAINS(out, "refused 1\nprocesses 0\n");
	printf("ledger: the Go reader saw 200 MiB and 1 refusal, then nothing once the process was killed\n");
	root_teardown(&r);
}

int main(int argc, char **argv)
{
	static const struct test_case tests[] = {
		{ "nri", test_nri }, { "perclaim", test_perclaim }, { "retry", test_retry },
		{ "not_found", test_not_found }, { "restart", test_restart }, { "missing_dir", test_missing_dir },
		{ "ledger", test_ledger },
	};
	signal(SIGPIPE, SIG_IGN);
	return test_dispatch(argc, argv, "real_registry_", tests, sizeof(tests) / sizeof(tests[0]));
}
