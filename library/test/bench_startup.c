/* make bench-library: start-up of many processes of one container at once (issue 26 §1; target:
 * 300 processes initialising CUDA within 5 s in total under the library). One container root,
 * one vgpu.config (a memory and a core limit, so every process registers and opens the
 * ledger and the core buckets) and the project's real registry server (test/registryserver:
 * pkg/registry with its production bounds, contract §5), started once for the whole run.
 *
 * A burst forks N children (default 300) as fast as the parent can, each of which execs this
 * binary to call cuInit and cuCtxCreate and exit; its figure is the wall time from the first
 * fork to the last exit. The same burst runs without the library (the fake driver alone) and
 * with libvgpu-test.so preloaded, alternately, over ROUNDS rounds; the medians are compared.
 * With the library a measuring shim (prog/connect_count.c) is preloaded after it, to count each
 * process's registration attempts: connects that failed (the listen backlog full) and answers
 * that were not OK (BUSY or RETRY: retried), which is where a registry's bounds would cost
 * time. Each child also records how long its cuInit and its cuCtxCreate took.
 *
 *   bench_startup [N]          the driver: prints a table, the verdict and one line in `go test
 *                              -bench` format that make bench's table reads
 *   bench_startup child I FILE one process of a burst (I: its index in FILE's records) */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../src/hooks.h"
#include "fake/fake_state.h"

CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice dev);

#define POD_UID "0b7a2c6e-1f7e-4c9e-9d2a-3f1e5b6c7d8e"
#define ROUNDS 5
#define TARGET_S 5.0
#define MAX_PROCS 1000

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One process of a burst: its record is the seconds cuInit and cuCtxCreate took. */
static int child(int index, const char *records)
{
	double t0 = now_s();
	CUresult init = cuInit(0);
	double t1 = now_s();
	CUcontext ctx;
	CUresult create = init == CUDA_SUCCESS ? cuCtxCreate_v2(&ctx, 0, 0) : init;
	double rec[2] = { t1 - t0, now_s() - t1 };
	if (init != CUDA_SUCCESS || create != CUDA_SUCCESS) {
		fprintf(stderr, "process %d: cuInit %d, cuCtxCreate %d\n", index, init, create);
		return 2;
	}
	int fd = open(records, O_WRONLY);
	if (fd < 0 || pwrite(fd, rec, sizeof(rec), (off_t)index * (off_t)sizeof(rec)) != (ssize_t)sizeof(rec) ||
	    close(fd) != 0)
		return 3;
	return 0;
}

static char root[64], sock[128], records[128], counts[128], errors[128];

static void write_file(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text) || close(fd) != 0) {
		perror(path);
		exit(2);
	}
}

static void setup_root(void)
{
	snprintf(root, sizeof(root), "/tmp/vgs.XXXXXX");
	if (mkdtemp(root) == NULL) {
		perror("mkdtemp");
		exit(2);
	}
	const char *dirs[] = { "/etc", "/etc/vgpu-dra", "/etc/vgpu-dra/registry", "/etc/vgpu-dra/config", "/tmp",
			       "/tmp/.vgpu_lock", "/tmp/.vmem_node" };
	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
		char p[128];
		snprintf(p, sizeof(p), "%s%s", root, dirs[i]);
		if (mkdir(p, 0755) != 0 && errno != EEXIST) {
			perror(p);
			exit(2);
		}
	}
	char path[160], text[512];
	snprintf(path, sizeof(path), "%s/etc/vgpu-dra/config/vgpu.config", root);
	/* vgpu.config as the plugin writes it (contract §4): 4 GiB, 50 % of the cores */
	write_file(path, "version 1\npod " POD_UID "\ncontainer app\ngpu 0 " FAKE_DEFAULT_UUID " 4294967296 50\n");
	/* the server's targets: this container, its cgroup that of this process (the server's
	 * parent), so that every child passes the peer check, as a container's processes do */
	snprintf(path, sizeof(path), "%s/targets.json", root);
	snprintf(text, sizeof(text),
		 "{\"synced\": true, \"containers\": [{\"podUID\": \"" POD_UID "\", \"containerName\": \"app\", "
		 "\"configDir\": \"%s/etc/vgpu-dra/config\", \"cgroupOf\": \"parent\"}]}",
		 root);
	write_file(path, text);
	snprintf(sock, sizeof(sock), "%s/etc/vgpu-dra/registry/registry.sock", root);
	snprintf(records, sizeof(records), "%s/records", root);
	snprintf(counts, sizeof(counts), "%s/connects", root);
	snprintf(errors, sizeof(errors), "%s/errors", root);
}

/* The real registry server, stopped by closing its stdin (or killed). */
static pid_t server = -1;
static int lifeline = -1;

static void server_start(void)
{
	int in[2], out[2];
	char targets[160], log[160];
	snprintf(targets, sizeof(targets), "%s/targets.json", root);
	snprintf(log, sizeof(log), "%s/server.log", root);
	if (pipe(in) != 0 || pipe(out) != 0)
		exit(2);
	server = fork();
	if (server == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd < 0 || dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0 || dup2(fd, 2) < 0)
			_exit(126);
		close(in[1]);
		close(out[0]);
		execl(REGISTRYSERVER_BIN, REGISTRYSERVER_BIN, "--socket", sock, "--targets", targets, "--stdin-lifeline",
		      (char *)NULL);
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	fcntl(in[1], F_SETFD, FD_CLOEXEC);
	lifeline = in[1];
	char line[512];
	size_t got = 0;
	double deadline = now_s() + 30;
	while (now_s() < deadline && got < sizeof(line) - 1 && memchr(line, '\n', got) == NULL) {
		struct pollfd p = { .fd = out[0], .events = POLLIN };
		if (poll(&p, 1, 200) <= 0)
			continue;
		ssize_t n = read(out[0], line + got, sizeof(line) - 1 - got);
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	line[got] = '\0';
	close(out[0]);
	if (strncmp(line, "READY ", 6) != 0) {
		fprintf(stderr, "the registry server did not get ready (stdout \"%s\"); its log is %s\n", line, log);
		exit(2);
	}
}

static void server_stop(void)
{
	if (close(lifeline) != 0)
		perror("closing the registry server's stdin");
	for (int i = 0; i < 500; i++) {
		if (waitpid(server, NULL, WNOHANG) == server)
			return;
		usleep(10000);
	}
	kill(server, SIGKILL);
	waitpid(server, NULL, 0);
}

struct burst {
	double wall_s;                 /* first fork to last exit */
	double init_p50_ms, init_max_ms; /* one process's cuInit */
	double ctx_p50_ms;             /* one process's cuCtxCreate */
	long connects, connect_failures; /* with the library: registration attempts */
	double procs_cpu_s, server_cpu_s; /* CPU time of the burst's processes, and of the server */
};

static double children_cpu_s(void)
{
	struct rusage ru;
	getrusage(RUSAGE_CHILDREN, &ru);
	return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
	       (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* The server's CPU time so far (utime + stime from /proc). */
static double server_cpu_s(void)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)server);
	int fd = open(path, O_RDONLY);
	ssize_t n = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;
	if (fd >= 0)
		close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	char *p = strrchr(buf, ')'); /* the fields after the command's name */
	unsigned long utime = 0, stime = 0;
	if (p == NULL || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime) != 2)
		return 0;
	return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static off_t file_size(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 ? st.st_size : 0;
}

static long count_byte(const char *path, char c)
{
	long n = 0;
	FILE *f = fopen(path, "r");
	if (f == NULL)
		return 0;
	for (int ch; (ch = fgetc(f)) != EOF;)
		n += ch == c;
	fclose(f);
	return n;
}

/* Starts n processes at once, with the library preloaded or without; 0 when all succeeded. */
static int burst(const char *self, int n, int library, struct burst *b)
{
	static double rec[MAX_PROCS][2];
	memset(rec, 0, sizeof(rec));
	int fd = open(records, O_RDWR | O_CREAT | O_TRUNC, 0644);
	if (fd < 0 || ftruncate(fd, (off_t)sizeof(rec)) != 0)
		return -1;
	if (unlink(counts) != 0 && errno != ENOENT)
		return -1;
	char env_buf[12][256];
	char *env[13];
	int e = 0;
	snprintf(env_buf[e++], 256, "LD_LIBRARY_PATH=%s", FAKE_DIR);
	snprintf(env_buf[e++], 256, "VGPU_TEST_ROOT=%s", root);
	snprintf(env_buf[e++], 256, "FAKE_GPU_STATE=%s/fake.state", root);
	snprintf(env_buf[e++], 256, "FAKE_PID_OFFSET=0"); /* the server lists real PIDs */
	/* what the plugin injects next to the file */
	snprintf(env_buf[e++], 256, "MANAGER_VISIBLE_DEVICE_0=%s", FAKE_DEFAULT_UUID);
	snprintf(env_buf[e++], 256, "CUDA_MEM_LIMIT_0=4096m");
	snprintf(env_buf[e++], 256, "CUDA_CORE_LIMIT_0=50");
	snprintf(env_buf[e++], 256, "VGPU_POD_UID=" POD_UID);
	snprintf(env_buf[e++], 256, "VGPU_CONTAINER_NAME=app");
	if (library) {
		snprintf(env_buf[e++], 256, "LD_PRELOAD=%s:%s", LIBVGPU_TEST, CONNECT_COUNT_LIB);
		snprintf(env_buf[e++], 256, "CONNECT_COUNT_FILE=%s", counts);
	}
	for (int i = 0; i < e; i++)
		env[i] = env_buf[i];
	env[e] = NULL;
	int err = open(errors, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	double cpu0 = children_cpu_s(), srv0 = server_cpu_s();
	double t0 = now_s();
	int started = 0;
	for (; started < n; started++) {
		char index[16];
		snprintf(index, sizeof(index), "%d", started);
		pid_t pid = fork();
		if (pid < 0)
			break;
		if (pid == 0) {
			if (err >= 0 && dup2(err, 2) < 0)
				_exit(126);
			char *argv[] = { (char *)self, "child", index, records, NULL };
			execve(self, argv, env);
			_exit(127);
		}
	}
	int failed = started < n;
	for (int i = 0; i < started; i++) {
		int st;
		if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
			failed = 1;
	}
	b->wall_s = now_s() - t0;
	b->procs_cpu_s = children_cpu_s() - cpu0;
	b->server_cpu_s = server_cpu_s() - srv0;
	if (err >= 0 && close(err) != 0)
		failed = 1;
	if (pread(fd, rec, sizeof(rec), 0) != (ssize_t)sizeof(rec) || close(fd) != 0)
		failed = 1;
	double init[MAX_PROCS], ctx[MAX_PROCS];
	for (int i = 0; i < n; i++) {
		init[i] = rec[i][0] * 1e3;
		ctx[i] = rec[i][1] * 1e3;
	}
	qsort(init, (size_t)n, sizeof(init[0]), cmp_double);
	qsort(ctx, (size_t)n, sizeof(ctx[0]), cmp_double);
	b->init_p50_ms = init[n / 2];
	b->init_max_ms = init[n - 1];
	b->ctx_p50_ms = ctx[n / 2];
	b->connects = (long)file_size(counts);
	b->connect_failures = count_byte(counts, 'f');
	return failed ? -1 : 0;
}

/* The median wall time of the rounds' bursts. */
static double median_wall(const struct burst *b)
{
	double v[ROUNDS];
	for (int r = 0; r < ROUNDS; r++)
		v[r] = b[r].wall_s;
	qsort(v, ROUNDS, sizeof(v[0]), cmp_double);
	return v[ROUNDS / 2];
}

/* Runs the rounds, alternating which burst goes first so that neither always runs on a warmer
 * machine, and prints a row per burst. Returns 0 when every process of every burst succeeded. */
static int run_rounds(const char *self, int n, struct burst *drv, struct burst *lib)
{
	printf("start-up: %d processes of one container at once, each cuInit + cuCtxCreate then exit (fake driver; "
	       "real registry server; %d rounds)\n",
	       n, ROUNDS);
	printf("%-5s %-13s %7s %11s %12s %13s %13s %10s %9s %7s %10s\n", "round", "", "wall s", "procs CPU s",
	       "server CPU s", "cuInit p50 ms", "cuInit max ms", "ctx p50 ms", "attempts", "not OK", "no connect");
	for (int r = 0; r < ROUNDS; r++) {
		for (int k = 0; k < 2; k++) {
			int library = (k + r) % 2;
			struct burst *b = library ? &lib[r] : &drv[r];
			memset(b, 0, sizeof(*b));
			if (burst(self, n, library, b) != 0) {
				fprintf(stderr, "round %d %s: a process failed; see %s\n", r + 1,
					library ? "library" : "driver", errors);
				return 1;
			}
			printf("%-5d %-13s %7.3f %11.2f %12.2f %13.2f %13.2f %10.2f", r + 1,
			       library ? "library" : "driver alone", b->wall_s, b->procs_cpu_s, b->server_cpu_s,
			       b->init_p50_ms, b->init_max_ms, b->ctx_p50_ms);
			if (library)
				printf(" %9ld %7ld %10ld", b->connects, b->connects - b->connect_failures - n,
				       b->connect_failures);
			printf("\n");
		}
	}
	return 0;
}

/* The medians against the target, and the line make bench's table reads. */
static void report(int n, const struct burst *drv, const struct burst *lib)
{
	double d = median_wall(drv), l = median_wall(lib);
	long retries = 0;
	for (int r = 0; r < ROUNDS; r++)
		retries += lib[r].connects - n;
	printf("(procs CPU: all %d processes of the burst; attempts: their registration connects; not OK: "
	       "answers BUSY or RETRY, each retried; no connect: connects refused, each retried)\n",
	       n);
	printf("%d processes at once, first fork to last exit (median): driver alone %.3f s, library %.3f s "
	       "(%.2fx); target <= %.0f s: %s\n",
	       n, d, l, d > 0 ? l / d : 0, TARGET_S, l <= TARGET_S ? "PASS" : "MISS");
	/* for make bench's table (hack/bench-targets.txt) */
	printf("BenchmarkLibraryStartup%d 1 %.3f wall-s %.3f driver-wall-s %.2f retries/round\n", n, l, d,
	       (double)retries / ROUNDS);
}

int main(int argc, char **argv)
{
	if (argc == 4 && strcmp(argv[1], "child") == 0)
		return child(atoi(argv[2]), argv[3]);
	int n = argc == 2 ? atoi(argv[1]) : 300;
	if (n < 1 || n > MAX_PROCS) {
		fprintf(stderr, "usage: bench_startup [processes, 1..%d]\n", MAX_PROCS);
		return 2;
	}
	setup_root();
	server_start();
	struct burst drv[ROUNDS], lib[ROUNDS];
	int rc = run_rounds(argv[0], n, drv, lib);
	if (rc == 0)
		report(n, drv, lib);
	server_stop();
	if (rc != 0) {
		fprintf(stderr, "kept %s for a look (server.log, errors)\n", root);
		return rc;
	}
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
	if (strncmp(root, "/tmp/vgs.", 9) == 0 && system(cmd) != 0)
		rc = 1;
	return rc;
}
