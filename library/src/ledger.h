/* The container's shared memory ledger in /tmp/.vmem_node (contract.md §4).
 *
 * One file-backed shared mapping per container: a slot per process that uses memory with
 * the bytes it holds on each device index, plus, per device, the driver memory that the
 * hooks cannot see (contexts, the driver's own), reconciled from NVML. Every change happens
 * under flock(LOCK_EX) on the process's own open file description: the kernel drops a lock
 * whose holder dies, so a SIGKILLed holder never hangs the others, and the worst a holder
 * killed half-way can leave behind is its own slot, which is reclaimed as dead. */
#ifndef VGPU_LEDGER_H
#define VGPU_LEDGER_H

#include <stddef.h>
#include <stdint.h>

#include "env_config.h"
#include "spinlock.h"

#define LEDGER_FILE_NAME "ledger.v1"
#define LEDGER_MAGIC 0x4c4d4756u /* "VGML" */
#define LEDGER_VERSION 1u
#define LEDGER_SLOTS 1024u

struct ledger_slot {
	int32_t pid;         /* PID in the container's namespace; 0 = free */
	uint32_t pad;
	uint64_t start_time; /* /proc/<pid>/stat start time: a reused PID is not the owner */
	uint64_t used[VGPU_MAX_DEVICES];
};

struct ledger_header {
	uint32_t magic;
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
	uint64_t reserved[7];
};

struct ledger_file {
	struct ledger_header h;
	struct ledger_slot slot[LEDGER_SLOTS];
};

/* The layout is shared between processes (and library builds): pin it. */
_Static_assert(sizeof(struct ledger_slot) == 16 + 8 * VGPU_MAX_DEVICES, "ledger slot layout");
_Static_assert(sizeof(struct ledger_header) == 32 + 16 * VGPU_MAX_DEVICES + 64, "ledger header layout");
_Static_assert(offsetof(struct ledger_header, unseen) == 32, "ledger header layout");
_Static_assert(offsetof(struct ledger_file, slot) == sizeof(struct ledger_header), "ledger file layout");
_Static_assert(sizeof(struct ledger_file) == 352 + 144 * LEDGER_SLOTS, "ledger file layout");

struct vgpu_ledger {
	int fd;
	struct ledger_file *map;
	int my_slot; /* -1 until this process first reserves */
	int32_t my_pid;
	uint64_t my_start;
	vgpu_spinlock lock; /* flock is per open file description: threads serialise here first */
};

/* Opens (creating if needed) the ledger in dir. Returns 0, or -1 with a message. */
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
uint64_t vgpu_ledger_reconciled_ns(const struct vgpu_ledger *l, int dev);

/* In a forked child: drop the parent's descriptor (its flock belongs to the parent's open
 * file description) and mapping; the child opens its own on first use. */
void vgpu_ledger_forget(struct vgpu_ledger *l);

/* Test support: take and hold the lock as the reserve path does. */
int vgpu_ledger_lock(struct vgpu_ledger *l);
void vgpu_ledger_unlock(struct vgpu_ledger *l);

#endif
