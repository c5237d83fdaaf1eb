#include "registry_client.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"

static uint64_t real_now_ms(void *ctx) { (void)ctx; return vgpu_now_ns() / 1000000ull; }
static void real_sleep_ms(void *ctx, uint64_t ms) { (void)ctx; vgpu_sleep_ns(ms * 1000000ull); }
static uint32_t real_rand32(void *ctx)
{
	(void)ctx;
	/* xorshift seeded from the clock and pid: jitter only needs to differ between processes */
	static __thread uint32_t s;
	if (s == 0)
		s = (uint32_t)vgpu_now_ns() ^ ((uint32_t)getpid() << 16) ^ 0x9e3779b9u;
	s ^= s << 13; s ^= s >> 17; s ^= s << 5;
	return s;
}
static const struct reg_client_deps real_deps = { real_now_ms, real_sleep_ms, real_rand32, NULL };

uint64_t reg_retry_wait_ms(int has_retry_after, uint32_t retry_after_ms, uint32_t random)
{
	uint64_t base = has_retry_after ? retry_after_ms : REG_DEFAULT_WAIT_MS;
	if (base < REG_MIN_WAIT_MS)
		base = REG_MIN_WAIT_MS;
	uint64_t extra = base / 4;
	return base + (extra == 0 ? 0 : (uint64_t)random % (extra + 1));
}

/* DROPPED: the server closed or reset the connection before answering a byte (contract §5). */
enum attempt_result { ATTEMPT_RESPONSE, ATTEMPT_CONNECT_FAILED, ATTEMPT_DROPPED, ATTEMPT_TRANSPORT };

/* Waits until fd is ready for events or the deadline passes. */
static int wait_fd(int fd, short events, uint64_t deadline_ms, const struct reg_client_deps *d)
{
	for (;;) {
		uint64_t now = d->now_ms(d->ctx);
		if (now >= deadline_ms)
			return -1;
		struct pollfd p = { .fd = fd, .events = events };
		uint64_t left = deadline_ms - now;
		int r = poll(&p, 1, left > 1000 ? 1000 : (int)left);
		if (r > 0)
			return 0;
		if (r < 0 && errno != EINTR)
			return -1;
	}
}

/* The peer went away: it closed or reset the connection. */
static int peer_gone(int err) { return err == ECONNRESET || err == EPIPE; }

/* Reads n bytes. Returns 0, or READ_DROPPED when the peer closed or reset the connection
 * before sending a single byte, or -1 (a frame cut short, the deadline, another error). */
#define READ_DROPPED (-2)
static int read_full(int fd, uint8_t *buf, size_t n, uint64_t deadline_ms, const struct reg_client_deps *d)
{
	size_t got = 0;
	while (got < n) {
		ssize_t r = read(fd, buf + got, n - got);
		if (r > 0) {
			got += (size_t)r;
			continue;
		}
		if (r == 0)
			return got == 0 ? READ_DROPPED : -1; /* closed before a whole frame */
		if (errno == EINTR)
			continue;
		if (peer_gone(errno))
			return got == 0 ? READ_DROPPED : -1;
		if (errno != EAGAIN || wait_fd(fd, POLLIN, deadline_ms, d) != 0)
			return -1;
	}
	return 0;
}

static int write_full(int fd, const uint8_t *buf, size_t n, uint64_t deadline_ms, const struct reg_client_deps *d)
{
	size_t put = 0;
	while (put < n) {
		ssize_t w = send(fd, buf + put, n - put, MSG_NOSIGNAL);
		if (w > 0) {
			put += (size_t)w;
			continue;
		}
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno == EAGAIN && wait_fd(fd, POLLOUT, deadline_ms, d) == 0)
			continue;
		return -1;
	}
	return 0;
}

static enum attempt_result attempt(const char *path, const uint8_t *frame, size_t frame_len, uint64_t deadline_ms,
				   const struct reg_client_deps *d, struct reg_response *res, char *detail,
				   size_t detail_len)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof(addr.sun_path)) {
		snprintf(detail, detail_len, "socket path %s is too long", path);
		return ATTEMPT_TRANSPORT;
	}
	strcpy(addr.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		snprintf(detail, detail_len, "socket: %s", strerror(errno));
		return ATTEMPT_TRANSPORT;
	}
	/* A unix connect completes at once or fails at once (EAGAIN: backlog full). */
	if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
		snprintf(detail, detail_len, "connect %s: %s", path, strerror(errno));
		close(fd);
		return ATTEMPT_CONNECT_FAILED;
	}
	enum attempt_result out = ATTEMPT_TRANSPORT;
	uint8_t hdr[REG_HEADER_LEN];
	uint8_t body[REG_MAX_BODY];
	int kind;
	uint32_t body_len;
	int hr;
	if (write_full(fd, frame, frame_len, deadline_ms, d) != 0) {
		int err = errno;
		snprintf(detail, detail_len, "sending the request to %s failed: %s", path, strerror(err));
		if (peer_gone(err))
			out = ATTEMPT_DROPPED;
	} else if ((hr = read_full(fd, hdr, sizeof(hdr), deadline_ms, d)) != 0) {
		if (hr == READ_DROPPED) {
			snprintf(detail, detail_len, "%s closed the connection without a response", path);
			out = ATTEMPT_DROPPED;
		} else {
			snprintf(detail, detail_len, "no response from %s", path);
		}
	} else if (reg_decode_header(hdr, &kind, &body_len) != 0 || kind != REG_KIND_RESPONSE) {
		snprintf(detail, detail_len, "malformed response header from %s", path);
	} else if (read_full(fd, body, body_len, deadline_ms, d) != 0) {
		snprintf(detail, detail_len, "truncated response from %s", path);
	} else if (reg_decode_response_body(body, body_len, res) != 0) {
		snprintf(detail, detail_len, "malformed response body from %s", path);
	} else {
		snprintf(detail, detail_len, "%s%s%s", reg_status_name(res->status), res->message[0] ? ": " : "",
			 res->message);
		out = ATTEMPT_RESPONSE;
	}
	if (close(fd) != 0)
		vgpu_log_debug("close of the registry connection failed: %s", strerror(errno));
	return out;
}

enum reg_outcome reg_register(const char *socket_path, const struct reg_request *req, uint32_t budget_ms,
			      const struct reg_client_deps *deps, struct reg_response *res,
			      struct reg_attempt_log *log, char *detail, size_t detail_len)
{
	const struct reg_client_deps *d = deps != NULL ? deps : &real_deps;
	uint8_t frame[REG_HEADER_LEN + REG_MAX_BODY];
	size_t frame_len;
	struct reg_attempt_log scratch;
	if (log == NULL)
		log = &scratch;
	memset(log, 0, sizeof(*log));
	memset(res, 0, sizeof(*res));
	res->status = -1;
	if (reg_encode_request(req, frame, sizeof(frame), &frame_len) != 0) {
		snprintf(detail, detail_len, "registration request does not fit in a frame");
		return REG_OUTCOME_TRANSPORT;
	}
	const uint64_t start = d->now_ms(d->ctx);
	const uint64_t deadline = start + budget_ms;
	for (;;) {
		log->attempts++;
		memset(res, 0, sizeof(*res));
		res->status = -1;
		enum attempt_result a = attempt(socket_path, frame, frame_len, deadline, d, res, detail, detail_len);
		uint64_t wait;
		if (a == ATTEMPT_CONNECT_FAILED) {
			log->connect_failures++;
			wait = reg_retry_wait_ms(0, 0, d->rand32(d->ctx));
		} else if (a == ATTEMPT_DROPPED) {
			/* Closed or reset before a byte of an answer: above all a plugin killed (the
			 * OOM killer, SIGKILL) with the request accepted. Retried like a failed
			 * connect (contract §5): registration is idempotent, and a server that
			 * closes a slow request unanswered costs one more attempt at most. */
			log->dropped++;
			wait = reg_retry_wait_ms(0, 0, d->rand32(d->ctx));
		} else if (a == ATTEMPT_TRANSPORT) {
			/* Connected, then a malformed or cut-short answer, or none before the
			 * deadline: final, a server that answers wrong is not cured by asking
			 * again (contract §5). */
			return REG_OUTCOME_TRANSPORT;
		} else if (res->status == REG_STATUS_OK) {
			return REG_OUTCOME_OK;
		} else if (res->status == REG_STATUS_RETRY || res->status == REG_STATUS_BUSY) {
			wait = reg_retry_wait_ms(res->has_retry_after, res->retry_after_ms, d->rand32(d->ctx));
		} else {
			return REG_OUTCOME_FINAL;
		}
		uint64_t now = d->now_ms(d->ctx);
		if (now + wait > deadline) {
			size_t n = strlen(detail);
			snprintf(detail + n, detail_len - n, " (gave up: %u attempts within the %u ms budget)",
				 log->attempts, budget_ms);
			return REG_OUTCOME_BUDGET;
		}
		if (log->nwaits < sizeof(log->waits_ms) / sizeof(log->waits_ms[0]))
			log->waits_ms[log->nwaits++] = wait;
		d->sleep_ms(d->ctx, wait);
	}
}
