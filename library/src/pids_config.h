/* Reader of pids.config (contract.md §6): host PIDs, decimal, ascending, one per line. */
#ifndef VGPU_PIDS_CONFIG_H
#define VGPU_PIDS_CONFIG_H

#include <stddef.h>
#include <sys/types.h>

#define VGPU_MAX_PIDS 4096

struct vgpu_pids {
	size_t n;
	unsigned int pid[VGPU_MAX_PIDS];
};

/* Parses the file's bytes. Returns 0, or -1 if a line is not a decimal PID ending in '\n'. */
int vgpu_pids_parse(const char *data, size_t len, struct vgpu_pids *out);

/* Reads the file under flock(LOCK_SH). Returns 0, or -1 with errno set (EINVAL: malformed). */
int vgpu_pids_read(const char *path, struct vgpu_pids *out);

int vgpu_pids_contains(const struct vgpu_pids *p, unsigned int pid);

#endif
