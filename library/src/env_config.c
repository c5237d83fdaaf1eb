#include "env_config.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

static int is_digit(char c) { return c >= '0' && c <= '9'; }

int vgpu_parse_mem_limit(const char *s, uint64_t *bytes)
{
	if (s == NULL || !is_digit(s[0]))
		return -1;
	uint64_t v = 0;
	const char *p = s;
	for (; is_digit(*p); p++) {
		uint64_t d = (uint64_t)(*p - '0');
		if (v > (UINT64_MAX - d) / 10)
			return -1;
		v = v * 10 + d;
	}
	unsigned shift = 0;
	switch (*p) {
	case '\0': shift = 0; break;
	case 'k': case 'K': shift = 10; p++; break;
	case 'm': case 'M': shift = 20; p++; break;
	case 'g': case 'G': shift = 30; p++; break;
	default: return -1;
	}
	if (*p != '\0' || v == 0)
		return -1;
	if (shift != 0 && v > (UINT64_MAX >> shift))
		return -1;
	*bytes = v << shift;
	return 0;
}

int vgpu_parse_core_limit(const char *s, int *cores)
{
	if (s == NULL || !is_digit(s[0]))
		return -1;
	int v = 0;
	for (const char *p = s; *p; p++) {
		if (!is_digit(*p))
			return -1;
		v = v * 10 + (*p - '0');
		if (v > VGPU_CORE_UNLIMITED)
			return -1;
	}
	if (v < 1)
		return -1;
	*cores = v;
	return 0;
}

static int copy_value(char *dst, size_t cap, const char *src)
{
	size_t n = strlen(src);
	if (n >= cap)
		return -1;
	memcpy(dst, src, n + 1);
	return 0;
}

static int valid_uuid_text(const char *s)
{
	for (const char *p = s; *p; p++)
		if (*p <= ' ' || *p > '~')
			return 0;
	return 1;
}

int vgpu_config_parse(struct vgpu_config *cfg, vgpu_getenv_fn get, void *ctx, char *err, size_t errlen)
{
	char name[64];
	memset(cfg, 0, sizeof(*cfg));
	if (errlen > 0)
		err[0] = '\0';

	for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
		struct vgpu_device_cfg *d = &cfg->dev[i];
		d->core_limit = VGPU_CORE_UNLIMITED;
		snprintf(name, sizeof(name), "MANAGER_VISIBLE_DEVICE_%d", i);
		const char *uuid = get(name, ctx);
		if (uuid == NULL || uuid[0] == '\0')
			continue; /* only indices with a device count; their limits are ignored */
		if (copy_value(d->uuid, sizeof(d->uuid), uuid) != 0 || !valid_uuid_text(d->uuid)) {
			snprintf(err, errlen, "%s is not a valid GPU UUID", name);
			return -1;
		}
		d->present = 1;
		cfg->ndevices++;

		snprintf(name, sizeof(name), "CUDA_MEM_LIMIT_%d", i);
		const char *mem = get(name, ctx);
		if (mem != NULL && mem[0] != '\0') {
			if (vgpu_parse_mem_limit(mem, &d->mem_limit) != 0) {
				snprintf(err, errlen, "%s=\"%.32s\" is not a memory size like 4096m", name, mem);
				return -1;
			}
			cfg->any_limit = 1;
		}
		snprintf(name, sizeof(name), "CUDA_CORE_LIMIT_%d", i);
		const char *core = get(name, ctx);
		if (core != NULL && core[0] != '\0') {
			if (vgpu_parse_core_limit(core, &d->core_limit) != 0) {
				snprintf(err, errlen, "%s=\"%.32s\" is not a core limit between 1 and 100", name, core);
				return -1;
			}
			if (d->core_limit < VGPU_CORE_UNLIMITED) {
				cfg->any_limit = 1;
				cfg->any_core_limit = 1;
			}
		}
		for (int j = 0; j < i; j++) {
			if (cfg->dev[j].present && strcasecmp(cfg->dev[j].uuid, d->uuid) == 0) {
				snprintf(err, errlen,
					 "GPU %s appears under two indices (MANAGER_VISIBLE_DEVICE_%d and _%d)",
					 d->uuid, j, i);
				return -1;
			}
		}
	}

	/* The register UUID first: on the per-claim path (a non-empty one) nothing sets
	 * VGPU_POD_UID or VGPU_CONTAINER_NAME for the container, so values an image carries are
	 * stale and not read at all (not even checked for length). */
	static const struct { const char *var; size_t off; } ids[] = {
		{ "MANAGER_CLIENT_REGISTER_UUID", offsetof(struct vgpu_config, register_uuid) },
		{ "VGPU_POD_UID", offsetof(struct vgpu_config, pod_uid) },
		{ "VGPU_CONTAINER_NAME", offsetof(struct vgpu_config, container_name) },
	};
	for (size_t k = 0; k < sizeof(ids) / sizeof(ids[0]); k++) {
		if (k > 0 && cfg->register_uuid[0] != '\0')
			break;
		const char *v = get(ids[k].var, ctx);
		if (v == NULL)
			continue;
		if (copy_value((char *)cfg + ids[k].off, 64, v) != 0) {
			snprintf(err, errlen, "%s is longer than 63 bytes", ids[k].var);
			return -1;
		}
	}
	return 0;
}

int vgpu_config_find_uuid(const struct vgpu_config *cfg, const char *uuid)
{
	for (int i = 0; i < VGPU_MAX_DEVICES; i++)
		if (cfg->dev[i].present && strcasecmp(cfg->dev[i].uuid, uuid) == 0)
			return i;
	return -1;
}
