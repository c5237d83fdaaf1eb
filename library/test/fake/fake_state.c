/* TEST DOUBLE: see fake_state.h. */
#include "fake_state.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define FAKE_MAGIC 0x46414b45u

static struct fake_state *state;
static int state_fd = -1;
static int state_pid;

static void die(const char *what)
{
	fprintf(stderr, "fake gpu: %s: %s\n", what, strerror(errno));
	abort();
}

uint64_t fake_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void init_devices(struct fake_state *s)
{
	const char *spec = getenv("FAKE_GPU_DEVICES");
	char buf[4096];
	snprintf(buf, sizeof(buf), "%s", spec && *spec ? spec : FAKE_DEFAULT_UUID ":16384");
	s->ndev = 0;
	for (char *tok = strtok(buf, ","); tok && s->ndev < FAKE_MAX_DEV; tok = strtok(NULL, ",")) {
		char *colon = strchr(tok, ':');
		if (colon == NULL)
			continue;
		*colon = '\0';
		snprintf(s->uuid[s->ndev], sizeof(s->uuid[0]), "%s", tok);
		s->total[s->ndev] = strtoull(colon + 1, NULL, 10) << 20;
		s->ndev++;
	}
}

struct fake_state *fake_state(void)
{
	if (state != NULL && state_pid == getpid())
		return state;
	const char *path = getenv("FAKE_GPU_STATE");
	if (path == NULL) {
		errno = EINVAL;
		die("FAKE_GPU_STATE is not set");
	}
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
	if (fd < 0)
		die(path);
	if (flock(fd, LOCK_EX) != 0)
		die("flock");
	off_t size = lseek(fd, 0, SEEK_END);
	if (size == 0 && ftruncate(fd, sizeof(struct fake_state)) != 0)
		die("ftruncate");
	struct fake_state *s = mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (s == MAP_FAILED)
		die("mmap");
	if (s->magic != FAKE_MAGIC) {
		init_devices(s);
		s->magic = FAKE_MAGIC;
	}
	if (flock(fd, LOCK_UN) != 0)
		die("flock");
	state_fd = fd;
	state = s;
	state_pid = getpid();
	return s;
}

void fake_lock(void)
{
	fake_state();
	while (flock(state_fd, LOCK_EX) != 0)
		if (errno != EINTR)
			die("flock");
}

void fake_unlock(void)
{
	if (flock(state_fd, LOCK_UN) != 0)
		die("flock");
}

int fake_pid_alive(int pid)
{
	if (kill(pid, 0) != 0 && errno == ESRCH)
		return 0;
	char path[64], buf[512];
	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	FILE *f = fopen(path, "r");
	if (f == NULL)
		return 0;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	char *p = strrchr(buf, ')');
	return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}

unsigned fake_pid_offset(void)
{
	const char *v = getenv("FAKE_PID_OFFSET");
	return v ? (unsigned)strtoul(v, NULL, 10) : 0;
}

struct fake_proc *fake_self(void)
{
	struct fake_state *s = fake_state();
	int me = getpid();
	struct fake_proc *free_slot = NULL;
	for (int i = 0; i < FAKE_MAX_PROCS; i++) {
		if (s->procs[i].pid == me)
			return &s->procs[i];
		if (free_slot == NULL && (s->procs[i].pid == 0 || !fake_pid_alive(s->procs[i].pid)))
			free_slot = &s->procs[i];
	}
	if (free_slot == NULL)
		die("no free process slot");
	memset(free_slot, 0, sizeof(*free_slot));
	free_slot->pid = me;
	return free_slot;
}

void fake_charge(int dev, int64_t delta)
{
	struct fake_state *s = fake_state();
	struct fake_proc *p = fake_self();
	p->used[dev] = (uint64_t)((int64_t)p->used[dev] + delta);
	uint64_t sum = 0;
	for (int i = 0; i < FAKE_MAX_PROCS; i++)
		if (s->procs[i].pid != 0 && (s->procs[i].pid == getpid() || kill(s->procs[i].pid, 0) == 0 || errno != ESRCH))
			sum += s->procs[i].used[dev];
	if (sum > s->peak[dev])
		s->peak[dev] = sum;
}
