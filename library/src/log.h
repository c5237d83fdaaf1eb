#ifndef VGPU_LOG_H
#define VGPU_LOG_H

/* Messages go to stderr with a "libvgpu:" prefix. Errors always print; debug output only
 * when LIBVGPU_LOG_LEVEL=debug. Never exits the process. */
void vgpu_log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void vgpu_log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void vgpu_log_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
