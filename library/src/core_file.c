#include "core_file.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"
#include "shm_file.h"
#include "shm_guard.h"

static void init_file(void *map)
{
	struct core_file *f = map;
	uint64_t now = vgpu_now_ns();
	for (int i = 0; i < VGPU_MAX_DEVICES; i++)
		core_bucket_init(&f->bucket[i], now);
	f->header_size = 64;
	f->nbuckets = VGPU_MAX_DEVICES;
	f->version = CORE_FILE_VERSION;
	__atomic_store_n(&f->magic, CORE_FILE_MAGIC, __ATOMIC_RELEASE);
}

static const struct vgpu_shm_spec core_spec = {
	.name = CORE_FILE_NAME,
	.what = "core-limit file",
	.size = sizeof(struct core_file),
	.init = init_file,
};

struct core_bucket *vgpu_core_file_open(const char *dir, char *err, size_t errlen)
{
	struct vgpu_shm shm;
	if (vgpu_shm_open(&core_spec, dir, &shm, err, errlen) != 0)
		return NULL;
	struct core_file *f = shm.map;
	struct vgpu_guard g;
	vgpu_guard_enter(&g, f, sizeof(*f));
	if (sigsetjmp(g.env, 0) != 0) {
		vgpu_guard_leave(&g);
		snprintf(err, errlen, "the core-limit file %s/%s was truncated while it was being opened", dir,
			 CORE_FILE_NAME);
		vgpu_shm_close(&core_spec, &shm);
		return NULL;
	}
	uint32_t version = f->version;
	int ok = __atomic_load_n(&f->magic, __ATOMIC_ACQUIRE) == CORE_FILE_MAGIC && version == CORE_FILE_VERSION &&
		 f->nbuckets == VGPU_MAX_DEVICES;
	vgpu_guard_leave(&g);
	if (!ok) {
		snprintf(err, errlen, "the core-limit file %s/%s has layout version %u, this library expects %u", dir,
			 CORE_FILE_NAME, version, CORE_FILE_VERSION);
		vgpu_shm_close(&core_spec, &shm);
		return NULL;
	}
	/* The mapping outlives the descriptor: nothing here is locked. */
	if (close(shm.fd) != 0)
		vgpu_log_debug("closing the core-limit file: %s", strerror(errno));
	return f->bucket;
}
