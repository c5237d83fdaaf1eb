/* The container's core-limit buckets in /tmp/.vgpu_lock: a small versioned header and one
 * 64-byte bucket per device (by the GPU's position in vgpu.config). Nothing in it is keyed by
 * a process: the buckets are shared by whoever launches. Created complete under a temporary
 * name and linked into place (shm_file.h), so a SIGKILL during creation leaves no
 * half-written file. */
#ifndef VGPU_CORE_FILE_H
#define VGPU_CORE_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "core_bucket.h"

#define CORE_FILE_NAME "core.v2"
#define CORE_FILE_MAGIC 0x43504756u /* "VGPC" */
#define CORE_FILE_VERSION 2u

struct core_file {
	uint32_t magic, version, header_size, nbuckets; /* magic written last */
	uint8_t pad[48];
	struct core_bucket bucket[VGPU_MAX_DEVICES];
};
_Static_assert(offsetof(struct core_file, bucket) == 64, "core file layout");
_Static_assert(sizeof(struct core_file) == 64 + 64 * VGPU_MAX_DEVICES, "core file layout");

/* Returns the buckets (mapped shared), or NULL with a message. Every access to them is made
 * inside a SIGBUS guard (shm_guard.h): another process of the claim can truncate the file. */
struct core_bucket *vgpu_core_file_open(const char *dir, char *err, size_t errlen);

#endif
