/* Container paths of contract.md §3-4. This file is the one place that knows them. */
#ifndef VGPU_PATHS_H
#define VGPU_PATHS_H

#include <stddef.h>

enum vgpu_path {
	VGPU_PATH_REGISTRY_SOCKET, /* /etc/vgpu-dra/registry/registry.sock */
	VGPU_PATH_CONFIG_DIR,      /* /etc/vgpu-dra/config (read-only; pids.config inside) */
	VGPU_PATH_PIDS_CONFIG,     /* /etc/vgpu-dra/config/pids.config */
	VGPU_PATH_VGPU_CONFIG,     /* /etc/vgpu-dra/config/vgpu.config (limits, GPUs, identity) */
	VGPU_PATH_VGPU_LOCK_DIR,   /* /tmp/.vgpu_lock (core-limit bucket) */
	VGPU_PATH_VMEM_NODE_DIR,   /* /tmp/.vmem_node (memory ledger) */
};

/* Writes the path into buf. Returns 0, or -1 if it does not fit.
 *
 * Test builds only (libvgpu-test.so, compiled with VGPU_TEST_HOOKS): every path is prefixed
 * with $VGPU_TEST_ROOT when it is set, so the suite can run without root and in parallel.
 * The production libvgpu.so does not contain that code; a ctest checks that it ignores
 * the variable. */
int vgpu_path(enum vgpu_path which, char *buf, size_t len);

/* Whether vgpu.config must be on the node's read-only mount of the config directory
 * (config_mount.h). Always in the shipped library; in test builds only when
 * $VGPU_TEST_CONFIG_MOUNT is set (the suite writes its configs to ordinary directories, and its
 * cases for the check make the mount in a mount namespace of their own). */
int vgpu_config_mount_required(void);

#endif
