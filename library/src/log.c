#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int debug_enabled(void)
{
	const char *v = getenv("LIBVGPU_LOG_LEVEL");
	return v != NULL && strcmp(v, "debug") == 0;
}

/* One write(2) per message so lines of concurrent processes do not interleave. */
static void emit(const char *level, const char *fmt, va_list ap)
{
	char buf[1024];
	int saved = errno;
	int n = snprintf(buf, sizeof(buf), "libvgpu: %s[%d]: ", level, (int)getpid());
	if (n < 0)
		n = 0;
	if ((size_t)n < sizeof(buf)) {
		int m = vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
		if (m > 0)
			n += m;
	}
	if ((size_t)n >= sizeof(buf) - 1)
		n = (int)sizeof(buf) - 2;
	buf[n++] = '\n';
	ssize_t w = write(STDERR_FILENO, buf, (size_t)n);
	(void)w; /* nothing sensible to do if stderr is gone */
	errno = saved;
}

void vgpu_log_error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	emit("error", fmt, ap);
	va_end(ap);
}

void vgpu_log_warn(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	emit("warning", fmt, ap);
	va_end(ap);
}

void vgpu_log_debug(const char *fmt, ...)
{
	if (!debug_enabled())
		return;
	va_list ap;
	va_start(ap, fmt);
	emit("debug", fmt, ap);
	va_end(ap);
}
