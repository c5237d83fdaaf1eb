/* A plugin restart must lose no registration (contract §5): the stopping registry answers
 * RETRY to what it accepted, the socket is missing until the next instance serves, and the
 * library's retry budget, REG_BUDGET_MS, covers the whole gap.
 * One ctest per case:
 *   test_registry_restart <budget_twin|simulated|real_server>
 *   budget_twin   REG_BUDGET_MS is contract.RegistryClientBudget (pkg/contract/registry.go)
 *   simulated     the client on a simulated clock against the scripted server: RETRY from the
 *                 stopping server, no socket for RESTART_GAP_MS, then OK
 *   real_server   libvgpu-test.so preloaded into the probe, against the project's real Go
 *                 server (test/registryserver), stopped with SIGTERM while the probe's
 *                 registration waits in it, and started again REAL_GAP_S seconds later
 *   real_server_killed  the same, but SIGKILLed: the accepted registration's connection is
 *                 closed unanswered, which the library retries like a failed connect */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../src/registry_client.h"
#include "fake/fake_state.h"
#include "server/scripted_registry.h"
#include "test_util.h"

#define POD_UID "0b7a2c6e-1f7e-4c9e-9d2a-3f1e5b6c7d8e"

/* A plugin pod restart on the local cluster, image cached, leaves the socket missing for
 * about 1.3 s (contract §5); one that crash-loops once (the kubelet's first back-off is
 * 10 s) or pulls a new image takes longer. The simulated restart is 20 s: covered by the
 * library's budget, not by the 10 s the contract had before. */
#define RESTART_GAP_MS 20000u
/* The real-time case waits just past that old 10 s budget. */
#define REAL_GAP_S 12

/* ---------------------------------------------------------------------------------- */

/* budget_twin: the Go constant, "RegistryClientBudget = <n> * time.Second", read from the
 * source, equals REG_BUDGET_MS. */
static void test_budget_twin(void)
{
	char path[512], buf[16384];
	snprintf(path, sizeof(path), "%s/pkg/contract/registry.go", REPO_ROOT);
	FILE *f = fopen(path, "r");
	CHECK(f != NULL, "open %s: %s", path, strerror(errno));
	if (f == NULL)
		return;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = '\0';
	fclose(f);
	const char *p = strstr(buf, "RegistryClientBudget = ");
	unsigned seconds = 0;
	CHECK(p != NULL && sscanf(p, "RegistryClientBudget = %u * time.Second", &seconds) == 1,
	      "no \"RegistryClientBudget = <n> * time.Second\" in %s", path);
	CHECK_EQ_U64(seconds * 1000ull, REG_BUDGET_MS);
}

/* ---------------------------------------------------------------------------------- */

static char dir[64], sock[128];

/* The simulated restart: time only moves when the client sleeps. The first server is the
 * stopping one (RETRY with retry_after_ms 200, as pkg/registry answers while it stops); once
 * the client has waited, it is gone and the socket with it; when the clock passes the gap,
 * the next instance serves (OK). */
struct restart_sim {
	uint64_t now, start;
	uint32_t seed;
	pid_t stopping, next;
};

static uint64_t sim_now(void *c) { return ((struct restart_sim *)c)->now; }
static uint32_t sim_rand(void *c)
{
	struct restart_sim *s = c;
	s->seed = s->seed * 1103515245u + 12345u;
	return s->seed >> 8;
}
static void sim_sleep(void *c, uint64_t ms)
{
	struct restart_sim *s = c;
	s->now += ms;
	if (s->stopping > 0) {
		scripted_registry_stop(s->stopping, sock);
		s->stopping = -1;
	}
	if (s->next <= 0 && s->now - s->start >= RESTART_GAP_MS)
		s->next = scripted_registry_start(sock, "OK", NULL, 0, NULL);
}

static enum reg_outcome restart_with_budget(uint32_t budget, struct reg_attempt_log *log, char *detail, size_t len)
{
	struct restart_sim s = { .now = 5000, .start = 5000, .seed = 11 };
	struct reg_client_deps deps = { sim_now, sim_sleep, sim_rand, &s };
	s.stopping = scripted_registry_start(sock, "RETRY:200", NULL, 0, NULL);
	CHECK(s.stopping > 0, "start the stopping server");
	struct reg_request req = { .pod_uid = POD_UID, .container_name = "app" };
	struct reg_response res;
	enum reg_outcome o = reg_register(sock, &req, budget, &deps, &res, log, detail, len);
	if (s.stopping > 0)
		scripted_registry_stop(s.stopping, sock);
	if (s.next > 0)
		scripted_registry_stop(s.next, sock);
	return o;
}

static void test_simulated(void)
{
	struct reg_attempt_log log;
	char detail[1200];
	enum reg_outcome o = restart_with_budget(REG_BUDGET_MS, &log, detail, sizeof(detail));
	CHECK(o == REG_OUTCOME_OK, "a %u ms restart with the library's %u ms budget: outcome %d (%s)", RESTART_GAP_MS,
	      REG_BUDGET_MS, o, detail);
	CHECK(log.connect_failures > 0 && log.attempts == log.connect_failures + 2,
	      "attempts %u, failed connects %u: want RETRY, failed connects, OK", log.attempts, log.connect_failures);
	CHECK(log.nwaits > 0 && log.waits_ms[0] >= 200 && log.waits_ms[0] <= 250,
	      "first wait %llu ms: want the stopping server's retry_after_ms (200) plus up to a quarter",
	      (unsigned long long)(log.nwaits ? log.waits_ms[0] : 0));
	printf("simulated: a %.1f s restart rides on %u attempts within the %.0f s budget\n", RESTART_GAP_MS / 1e3,
	       log.attempts, REG_BUDGET_MS / 1e3);
	/* The budget the contract had before, 10 s, gave up during such a restart. */
	o = restart_with_budget(10000, &log, detail, sizeof(detail));
	CHECK(o == REG_OUTCOME_BUDGET, "a %u ms restart with a 10 s budget: outcome %d (%s)", RESTART_GAP_MS, o, detail);
}

/* ---------------------------------------------------------------------------------- */

struct node {
	char dir[64], sock[128], config[128], pids[160], targets[160], log[160];
	pid_t server;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void mkdirs(const char *base, const char *rel)
{
	char p[256];
	snprintf(p, sizeof(p), "%s/%s", base, rel);
	for (char *c = p + strlen(base) + 1; *c; c++) {
		if (*c == '/') {
			*c = '\0';
			mkdir(p, 0755);
			*c = '/';
		}
	}
	if (mkdir(p, 0755) != 0 && errno != EEXIST)
		perror(p);
}

static void slurp(const char *path, char *buf, size_t cap)
{
	buf[0] = '\0';
	FILE *f = fopen(path, "r");
	if (f == NULL)
		return;
	size_t n = fread(buf, 1, cap - 1, f);
	buf[n] = '\0';
	fclose(f);
}

/* A container's view of the node (VGPU_TEST_ROOT), and the targets file of the real server:
 * the NRI path's one container, in the cgroup of this test process (the server's parent). */
static void node_setup(struct node *n)
{
	memset(n, 0, sizeof(*n));
	snprintf(n->dir, sizeof(n->dir), "/tmp/vgr.XXXXXX");
	if (mkdtemp(n->dir) == NULL) {
		perror("mkdtemp");
		exit(2);
	}
	mkdirs(n->dir, "etc/vgpu-dra/registry");
	mkdirs(n->dir, "etc/vgpu-dra/config");
	mkdirs(n->dir, "tmp/.vgpu_lock");
	mkdirs(n->dir, "tmp/.vmem_node");
	snprintf(n->sock, sizeof(n->sock), "%s/etc/vgpu-dra/registry/registry.sock", n->dir);
	snprintf(n->config, sizeof(n->config), "%s/etc/vgpu-dra/config", n->dir);
	snprintf(n->pids, sizeof(n->pids), "%s/pids.config", n->config);
	snprintf(n->targets, sizeof(n->targets), "%s/targets.json", n->dir);
	snprintf(n->log, sizeof(n->log), "%s/server.log", n->dir);
	FILE *f = fopen(n->targets, "w");
	CHECK(f != NULL, "write %s", n->targets);
	if (f) {
		fprintf(f, "{\"synced\": true, \"containers\": [{\"podUID\": \"" POD_UID "\", \"containerName\": \"app\", "
			   "\"configDir\": \"%s\", \"cgroupOf\": \"parent\"}]}", n->config);
		fclose(f);
	}
	/* The container's limits and identity, as the plugin writes them (contract §4a): the
	 * library takes nothing from its env. */
	char vgpu_config[200];
	snprintf(vgpu_config, sizeof(vgpu_config), "%s/vgpu.config", n->config);
	f = fopen(vgpu_config, "w");
	CHECK(f != NULL, "write %s", vgpu_config);
	if (f) {
		fputs("version 1\npod " POD_UID "\ncontainer app\ngpu 0 " FAKE_DEFAULT_UUID " 268435456 0\n", f);
		fclose(f);
	}
}

/* Starts the real server (log at -v=2 appended to n->log) and waits until its socket
 * answers a connect. lock_timeout may be NULL (the server's default). */
static int server_start(struct node *n, const char *lock_timeout)
{
	pid_t pid = fork();
	if (pid == 0) {
		int log = open(n->log, O_WRONLY | O_CREAT | O_APPEND, 0644), null = open("/dev/null", O_RDWR);
		if (log < 0 || null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0 || dup2(log, 2) < 0)
			_exit(126);
		char flag[64];
		snprintf(flag, sizeof(flag), "--lock-timeout=%s", lock_timeout ? lock_timeout : "0");
		execl(REGISTRYSERVER_BIN, REGISTRYSERVER_BIN, "--socket", n->sock, "--targets", n->targets, flag, "-v=2",
		      (char *)NULL);
		_exit(127);
	}
	n->server = pid;
	for (double end = now_s() + 30; now_s() < end; usleep(10000)) {
		if (access(n->sock, F_OK) == 0)
			return 0;
		if (waitpid(pid, NULL, WNOHANG) == pid)
			break;
	}
	n->server = -1;
	return -1;
}

/* Sends SIGTERM, as the kubelet does to the plugin, and reaps the server. 0 when it exited
 * by itself within 10 s. */
static int server_sigterm(struct node *n)
{
	if (n->server <= 0)
		return -1;
	kill(n->server, SIGTERM);
	for (int i = 0; i < 1000; i++) {
		if (waitpid(n->server, NULL, WNOHANG) == n->server) {
			n->server = -1;
			return 0;
		}
		usleep(10000);
	}
	kill(n->server, SIGKILL);
	waitpid(n->server, NULL, 0);
	n->server = -1;
	return -1;
}

/* Whether /proc/locks shows a blocked LOCK_EX request of pid on the file with inode ino:
 * the server waiting for the lock while handling a registration. */
static int blocked_writer(pid_t pid, ino_t ino)
{
	char buf[65536];
	slurp("/proc/locks", buf, sizeof(buf));
	for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
		char kind[16], mode[16];
		int who;
		unsigned long long inode;
		if (strstr(line, "->") == NULL ||
		    sscanf(strstr(line, "->") + 2, " %15s %*s %15s %d %*x:%*x:%llu", kind, mode, &who, &inode) != 4)
			continue;
		if (strcmp(kind, "FLOCK") == 0 && strcmp(mode, "WRITE") == 0 && who == (int)pid && inode == (unsigned long long)ino)
			return 1;
	}
	return 0;
}

static pid_t spawn_probe(struct node *n, const char *out, const char *err)
{
	char state[128], root[96];
	snprintf(state, sizeof(state), "FAKE_GPU_STATE=%s/fake.state", n->dir);
	snprintf(root, sizeof(root), "VGPU_TEST_ROOT=%s", n->dir);
	char *const env[] = {
		"LD_LIBRARY_PATH=" FAKE_DIR, "FAKE_PID_OFFSET=0", "MANAGER_VISIBLE_DEVICE_0=" FAKE_DEFAULT_UUID,
		"CUDA_MEM_LIMIT_0=256m", "ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0", "PATH=/usr/bin:/bin",
		"VGPU_POD_UID=" POD_UID, "VGPU_CONTAINER_NAME=app", state, root, "LD_PRELOAD=" LIBVGPU_TEST, NULL,
	};
	char *const argv[] = { PROBE_BIN, "alloc", "200", "100", NULL };
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

/* The probe's registration waits in the server (pids.config held LOCK_SH by a reader, the
 * server's lock deadline long) when the server gets sig:
 *   SIGTERM (real_server): the server must exit at once and answer that registration RETRY;
 *     the socket is then missing for gap_s seconds;
 *   SIGKILL (real_server_killed: the OOM killer, the chaos suite's plugin kill): the
 *     connection is closed unanswered and the dead server's socket refuses connects for gap_s.
 * Either way the probe must still be retrying, then register with the next server and run
 * within its limit. */
static void real_restart(int sig, int gap_s)
{
	const char *name = sig == SIGKILL ? "real_server_killed" : "real_server";
	struct node n;
	node_setup(&n);
	int reader = open(n.pids, O_RDWR | O_CREAT | O_CLOEXEC, 0644); /* no child may share the lock */
	struct stat st;
	CHECK(reader >= 0 && write(reader, "1\n", 2) == 2 && flock(reader, LOCK_SH) == 0 && fstat(reader, &st) == 0,
	      "create and lock %s: %s", n.pids, strerror(errno));
	CHECK(server_start(&n, "1m") == 0, "start the registry server");
	char out[160], err[160];
	snprintf(out, sizeof(out), "%s/probe.out", n.dir);
	snprintf(err, sizeof(err), "%s/probe.err", n.dir);
	double t0 = now_s();
	pid_t probe = spawn_probe(&n, out, err);
	int waiting = 0;
	for (double end = now_s() + 30; !waiting && now_s() < end; usleep(5000))
		waiting = blocked_writer(n.server, st.st_ino);
	CHECK(waiting, "the probe's registration never waited for pids.config's lock in the server");

	char log[65536];
	if (sig == SIGTERM) {
		CHECK(server_sigterm(&n) == 0, "the registry server did not exit within 10 s of SIGTERM");
		slurp(n.log, log, sizeof(log));
		CHECK_STR_CONTAINS(log, "status=\"RETRY\"");
		CHECK_STR_CONTAINS(log, "the registry is restarting");
		CHECK(access(n.sock, F_OK) != 0, "the stopped server left its socket");
	} else {
		kill(n.server, SIGKILL);
		waitpid(n.server, NULL, 0);
		n.server = -1;
	}
	double stopped = now_s();
	close(reader);

	while (now_s() < stopped + gap_s)
		usleep(50000);
	CHECK(waitpid(probe, NULL, WNOHANG) == 0, "the probe gave up while the registry was gone for %d s", gap_s);
	double restarted = now_s() - t0;
	unlink(n.sock); /* a killed server leaves its socket behind; the next one binds anew */
	CHECK(server_start(&n, NULL) == 0, "start the next registry server");
	int status = -1;
	CHECK(waitpid(probe, &status, 0) == probe, "reap the probe");
	double took = now_s() - t0;
	char pout[4096], perr[4096];
	slurp(out, pout, sizeof(pout));
	slurp(err, perr, sizeof(perr));
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "probe exit status %d\n%s%s", status, pout, perr);
	CHECK_STR_CONTAINS(pout, "alloc 200 MiB = 0");
	CHECK_STR_CONTAINS(pout, "alloc 100 MiB = 2"); /* registered and enforced: 300 MiB is over 256 MiB */
	CHECK(perr[0] == '\0', "probe stderr: %s", perr);
	server_sigterm(&n);
	printf("%s: stopped %.2f s after the probe started, served again at %.2f s, registered at %.2f s\n", name,
	       stopped - t0, restarted, took);
	if (test_failures) {
		slurp(n.log, log, sizeof(log));
		fprintf(stderr, "--- registry server log ---\n%s---\n", log);
	}
	char cmd[96];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", n.dir);
	if (system(cmd) != 0)
		fprintf(stderr, "cleanup of %s failed\n", n.dir);
}

/* real_server: SIGTERM, and the socket gone past the old 10 s budget. */
static void test_real_server(void) { real_restart(SIGTERM, REAL_GAP_S); }

/* real_server_killed: SIGKILL with the registration accepted, and the plugin's restart of
 * about 2 s (the chaos suite's "new plugin process p50 1.8 s"). */
static void test_real_server_killed(void) { real_restart(SIGKILL, 2); }

int main(int argc, char **argv)
{
	static const struct test_case tests[] = {
		{ "budget_twin", test_budget_twin }, { "simulated", test_simulated }, { "real_server", test_real_server },
		{ "real_server_killed", test_real_server_killed },
	};
	signal(SIGPIPE, SIG_IGN);
	snprintf(dir, sizeof(dir), "/tmp/vgr.XXXXXX");
	if (mkdtemp(dir) == NULL)
		return 2;
	snprintf(sock, sizeof(sock), "%s/r.sock", dir);
	int rc = test_dispatch(argc, argv, "registry_restart_", tests, sizeof(tests) / sizeof(tests[0]));
	unlink(sock);
	rmdir(dir);
	return rc;
}
