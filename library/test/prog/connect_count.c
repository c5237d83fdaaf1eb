/* A measuring shim for bench_startup, preloaded after the library: counts the unix-socket
 * connects a process makes (its registration attempts, contract §5) by appending one byte
 * per connect to the file named by CONNECT_COUNT_FILE: 'c' for a connect that succeeded,
 * 'f' for one that failed (a full listen backlog: EAGAIN). The file's bytes are then the
 * attempts of every process, without changing what any of them does. Calls the kernel
 * directly, so it needs neither dlsym nor the libc symbol it replaces. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

__attribute__((visibility("default"))) int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
	int r = (int)syscall(SYS_connect, fd, addr, len);
	const char *path = getenv("CONNECT_COUNT_FILE");
	if (path != NULL && addr != NULL && addr->sa_family == AF_UNIX) {
		int err = errno;
		int out = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
		if (out >= 0) {
			ssize_t w = write(out, r == 0 ? "c" : "f", 1);
			(void)w;
			close(out);
		}
		errno = err;
	}
	return r;
}
