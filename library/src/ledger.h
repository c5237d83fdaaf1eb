/* The container's shared memory ledger in /tmp/.vmem_node (contract.md §4).
 *
 * One file-backed shared mapping per container (on the per-claim path: per claim, shared by
 * the claim's containers): a slot per process that uses memory with the bytes it holds on
 * each device (by the GPU's position in vgpu.config), plus, per device, the driver memory
 * that the hooks cannot see (contexts, the driver's own), reconciled from NVML.
 *
 * Liveness without PIDs. The processes sharing a ledger may live in different PID
 * namespaces (two containers of one claim), so a PID says nothing about another process:
 * numbers collide and kill(pid, 0) asks the wrong namespace. Instead a process owns its slot
 * by an open-file-description lock (F_OFD_SETLK) on the slot's bytes, taken when it claims
 * the slot and held for its life. The kernel drops an OFD lock when the open file
 * description is released, whatever the namespace: when its last descriptor is closed and
 * its last mapping is gone, that is at exit (SIGKILL included) and at exec (the descriptor
 * is close-on-exec). So an application that closes the descriptor behind the library's back
 * does not give its slot away while it still maps the ledger. A slot marked used whose lock
 * anyone can take belongs to a process that is gone and is reclaimed by whoever finds it.
 * OFD locks, unlike POSIX record locks, belong to the open file description, not to the
 * PID, and are not dropped when the process closes some other descriptor of the file. A
 * forked child inherits the descriptor and the mapping, and with them the parent's locks:
 * its fork handler (runtime.c) unmaps and closes both (vgpu_ledger_forget) before it can
 * use them, so it never holds or clears the parent's slot, and opens its own on first use.
 *
 * Every change of the shared state happens under an OFD write lock on the header's bytes
 * (threads of one process share the open file description, so they serialise on a spinlock
 * first). The kernel drops it too when its holder dies, so a SIGKILLed holder never hangs the
 * others; the worst a holder killed half-way leaves behind is its own slot, reclaimed as dead.
 *
 * The file is created complete under a temporary name and then linked into place
 * (shm_file.h): a SIGKILL during creation never leaves a half-written ledger.
 *
 * The plugin reads the file too, for its per-container metrics (pkg/usage, contract.md §4a):
 * without the lock, never blocking, counting a used slot only while its lock is held. Its Go
 * reader follows this layout field by field; library/test/ledger_layout.c prints the layout
 * for the Go test that fails when the two drift apart. */
#ifndef VGPU_LEDGER_H
#define VGPU_LEDGER_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "spinlock.h"

#define LEDGER_FILE_NAME "ledger.v2"
#define LEDGER_MAGIC 0x4c4d4756u /* "VGML" */
#define LEDGER_VERSION 2u
#define LEDGER_SLOTS 1024u
#define LEDGER_SLOT_FREE 0u
#define LEDGER_SLOT_USED 1u

struct ledger_slot {
	uint32_t state;      /* LEDGER_SLOT_*; a used slot is alive while its byte range is locked */
	int32_t pid;         /* the owner's PID in its own namespace: for people reading the file only */
	uint64_t owner;      /* random, per process: the owner notices if its slot was taken from it */
	uint64_t used[VGPU_MAX_DEVICES];
};

struct ledger_header {
	uint32_t magic;      /* written last: a file without it was never completed */
	uint32_t version;
	uint32_t header_size;
	uint32_t slot_size;
	uint32_t nslots;
	uint32_t ndevices;
	uint32_t high_water; /* slots [0, high_water) may be in use */
	uint32_t pad;
	uint64_t unseen[VGPU_MAX_DEVICES];        /* bytes NVML sees and the hooks do not */
	uint64_t reconciled_ns[VGPU_MAX_DEVICES]; /* CLOCK_MONOTONIC of the last reconciliation */
	uint64_t reclaimed_ns;                    /* last dead-slot scan */
	uint64_t refused;    /* reservations refused for the limit, all devices: the plugin's metrics read it */
	uint64_t reserved[6];
};

struct ledger_file {
	struct ledger_header h;
	struct ledger_slot slot[LEDGER_SLOTS];
};

/* The layout is shared between processes (and library builds): pin it. */
_Static_assert(sizeof(struct ledger_slot) == 16 + 8 * VGPU_MAX_DEVICES, "ledger slot layout");
_Static_assert(offsetof(struct ledger_slot, owner) == 8 && offsetof(struct ledger_slot, used) == 16,
	       "ledger slot layout");
_Static_assert(sizeof(struct ledger_header) == 32 + 16 * VGPU_MAX_DEVICES + 64, "ledger header layout");
_Static_assert(offsetof(struct ledger_header, unseen) == 32, "ledger header layout");
_Static_assert(offsetof(struct ledger_header, refused) == 32 + 16 * VGPU_MAX_DEVICES + 8, "ledger header layout");
_Static_assert(offsetof(struct ledger_file, slot) == sizeof(struct ledger_header), "ledger file layout");
_Static_assert(sizeof(struct ledger_file) == 352 + 144 * LEDGER_SLOTS, "ledger file layout");

struct vgpu_ledger {
	int fd;
	struct ledger_file *map;
	int my_slot;       /* -1 until this process first reserves */
	uint64_t my_owner; /* this process's mark in its slot */
	vgpu_spinlock lock; /* the OFD lock is per open file description: threads serialise here first */
	int truncated;        /* the file shrank under the mapping: not used again */
	uint64_t stuck_until; /* the header's lock was held past its bound: refused at once until then */
	char path[256];       /* for messages */
};

/* Trust. Every process of the claim can write the file (it is 0666 so that the claim's users
 * can share it), so nothing read from the mapping is trusted: high_water is clamped to
 * LEDGER_SLOTS on every use and sums saturate, so a forged value can make the ledger count too
 * much or too little, never index past the mapping; the header's lock is waited for at most
 * LEDGER_LOCK_WAIT_NS, then the reservation is refused with a message naming the ledger; and
 * every access is made inside a SIGBUS guard (shm_guard.h), so a file truncated under the
 * mapping makes the ledger refuse from then on instead of killing the process. */
#define LEDGER_LOCK_WAIT_NS 5000000000ull
#define LEDGER_LOCK_REFUSE_NS 1000000000ull /* after a wait ran out: later ones refused at once */

/* Opens (creating if needed) the ledger in dir. Returns 0, or -1 with a message. The
 * header's layout fields are checked once here; high_water is not (it is clamped on use). */
int vgpu_ledger_open(struct vgpu_ledger *l, const char *dir, char *err, size_t errlen);

/* Reserve-then-allocate: adds bytes to this process's slot if the container's total plus
 * bytes stays within limit. 0 = reserved, 1 = over the limit, -1 = error. */
int vgpu_ledger_reserve(struct vgpu_ledger *l, int dev, uint64_t bytes, uint64_t limit);

/* Gives bytes back (after a free, or a failed allocation). */
int vgpu_ledger_release(struct vgpu_ledger *l, int dev, uint64_t bytes);

/* The container's usage on dev: hooked bytes of live processes, and that plus the unseen
 * driver memory. Reclaims dead processes first. */
int vgpu_ledger_usage(struct vgpu_ledger *l, int dev, uint64_t *hooked, uint64_t *total);

/* Records NVML's per-process total for the container's PIDs; unseen = max(0, nvml - hooked). */
int vgpu_ledger_reconcile(struct vgpu_ledger *l, int dev, uint64_t nvml_total, uint64_t now_ns);

/* When dev was last reconciled (0 = never). */
uint64_t vgpu_ledger_reconciled_ns(struct vgpu_ledger *l, int dev);

/* In a forked child: drop the parent's descriptor (its locks, the slot's included, belong to
 * the parent's open file description) and mapping; the child opens its own on first use.
 * Also releases this process's slot when it is the last holder of the descriptor. */
void vgpu_ledger_forget(struct vgpu_ledger *l);

/* 0 while the ledger can be used (opened, not truncated under the mapping). */
int vgpu_ledger_usable(const struct vgpu_ledger *l);

/* Test support: take and hold the lock as the reserve path does (-1, with a message, when
 * another process holds it past LEDGER_LOCK_WAIT_NS). */
int vgpu_ledger_lock(struct vgpu_ledger *l);
void vgpu_ledger_unlock(struct vgpu_ledger *l);

#endif
