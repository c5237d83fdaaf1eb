#include "core_allowance.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "sys_stat.h"
#include <unistd.h>

#include "log.h"
#include "paths.h"
#include "runtime.h"
#include "spinlock.h"

int vgpu_core_allowance_parse(const char *data, size_t len, const struct vgpu_config *cfg, int out[VGPU_MAX_DEVICES])
{
	for (int i = 0; i < VGPU_MAX_DEVICES; i++)
		out[i] = -1;
	int versioned = 0;
	size_t pos = 0;
	while (pos < len) {
		const char *line = data + pos;
		const char *nl = memchr(line, '\n', len - pos);
		size_t n = nl != NULL ? (size_t)(nl - line) : len - pos;
		pos += n + 1;
		char buf[256];
		if (n >= sizeof(buf))
			return -1; /* no valid line is this long */
		memcpy(buf, line, n);
		buf[n] = '\0';
		char key[16], uuid[VGPU_UUID_MAX], pct[8], extra[2];
		int fields = sscanf(buf, "%15s %79s %7s %1s", key, uuid, pct, extra);
		if (fields <= 0 || key[0] == '#')
			continue;
		if (!versioned) {
			if (fields != 2 || strcmp(key, "version") != 0 || strcmp(uuid, "1") != 0)
				return -1;
			versioned = 1;
			continue;
		}
		if (strcmp(key, "gpu") != 0)
			continue;
		if (fields != 3)
			return -1;
		char *end;
		long v = strtol(pct, &end, 10);
		if (*end != '\0' || end == pct || v < 1 || v > 100)
			return -1;
		for (int i = 0; i < cfg->ndevices && i < VGPU_MAX_DEVICES; i++) {
			if (strcmp(cfg->dev[i].uuid, uuid) != 0)
				continue;
			if (out[i] != -1)
				return -1;
			out[i] = (int)v;
		}
	}
	return versioned ? 0 : -1;
}

static vgpu_spinlock lock = VGPU_SPINLOCK_INIT;
static struct {
	int known; /* the file was looked at once */
	dev_t dev;
	ino_t ino;
	off_t size;
	struct timespec mtime;
	int pct[VGPU_MAX_DEVICES];
} seen;

/* Reads the file again when it changed; called under lock. */
static void refresh(void)
{
	char path[512];
	if (vgpu_path(VGPU_PATH_CONFIG_DIR, path, sizeof(path)) != 0)
		return;
	size_t dl = strlen(path);
	if (dl + 1 + sizeof(VGPU_CORE_ALLOWANCE_NAME) > sizeof(path))
		return;
	path[dl] = '/';
	memcpy(path + dl + 1, VGPU_CORE_ALLOWANCE_NAME, sizeof(VGPU_CORE_ALLOWANCE_NAME));
	struct stat st;
	if (vgpu_stat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
		for (int i = 0; i < VGPU_MAX_DEVICES; i++)
			seen.pct[i] = -1; /* no file (no arbiter, or not yet): vgpu.config's cores */
		seen.known = 1, seen.ino = 0;
		return;
	}
	if (seen.known && seen.dev == st.st_dev && seen.ino == st.st_ino && seen.size == st.st_size &&
	    seen.mtime.tv_sec == st.st_mtim.tv_sec && seen.mtime.tv_nsec == st.st_mtim.tv_nsec)
		return;
	seen.known = 1, seen.dev = st.st_dev, seen.ino = st.st_ino, seen.size = st.st_size, seen.mtime = st.st_mtim;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	char data[VGPU_CORE_ALLOWANCE_MAX_BYTES];
	ssize_t n = fd >= 0 ? read(fd, data, sizeof(data)) : -1;
	if (fd >= 0)
		close(fd);
	int pct[VGPU_MAX_DEVICES];
	if (n < 0 || (size_t)n >= sizeof(data) || vgpu_core_allowance_parse(data, (size_t)n, &vgpu_rt.cfg, pct) != 0) {
		vgpu_log_debug("%s is unreadable or malformed: the core limits of vgpu.config apply", path);
		for (int i = 0; i < VGPU_MAX_DEVICES; i++)
			seen.pct[i] = -1;
		return;
	}
	memcpy(seen.pct, pct, sizeof(pct));
}

int vgpu_core_target(int index)
{
	int fallback = vgpu_rt.cfg.dev[index].core_limit;
	vgpu_spin_lock(&lock);
	refresh();
	int pct = seen.pct[index];
	vgpu_spin_unlock(&lock);
	return pct > 0 ? pct : fallback;
}
