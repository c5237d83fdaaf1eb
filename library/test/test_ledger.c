/* The shared memory ledger across real processes: exact limit under concurrency, a process
 * SIGKILLed while holding the lock does not hang the others, dead (and zombie) processes'
 * reservations are reclaimed. */
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>
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

int main(void)
{
	snprintf(dir, sizeof(dir), "/tmp/vgl.XXXXXX");
	if (mkdtemp(dir) == NULL)
		return 2;
	test_basic();
	test_concurrent_exact();
	test_killed_holding_lock();
	test_zombie_reclaimed();
	char path[128];
	snprintf(path, sizeof(path), "%s/" LEDGER_FILE_NAME, dir);
	unlink(path);
	rmdir(dir);
	return test_finish("ledger");
}
