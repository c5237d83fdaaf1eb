#include "ledger.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"
#include "shm_file.h"

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
	       h->nslots == LEDGER_SLOTS && h->ndevices == VGPU_MAX_DEVICES && h->high_water <= LEDGER_SLOTS;
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

int vgpu_ledger_open(struct vgpu_ledger *l, const char *dir, char *err, size_t errlen)
{
	memset(l, 0, sizeof(*l));
	l->fd = -1;
	l->my_slot = -1;
	struct vgpu_shm shm;
	if (vgpu_shm_open(&ledger_spec, dir, &shm, err, errlen) != 0)
		return -1;
	struct ledger_file *f = shm.map;
	if (!header_matches(&f->h)) {
		snprintf(err, errlen, "the memory ledger %s/%s has layout version %u, this library expects %u", dir,
			 LEDGER_FILE_NAME, f->h.version, LEDGER_VERSION);
		vgpu_shm_close(&ledger_spec, &shm);
		return -1;
	}
	l->fd = shm.fd;
	l->map = f;
	/* a mark, not a secret: tells this process's slot from one another process took over */
	uint64_t r = 0;
	if (syscall(SYS_getrandom, &r, sizeof(r), GRND_NONBLOCK) != (long)sizeof(r))
		r = vgpu_now_ns() ^ (uint64_t)(uintptr_t)l;
	l->my_owner = (r ^ ((uint64_t)(uint32_t)getpid() << 32)) | 1;
	return 0;
}

int vgpu_ledger_lock(struct vgpu_ledger *l)
{
	vgpu_spin_lock(&l->lock);
	if (ofd_lock(l->fd, F_OFD_SETLKW, F_WRLCK, 0, sizeof(struct ledger_header)) != 0) {
		vgpu_log_error("cannot lock the memory ledger: %s", strerror(errno));
		vgpu_spin_unlock(&l->lock);
		return -1;
	}
	return 0;
}

void vgpu_ledger_unlock(struct vgpu_ledger *l)
{
	if (ofd_lock(l->fd, F_OFD_SETLK, F_UNLCK, 0, sizeof(struct ledger_header)) != 0)
		vgpu_log_error("cannot unlock the memory ledger: %s", strerror(errno));
	vgpu_spin_unlock(&l->lock);
}

/* Under the lock: a used slot whose lock nobody holds belongs to a process that is gone.
 * (Our own open file description's locks never conflict with us: callers skip our slot.)
 * When the kernel cannot answer, the slot counts as alive: never under-count. */
static int slot_is_dead(const struct vgpu_ledger *l, int i)
{
	return ofd_lock(l->fd, F_OFD_GETLK, F_WRLCK, slot_offset(i), sizeof(struct ledger_slot)) == F_UNLCK;
}

/* Under the lock. */
static void reclaim_dead(struct vgpu_ledger *l, uint64_t now)
{
	struct ledger_file *f = l->map;
	uint32_t hw = f->h.high_water;
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

static uint64_t hooked_total(const struct ledger_file *f, int dev)
{
	uint64_t sum = 0;
	for (uint32_t i = 0; i < f->h.high_water; i++)
		if (f->slot[i].state != LEDGER_SLOT_FREE)
			sum += __atomic_load_n(&f->slot[i].used[dev], __ATOMIC_ACQUIRE);
	return sum;
}

/* Under the lock: take a free slot (reclaiming dead ones if none is free) by locking its
 * bytes, then mark it used. The lock is kept for the life of the open file description. */
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
			if (i >= f->h.high_water)
				f->h.high_water = i + 1;
			__atomic_store_n(&l->my_slot, (int)i, __ATOMIC_RELEASE);
			return 0;
		}
	}
	return -1;
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
		if (l->my_slot < 0)
			vgpu_log_error("the memory ledger has no free slot (%u processes)", LEDGER_SLOTS);
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
	__atomic_fetch_add(&f->h.refused, 1, __ATOMIC_RELAXED);
out:
	vgpu_ledger_unlock(l);
	return rc;
}

/* Without the lock: only this process writes its slot, and a concurrent reader that sees
 * the old, larger value is merely conservative. Saves two lock calls per free. */
int vgpu_ledger_release(struct vgpu_ledger *l, int dev, uint64_t bytes)
{
	if (dev < 0 || dev >= VGPU_MAX_DEVICES)
		return -1;
	int slot = __atomic_load_n(&l->my_slot, __ATOMIC_ACQUIRE);
	if (slot < 0 || l->map->slot[slot].state != LEDGER_SLOT_USED || l->map->slot[slot].owner != l->my_owner)
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
	/* Only an opened ledger has a descriptor: a zeroed one's fd 0 is the application's stdin. */
	if (l->map != NULL) {
		struct vgpu_shm shm = { .fd = l->fd, .map = l->map };
		vgpu_shm_close(&ledger_spec, &shm);
	}
	memset(l, 0, sizeof(*l));
	l->fd = -1;
	l->my_slot = -1;
}
