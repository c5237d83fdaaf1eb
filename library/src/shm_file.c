#include "shm_file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"
#include "shm_guard.h"
#include "sys_stat.h"
#include "test_hook.h"

#define CREATE_ATTEMPTS 8

/* The creator's lock: one byte just past the end, where no reader's lock ever is. */
static int build_lock(int fd, size_t size, int cmd, short type)
{
	struct flock fl = { .l_type = type, .l_whence = SEEK_SET, .l_start = (off_t)size, .l_len = 1 };
	if (fcntl(fd, cmd, &fl) != 0)
		return -1;
	return cmd == F_OFD_GETLK ? fl.l_type : 0;
}

/* Removes temporary files whose creator is gone (killed while building). A file whose
 * creator has not yet taken its lock may be removed too: that creator's link() then fails
 * with ENOENT and it starts again. */
static void remove_leftovers(const struct vgpu_shm_spec *spec, const char *dir)
{
	char prefix[128];
	int plen = snprintf(prefix, sizeof(prefix), "%s.tmp.", spec->name);
	DIR *d = opendir(dir);
	if (d == NULL || plen <= 0 || plen >= (int)sizeof(prefix)) {
		if (d != NULL && closedir(d) != 0)
			vgpu_log_debug("closedir %s: %s", dir, strerror(errno));
		return;
	}
	int dfd = dirfd(d);
	for (struct dirent *e; (e = readdir(d)) != NULL;) {
		if (strncmp(e->d_name, prefix, (size_t)plen) != 0)
			continue;
		/* O_NONBLOCK: a FIFO planted under the name must not hang the open */
		int fd = openat(dfd, e->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
		if (fd < 0)
			continue; /* another user's, not yet opened up: not ours to judge */
		int held = build_lock(fd, spec->size, F_OFD_GETLK, F_RDLCK);
		if (close(fd) != 0 || held != F_UNLCK)
			continue;
		if (unlinkat(dfd, e->d_name, 0) != 0 && errno != ENOENT)
			vgpu_log_debug("cannot remove the leftover %s/%s: %s", dir, e->d_name, strerror(errno));
		else
			vgpu_log_debug("removed %s/%s, left by a creator that died", dir, e->d_name);
	}
	if (closedir(d) != 0)
		vgpu_log_debug("closedir %s: %s", dir, strerror(errno));
}

/* Builds the file under a temporary name and links it into place. 1: ours is in place
 * (out filled); 0: it was not linked (another creator's is there, or our temporary name
 * was removed): open again; -1: error. */
static int create(const struct vgpu_shm_spec *spec, const char *dir, const char *path, struct vgpu_shm *out,
		  char *err, size_t errlen)
{
	char tmp[512];
	if (snprintf(tmp, sizeof(tmp), "%s/%s.tmp.XXXXXX", dir, spec->name) >= (int)sizeof(tmp)) {
		snprintf(err, errlen, "the %s path under %s is too long", spec->what, dir);
		return -1;
	}
	int fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0) {
		snprintf(err, errlen, "cannot create the %s in %s: %s", spec->what, dir, strerror(errno));
		return -1;
	}
	void *map = MAP_FAILED;
	const char *doing = "lock";
	if (build_lock(fd, spec->size, F_OFD_SETLK, F_WRLCK) != 0)
		goto fail;
	vgpu_test_crash_point(spec->name, VGPU_STEP_CREATED);
	/* 0666: the container's processes may run as different users (the directory is 1777) */
	if (fchmod(fd, 0666) != 0)
		vgpu_log_debug("fchmod %s: %s", tmp, strerror(errno));
	doing = "size";
	if (ftruncate(fd, (off_t)spec->size) != 0)
		goto fail;
	vgpu_test_crash_point(spec->name, VGPU_STEP_SIZED);
	doing = "map";
	map = mmap(NULL, spec->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED)
		goto fail;
	/* the temporary file is 0666 already: another process may truncate it under us */
	struct vgpu_guard g;
	vgpu_guard_enter(&g, map, spec->size);
	if (sigsetjmp(g.env, 0) != 0) {
		vgpu_guard_leave(&g);
		errno = EIO;
		doing = "fill (it was truncated)";
		goto fail;
	}
	spec->init(map);
	vgpu_guard_leave(&g);
	vgpu_test_crash_point(spec->name, VGPU_STEP_INITIALISED);
	int linked = link(tmp, path) == 0;
	int link_errno = errno;
	if (linked)
		vgpu_test_crash_point(spec->name, VGPU_STEP_LINKED);
	if (unlink(tmp) != 0 && errno != ENOENT)
		vgpu_log_debug("cannot remove %s: %s", tmp, strerror(errno)); /* a second name, harmless */
	if (build_lock(fd, spec->size, F_OFD_SETLK, F_UNLCK) != 0)
		vgpu_log_debug("cannot unlock %s: %s", path, strerror(errno));
	if (linked) {
		out->fd = fd;
		out->map = map;
		return 1;
	}
	if (munmap(map, spec->size) != 0)
		vgpu_log_debug("munmap: %s", strerror(errno));
	if (close(fd) != 0)
		vgpu_log_debug("close: %s", strerror(errno));
	if (link_errno == EEXIST || link_errno == ENOENT)
		return 0;
	snprintf(err, errlen, "cannot put the new %s in place as %s: %s", spec->what, path, strerror(link_errno));
	return -1;
fail:
	snprintf(err, errlen, "cannot %s the new %s %s: %s", doing, spec->what, tmp, strerror(errno));
	if (map != MAP_FAILED && munmap(map, spec->size) != 0)
		vgpu_log_debug("munmap: %s", strerror(errno));
	if (unlink(tmp) != 0)
		vgpu_log_debug("cannot remove %s: %s", tmp, strerror(errno));
	if (close(fd) != 0)
		vgpu_log_debug("close: %s", strerror(errno));
	return -1;
}

static const char *kind_of(mode_t m)
{
	if (S_ISDIR(m))
		return "a directory";
	if (S_ISFIFO(m))
		return "a FIFO";
	if (S_ISLNK(m))
		return "a symbolic link";
	if (S_ISSOCK(m))
		return "a socket";
	if (S_ISCHR(m) || S_ISBLK(m))
		return "a device";
	return "not a regular file";
}

/* Why a file this library creates (a regular file, mode 0666, of spec->size bytes) could not
 * be opened: its owner and mode, when they are what keeps this process out. */
static void explain_open_failure(const struct vgpu_shm_spec *spec, const char *path, int open_errno, char *err,
				 size_t errlen)
{
	struct stat st;
	if ((open_errno == EACCES || open_errno == EPERM) &&
	    syscall(SYS_newfstatat, AT_FDCWD, path, &st, AT_SYMLINK_NOFOLLOW) == 0) {
		snprintf(err, errlen,
			 "cannot open the %s %s: %s: it is mode %04o, owned by uid %u, where libvgpu makes it mode "
			 "0666 for every user of the claim (was it created by something else?)",
			 spec->what, path, strerror(open_errno), (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid);
		return;
	}
	if (open_errno == ELOOP) {
		snprintf(err, errlen, "the %s %s is a symbolic link, where libvgpu makes a regular file", spec->what,
			 path);
		return;
	}
	snprintf(err, errlen, "cannot open the %s %s: %s", spec->what, path, strerror(open_errno));
}

/* Opens and maps the file at path if it exists: 1; 0 if it does not; -1 on error. */
static int open_existing(const struct vgpu_shm_spec *spec, const char *path, struct vgpu_shm *out, char *err,
			 size_t errlen)
{
	/* O_NONBLOCK: a FIFO planted under the name must not hang the open */
	int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0) {
		if (errno == ENOENT)
			return 0;
		explain_open_failure(spec, path, errno, err, errlen);
		return -1;
	}
	struct stat st;
	if (vgpu_fstat(fd, &st) != 0) {
		snprintf(err, errlen, "cannot stat the %s %s: %s", spec->what, path, strerror(errno));
	} else if (!S_ISREG(st.st_mode)) {
		snprintf(err, errlen, "the %s %s is %s, owned by uid %u, where libvgpu makes a regular file", spec->what,
			 path, kind_of(st.st_mode), (unsigned)st.st_uid);
	} else if ((size_t)st.st_size != spec->size) {
		snprintf(err, errlen, "the %s %s has %lld bytes, this library expects %zu (another library version?)",
			 spec->what, path, (long long)st.st_size, spec->size);
	} else {
		/* a file of ours that lost its mode (made by hand, or with another umask): the claim's
		 * other users could not open it; put it right */
		if ((st.st_mode & 0777) != 0666 && st.st_uid == geteuid() && fchmod(fd, 0666) != 0)
			vgpu_log_debug("fchmod %s: %s", path, strerror(errno));
		void *map = mmap(NULL, spec->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (map != MAP_FAILED) {
			out->fd = fd;
			out->map = map;
			return 1;
		}
		snprintf(err, errlen, "cannot map the %s %s: %s", spec->what, path, strerror(errno));
	}
	if (close(fd) != 0)
		vgpu_log_debug("close: %s", strerror(errno));
	return -1;
}

int vgpu_shm_open(const struct vgpu_shm_spec *spec, const char *dir, struct vgpu_shm *out, char *err, size_t errlen)
{
	char path[512];
	out->fd = -1;
	out->map = NULL;
	if (snprintf(path, sizeof(path), "%s/%s", dir, spec->name) >= (int)sizeof(path)) {
		snprintf(err, errlen, "the %s path under %s is too long", spec->what, dir);
		return -1;
	}
	if (vgpu_guard_install() != 0) {
		snprintf(err, errlen, "cannot install the SIGBUS handler that guards the %s against truncation",
			 spec->what);
		return -1;
	}
	for (int attempt = 0; attempt < CREATE_ATTEMPTS; attempt++) {
		int rc = open_existing(spec, path, out, err, errlen);
		if (rc != 0)
			return rc > 0 ? 0 : -1;
		if (attempt == 0)
			remove_leftovers(spec, dir);
		rc = create(spec, dir, path, out, err, errlen);
		if (rc != 0)
			return rc > 0 ? 0 : -1;
	}
	snprintf(err, errlen, "cannot create the %s %s: it kept disappearing", spec->what, path);
	return -1;
}

void vgpu_shm_close(const struct vgpu_shm_spec *spec, struct vgpu_shm *shm)
{
	if (shm->map != NULL && munmap(shm->map, spec->size) != 0)
		vgpu_log_debug("munmap: %s", strerror(errno));
	if (shm->fd >= 0 && close(shm->fd) != 0)
		vgpu_log_debug("close: %s", strerror(errno));
	shm->map = NULL;
	shm->fd = -1;
}
