/* The shared memory ledger across real processes and threads: exact limit under
 * concurrency, a process SIGKILLed while holding the lock does not hang the others, dead
 * (and zombie) processes' reservations are reclaimed, creation killed at any step leaves a
 * usable ledger and no temporary file behind. What another process of the claim can do to
 * the shared files (forge the header, hold its lock, truncate them, put a file of its own
 * there) gives a refusal naming the file, never a crash or a hang. (Processes in separate
 * PID namespaces: test_preload pidns; truncation under a running application: test_preload
 * truncate.) */
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
#include "../src/core_file.h"
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

/* Another process's view of the ledger: a mapping of its own, written behind the library. */
static struct ledger_file *map_behind(void)
{
	char path[128];
	snprintf(path, sizeof(path), "%s/" LEDGER_FILE_NAME, dir);
	int fd = open(path, O_RDWR);
	void *p = fd < 0 ? MAP_FAILED : mmap(NULL, sizeof(struct ledger_file), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (fd >= 0)
		close(fd);
	return p == MAP_FAILED ? NULL : p;
}

/* Runs fn in a child: a crash there is a failed check here, not the end of the test. */
static void in_child(const char *what, void (*fn)(void))
{
	pid_t kid = fork();
	if (kid == 0) {
		test_failures = 0; /* the child's own */
		alarm(60);         /* a hang is the failure too */
		fn();
		_exit(test_failures ? 1 : 0);
	}
	int st;
	CHECK(waitpid(kid, &st, 0) == kid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: the child %s %d", what,
	      WIFSIGNALED(st) ? "was killed by signal" : "exited with", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
}

/* high_water 0xFFFFFFF0 and unseen bytes that would overflow the sum: every operation stays
 * inside the mapping (the loops used to run off it: SIGSEGV), and the forged figures refuse,
 * never wrap around to room. */
static void forged_header(void)
{
	struct vgpu_ledger l;
	open_ledger(&l);
	CHECK_EQ_INT(vgpu_ledger_reserve(&l, 0, 100, 1000), 0);
	struct ledger_file *other = map_behind();
	CHECK(other != NULL, "map the ledger");
	if (other == NULL)
		return;
	other->h.high_water = 0xFFFFFFF0u;
	uint64_t hooked = 0, total = 0;
	CHECK_EQ_INT(vgpu_ledger_reserve(&l, 0, 100, 1000), 0);
	CHECK(vgpu_ledger_usage(&l, 0, &hooked, &total) == 0 && hooked == 200, "usage with a forged high_water: %llu",
	      (unsigned long long)hooked);
	other->h.high_water = 0xFFFFFFF0u;
	CHECK_EQ_INT(vgpu_ledger_reconcile(&l, 0, 0, vgpu_now_ns()), 0);
	other->h.high_water = 0xFFFFFFF0u;
	CHECK_EQ_INT(vgpu_ledger_release(&l, 0, 200), 0);
	/* unseen near 2^64: the sum saturates, the reservation is refused */
	other->h.unseen[0] = UINT64_MAX - 50;
	CHECK_EQ_INT(vgpu_ledger_reserve(&l, 0, 100, 1000), 1);
	other->h.unseen[0] = 0;
	/* a forged used slot nobody holds: read (inside the clamp), found dead, reclaimed */
	other->slot[1000].state = LEDGER_SLOT_USED;
	other->slot[1000].used[0] = UINT64_MAX;
	other->h.high_water = 0xFFFFFFF0u;
	CHECK_EQ_INT(vgpu_ledger_reserve(&l, 0, 1000, 1000), 0);
	CHECK(other->slot[1000].state == LEDGER_SLOT_FREE, "the forged slot was not reclaimed");
	CHECK_EQ_INT(vgpu_ledger_release(&l, 0, 1000), 0);
	munmap(other, sizeof(*other));
	vgpu_ledger_forget(&l);
}

static void test_forged_header(void)
{
	in_child("forged header", forged_header);
	/* a new process opens a ledger whose high_water was forged: clamped, not refused */
	struct ledger_file *other = map_behind();
	if (other != NULL) {
		other->h.high_water = 0xFFFFFFF0u;
		munmap(other, sizeof(*other));
	}
	in_child("open with a forged high_water", forged_header);
}

/* Another process holds the header's lock and never lets go: a reservation is refused after
 * LEDGER_LOCK_WAIT_NS, the next one at once, and once the lock is free they work again. */
static void test_lock_held(void)
{
	struct vgpu_ledger l;
	open_ledger(&l); /* the file exists before the child locks it */
	int ready[2];
	CHECK(pipe(ready) == 0, "pipe");
	pid_t kid = fork();
	if (kid == 0) {
		char path[128];
		snprintf(path, sizeof(path), "%s/" LEDGER_FILE_NAME, dir);
		int fd = open(path, O_RDWR);
		struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0,
				    .l_len = sizeof(struct ledger_header) };
		if (fd < 0 || fcntl(fd, F_OFD_SETLK, &fl) != 0 || write(ready[1], "x", 1) != 1)
			_exit(3);
		pause();
		_exit(0);
	}
	close(ready[1]);
	char c;
	CHECK(read(ready[0], &c, 1) == 1, "the child took the lock");
	alarm(60); /* a hang here is the failure: SIGALRM ends the test */
	uint64_t t0 = vgpu_now_ns();
	CHECK_EQ_INT(vgpu_ledger_reserve(&l, 0, 100, 1000), -1);
	CHECK(vgpu_now_ns() - t0 >= LEDGER_LOCK_WAIT_NS, "refused before the bound");
	CHECK_EQ_INT(vgpu_ledger_reserve(&l, 0, 100, 1000), -1);
	uint64_t hooked, total;
	CHECK_EQ_INT(vgpu_ledger_usage(&l, 0, &hooked, &total), -1);
	kill(kid, SIGKILL);
	waitpid(kid, NULL, 0);
	vgpu_sleep_ns(LEDGER_LOCK_REFUSE_NS);
	CHECK_EQ_INT(vgpu_ledger_reserve(&l, 0, 100, 1000), 0);
	CHECK_EQ_INT(vgpu_ledger_release(&l, 0, 100), 0);
	alarm(0);
	vgpu_ledger_forget(&l);
	close(ready[0]);
}

/* The file shrinks under the mapping: the next access is refused and said, the process lives. */
static void truncated_under(void)
{
	struct vgpu_ledger l;
	open_ledger(&l);
	CHECK_EQ_INT(vgpu_ledger_reserve(&l, 0, 100, 1000), 0);
	char path[128];
	snprintf(path, sizeof(path), "%s/" LEDGER_FILE_NAME, dir);
	CHECK(truncate(path, 0) == 0, "truncate");
	CHECK_EQ_INT(vgpu_ledger_release(&l, 0, 100), -1);
	CHECK_EQ_INT(vgpu_ledger_reserve(&l, 0, 100, 1000), -1);
	uint64_t hooked, total;
	CHECK_EQ_INT(vgpu_ledger_usage(&l, 0, &hooked, &total), -1);
	CHECK_EQ_INT(vgpu_ledger_usable(&l), -1);
	vgpu_ledger_forget(&l);
	/* a new process: refused at open, naming the size */
	char err[600];
	CHECK(vgpu_ledger_open(&l, dir, err, sizeof(err)) != 0 && strstr(err, "has 0 bytes"), "open: %s", err);
}

static void test_truncated(void)
{
	in_child("truncated under the mapping", truncated_under);
	char path[128];
	snprintf(path, sizeof(path), "%s/" LEDGER_FILE_NAME, dir);
	CHECK(unlink(path) == 0, "unlink");
}

/* A file put under the ledger's or the core file's name before the first process, that
 * processes of other users cannot open (mode 0600, another owner): the refusal names its
 * mode and owner. The same file owned by the process itself is given mode 0666 back. A FIFO
 * under the name is refused without hanging the open. */
static void other_user(void)
{
	if (setgid(65534) != 0 || setuid(65534) != 0) {
		CHECK(0, "setuid: %s", strerror(errno));
		return;
	}
	struct vgpu_ledger l;
	char err[600] = "";
	CHECK(vgpu_ledger_open(&l, dir, err, sizeof(err)) != 0, "opened a ledger it cannot share");
	CHECK_STR_CONTAINS(err, "it is mode 0600, owned by uid 12345");
	CHECK_STR_CONTAINS(err, LEDGER_FILE_NAME);
	err[0] = '\0';
	CHECK(vgpu_core_file_open(dir, err, sizeof(err)) == NULL, "opened a core file it cannot share");
	CHECK_STR_CONTAINS(err, "it is mode 0600, owned by uid 12345");
	CHECK_STR_CONTAINS(err, CORE_FILE_NAME);
}

static void precreate(const char *name, size_t size, uid_t owner, mode_t mode)
{
	char path[128];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
	CHECK(fd >= 0 && ftruncate(fd, (off_t)size) == 0 && fchown(fd, owner, owner) == 0 && fchmod(fd, mode) == 0 &&
	      close(fd) == 0, "pre-create %s", path);
}

static void test_precreated(void)
{
	if (geteuid() != 0) {
		CHECK(0, "a file of another user needs root (chown, setuid)");
		return;
	}
	char path[128], core[128], err[600];
	snprintf(path, sizeof(path), "%s/" LEDGER_FILE_NAME, dir);
	snprintf(core, sizeof(core), "%s/" CORE_FILE_NAME, dir);
	precreate(LEDGER_FILE_NAME, sizeof(struct ledger_file), 12345, 0600);
	precreate(CORE_FILE_NAME, sizeof(struct core_file), 12345, 0600);
	CHECK(chmod(dir, 0755) == 0, "chmod");
	in_child("another user's 0600 file", other_user);
	CHECK(unlink(path) == 0 && unlink(core) == 0, "unlink");

	/* its own file, mode 0600: used, and opened up for the claim's other users */
	precreate(LEDGER_FILE_NAME, sizeof(struct ledger_file), 0, 0600);
	int fd = open(path, O_RDWR);
	CHECK(fd >= 0, "open");
	struct vgpu_ledger l;
	struct stat st;
	if (fd >= 0) {
		struct ledger_file *f = mmap(NULL, sizeof(*f), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		close(fd);
		if (f != MAP_FAILED) {
			f->h.version = LEDGER_VERSION;
			f->h.header_size = sizeof(struct ledger_header);
			f->h.slot_size = sizeof(struct ledger_slot);
			f->h.nslots = LEDGER_SLOTS;
			f->h.ndevices = VGPU_MAX_DEVICES;
			f->h.magic = LEDGER_MAGIC;
			munmap(f, sizeof(*f));
		}
	}
	CHECK(vgpu_ledger_open(&l, dir, err, sizeof(err)) == 0, "own 0600 ledger: %s", err);
	CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0666, "mode %o, want 0666", (unsigned)(st.st_mode & 0777));
	vgpu_ledger_forget(&l);
	CHECK(unlink(path) == 0, "unlink");

	/* a FIFO under the name */
	CHECK(mkfifo(path, 0666) == 0, "mkfifo");
	alarm(60);
	CHECK(vgpu_ledger_open(&l, dir, err, sizeof(err)) != 0 && strstr(err, "is a FIFO"), "FIFO: %s", err);
	alarm(0);
	CHECK(unlink(path) == 0, "unlink");
	CHECK(chmod(dir, 0700) == 0, "chmod");
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
	test_forged_header();
	test_lock_held();
	test_truncated();
	test_precreated();
	char path[128];
	snprintf(path, sizeof(path), "%s/" LEDGER_FILE_NAME, dir);
	unlink(path);
	CHECK(rmdir(dir) == 0, "%s is not empty: the test left files", dir);
	return test_finish("ledger");
}
