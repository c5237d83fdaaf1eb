#include "core_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clock.h"
#include "sys_stat.h"

struct core_bucket *vgpu_core_file_open(const char *dir, char *err, size_t errlen)
{
	char path[512];
	if (snprintf(path, sizeof(path), "%s/%s", dir, CORE_FILE_NAME) >= (int)sizeof(path)) {
		snprintf(err, errlen, "core-limit path under %s is too long", dir);
		return NULL;
	}
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
	if (fd < 0) {
		snprintf(err, errlen, "cannot open the core-limit file %s: %s", path, strerror(errno));
		return NULL;
	}
	struct stat st;
	int locked = 0;
	while (!(locked = flock(fd, LOCK_EX) == 0) && errno == EINTR)
		;
	if (!locked || vgpu_fstat(fd, &st) != 0) {
		snprintf(err, errlen, "cannot lock the core-limit file %s: %s", path, strerror(errno));
		close(fd);
		return NULL;
	}
	const size_t size = sizeof(struct core_file);
	int fresh = st.st_size == 0;
	if (fresh) {
		if (fchmod(fd, 0666) != 0 && errno != EPERM) {
			/* another user's process may still be unable to join; it will say so */
		}
		if (ftruncate(fd, (off_t)size) != 0) {
			snprintf(err, errlen, "cannot size the core-limit file %s: %s", path, strerror(errno));
			close(fd);
			return NULL;
		}
	} else if ((size_t)st.st_size != size) {
		snprintf(err, errlen, "core-limit file %s has %lld bytes, this library expects %zu", path,
			 (long long)st.st_size, size);
		close(fd);
		return NULL;
	}
	struct core_file *f = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (f == MAP_FAILED) {
		snprintf(err, errlen, "cannot map the core-limit file %s: %s", path, strerror(errno));
		close(fd);
		return NULL;
	}
	if (fresh) {
		uint64_t now = vgpu_now_ns();
		for (int i = 0; i < VGPU_MAX_DEVICES; i++)
			core_bucket_init(&f->bucket[i], now);
		f->header_size = 64;
		f->nbuckets = VGPU_MAX_DEVICES;
		f->version = CORE_FILE_VERSION;
		__atomic_store_n(&f->magic, CORE_FILE_MAGIC, __ATOMIC_RELEASE);
	}
	if (f->magic != CORE_FILE_MAGIC || f->version != CORE_FILE_VERSION || f->nbuckets != VGPU_MAX_DEVICES) {
		snprintf(err, errlen, "core-limit file %s has layout version %u, this library expects %u", path,
			 f->version, CORE_FILE_VERSION);
		munmap(f, size);
		close(fd);
		return NULL;
	}
	/* The mapping outlives the descriptor; the lock goes with it. */
	if (close(fd) != 0) {
		snprintf(err, errlen, "closing the core-limit file %s: %s", path, strerror(errno));
		munmap(f, size);
		return NULL;
	}
	return f->bucket;
}
