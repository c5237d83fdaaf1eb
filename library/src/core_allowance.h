#ifndef VGPU_CORE_ALLOWANCE_H
#define VGPU_CORE_ALLOWANCE_H

#include <stddef.h>

#include "config.h"

/* The node arbiter's allowance file (contract §16): in the read-only config directory beside
 * vgpu.config, the share of each GPU's SMs the container may keep busy now (a burst above its
 * cores, or its cores). */
#define VGPU_CORE_ALLOWANCE_NAME "cores.allowance"
#define VGPU_CORE_ALLOWANCE_VERSION 1
#define VGPU_CORE_ALLOWANCE_MAX_BYTES 4096

/* Parses the file's bytes against cfg's GPUs: out[i] is the percent (1-100) of cfg->dev[i], or
 * -1 when the file has no line for it. Unknown keys and GPUs are skipped. Returns 0, or -1 when
 * the file is malformed (no version first, a percent outside 1-100, a GPU twice). */
int vgpu_core_allowance_parse(const char *data, size_t len, const struct vgpu_config *cfg, int out[VGPU_MAX_DEVICES]);

/* The core limiter's target for device index: the allowance when the file exists and parses,
 * else the device's cores from vgpu.config. Re-reads the file only when it changed (inode,
 * size, modification time); safe from any thread. */
int vgpu_core_target(int index);

#endif
