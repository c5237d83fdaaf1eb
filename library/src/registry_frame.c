#include "registry_frame.h"

#include <string.h>

const char *reg_status_name(int status)
{
	switch (status) {
	case REG_STATUS_OK: return "OK";
	case REG_STATUS_RETRY: return "RETRY";
	case REG_STATUS_NOT_FOUND: return "NOT_FOUND";
	case REG_STATUS_DENIED: return "DENIED";
	case REG_STATUS_INVALID: return "INVALID";
	case REG_STATUS_BUSY: return "BUSY";
	case REG_STATUS_INTERNAL: return "INTERNAL";
	default: return "UNKNOWN";
	}
}

static void put_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }
static void put_u32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}
static uint16_t get_u16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static uint32_t get_u32(const uint8_t *p)
{
	return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

void reg_put_header(uint8_t *hdr, int kind, uint32_t body_len)
{
	memcpy(hdr, REG_MAGIC, 4);
	hdr[4] = REG_VERSION;
	hdr[5] = (uint8_t)kind;
	put_u16(hdr + 6, 0);
	put_u32(hdr + 8, body_len);
}

int reg_put_field(uint8_t *buf, size_t cap, size_t *off, int tag, const void *val, size_t len)
{
	if (len > 0xffff || *off + 3 + len > cap)
		return -1;
	buf[*off] = (uint8_t)tag;
	put_u16(buf + *off + 1, (uint16_t)len);
	if (len > 0)
		memcpy(buf + *off + 3, val, len);
	*off += 3 + len;
	return 0;
}

int reg_encode_request(const struct reg_request *req, uint8_t *buf, size_t cap, size_t *len)
{
	const struct { int tag; const char *v; size_t max; } fields[] = {
		{ REG_TAG_POD_UID, req->pod_uid, 64 },
		{ REG_TAG_CONTAINER_NAME, req->container_name, 63 },
		{ REG_TAG_REGISTER_UUID, req->register_uuid, 64 },
		{ REG_TAG_CLIENT_VERSION, req->client_version, 64 },
	};
	if (cap < REG_HEADER_LEN)
		return -1;
	size_t off = REG_HEADER_LEN;
	size_t limit = cap < REG_HEADER_LEN + REG_MAX_BODY ? cap : REG_HEADER_LEN + REG_MAX_BODY;
	for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
		if (fields[i].v == NULL || fields[i].v[0] == '\0')
			continue;
		size_t n = strlen(fields[i].v);
		if (n > fields[i].max)
			return -1;
		if (reg_put_field(buf, limit, &off, fields[i].tag, fields[i].v, n) != 0)
			return -1;
	}
	reg_put_header(buf, REG_KIND_REQUEST, (uint32_t)(off - REG_HEADER_LEN));
	*len = off;
	return 0;
}

int reg_decode_header(const uint8_t *hdr, int *kind, uint32_t *body_len)
{
	if (memcmp(hdr, REG_MAGIC, 4) != 0 || hdr[4] != REG_VERSION || get_u16(hdr + 6) != 0)
		return -1;
	uint32_t n = get_u32(hdr + 8);
	if (n > REG_MAX_BODY)
		return -1;
	*kind = hdr[5];
	*body_len = n;
	return 0;
}

int reg_decode_response_body(const uint8_t *body, size_t len, struct reg_response *out)
{
	memset(out, 0, sizeof(*out));
	if (len < 2)
		return -1;
	out->status = get_u16(body);
	int seen_message = 0;
	size_t off = 2;
	while (off < len) {
		if (len - off < 3)
			return -1;
		int tag = body[off];
		size_t flen = get_u16(body + off + 1);
		off += 3;
		if (flen > len - off)
			return -1;
		const uint8_t *val = body + off;
		off += flen;
		if (tag == REG_TAG_MESSAGE) {
			if (seen_message || flen > 1024)
				return -1;
			seen_message = 1;
			memcpy(out->message, val, flen);
			out->message[flen] = '\0';
		} else if (tag == REG_TAG_RETRY_AFTER_MS) {
			if (out->has_retry_after || flen != 4)
				return -1;
			out->has_retry_after = 1;
			out->retry_after_ms = get_u32(val);
		}
		/* unknown tags are skipped */
	}
	return 0;
}
