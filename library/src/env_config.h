/* The environment the plugin injects next to vgpu.config (contract.md §3): kept for humans
 * and tools, never trusted for limits, GPUs or identity (a process can blank or rewrite its
 * own env). The library only compares it with the file, to say once that it differs. */
#ifndef VGPU_ENV_CONFIG_H
#define VGPU_ENV_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"

/* Parses "<digits>m" (MiB, the plugin's form) and also k/g suffixes and plain bytes.
 * Rejects empty digits, zero, junk, overflow. Returns 0 on success, -1 otherwise. */
int vgpu_parse_mem_limit(const char *s, uint64_t *bytes);

/* Parses a core limit 1-100. Returns 0 on success, -1 otherwise. */
int vgpu_parse_core_limit(const char *s, int *cores);

/* Names (comma-separated, in envp's order, into names) the variables of envp that are set
 * and say something else than cfg: MANAGER_VISIBLE_DEVICE_<i>, CUDA_MEM_LIMIT_<i>,
 * CUDA_CORE_LIMIT_<i> (<i> the NVML index; empty = no GPU / unlimited), and the identity
 * of the file's path: MANAGER_CLIENT_REGISTER_UUID, and on the NRI path VGPU_POD_UID and
 * VGPU_CONTAINER_NAME (the per-claim path ignores those two, which images may carry).
 * An unset variable is not a difference. Returns the number of differing variables. */
int vgpu_env_differences(const struct vgpu_config *cfg, char *const *envp, char *names, size_t len);

#endif
