/* The container's core-limit buckets in /tmp/.vgpu_lock: a small versioned header and one
 * 64-byte bucket per device (by the GPU's position in vgpu.config). Nothing in it is keyed by
 * a process: the buckets are shared by whoever launches. Created complete under a temporary
 * name and linked into place (shm_file.h), so a SIGKILL during creation leaves no
 * half-written file. A new version is a new name: processes of an older library in the same
 * container (none in practice: the library is the container's, mounted at its creation) keep
 * their own file. */
#ifndef VGPU_CORE_FILE_H
#define VGPU_CORE_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "core_bucket.h"

#define CORE_FILE_NAME "core.v3" /* v3: 128-byte buckets (the controller's gathered window) */
#define CORE_FILE_MAGIC 0x43504756u /* "VGPC" */
#define CORE_FILE_VERSION 3u

struct core_file {
	uint32_t magic, version, header_size, nbuckets; /* magic written last */
	/* Per device, the target (percent) the bucket's rate was set for, so that a change of the
	 * allowance is applied to the shared rate once, by whichever process sees it first; 0: none
	 * recorded yet. These bytes were reserved (zero) before: a file of an earlier build reads 0. */
	_Atomic uint8_t rate_target[VGPU_MAX_DEVICES];
	uint8_t pad[48 - VGPU_MAX_DEVICES];
	struct core_bucket bucket[VGPU_MAX_DEVICES];
};
_Static_assert(offsetof(struct core_file, rate_target) == 16, "core file layout");
_Static_assert(sizeof(_Atomic uint8_t) == 1, "core file layout");
_Static_assert(offsetof(struct core_file, bucket) == 64, "core file layout");
_Static_assert(sizeof(struct core_file) == 64 + 128 * VGPU_MAX_DEVICES, "core file layout");

/* Returns the buckets (mapped shared), or NULL with a message. Every access to them is made
 * inside a SIGBUS guard (shm_guard.h): another process of the claim can truncate the file. */
struct core_bucket *vgpu_core_file_open(const char *dir, char *err, size_t errlen);

/* The file that holds buckets (as vgpu_core_file_open returned them). */
static inline struct core_file *vgpu_core_file_of(struct core_bucket *buckets)
{
	return (struct core_file *)(void *)((char *)buckets - offsetof(struct core_file, bucket));
}

#endif
