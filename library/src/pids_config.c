#include "pids_config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

static int cmp_uint(const void *a, const void *b)
{
	unsigned int x = *(const unsigned int *)a, y = *(const unsigned int *)b;
	return x < y ? -1 : x > y;
}

int vgpu_pids_parse(const char *data, size_t len, struct vgpu_pids *out)
{
	out->n = 0;
	size_t i = 0;
	while (i < len) {
		uint64_t v = 0;
		size_t digits = 0;
		while (i < len && data[i] >= '0' && data[i] <= '9') {
			v = v * 10 + (uint64_t)(data[i] - '0');
			if (v > UINT32_MAX)
				return -1;
			i++;
			digits++;
		}
		if (digits == 0 || i >= len || data[i] != '\n' || v == 0)
			return -1;
		i++;
		if (out->n == VGPU_MAX_PIDS)
			return -1;
		out->pid[out->n++] = (unsigned int)v;
	}
	/* ascending by contract; sort anyway so lookups never depend on the writer */
	for (size_t k = 1; k < out->n; k++) {
		if (out->pid[k - 1] >= out->pid[k]) {
			qsort(out->pid, out->n, sizeof(out->pid[0]), cmp_uint);
			break;
		}
	}
	return 0;
}

int vgpu_pids_read(const char *path, struct vgpu_pids *out)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return -1;
	if (flock(fd, LOCK_SH) != 0) {
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	size_t cap = 64 * 1024, len = 0;
	char *buf = malloc(cap);
	int rc = -1, err = ENOMEM;
	if (buf != NULL) {
		for (;;) {
			ssize_t r = pread(fd, buf + len, cap - len, (off_t)len);
			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0) {
				err = errno;
				break;
			}
			len += (size_t)r;
			if (r == 0 || len == cap) {
				rc = 0;
				break;
			}
		}
	}
	/* flock is released by close; nothing else to undo */
	if (close(fd) != 0 && rc == 0) {
		err = errno;
		rc = -1;
	}
	if (rc == 0 && (len == cap || vgpu_pids_parse(buf, len, out) != 0)) {
		err = EINVAL;
		rc = -1;
	}
	free(buf);
	if (rc != 0)
		errno = err;
	return rc;
}

int vgpu_pids_contains(const struct vgpu_pids *p, unsigned int pid)
{
	size_t lo = 0, hi = p->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (p->pid[mid] == pid)
			return 1;
		if (p->pid[mid] < pid)
			lo = mid + 1;
		else
			hi = mid;
	}
	return 0;
}
