#include "config_mount.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* mountinfo files larger than this are refused rather than read in part: a node with many
 * thousands of mounts visible in a container is not one the plugin sets up. */
#define MOUNTINFO_MAX_BYTES (4 * 1024 * 1024)

static int parse_int(const char *s, const char *end, int *out)
{
	long v = 0;
	if (s == end)
		return -1;
	for (; s < end; s++) {
		if (*s < '0' || *s > '9' || v > 100000000)
			return -1;
		v = v * 10 + (*s - '0');
	}
	*out = (int)v;
	return 0;
}

/* Copies the field [s, end) into out, undoing the kernel's octal escapes. */
static int unescape(const char *s, const char *end, char *out, size_t outlen)
{
	size_t n = 0;
	while (s < end) {
		char c = *s++;
		if (c == '\\' && end - s >= 3 && s[0] >= '0' && s[0] <= '3' && s[1] >= '0' && s[1] <= '7' && s[2] >= '0' &&
		    s[2] <= '7') {
			c = (char)((s[0] - '0') * 64 + (s[1] - '0') * 8 + (s[2] - '0'));
			s += 3;
		}
		if (n + 1 >= outlen)
			return -1;
		out[n++] = c;
	}
	out[n] = '\0';
	return 0;
}

int vgpu_mountinfo_mount_point(const char *mi, size_t len, int mnt_id, char *out, size_t outlen)
{
	const char *end = mi + len;
	for (const char *line = mi; line < end;) {
		const char *eol = memchr(line, '\n', (size_t)(end - line));
		if (eol == NULL)
			eol = end;
		/* fields 1 (id) and 5 (mount point), separated by single spaces */
		const char *f[6];
		int nf = 0;
		for (const char *p = line; p < eol && nf < 6;) {
			f[nf++] = p;
			const char *sp = memchr(p, ' ', (size_t)(eol - p));
			p = sp == NULL ? eol : sp + 1;
		}
		int id;
		const char *id_end = memchr(line, ' ', (size_t)(eol - line));
		if (id_end != NULL && parse_int(line, id_end, &id) == 0 && id == mnt_id) {
			if (nf < 6)
				return -1;
			return unescape(f[4], f[5] - 1, out, outlen);
		}
		line = eol + 1;
	}
	return -1;
}

/* Reads a whole /proc file (their size is not known in advance) into a malloc'd buffer. */
static char *read_proc(const char *path, size_t *len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	size_t cap = 16384, n = 0;
	char *buf = malloc(cap);
	while (buf != NULL) {
		if (n == cap) {
			char *bigger = cap >= MOUNTINFO_MAX_BYTES ? NULL : realloc(buf, cap * 2);
			if (bigger == NULL) {
				free(buf);
				buf = NULL;
				break;
			}
			buf = bigger;
			cap *= 2;
		}
		ssize_t r = read(fd, buf + n, cap - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			free(buf);
			buf = NULL;
			break;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	int e = errno;
	close(fd);
	errno = e;
	*len = n;
	return buf;
}

static int fd_mount_id(int fd, int *mnt_id)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
	size_t len;
	char *info = read_proc(path, &len);
	if (info == NULL)
		return -1;
	int rc = -1;
	for (const char *p = info, *end = info + len; p < end;) {
		const char *eol = memchr(p, '\n', (size_t)(end - p));
		if (eol == NULL)
			eol = end;
		if (eol - p > 7 && memcmp(p, "mnt_id:", 7) == 0) {
			const char *v = p + 7;
			while (v < eol && (*v == '\t' || *v == ' '))
				v++;
			rc = parse_int(v, eol, mnt_id);
			break;
		}
		p = eol + 1;
	}
	free(info);
	return rc;
}

int vgpu_config_mount_check(int fd, const char *mount_point, char *err, size_t errlen)
{
	struct statvfs sv;
	if (fstatvfs(fd, &sv) != 0) {
		snprintf(err, errlen, "cannot tell which file system it is on: %s", strerror(errno));
		return -1;
	}
	if (!(sv.f_flag & ST_RDONLY)) {
		snprintf(err, errlen,
			 "is on a writable file system, not the node's read-only mount at %s: it was not put there by the "
			 "node (was %s renamed or replaced?)",
			 mount_point, mount_point);
		return -1;
	}
	int id;
	if (fd_mount_id(fd, &id) != 0) {
		snprintf(err, errlen, "cannot tell which mount it is on (/proc/self/fdinfo: %s)", strerror(errno));
		return -1;
	}
	size_t len;
	char *mi = read_proc("/proc/self/mountinfo", &len);
	if (mi == NULL) {
		snprintf(err, errlen, "cannot read /proc/self/mountinfo: %s", strerror(errno));
		return -1;
	}
	char mp[4096];
	int found = vgpu_mountinfo_mount_point(mi, len, id, mp, sizeof(mp));
	free(mi);
	if (found != 0) {
		snprintf(err, errlen, "is on mount %d, which /proc/self/mountinfo does not list", id);
		return -1;
	}
	if (strcmp(mp, mount_point) != 0) {
		snprintf(err, errlen,
			 "is on a read-only mount at %.1000s, not the node's mount at %s: it was not put there by the node",
			 mp, mount_point);
		return -1;
	}
	return 0;
}
