/* TEST DOUBLE: see scripted_registry.h. */
#include "scripted_registry.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../src/registry_frame.h"

struct action { int status; int retry_ms; int kind; }; /* kind 0 respond, 1 close, 2 garbage */

static int parse_action(const char *tok, struct action *a)
{
	static const struct { const char *name; int status; } names[] = {
		{ "OK", REG_STATUS_OK }, { "RETRY", REG_STATUS_RETRY }, { "NOT_FOUND", REG_STATUS_NOT_FOUND },
		{ "DENIED", REG_STATUS_DENIED }, { "INVALID", REG_STATUS_INVALID }, { "BUSY", REG_STATUS_BUSY },
		{ "INTERNAL", REG_STATUS_INTERNAL },
	};
	memset(a, 0, sizeof(*a));
	a->retry_ms = -1;
	if (strcmp(tok, "CLOSE") == 0) { a->kind = 1; return 0; }
	if (strcmp(tok, "GARBAGE") == 0) { a->kind = 2; return 0; }
	if (strncmp(tok, "STATUS:", 7) == 0) { a->status = atoi(tok + 7); return 0; }
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		size_t n = strlen(names[i].name);
		if (strncmp(tok, names[i].name, n) == 0 && (tok[n] == '\0' || tok[n] == ':')) {
			a->status = names[i].status;
			if (tok[n] == ':')
				a->retry_ms = atoi(tok + n + 1);
			return 0;
		}
	}
	return -1;
}

static int read_full(int fd, void *buf, size_t n)
{
	size_t got = 0;
	while (got < n) {
		ssize_t r = read(fd, (char *)buf + got, n - got);
		if (r <= 0) {
			if (r < 0 && errno == EINTR)
				continue;
			return -1;
		}
		got += (size_t)r;
	}
	return 0;
}

static void write_pids(const char *path, unsigned *pids, int n)
{
	char buf[8192];
	size_t len = 0;
	for (int i = 0; i < n; i++)
		len += (size_t)snprintf(buf + len, sizeof(buf) - len, "%u\n", pids[i]);
	int fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd < 0 || flock(fd, LOCK_EX) != 0 || pwrite(fd, buf, len, 0) != (ssize_t)len ||
	    ftruncate(fd, (off_t)len) != 0) {
		perror("scripted registry: pids.config");
		_exit(3);
	}
	close(fd);
}

static void add_pid(unsigned *pids, int *n, unsigned pid)
{
	int i = 0;
	while (i < *n && pids[i] < pid)
		i++;
	if (i < *n && pids[i] == pid)
		return;
	memmove(pids + i + 1, pids + i, (size_t)(*n - i) * sizeof(*pids));
	pids[i] = pid;
	(*n)++;
}

static void respond(int fd, int status, int retry_ms, const char *msg)
{
	uint8_t out[REG_HEADER_LEN + 2 + 3 + 64 + 7];
	size_t off = REG_HEADER_LEN;
	out[off++] = (uint8_t)(status >> 8);
	out[off++] = (uint8_t)status;
	if (msg != NULL && reg_put_field(out, sizeof(out), &off, REG_TAG_MESSAGE, msg, strlen(msg)) != 0)
		_exit(4);
	if (retry_ms >= 0) {
		uint8_t v[4] = { (uint8_t)(retry_ms >> 24), (uint8_t)(retry_ms >> 16), (uint8_t)(retry_ms >> 8),
				 (uint8_t)retry_ms };
		if (reg_put_field(out, sizeof(out), &off, REG_TAG_RETRY_AFTER_MS, v, 4) != 0)
			_exit(4);
	}
	reg_put_header(out, REG_KIND_RESPONSE, (uint32_t)(off - REG_HEADER_LEN));
	if (write(fd, out, off) != (ssize_t)off)
		perror("scripted registry: write");
}

static void serve(int lfd, const char *script, const char *pids_path, unsigned offset, const char *log_path)
{
	struct action acts[32];
	int nacts = 0;
	char buf[512];
	snprintf(buf, sizeof(buf), "%s", script);
	for (char *t = strtok(buf, ","); t && nacts < 32; t = strtok(NULL, ","))
		if (parse_action(t, &acts[nacts]) == 0)
			nacts++;
	if (nacts == 0)
		_exit(2);
	static unsigned pids[1024];
	int npids = 0;
	FILE *log = log_path ? fopen(log_path, "a") : NULL;
	for (int conn = 0;; conn++) {
		int fd = accept(lfd, NULL, NULL);
		if (fd < 0) {
			if (errno == EINTR)
				continue;
			_exit(1);
		}
		const struct action *a = &acts[conn < nacts ? conn : nacts - 1];
		struct ucred cred;
		socklen_t cl = sizeof(cred);
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0)
			cred.pid = 0;
		uint8_t hdr[REG_HEADER_LEN], body[REG_MAX_BODY];
		int kind;
		uint32_t len;
		char fields[5][80] = { "", "", "", "", "" };
		int valid = read_full(fd, hdr, sizeof(hdr)) == 0 && reg_decode_header(hdr, &kind, &len) == 0 &&
			    kind == REG_KIND_REQUEST && read_full(fd, body, len) == 0;
		for (uint32_t off = 0; valid && off < len;) {
			if (len - off < 3) { valid = 0; break; }
			int tag = body[off];
			uint32_t fl = (uint32_t)(body[off + 1] << 8 | body[off + 2]);
			off += 3;
			if (fl > len - off) { valid = 0; break; }
			if (tag >= 1 && tag <= 4)
				snprintf(fields[tag], sizeof(fields[tag]), "%.*s", (int)fl, (const char *)body + off);
			off += fl;
		}
		if (log) {
			fprintf(log, "%d pid=%d pod=%s name=%s uuid=%s version=%s valid=%d\n", conn, (int)cred.pid,
				fields[1], fields[2], fields[3], fields[4], valid);
			fflush(log);
		}
		if (!valid) {
			respond(fd, REG_STATUS_INVALID, -1, "malformed frame");
		} else if (a->kind == 1) {
			/* close without answering */
		} else if (a->kind == 2) {
			if (write(fd, "XXXXXXXXXXXXXXXX", 16) != 16)
				perror("scripted registry: write");
		} else {
			if (a->status == REG_STATUS_OK && pids_path != NULL && cred.pid > 0) {
				add_pid(pids, &npids, (unsigned)cred.pid + offset);
				write_pids(pids_path, pids, npids);
			}
			respond(fd, a->status, a->retry_ms, a->status == REG_STATUS_OK ? NULL : "scripted answer");
		}
		shutdown(fd, SHUT_WR);
		close(fd);
	}
}

pid_t scripted_registry_start(const char *sock_path, const char *script, const char *pids_path,
			      unsigned pid_offset, const char *log_path)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	if (strlen(sock_path) >= sizeof(addr.sun_path))
		return -1;
	strcpy(addr.sun_path, sock_path);
	unlink(sock_path);
	int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&addr, sizeof(addr)) != 0 || listen(lfd, 64) != 0) {
		perror("scripted registry: listen");
		return -1;
	}
	pid_t pid = fork();
	if (pid == 0) {
		serve(lfd, script, pids_path, pid_offset, log_path);
		_exit(0);
	}
	close(lfd);
	return pid;
}

void scripted_registry_stop(pid_t pid, const char *sock_path)
{
	if (pid > 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
	}
	unlink(sock_path);
}
