#include "paths.h"

#include <stdio.h>
#include <stdlib.h>

static const char *const container_paths[] = {
	[VGPU_PATH_REGISTRY_SOCKET] = "/etc/vgpu-dra/registry/registry.sock",
	[VGPU_PATH_CONFIG_DIR] = "/etc/vgpu-dra/config",
	[VGPU_PATH_PIDS_CONFIG] = "/etc/vgpu-dra/config/pids.config",
	[VGPU_PATH_VGPU_CONFIG] = "/etc/vgpu-dra/config/vgpu.config",
	[VGPU_PATH_VGPU_LOCK_DIR] = "/tmp/.vgpu_lock",
	[VGPU_PATH_VMEM_NODE_DIR] = "/tmp/.vmem_node",
};

int vgpu_config_mount_required(void)
{
#ifdef VGPU_TEST_HOOKS
	return getenv("VGPU_TEST_CONFIG_MOUNT") != NULL;
#else
	return 1;
#endif
}

int vgpu_path(enum vgpu_path which, char *buf, size_t len)
{
	const char *root = "";
#ifdef VGPU_TEST_HOOKS
	const char *test_root = getenv("VGPU_TEST_ROOT");
	if (test_root != NULL)
		root = test_root;
#endif
	int n = snprintf(buf, len, "%s%s", root, container_paths[which]);
	return (n < 0 || (size_t)n >= len) ? -1 : 0;
}
