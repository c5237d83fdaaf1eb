#include "core_wake.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "paths.h"
#include "sys_stat.h"

enum { WAKE_UNOPENED = -3, WAKE_OPENING = -2, WAKE_FAILED = -1 };

static _Atomic int wake_fd = WAKE_UNOPENED;
static _Atomic int write_failure_logged;

/* O_NONBLOCK: a FIFO planted under the name must not hang a launch; only a regular file is
 * written. 0666 as the library's other files there: the container's processes may run as
 * different users. */
static int open_wake(void)
{
	char dir[400], path[512];
	if (vgpu_path(VGPU_PATH_VGPU_LOCK_DIR, dir, sizeof(dir)) != 0 ||
	    snprintf(path, sizeof(path), "%s/%s", dir, VGPU_CORE_WAKE_NAME) >= (int)sizeof(path))
		return -1;
	int fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0666);
	if (fd < 0) {
		vgpu_log_debug("cannot open %s (the arbiter sees this process's work a pass later): %s", path,
			       strerror(errno));
		return -1;
	}
	struct stat st;
	if (vgpu_fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		vgpu_log_debug("%s is not a regular file: no wake signal from this process", path);
		if (close(fd) != 0)
			vgpu_log_debug("close %s: %s", path, strerror(errno));
		return -1;
	}
	if ((st.st_mode & 0777) != 0666 && st.st_uid == geteuid() && fchmod(fd, 0666) != 0)
		vgpu_log_debug("fchmod %s: %s", path, strerror(errno));
	return fd;
}

void vgpu_core_wake(void)
{
	int fd = atomic_load_explicit(&wake_fd, memory_order_acquire);
	if (fd == WAKE_UNOPENED) {
		if (!atomic_compare_exchange_strong(&wake_fd, &fd, WAKE_OPENING))
			return; /* another thread opens it now: its wake is this one's too */
		fd = open_wake();
		atomic_store_explicit(&wake_fd, fd >= 0 ? fd : WAKE_FAILED, memory_order_release);
	}
	if (fd < 0)
		return;
	if (pwrite(fd, "w", 1, 0) != 1 && !atomic_exchange(&write_failure_logged, 1))
		vgpu_log_debug("writing the wake signal failed (ignored from now on): %s", strerror(errno));
}
