#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "config_mount.h"
#include "sys_stat.h"

#define MAX_FIELDS 6
#define LINE_MAX_BYTES 1024

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -1;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* Decimal digits only (no sign, no blanks), no overflow. */
static int parse_u64(const char *s, uint64_t *out)
{
	if (!is_digit(s[0]))
		return -1;
	uint64_t v = 0;
	for (const char *p = s; *p; p++) {
		if (!is_digit(*p))
			return -1;
		uint64_t d = (uint64_t)(*p - '0');
		if (v > (UINT64_MAX - d) / 10)
			return -1;
		v = v * 10 + d;
	}
	*out = v;
	return 0;
}

/* Canonical lower-case 8-4-4-4-12, as Kubernetes writes UIDs and the plugin mints UUIDs. */
static int is_uuid(const char *s)
{
	if (strlen(s) != 36)
		return 0;
	for (int i = 0; i < 36; i++) {
		if (i == 8 || i == 13 || i == 18 || i == 23) {
			if (s[i] != '-')
				return 0;
		} else if (!is_digit(s[i]) && !(s[i] >= 'a' && s[i] <= 'f')) {
			return 0;
		}
	}
	return 1;
}

/* RFC 1123 label, as Kubernetes requires of container names. */
static int is_dns_label(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n > 63 || s[0] == '-' || s[n - 1] == '-')
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!is_digit(s[i]) && !(s[i] >= 'a' && s[i] <= 'z') && s[i] != '-')
			return 0;
	return 1;
}

struct identity_key {
	const char *key;
	size_t off;
	int (*valid)(const char *);
	const char *form;
};

static const struct identity_key identity_keys[] = {
	{ "claim", offsetof(struct vgpu_config, claim_uid), is_uuid, "a lower-case UUID" },
	{ "pod", offsetof(struct vgpu_config, pod_uid), is_uuid, "a lower-case UUID" },
	{ "container", offsetof(struct vgpu_config, container_name), is_dns_label, "a DNS label" },
	{ "register", offsetof(struct vgpu_config, register_uuid), is_uuid, "a lower-case UUID" },
};

static int parse_gpu(struct vgpu_config *cfg, char **f, int nf, int line, char *err, size_t errlen)
{
	if (nf != 5)
		return fail(err, errlen,
			    "line %d: a gpu line is \"gpu <NVML index> <GPU UUID> <memory limit bytes> <core limit percent>\"",
			    line);
	if (cfg->ndevices == VGPU_MAX_DEVICES)
		return fail(err, errlen, "line %d: more than %d gpu lines", line, VGPU_MAX_DEVICES);
	uint64_t index, mem, core;
	if (parse_u64(f[1], &index) != 0 || index > INT_MAX)
		return fail(err, errlen, "line %d: the NVML index \"%.32s\" is not a non-negative number", line, f[1]);
	size_t ulen = strlen(f[2]);
	if (ulen >= VGPU_UUID_MAX)
		return fail(err, errlen, "line %d: the GPU UUID is longer than %d bytes", line, VGPU_UUID_MAX - 1);
	if (parse_u64(f[3], &mem) != 0)
		return fail(err, errlen, "line %d: the memory limit \"%.32s\" is not a number of bytes", line, f[3]);
	if (parse_u64(f[4], &core) != 0 || core > VGPU_CORE_UNLIMITED)
		return fail(err, errlen, "line %d: the core limit \"%.32s\" is not a percentage 0-100", line, f[4]);
	for (int i = 0; i < cfg->ndevices; i++) {
		const struct vgpu_device_cfg *o = &cfg->dev[i];
		if (strcasecmp(o->uuid, f[2]) == 0)
			return fail(err, errlen, "line %d: GPU %s is listed twice (also on line %d)", line, f[2], o->line);
		if (o->nvml_index == (int)index)
			return fail(err, errlen, "line %d: NVML index %d is listed twice (also on line %d)", line,
				    (int)index, o->line);
	}
	struct vgpu_device_cfg *d = &cfg->dev[cfg->ndevices++];
	d->nvml_index = (int)index;
	d->line = line;
	memcpy(d->uuid, f[2], ulen + 1);
	d->mem_limit = mem;
	d->core_limit = core == 0 ? VGPU_CORE_UNLIMITED : (int)core;
	if (d->mem_limit != 0 || d->core_limit < VGPU_CORE_UNLIMITED)
		cfg->any_limit = 1;
	if (d->core_limit < VGPU_CORE_UNLIMITED)
		cfg->any_core_limit = 1;
	return 0;
}

/* One line that is neither blank nor a comment, split into fields. */
static int parse_line(struct vgpu_config *cfg, char **f, int nf, int line, int *seen, char *err, size_t errlen)
{
	if (!seen[0]) {
		if (strcmp(f[0], "version") != 0 || nf != 2)
			return fail(err, errlen, "line %d: the first line must be \"version %d\"", line, VGPU_CONFIG_VERSION);
		uint64_t v;
		if (parse_u64(f[1], &v) != 0 || v != VGPU_CONFIG_VERSION)
			return fail(err, errlen, "has version %.32s; this library reads version %d", f[1], VGPU_CONFIG_VERSION);
		seen[0] = 1;
		return 0;
	}
	if (strcmp(f[0], "version") == 0)
		return fail(err, errlen, "line %d: version appears twice", line);
	if (strcmp(f[0], "gpu") == 0)
		return parse_gpu(cfg, f, nf, line, err, errlen);
	for (size_t k = 0; k < sizeof(identity_keys) / sizeof(identity_keys[0]); k++) {
		const struct identity_key *id = &identity_keys[k];
		if (strcmp(f[0], id->key) != 0)
			continue;
		if (seen[1 + k])
			return fail(err, errlen, "line %d: %s appears twice", line, id->key);
		if (nf != 2 || !id->valid(f[1]))
			return fail(err, errlen, "line %d: %s \"%.64s\" is not %s", line, id->key, nf > 1 ? f[1] : "",
				    id->form);
		seen[1 + k] = 1;
		memcpy((char *)cfg + id->off, f[1], strlen(f[1]) + 1); /* valid values fit in 64 */
		return 0;
	}
	return 0; /* an unknown key: an addition within this version, skipped */
}

int vgpu_config_parse(const char *data, size_t len, struct vgpu_config *cfg, char *err, size_t errlen)
{
	memset(cfg, 0, sizeof(*cfg));
	if (errlen > 0)
		err[0] = '\0';
	if (len > VGPU_CONFIG_MAX_BYTES)
		return fail(err, errlen, "is larger than %d KiB", VGPU_CONFIG_MAX_BYTES / 1024);
	int seen[1 + sizeof(identity_keys) / sizeof(identity_keys[0])] = { 0 }; /* version, identity keys */
	int line = 0;
	for (size_t pos = 0; pos < len;) {
		line++;
		const char *start = data + pos;
		const char *nl = memchr(start, '\n', len - pos);
		if (nl == NULL)
			return fail(err, errlen, "line %d does not end with a newline", line);
		size_t n = (size_t)(nl - start);
		pos += n + 1;
		if (n == 0 || start[0] == '#')
			continue;
		if (n >= LINE_MAX_BYTES)
			return fail(err, errlen, "line %d is longer than %d bytes", line, LINE_MAX_BYTES - 1);
		char buf[LINE_MAX_BYTES];
		memcpy(buf, start, n);
		buf[n] = '\0';
		char *f[MAX_FIELDS];
		int nf = 0;
		for (size_t i = 0; i < n; i++) {
			unsigned char c = (unsigned char)buf[i];
			if (c < ' ' || c == 0x7f)
				return fail(err, errlen, "line %d holds a control character (0x%02x)", line, c);
		}
		for (char *p = buf;;) {
			char *sp = strchr(p, ' ');
			if (nf < MAX_FIELDS)
				f[nf] = p;
			nf++;
			if (*p == '\0' || p == sp)
				return fail(err, errlen, "line %d: fields are separated by exactly one space", line);
			if (sp == NULL)
				break;
			*sp = '\0';
			p = sp + 1;
		}
		if (nf > MAX_FIELDS)
			nf = MAX_FIELDS; /* more than any known key takes: malformed if known, else skipped */
		if (parse_line(cfg, f, nf, line, seen, err, errlen) != 0)
			return -1;
	}
	if (!seen[0])
		return fail(err, errlen, "has no \"version %d\" line", VGPU_CONFIG_VERSION);
	return 0;
}

int vgpu_config_read(const char *path, struct vgpu_config *cfg, char *err, size_t errlen)
{
	return vgpu_config_read_mounted(path, NULL, cfg, err, errlen);
}

int vgpu_config_read_mounted(const char *path, const char *mount_point, struct vgpu_config *cfg, char *err,
			     size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0) {
		int e = errno;
		snprintf(err, errlen, "cannot read %s: %s", path, strerror(e));
		errno = e;
		return -1;
	}
	struct stat st;
	int e = 0;
	char *buf = NULL, merr[1200];
	size_t len = 0;
	if (vgpu_fstat(fd, &st) != 0) {
		e = errno;
	} else if (!S_ISREG(st.st_mode)) {
		e = EINVAL;
		snprintf(err, errlen, "%s is not a regular file", path);
	} else if (mount_point != NULL && vgpu_config_mount_check(fd, mount_point, merr, sizeof(merr)) != 0) {
		e = EPERM;
		snprintf(err, errlen, "%s %s", path, merr);
	} else if ((buf = malloc(VGPU_CONFIG_MAX_BYTES + 1)) == NULL) {
		e = ENOMEM;
	} else {
		/* one byte more than allowed: a longer file is rejected, never cut short */
		while (len <= VGPU_CONFIG_MAX_BYTES) {
			ssize_t r = read(fd, buf + len, VGPU_CONFIG_MAX_BYTES + 1 - len);
			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0) {
				e = errno;
				break;
			}
			if (r == 0)
				break;
			len += (size_t)r;
		}
	}
	if (close(fd) != 0 && e == 0)
		e = errno;
	if (e != 0) {
		if (e != EINVAL && e != EPERM)
			snprintf(err, errlen, "cannot read %s: %s", path, strerror(e));
		free(buf);
		errno = e;
		return -1;
	}
	char perr[400];
	int rc = vgpu_config_parse(buf, len, cfg, perr, sizeof(perr));
	free(buf);
	if (rc != 0) {
		snprintf(err, errlen, "%s %s", path, perr);
		errno = EINVAL;
		return -1;
	}
	return 0;
}

/* uuid_body is a UUID without its "GPU-" or "MIG-" prefix: CUDA's cuDeviceGetUuid gives 16
 * bytes with no kind, which the library spells "GPU-…", while a container on a MIG partition has
 * the MIG device's "MIG-…" in its gpu line (contract §18). The bytes name one device either way. */
static const char *uuid_body(const char *uuid)
{
	if (strncasecmp(uuid, "GPU-", 4) == 0 || strncasecmp(uuid, "MIG-", 4) == 0)
		return uuid + 4;
	return uuid;
}

int vgpu_config_find_uuid(const struct vgpu_config *cfg, const char *uuid)
{
	for (int i = 0; i < cfg->ndevices; i++)
		if (strcasecmp(uuid_body(cfg->dev[i].uuid), uuid_body(uuid)) == 0)
			return i;
	return -1;
}

int vgpu_config_find_index(const struct vgpu_config *cfg, int nvml_index)
{
	for (int i = 0; i < cfg->ndevices; i++)
		if (cfg->dev[i].nvml_index == nvml_index)
			return i;
	return -1;
}
