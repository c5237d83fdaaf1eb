/* The container's vGPU configuration: limits, GPU map and registration identity, read from
 * vgpu.config in the read-only config directory (contract.md §4, "vgpu.config"). The file
 * is the only source: the environment is never trusted for any of it (env_config.h only
 * compares the env with the file, to say so once).
 *
 * Format (version 1), one item per line, each line ending in '\n', at most 64 KiB:
 *   # comment            (blank lines are ignored too)
 *   version 1            the first line that is not a comment or blank
 *   claim <claim UID>    informational
 *   pod <pod UID>        NRI-path identity, with container
 *   container <name>
 *   register <UUID>      per-claim identity (instead of pod and container)
 *   gpu <NVML index> <GPU UUID> <memory limit bytes, 0 = unlimited> <core %, 0 or 100 = unlimited>
 * Fields are separated by one space. Unknown keys are skipped (additions within version 1);
 * a malformed known line, a repeated identity key, a GPU UUID or NVML index listed twice,
 * or more than VGPU_MAX_DEVICES gpu lines is an error naming the line. */
#ifndef VGPU_CONFIG_H
#define VGPU_CONFIG_H

#include <stddef.h>
#include <stdint.h>

/* gpu lines a config may hold: the per-device slots of the ledger and of the core-limit
 * buckets are indexed by a GPU's position in the file (0-15), never by its NVML index. */
#define VGPU_MAX_DEVICES 16
#define VGPU_UUID_MAX 80
#define VGPU_CORE_UNLIMITED 100
#define VGPU_CONFIG_MAX_BYTES (64 * 1024)
#define VGPU_CONFIG_VERSION 1
#define VGPU_CONFIG_FILE_NAME "vgpu.config"

struct vgpu_device_cfg {
	int nvml_index;           /* the node's NVML index: for messages and the env comparison */
	int line;                 /* line of the file, for messages */
	char uuid[VGPU_UUID_MAX]; /* as given, e.g. GPU-0b1c...; CUDA devices are matched by it */
	uint64_t mem_limit;       /* bytes; 0 = unlimited */
	int core_limit;           /* 1-100; 100 = unlimited */
};

struct vgpu_config {
	struct vgpu_device_cfg dev[VGPU_MAX_DEVICES]; /* [0, ndevices), in the file's order */
	int ndevices;
	int any_limit;      /* some GPU has a memory or core limit */
	int any_core_limit;
	char claim_uid[64];
	char pod_uid[64];
	char container_name[64];
	char register_uuid[64];
};

/* Parses the file's bytes. Returns 0, or -1 with a message in err (naming the line). */
int vgpu_config_parse(const char *data, size_t len, struct vgpu_config *cfg, char *err, size_t errlen);

/* Reads and parses path (a regular file, not followed if a symlink). Returns 0; or -1 with
 * errno set and a message in err when the file cannot be read (errno ENOENT: missing); or
 * -1 with errno EINVAL when it is malformed. */
int vgpu_config_read(const char *path, struct vgpu_config *cfg, char *err, size_t errlen);

/* vgpu_config_read, and when mount_point is not NULL the file must be on a read-only mount
 * whose mount point is mount_point (config_mount.h): otherwise -1 with errno EPERM. */
int vgpu_config_read_mounted(const char *path, const char *mount_point, struct vgpu_config *cfg, char *err,
			     size_t errlen);

/* Position of the GPU whose UUID equals uuid (case-insensitive), or -1. */
int vgpu_config_find_uuid(const struct vgpu_config *cfg, const char *uuid);

/* Position of the GPU at NVML index nvml_index, or -1. */
int vgpu_config_find_index(const struct vgpu_config *cfg, int nvml_index);

#endif
