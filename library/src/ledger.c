#include "ledger.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"
#include "shm_file.h"
#include "shm_guard.h"

#define RECLAIM_INTERVAL_NS 500000000ull /* dead processes are reclaimed within 1 s */

static void init_file(void *map)
{
	struct ledger_header *h = map;
	h->version = LEDGER_VERSION;
	h->header_size = sizeof(struct ledger_header);
	h->slot_size = sizeof(struct ledger_slot);
	h->nslots = LEDGER_SLOTS;
	h->ndevices = VGPU_MAX_DEVICES;
	__atomic_store_n(&h->magic, LEDGER_MAGIC, __ATOMIC_RELEASE);
}

static const struct vgpu_shm_spec ledger_spec = {
	.name = LEDGER_FILE_NAME,
	.what = "memory ledger",
	.size = sizeof(struct ledger_file),
	.init = init_file,
};

static int header_matches(const struct ledger_header *h)
{
	return __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == LEDGER_MAGIC && h->version == LEDGER_VERSION &&
	       h->header_size == sizeof(struct ledger_header) && h->slot_size == sizeof(struct ledger_slot) &&
	       h->nslots == LEDGER_SLOTS && h->ndevices == VGPU_MAX_DEVICES;
}

/* Slots [0, high_water) may be in use. Another process may have written anything there. */
static uint32_t high_water(const struct ledger_file *f)
{
	uint32_t hw = __atomic_load_n(&f->h.high_water, __ATOMIC_RELAXED);
	return hw < LEDGER_SLOTS ? hw : LEDGER_SLOTS;
}

static uint64_t add_sat(uint64_t a, uint64_t b)
{
	return a + b < a ? UINT64_MAX : a + b;
}

/* An OFD lock (owned by the open file description, not the process) on [start, start+len). */
static int ofd_lock(int fd, int cmd, short type, size_t start, size_t len)
{
	struct flock fl = { .l_type = type, .l_whence = SEEK_SET, .l_start = (off_t)start, .l_len = (off_t)len };
	while (fcntl(fd, cmd, &fl) != 0) {
		if (errno != EINTR)
			return -1;
	}
	return cmd == F_OFD_GETLK ? fl.l_type : 0;
}

static size_t slot_offset(int i)
{
	return offsetof(struct ledger_file, slot) + (size_t)i * sizeof(struct ledger_slot);
}

static void mark_truncated(struct vgpu_ledger *l)
{
	if (__atomic_exchange_n(&l->truncated, 1, __ATOMIC_ACQ_REL) == 0)
		vgpu_log_error("the memory ledger %s was truncated while in use (by another process of the claim?): "
			       "allocations that need it are refused from now on",
			       l->path);
}

/* Runs fn on the mapping inside a SIGBUS guard: -1, and the ledger unusable from then on,
 * when the file was truncated under it. */
static int guarded(struct vgpu_ledger *l, int (*fn)(struct vgpu_ledger *l, void *arg), void *arg)
{
	struct vgpu_guard g;
	vgpu_guard_enter(&g, l->map, sizeof(*l->map));
	if (sigsetjmp(g.env, 0) != 0) {
		vgpu_guard_leave(&g);
		mark_truncated(l);
		return -1;
	}
	int rc = fn(l, arg);
	vgpu_guard_leave(&g);
	return rc;
}

static int check_header(struct vgpu_ledger *l, void *arg)
{
	uint32_t *version = arg;
	*version = l->map->h.version;
	return header_matches(&l->map->h) ? 0 : 1;
}

int vgpu_ledger_open(struct vgpu_ledger *l, const char *dir, char *err, size_t errlen)
{
	memset(l, 0, sizeof(*l));
	l->fd = -1;
	l->my_slot = -1;
	snprintf(l->path, sizeof(l->path), "%s/%s", dir, LEDGER_FILE_NAME);
	struct vgpu_shm shm;
	if (vgpu_shm_open(&ledger_spec, dir, &shm, err, errlen) != 0)
		return -1;
	l->fd = shm.fd;
	l->map = shm.map;
	uint32_t version = 0;
	int rc = guarded(l, check_header, &version);
	if (rc != 0) {
		if (rc < 0)
			snprintf(err, errlen, "the memory ledger %s was truncated while it was being opened", l->path);
		else
			snprintf(err, errlen, "the memory ledger %s has layout version %u, this library expects %u", l->path,
				 version, LEDGER_VERSION);
		vgpu_shm_close(&ledger_spec, &shm);
		l->fd = -1;
		l->map = NULL;
		return -1;
	}
	/* a mark, not a secret: tells this process's slot from one another process took over */
	uint64_t r = 0;
	if (syscall(SYS_getrandom, &r, sizeof(r), GRND_NONBLOCK) != (long)sizeof(r))
		r = vgpu_now_ns() ^ (uint64_t)(uintptr_t)l;
	l->my_owner = (r ^ ((uint64_t)(uint32_t)getpid() << 32)) | 1;
	return 0;
}

int vgpu_ledger_usable(const struct vgpu_ledger *l)
{
	return l->map != NULL && !__atomic_load_n(&l->truncated, __ATOMIC_ACQUIRE) ? 0 : -1;
}

/* The header's lock is held for microseconds; a holder killed drops it. One held longer is a
 * process stopped while holding it (SIGSTOP, the enforcer's freezer: under a second) or one
 * holding it on purpose: after LEDGER_LOCK_WAIT_NS the reservation is refused, and for
 * LEDGER_LOCK_REFUSE_NS after that the next ones are refused without waiting. */
int vgpu_ledger_lock(struct vgpu_ledger *l)
{
	vgpu_spin_lock(&l->lock);
	uint64_t deadline = 0, nap = 20000;
	for (unsigned tries = 0;; tries++) {
		if (ofd_lock(l->fd, F_OFD_SETLK, F_WRLCK, 0, sizeof(struct ledger_header)) == 0) {
			__atomic_store_n(&l->stuck_until, 0, __ATOMIC_RELAXED);
			return 0;
		}
		if (errno != EAGAIN && errno != EACCES) {
			vgpu_log_error("cannot lock the memory ledger %s: %s", l->path, strerror(errno));
			break;
		}
		uint64_t now = vgpu_now_ns();
		if (deadline == 0) {
			if (now < __atomic_load_n(&l->stuck_until, __ATOMIC_RELAXED))
				break;
			deadline = now + LEDGER_LOCK_WAIT_NS;
		} else if (now >= deadline) {
			__atomic_store_n(&l->stuck_until, now + LEDGER_LOCK_REFUSE_NS, __ATOMIC_RELAXED);
			vgpu_log_error("the memory ledger %s has been locked by another process for more than %llu s "
				       "(a process of the claim stopped while holding it, or holding it on purpose): "
				       "allocation refused",
				       l->path, LEDGER_LOCK_WAIT_NS / 1000000000ull);
			break;
		}
		if (tries < 16) {
			sched_yield();
		} else {
			vgpu_sleep_ns(nap);
			if (nap < 1000000)
				nap *= 2;
		}
	}
	vgpu_spin_unlock(&l->lock);
	return -1;
}

void vgpu_ledger_unlock(struct vgpu_ledger *l)
{
	if (ofd_lock(l->fd, F_OFD_SETLK, F_UNLCK, 0, sizeof(struct ledger_header)) != 0)
		vgpu_log_error("cannot unlock the memory ledger %s: %s", l->path, strerror(errno));
	vgpu_spin_unlock(&l->lock);
}

/* Under the lock: a used slot whose lock nobody holds belongs to a process that is gone.
 * (Our own open file description's locks never conflict with us: callers skip our slot.)
 * When the kernel cannot answer, the slot counts as alive: never under-count. */
static int slot_is_dead(const struct vgpu_ledger *l, int i)
{
	return ofd_lock(l->fd, F_OFD_GETLK, F_WRLCK, slot_offset(i), sizeof(struct ledger_slot)) == F_UNLCK;
}

/* Under the lock and the guard. */
static void reclaim_dead(struct vgpu_ledger *l, uint64_t now)
{
	struct ledger_file *f = l->map;
	uint32_t hw = high_water(f);
	for (uint32_t i = 0; i < hw; i++) {
		struct ledger_slot *s = &f->slot[i];
		if (s->state == LEDGER_SLOT_FREE || (int)i == l->my_slot)
			continue;
		if (slot_is_dead(l, (int)i)) {
			vgpu_log_debug("reclaiming ledger slot %u of a process that is gone (pid %d in its namespace)", i,
				       (int)s->pid);
			memset(s, 0, sizeof(*s));
		}
	}
	while (hw > 0 && f->slot[hw - 1].state == LEDGER_SLOT_FREE)
		hw--;
	if (l->my_slot >= 0 && (uint32_t)l->my_slot >= hw)
		hw = (uint32_t)l->my_slot + 1;
	f->h.high_water = hw;
	f->h.reclaimed_ns = now;
}

/* Under the guard. */
static uint64_t hooked_total(const struct ledger_file *f, int dev)
{
	uint64_t sum = 0;
	uint32_t hw = high_water(f);
	for (uint32_t i = 0; i < hw; i++)
		if (f->slot[i].state != LEDGER_SLOT_FREE)
			sum = add_sat(sum, __atomic_load_n(&f->slot[i].used[dev], __ATOMIC_ACQUIRE));
	return sum;
}

/* Under the lock and the guard: take a free slot (reclaiming dead ones if none is free) by
 * locking its bytes, then mark it used. The lock is kept for the life of the open file
 * description. */
static int claim_slot(struct vgpu_ledger *l)
{
	struct ledger_file *f = l->map;
	if (l->my_slot >= 0) {
		const struct ledger_slot *mine = &f->slot[l->my_slot];
		if (mine->state == LEDGER_SLOT_USED && mine->owner == l->my_owner)
			return 0;
		/* reclaimed as dead: the application closed the ledger's descriptor, and with it
		 * dropped the slot's lock. What this process holds is no longer counted. */
		vgpu_log_error("this process's memory ledger slot was taken over (was its descriptor closed?)");
		return -1;
	}
	for (int pass = 0; pass < 2; pass++) {
		if (pass == 1)
			reclaim_dead(l, vgpu_now_ns());
		for (uint32_t i = 0; i < LEDGER_SLOTS; i++) {
			struct ledger_slot *s = &f->slot[i];
			if (s->state != LEDGER_SLOT_FREE)
				continue;
			/* a free slot that is still locked: a process that lost its mark (cannot happen
			 * through this code); leave it alone */
			if (ofd_lock(l->fd, F_OFD_SETLK, F_WRLCK, slot_offset((int)i), sizeof(*s)) != 0)
				continue;
			memset(s, 0, sizeof(*s));
			s->pid = (int32_t)getpid();
			s->owner = l->my_owner;
			s->state = LEDGER_SLOT_USED;
			if (i >= high_water(f))
				f->h.high_water = i + 1;
			__atomic_store_n(&l->my_slot, (int)i, __ATOMIC_RELEASE);
			return 0;
		}
	}
	return -1;
}

struct reserve_args {
	int dev;
	uint64_t bytes, limit;
};

/* Under the lock and the guard. */
static int reserve_locked(struct vgpu_ledger *l, void *arg)
{
	const struct reserve_args *a = arg;
	struct ledger_file *f = l->map;
	uint64_t now = vgpu_now_ns();
	if (claim_slot(l) != 0) {
		if (l->my_slot < 0)
			vgpu_log_error("the memory ledger has no free slot (%u processes)", LEDGER_SLOTS);
		return -1;
	}
	if (now - f->h.reclaimed_ns >= RECLAIM_INTERVAL_NS)
		reclaim_dead(l, now);
	for (int pass = 0; pass < 2; pass++) {
		uint64_t used = add_sat(hooked_total(f, a->dev), f->h.unseen[a->dev]);
		if (used <= a->limit && a->bytes <= a->limit - used) {
			__atomic_fetch_add(&f->slot[l->my_slot].used[a->dev], a->bytes, __ATOMIC_RELEASE);
			return 0;
		}
		if (pass == 0)
			reclaim_dead(l, now); /* a dead process may hold what we need */
	}
	__atomic_fetch_add(&f->h.refused, 1, __ATOMIC_RELAXED);
	return 1;
}

int vgpu_ledger_reserve(struct vgpu_ledger *l, int dev, uint64_t bytes, uint64_t limit)
{
	if (dev < 0 || dev >= VGPU_MAX_DEVICES || vgpu_ledger_usable(l) != 0)
		return -1;
	if (vgpu_ledger_lock(l) != 0)
		return -1;
	struct reserve_args a = { dev, bytes, limit };
	int rc = guarded(l, reserve_locked, &a);
	vgpu_ledger_unlock(l);
	return rc;
}

struct release_args {
	int slot, dev;
	uint64_t bytes;
};

/* Under the guard, without the lock: only this process writes its slot, and a concurrent
 * reader that sees the old, larger value is merely conservative. Saves two lock calls per
 * free. */
static int release_unlocked(struct vgpu_ledger *l, void *arg)
{
	const struct release_args *a = arg;
	struct ledger_slot *s = &l->map->slot[a->slot];
	if (s->state != LEDGER_SLOT_USED || s->owner != l->my_owner)
		return -1;
	uint64_t *u = &s->used[a->dev];
	uint64_t cur = __atomic_load_n(u, __ATOMIC_RELAXED);
	uint64_t next;
	do {
		next = cur >= a->bytes ? cur - a->bytes : 0;
	} while (!__atomic_compare_exchange_n(u, &cur, next, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED));
	return 0;
}

int vgpu_ledger_release(struct vgpu_ledger *l, int dev, uint64_t bytes)
{
	if (dev < 0 || dev >= VGPU_MAX_DEVICES || vgpu_ledger_usable(l) != 0)
		return -1;
	int slot = __atomic_load_n(&l->my_slot, __ATOMIC_ACQUIRE);
	if (slot < 0)
		return -1;
	struct release_args a = { slot, dev, bytes };
	return guarded(l, release_unlocked, &a);
}

struct usage_args {
	int dev;
	uint64_t hooked, total;
};

/* Under the lock and the guard. */
static int usage_locked(struct vgpu_ledger *l, void *arg)
{
	struct usage_args *a = arg;
	reclaim_dead(l, vgpu_now_ns());
	a->hooked = hooked_total(l->map, a->dev);
	a->total = add_sat(a->hooked, l->map->h.unseen[a->dev]);
	return 0;
}

int vgpu_ledger_usage(struct vgpu_ledger *l, int dev, uint64_t *hooked, uint64_t *total)
{
	if (dev < 0 || dev >= VGPU_MAX_DEVICES || vgpu_ledger_usable(l) != 0)
		return -1;
	if (vgpu_ledger_lock(l) != 0)
		return -1;
	struct usage_args a = { .dev = dev };
	int rc = guarded(l, usage_locked, &a);
	vgpu_ledger_unlock(l);
	if (rc == 0) {
		*hooked = a.hooked;
		*total = a.total;
	}
	return rc;
}

struct reconcile_args {
	int dev;
	uint64_t nvml_total, now_ns;
};

/* Under the lock and the guard. */
static int reconcile_locked(struct vgpu_ledger *l, void *arg)
{
	const struct reconcile_args *a = arg;
	uint64_t h = hooked_total(l->map, a->dev);
	l->map->h.unseen[a->dev] = a->nvml_total > h ? a->nvml_total - h : 0;
	l->map->h.reconciled_ns[a->dev] = a->now_ns;
	return 0;
}

int vgpu_ledger_reconcile(struct vgpu_ledger *l, int dev, uint64_t nvml_total, uint64_t now_ns)
{
	if (dev < 0 || dev >= VGPU_MAX_DEVICES || vgpu_ledger_usable(l) != 0)
		return -1;
	if (vgpu_ledger_lock(l) != 0)
		return -1;
	struct reconcile_args a = { dev, nvml_total, now_ns };
	int rc = guarded(l, reconcile_locked, &a);
	vgpu_ledger_unlock(l);
	return rc;
}

struct reconciled_args {
	int dev;
	uint64_t ns;
};

static int read_reconciled(struct vgpu_ledger *l, void *arg)
{
	struct reconciled_args *a = arg;
	a->ns = __atomic_load_n(&l->map->h.reconciled_ns[a->dev], __ATOMIC_RELAXED);
	return 0;
}

uint64_t vgpu_ledger_reconciled_ns(struct vgpu_ledger *l, int dev)
{
	struct reconciled_args a = { dev, 0 };
	if (dev < 0 || dev >= VGPU_MAX_DEVICES || vgpu_ledger_usable(l) != 0 || guarded(l, read_reconciled, &a) != 0)
		return 0;
	return a.ns;
}

void vgpu_ledger_forget(struct vgpu_ledger *l)
{
	/* Only an opened ledger has a descriptor: a zeroed one's fd 0 is the application's stdin. */
	if (l->map != NULL) {
		struct vgpu_shm shm = { .fd = l->fd, .map = l->map };
		vgpu_shm_close(&ledger_spec, &shm);
	}
	memset(l, 0, sizeof(*l));
	l->fd = -1;
	l->my_slot = -1;
}
