/* The shared memory ledger across real processes and threads: exact limit under
 * concurrency, a process SIGKILLed while holding the lock does not hang the others, dead
 * (and zombie) processes' reservations are reclaimed, creation killed at any step leaves a
 * usable ledger and no temporary file behind. (Processes in separate PID namespaces:
 * test_preload pidns.) */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../src/clock.h"
#include "../src/ledger.h"
#include "test_util.h"

static char dir[64];

static void open_ledger(struct vgpu_ledger *l)
{
	char err[600];
	if (vgpu_ledger_open(l, dir, err, sizeof(err)) != 0) {
		fprintf(stderr, "%s\n", err);
		exit(2);
	}
}

static void test_basic(void)
{
	struct vgpu_ledger l;
	open_ledger(&l);
	uint64_t hooked, total;
	uint64_t refused = l.map->h.refused;
	CHECK_EQ_INT(vgpu_ledger_reserve(&l, 2, 600, 1000), 0);
	CHECK_EQ_INT(vgpu_ledger_reserve(&l, 2, 401, 1000), 1);
	CHECK_EQ_INT(vgpu_ledger_reserve(&l, 2, 400, 1000), 0);
	CHECK_EQ_INT(vgpu_ledger_reserve(&l, 1, 1000, 1000), 0); /* devices are separate */
	CHECK(vgpu_ledger_usage(&l, 2, &hooked, &total) == 0 && hooked == 1000 && total == 1000, "usage");
	CHECK_EQ_INT(vgpu_ledger_release(&l, 2, 1000), 0);
	CHECK_EQ_INT(vgpu_ledger_release(&l, 1, 1000), 0);
	/* unseen driver memory counts against the limit */
	CHECK_EQ_INT(vgpu_ledger_reconcile(&l, 2, 300, vgpu_now_ns()), 0);
	CHECK_EQ_INT(vgpu_ledger_reserve(&l, 2, 701, 1000), 1);
	CHECK_EQ_INT(vgpu_ledger_reserve(&l, 2, 700, 1000), 0);
	CHECK(vgpu_ledger_usage(&l, 2, &hooked, &total) == 0 && hooked == 700 && total == 1000, "usage with unseen");
	/* the two refusals are counted for the plugin's metrics, the reservations that fit are not */
	CHECK(l.map->h.refused == refused + 2, "refused counts refusals");
	CHECK_EQ_INT(vgpu_ledger_release(&l, 2, 700), 0);
	CHECK_EQ_INT(vgpu_ledger_reconcile(&l, 2, 0, vgpu_now_ns()), 0);
	vgpu_ledger_forget(&l);
}

static void test_concurrent_exact(void)
{
	enum { N = 8, CHUNK = 4096, LIMIT = 1000 * CHUNK };
	uint64_t *got = mmap(NULL, N * sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	int go[2];
	CHECK(pipe(go) == 0, "pipe");
	pid_t kids[N];
	for (int i = 0; i < N; i++) {
		if ((kids[i] = fork()) == 0) {
			struct vgpu_ledger l;
			open_ledger(&l);
			close(go[1]);
			char c;
			if (read(go[0], &c, 1) != 0) /* wait until the parent closes the pipe */
				_exit(3);
			while (vgpu_ledger_reserve(&l, 0, CHUNK, LIMIT) == 0)
				got[i] += CHUNK;
			pause(); /* hold the reservations until killed */
			_exit(0);
		}
	}
	close(go[0]);
	close(go[1]);
	uint64_t sum = 0;
	for (int spins = 0; spins < 1000; spins++) {
		sum = 0;
		for (int i = 0; i < N; i++)
			sum += __atomic_load_n(&got[i], __ATOMIC_RELAXED);
		if (sum == LIMIT)
			break;
		vgpu_sleep_ns(10000000);
	}
	vgpu_sleep_ns(50000000);
	sum = 0;
	for (int i = 0; i < N; i++)
		sum += got[i];
	CHECK(sum == LIMIT, "%d processes reserved %llu bytes, limit %d", N, (unsigned long long)sum, LIMIT);
	for (int i = 0; i < N; i++) {
		kill(kids[i], SIGKILL);
		waitpid(kids[i], NULL, 0);
	}
	/* all dead: the whole limit is free again */
	struct vgpu_ledger l;
	open_ledger(&l);
	CHECK_EQ_INT(vgpu_ledger_reserve(&l, 0, LIMIT, LIMIT), 0);
	CHECK_EQ_INT(vgpu_ledger_release(&l, 0, LIMIT), 0);
	vgpu_ledger_forget(&l);
	munmap(got, N * sizeof(uint64_t));
}

static void test_killed_holding_lock(void)
{
	int ready[2];
	CHECK(pipe(ready) == 0, "pipe");
	pid_t kid = fork();
	if (kid == 0) {
		struct vgpu_ledger l;
		open_ledger(&l);
		if (vgpu_ledger_reserve(&l, 0, 500, 1000) != 0)
			_exit(3);
		if (vgpu_ledger_lock(&l) != 0)
			_exit(3);
		if (write(ready[1], "x", 1) != 1)
			_exit(3);
		pause(); /* holding the lock */
		_exit(0);
	}
	char c;
	CHECK(read(ready[0], &c, 1) == 1, "child took the lock");
	kill(kid, SIGKILL);
	waitpid(kid, NULL, 0);
	alarm(20); /* a hang here is the failure: SIGALRM ends the test */
	struct vgpu_ledger l;
	open_ledger(&l);
	CHECK_EQ_INT(vgpu_ledger_reserve(&l, 0, 1000, 1000), 0); /* lock free, reservation reclaimed */
	CHECK_EQ_INT(vgpu_ledger_release(&l, 0, 1000), 0);
	alarm(0);
	vgpu_ledger_forget(&l);
}

static void test_zombie_reclaimed(void)
{
	pid_t kid = fork();
	if (kid == 0) {
		struct vgpu_ledger l;
		open_ledger(&l);
		_exit(vgpu_ledger_reserve(&l, 3, 900, 1000) == 0 ? 0 : 3);
	}
	vgpu_sleep_ns(200000000); /* exited, not reaped: a zombie */
	struct vgpu_ledger l;
	open_ledger(&l);
	CHECK_EQ_INT(vgpu_ledger_reserve(&l, 3, 1000, 1000), 0);
	int st;
	waitpid(kid, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child reserved");
	vgpu_ledger_forget(&l);
}

struct thread_arg {
	struct vgpu_ledger *l;
	uint64_t got;
};

static void *reserve_until_full(void *p)
{
	struct thread_arg *a = p;
	while (vgpu_ledger_reserve(a->l, 1, 4096, 1000 * 4096) == 0)
		a->got += 4096;
	return NULL;
}

/* Threads of one process share its slot and its open file description: they serialise on
 * the spinlock, and together reserve exactly the limit. */
static void test_threads_exact(void)
{
	enum { T = 6 };
	struct vgpu_ledger l;
	open_ledger(&l);
	pthread_t th[T];
	struct thread_arg args[T];
	for (int i = 0; i < T; i++) {
		args[i] = (struct thread_arg){ &l, 0 };
		CHECK(pthread_create(&th[i], NULL, reserve_until_full, &args[i]) == 0, "pthread_create");
	}
	uint64_t sum = 0;
	for (int i = 0; i < T; i++) {
		CHECK(pthread_join(th[i], NULL) == 0, "pthread_join");
		sum += args[i].got;
	}
	CHECK_EQ_U64(sum, 1000 * 4096);
	CHECK_EQ_INT(vgpu_ledger_release(&l, 1, sum), 0);
	vgpu_ledger_forget(&l);
}

/* A slot's lock belongs to the open file description, which the process's mapping of the
 * ledger keeps alive: an application that closes the descriptor behind the library's back
 * does not give its slot away (its usage stays counted) until the mapping goes too. */
static void test_descriptor_closed(void)
{
	struct vgpu_ledger a, b;
	open_ledger(&a);
	CHECK_EQ_INT(vgpu_ledger_reserve(&a, 0, 700, 1000), 0);
	CHECK(close(a.fd) == 0, "close");
	a.fd = -1;
	open_ledger(&b);
	CHECK_EQ_INT(vgpu_ledger_reserve(&b, 0, 301, 1000), 1); /* a's 700 still count */
	CHECK_EQ_INT(vgpu_ledger_reserve(&b, 0, 300, 1000), 0);
	vgpu_ledger_forget(&a); /* the mapping goes: now a is gone */
	CHECK_EQ_INT(vgpu_ledger_reserve(&b, 0, 700, 1000), 0);
	CHECK_EQ_INT(vgpu_ledger_release(&b, 0, 1000), 0);
	vgpu_ledger_forget(&b);
}

static int count_entries(const char *prefix)
{
	DIR *d = opendir(dir);
	int n = 0;
	for (struct dirent *e; d && (e = readdir(d)) != NULL;)
		n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
	if (d)
		closedir(d);
	return n;
}

/* SIGKILL at each step of creating the ledger: the next process opens a complete one, and
 * a dead creator's temporary file is removed by the next creator. */
static void test_crash_during_creation(void)
{
	static const char *const steps[] = { "created", "sized", "initialised", "linked" };
	char path[128];
	snprintf(path, sizeof(path), "%s/" LEDGER_FILE_NAME, dir);
	for (size_t k = 0; k < sizeof(steps) / sizeof(steps[0]); k++) {
		CHECK(unlink(path) == 0 || errno == ENOENT, "unlink %s", path);
		pid_t kid = fork();
		if (kid == 0) {
			char at[64];
			snprintf(at, sizeof(at), LEDGER_FILE_NAME ":%s", steps[k]);
			setenv("VGPU_TEST_CRASH_AT", at, 1);
			struct vgpu_ledger l;
			char err[600];
			vgpu_ledger_open(&l, dir, err, sizeof(err));
			_exit(3); /* not reached: killed at the step */
		}
		int st;
		CHECK(waitpid(kid, &st, 0) == kid && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "%s: not killed there",
		      steps[k]);
		CHECK_EQ_INT(access(path, F_OK) == 0, k == 3); /* the name appears only complete */
		struct vgpu_ledger l;
		open_ledger(&l);
		CHECK_EQ_INT(vgpu_ledger_reserve(&l, 0, 1000, 1000), 0);
		CHECK_EQ_INT(vgpu_ledger_release(&l, 0, 1000), 0);
		vgpu_ledger_forget(&l);
		CHECK_EQ_INT(count_entries(LEDGER_FILE_NAME ".tmp."), k == 3 ? 1 : 0);
	}
	/* the second name a creator killed after linking left: removed by the next creator,
	 * and the ledger it named stays */
	CHECK(unlink(path) == 0, "unlink %s", path);
	struct vgpu_ledger l;
	open_ledger(&l);
	CHECK_EQ_INT(count_entries(LEDGER_FILE_NAME ".tmp."), 0);
	vgpu_ledger_forget(&l);
}

/* A ledger from another layout under the same name is refused, never reinterpreted. */
static void test_foreign_layout(void)
{
	char path[128], err[600];
	snprintf(path, sizeof(path), "%s/" LEDGER_FILE_NAME, dir);
	CHECK(unlink(path) == 0 || errno == ENOENT, "unlink");
	int fd = open(path, O_RDWR | O_CREAT, 0666);
	CHECK(fd >= 0 && ftruncate(fd, sizeof(struct ledger_file)) == 0 && close(fd) == 0, "zeroed file");
	struct vgpu_ledger l;
	CHECK(vgpu_ledger_open(&l, dir, err, sizeof(err)) != 0 && strstr(err, "layout version 0"), "zeroed: %s", err);
	fd = open(path, O_RDWR | O_TRUNC);
	CHECK(fd >= 0 && ftruncate(fd, 4096) == 0 && close(fd) == 0, "file of another size");
	CHECK(vgpu_ledger_open(&l, dir, err, sizeof(err)) != 0 && strstr(err, "has 4096 bytes"), "other size: %s", err);
	CHECK(unlink(path) == 0, "unlink");
}

int main(void)
{
	snprintf(dir, sizeof(dir), "/tmp/vgl.XXXXXX");
	if (mkdtemp(dir) == NULL)
		return 2;
	test_basic();
	test_concurrent_exact();
	test_threads_exact();
	test_killed_holding_lock();
	test_zombie_reclaimed();
	test_descriptor_closed();
	test_crash_during_creation();
	test_foreign_layout();
	char path[128];
	snprintf(path, sizeof(path), "%s/" LEDGER_FILE_NAME, dir);
	unlink(path);
	CHECK(rmdir(dir) == 0, "%s is not empty: the test left files", dir);
	return test_finish("ledger");
}
