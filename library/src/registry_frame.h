/* Registry wire protocol codec (contract.md §5). Big-endian; frames of at most 4096 bytes. */
#ifndef VGPU_REGISTRY_FRAME_H
#define VGPU_REGISTRY_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define REG_MAGIC "VGPR"
#define REG_VERSION 1
#define REG_HEADER_LEN 12
#define REG_MAX_BODY 4096
#define REG_KIND_REQUEST 1
#define REG_KIND_RESPONSE 2

enum reg_status {
	REG_STATUS_OK = 0,
	REG_STATUS_RETRY = 1,
	REG_STATUS_NOT_FOUND = 2,
	REG_STATUS_DENIED = 3,
	REG_STATUS_INVALID = 4,
	REG_STATUS_BUSY = 5,
	REG_STATUS_INTERNAL = 6,
};

enum { REG_TAG_POD_UID = 1, REG_TAG_CONTAINER_NAME = 2, REG_TAG_REGISTER_UUID = 3,
       REG_TAG_CLIENT_VERSION = 4 };
enum { REG_TAG_MESSAGE = 1, REG_TAG_RETRY_AFTER_MS = 2 };

struct reg_request {
	const char *pod_uid;        /* NRI path */
	const char *container_name; /* NRI path */
	const char *register_uuid;  /* per-claim path when non-empty */
	const char *client_version;
};

struct reg_response {
	int status;
	char message[1025];
	int has_retry_after;
	uint32_t retry_after_ms;
};

const char *reg_status_name(int status);

/* Encodes a whole request frame. Empty or NULL fields are omitted. Returns 0, or -1 if a
 * field is too long or the frame does not fit in cap. */
int reg_encode_request(const struct reg_request *req, uint8_t *buf, size_t cap, size_t *len);

/* Validates a 12-byte header; on success stores kind and body length. */
int reg_decode_header(const uint8_t *hdr, int *kind, uint32_t *body_len);

/* Decodes a response body. Unknown tags are skipped; a repeated tag, a truncated field, an
 * over-long message or a retry_after of the wrong size is an error (-1). */
int reg_decode_response_body(const uint8_t *body, size_t len, struct reg_response *out);

/* Helpers shared with the scripted test server. */
void reg_put_header(uint8_t *hdr, int kind, uint32_t body_len);
int reg_put_field(uint8_t *buf, size_t cap, size_t *off, int tag, const void *val, size_t len);

#endif
