/* Parsing of the container's limits and identity from the environment (contract.md §3-4).
 * Pure functions over a getter, so the parsers can be fuzzed without touching environ. */
#ifndef VGPU_ENV_CONFIG_H
#define VGPU_ENV_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#define VGPU_MAX_DEVICES 16 /* indices 0-15, the range the plugin neutralises */
#define VGPU_UUID_MAX 80
#define VGPU_CORE_UNLIMITED 100

struct vgpu_device_cfg {
	int present;              /* MANAGER_VISIBLE_DEVICE_<i> is non-empty */
	char uuid[VGPU_UUID_MAX]; /* as given, e.g. GPU-0b1c... */
	uint64_t mem_limit;       /* bytes; 0 = unlimited */
	int core_limit;           /* 1-100; 100 = unlimited */
};

struct vgpu_config {
	struct vgpu_device_cfg dev[VGPU_MAX_DEVICES];
	int ndevices;   /* number of present indices */
	int any_limit;  /* some present index has a memory or core limit */
	int any_core_limit;
	char pod_uid[64];
	char container_name[64];
	char register_uuid[64];
};

typedef const char *(*vgpu_getenv_fn)(const char *name, void *ctx);

/* Parses "<digits>m" (MiB, the plugin's form) and also k/g suffixes and plain bytes.
 * Rejects empty digits, zero, junk, overflow. Returns 0 on success, -1 otherwise. */
int vgpu_parse_mem_limit(const char *s, uint64_t *bytes);

/* Parses a core limit 1-100. Returns 0 on success, -1 otherwise. */
int vgpu_parse_core_limit(const char *s, int *cores);

/* Fills cfg from the getter. Returns 0, or -1 with a message in err naming the variable:
 * a malformed limit or a UUID under two indices is an error (never silently unlimited). */
int vgpu_config_parse(struct vgpu_config *cfg, vgpu_getenv_fn get, void *ctx, char *err, size_t errlen);

/* Index of the present device whose UUID equals uuid (case-insensitive), or -1. */
int vgpu_config_find_uuid(const struct vgpu_config *cfg, const char *uuid);

#endif
