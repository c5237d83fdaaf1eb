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

/* The value after "<prefix><decimal index>=", with the index; NULL if var is not one. */
static const char *indexed(const char *var, const char *prefix, int *index)
{
	size_t n = strlen(prefix);
	if (strncmp(var, prefix, n) != 0 || !is_digit(var[n]))
		return NULL;
	long v = 0;
	const char *p = var + n;
	for (; is_digit(*p); p++) {
		v = v * 10 + (*p - '0');
		if (v > 1000000)
			return NULL;
	}
	if (*p != '=')
		return NULL;
	*index = (int)v;
	return p + 1;
}

static const char *named(const char *var, const char *name)
{
	size_t n = strlen(name);
	return strncmp(var, name, n) == 0 && var[n] == '=' ? var + n + 1 : NULL;
}

/* Does the set variable var say something else than cfg? */
static int differs(const struct vgpu_config *cfg, const char *var)
{
	int i;
	const char *v;
	if ((v = indexed(var, "MANAGER_VISIBLE_DEVICE_", &i)) != NULL) {
		int pos = vgpu_config_find_index(cfg, i);
		return pos < 0 ? v[0] != '\0' : strcasecmp(v, cfg->dev[pos].uuid) != 0;
	}
	if ((v = indexed(var, "CUDA_MEM_LIMIT_", &i)) != NULL) {
		int pos = vgpu_config_find_index(cfg, i);
		uint64_t want = pos < 0 ? 0 : cfg->dev[pos].mem_limit, have = 0;
		if (v[0] != '\0' && vgpu_parse_mem_limit(v, &have) != 0)
			return 1;
		return have != want;
	}
	if ((v = indexed(var, "CUDA_CORE_LIMIT_", &i)) != NULL) {
		int pos = vgpu_config_find_index(cfg, i);
		int want = pos < 0 ? VGPU_CORE_UNLIMITED : cfg->dev[pos].core_limit, have = VGPU_CORE_UNLIMITED;
		if (v[0] != '\0' && vgpu_parse_core_limit(v, &have) != 0)
			return 1;
		return have != want;
	}
	if ((v = named(var, "MANAGER_CLIENT_REGISTER_UUID")) != NULL)
		return strcmp(v, cfg->register_uuid) != 0;
	if (cfg->register_uuid[0] != '\0')
		return 0; /* per-claim path: the NRI identity is not used, whatever an image carries */
	if ((v = named(var, "VGPU_POD_UID")) != NULL)
		return strcmp(v, cfg->pod_uid) != 0;
	if ((v = named(var, "VGPU_CONTAINER_NAME")) != NULL)
		return strcmp(v, cfg->container_name) != 0;
	return 0;
}

int vgpu_env_differences(const struct vgpu_config *cfg, char *const *envp, char *names, size_t len)
{
	int n = 0, full = 0;
	size_t used = 0;
	if (len > 0)
		names[0] = '\0';
	for (size_t k = 0; envp != NULL && envp[k] != NULL; k++) {
		if (!differs(cfg, envp[k]))
			continue;
		n++;
		if (full || len == 0)
			continue;
		const char *eq = strchr(envp[k], '=');
		int w = snprintf(names + used, len - used, "%s%.*s", n > 1 ? ", " : "", (int)(eq - envp[k]), envp[k]);
		if (w > 0 && (size_t)w < len - used) {
			used += (size_t)w;
		} else { /* the line has its limit */
			full = 1;
			if (len >= 4)
				memcpy(names + len - 4, "...", 4);
		}
	}
	return n;
}
