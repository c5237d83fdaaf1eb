#include "ledger.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clock.h"
#include "sys_stat.h"
#include "log.h"
#include "proc_stat.h"

#define RECLAIM_INTERVAL_NS 500000000ull /* dead processes are reclaimed within 1 s */

static void init_header(struct ledger_header *h)
{
	memset(h, 0, sizeof(*h));
	h->magic = LEDGER_MAGIC;
	h->version = LEDGER_VERSION;
	h->header_size = sizeof(struct ledger_header);
	h->slot_size = sizeof(struct ledger_slot);
	h->nslots = LEDGER_SLOTS;
	h->ndevices = VGPU_MAX_DEVICES;
}

static int header_matches(const struct ledger_header *h)
{
	return h->magic == LEDGER_MAGIC && h->version == LEDGER_VERSION &&
	       h->header_size == sizeof(struct ledger_header) && h->slot_size == sizeof(struct ledger_slot) &&
	       h->nslots == LEDGER_SLOTS && h->ndevices == VGPU_MAX_DEVICES && h->high_water <= LEDGER_SLOTS;
}

static int flock_retry(int fd, int op)
{
	while (flock(fd, op) != 0) {
		if (errno != EINTR)
			return -1;
	}
	return 0;
}

int vgpu_ledger_open(struct vgpu_ledger *l, const char *dir, char *err, size_t errlen)
{
	char path[512];
	memset(l, 0, sizeof(*l));
	l->fd = -1;
	l->my_slot = -1;
	if (snprintf(path, sizeof(path), "%s/%s", dir, LEDGER_FILE_NAME) >= (int)sizeof(path)) {
		snprintf(err, errlen, "ledger path under %s is too long", dir);
		return -1;
	}
	/* 0666: processes of the container may run as different users (the dir is 1777). */
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
	if (fd < 0) {
		snprintf(err, errlen, "cannot open the memory ledger %s: %s", path, strerror(errno));
		return -1;
	}
	const size_t size = sizeof(struct ledger_file);
	struct stat st;
	if (flock_retry(fd, LOCK_EX) != 0 || vgpu_fstat(fd, &st) != 0) {
		snprintf(err, errlen, "cannot lock the memory ledger %s: %s", path, strerror(errno));
		close(fd);
		return -1;
	}
	int fresh = st.st_size == 0;
	if (fresh) {
		if (fchmod(fd, 0666) != 0 && errno != EPERM)
			vgpu_log_debug("fchmod %s: %s", path, strerror(errno));
		if (ftruncate(fd, (off_t)size) != 0) {
			snprintf(err, errlen, "cannot size the memory ledger %s: %s", path, strerror(errno));
			close(fd);
			return -1;
		}
	} else if ((size_t)st.st_size != size) {
		snprintf(err, errlen, "memory ledger %s has %lld bytes, this library expects %zu (another library version?)",
			 path, (long long)st.st_size, size);
		close(fd);
		return -1;
	}
	void *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED) {
		snprintf(err, errlen, "cannot map the memory ledger %s: %s", path, strerror(errno));
		close(fd);
		return -1;
	}
	struct ledger_file *f = map;
	if (fresh)
		init_header(&f->h);
	if (!header_matches(&f->h)) {
		snprintf(err, errlen, "memory ledger %s has layout version %u, this library expects %u", path,
			 f->h.version, LEDGER_VERSION);
		munmap(map, size);
		close(fd);
		return -1;
	}
	if (flock_retry(fd, LOCK_UN) != 0) {
		snprintf(err, errlen, "cannot unlock the memory ledger %s: %s", path, strerror(errno));
		munmap(map, size);
		close(fd);
		return -1;
	}
	l->fd = fd;
	l->map = f;
	l->my_pid = (int32_t)getpid();
	if (vgpu_proc_start_time(l->my_pid, &l->my_start, NULL) != 0)
		l->my_start = 0;
	return 0;
}

int vgpu_ledger_lock(struct vgpu_ledger *l)
{
	vgpu_spin_lock(&l->lock);
	if (flock_retry(l->fd, LOCK_EX) != 0) {
		vgpu_log_error("cannot lock the memory ledger: %s", strerror(errno));
		vgpu_spin_unlock(&l->lock);
		return -1;
	}
	return 0;
}

void vgpu_ledger_unlock(struct vgpu_ledger *l)
{
	if (flock_retry(l->fd, LOCK_UN) != 0)
		vgpu_log_error("cannot unlock the memory ledger: %s", strerror(errno));
	vgpu_spin_unlock(&l->lock);
}

static int slot_is_dead(const struct ledger_slot *s)
{
	if (kill(s->pid, 0) != 0 && errno == ESRCH)
		return 1;
	uint64_t start;
	char state;
	if (vgpu_proc_start_time(s->pid, &start, &state) != 0)
		return 0; /* cannot tell: keep counting it, never under-count */
	return state == 'Z' || state == 'X' || (s->start_time != 0 && start != s->start_time);
}

/* Under the lock. */
static void reclaim_dead(struct vgpu_ledger *l, uint64_t now)
{
	struct ledger_file *f = l->map;
	uint32_t hw = f->h.high_water;
	for (uint32_t i = 0; i < hw; i++) {
		struct ledger_slot *s = &f->slot[i];
		if (s->pid == 0 || (int)i == l->my_slot)
			continue;
		if (slot_is_dead(s)) {
			vgpu_log_debug("reclaiming ledger slot %u of dead process %d", i, (int)s->pid);
			memset(s, 0, sizeof(*s));
		}
	}
	while (hw > 0 && f->slot[hw - 1].pid == 0)
		hw--;
	if (l->my_slot >= 0 && (uint32_t)l->my_slot >= hw)
		hw = (uint32_t)l->my_slot + 1;
	f->h.high_water = hw;
	f->h.reclaimed_ns = now;
}

static uint64_t hooked_total(const struct ledger_file *f, int dev)
{
	uint64_t sum = 0;
	for (uint32_t i = 0; i < f->h.high_water; i++)
		if (f->slot[i].pid != 0)
			sum += __atomic_load_n(&f->slot[i].used[dev], __ATOMIC_ACQUIRE);
	return sum;
}

/* Under the lock: find or claim this process's slot. A slot already carrying our PID is a
 * leftover of an earlier image of this process (exec keeps the PID): its memory went with
 * that image, so it is cleared. */
static int claim_slot(struct vgpu_ledger *l)
{
	struct ledger_file *f = l->map;
	if (l->my_slot >= 0 && f->slot[l->my_slot].pid == l->my_pid)
		return 0;
	int free_slot = -1;
	for (uint32_t i = 0; i < LEDGER_SLOTS; i++) {
		struct ledger_slot *s = &f->slot[i];
		if (s->pid == l->my_pid) {
			memset(s, 0, sizeof(*s));
			if (free_slot < 0)
				free_slot = (int)i;
		} else if (s->pid == 0 && free_slot < 0) {
			free_slot = (int)i;
		}
	}
	if (free_slot < 0) {
		reclaim_dead(l, vgpu_now_ns());
		for (uint32_t i = 0; i < LEDGER_SLOTS && free_slot < 0; i++)
			if (f->slot[i].pid == 0)
				free_slot = (int)i;
		if (free_slot < 0)
			return -1;
	}
	struct ledger_slot *s = &f->slot[free_slot];
	memset(s, 0, sizeof(*s));
	s->pid = l->my_pid;
	s->start_time = l->my_start;
	if ((uint32_t)free_slot >= f->h.high_water)
		f->h.high_water = (uint32_t)free_slot + 1;
	__atomic_store_n(&l->my_slot, free_slot, __ATOMIC_RELEASE);
	return 0;
}

int vgpu_ledger_reserve(struct vgpu_ledger *l, int dev, uint64_t bytes, uint64_t limit)
{
	if (dev < 0 || dev >= VGPU_MAX_DEVICES)
		return -1;
	if (vgpu_ledger_lock(l) != 0)
		return -1;
	struct ledger_file *f = l->map;
	int rc = 0;
	uint64_t now = vgpu_now_ns();
	if (claim_slot(l) != 0) {
		vgpu_log_error("memory ledger has no free slot (%u processes)", LEDGER_SLOTS);
		rc = -1;
		goto out;
	}
	if (now - f->h.reclaimed_ns >= RECLAIM_INTERVAL_NS)
		reclaim_dead(l, now);
	for (int pass = 0; pass < 2; pass++) {
		uint64_t used = hooked_total(f, dev) + f->h.unseen[dev];
		if (used <= limit && bytes <= limit - used) {
			__atomic_fetch_add(&f->slot[l->my_slot].used[dev], bytes, __ATOMIC_RELEASE);
			rc = 0;
			goto out;
		}
		if (pass == 0)
			reclaim_dead(l, now); /* a dead process may hold what we need */
	}
	rc = 1;
out:
	vgpu_ledger_unlock(l);
	return rc;
}

/* Without the lock: only this process writes its slot, and a concurrent reader that sees
 * the old, larger value is merely conservative. Saves two flock calls per free. */
int vgpu_ledger_release(struct vgpu_ledger *l, int dev, uint64_t bytes)
{
	if (dev < 0 || dev >= VGPU_MAX_DEVICES)
		return -1;
	int slot = __atomic_load_n(&l->my_slot, __ATOMIC_ACQUIRE);
	if (slot < 0 || l->map->slot[slot].pid != l->my_pid)
		return -1;
	uint64_t *u = &l->map->slot[slot].used[dev];
	uint64_t cur = __atomic_load_n(u, __ATOMIC_RELAXED);
	uint64_t next;
	do {
		next = cur >= bytes ? cur - bytes : 0;
	} while (!__atomic_compare_exchange_n(u, &cur, next, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED));
	return 0;
}

int vgpu_ledger_usage(struct vgpu_ledger *l, int dev, uint64_t *hooked, uint64_t *total)
{
	if (dev < 0 || dev >= VGPU_MAX_DEVICES)
		return -1;
	if (vgpu_ledger_lock(l) != 0)
		return -1;
	reclaim_dead(l, vgpu_now_ns());
	uint64_t h = hooked_total(l->map, dev);
	*hooked = h;
	*total = h + l->map->h.unseen[dev];
	vgpu_ledger_unlock(l);
	return 0;
}

int vgpu_ledger_reconcile(struct vgpu_ledger *l, int dev, uint64_t nvml_total, uint64_t now_ns)
{
	if (dev < 0 || dev >= VGPU_MAX_DEVICES)
		return -1;
	if (vgpu_ledger_lock(l) != 0)
		return -1;
	uint64_t h = hooked_total(l->map, dev);
	l->map->h.unseen[dev] = nvml_total > h ? nvml_total - h : 0;
	l->map->h.reconciled_ns[dev] = now_ns;
	vgpu_ledger_unlock(l);
	return 0;
}

uint64_t vgpu_ledger_reconciled_ns(const struct vgpu_ledger *l, int dev)
{
	return __atomic_load_n(&l->map->h.reconciled_ns[dev], __ATOMIC_RELAXED);
}

void vgpu_ledger_forget(struct vgpu_ledger *l)
{
	if (l->map != NULL)
		munmap(l->map, sizeof(struct ledger_file));
	if (l->fd >= 0)
		close(l->fd);
	memset(l, 0, sizeof(*l));
	l->fd = -1;
	l->my_slot = -1;
}
