/* stat/fstat without glibc's stat symbols: glibc >= 2.33 exports stat and fstat as new
 * GLIBC_2.33 symbols (before, they were inline wrappers of __xstat), which would keep the
 * library from loading on older images. The kernel's struct stat is glibc's on the 64-bit
 * architectures supported (x86_64, aarch64). */
#ifndef VGPU_SYS_STAT_H
#define VGPU_SYS_STAT_H

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static inline int vgpu_fstat(int fd, struct stat *st)
{
	return (int)syscall(SYS_fstat, fd, st);
}

static inline int vgpu_stat(const char *path, struct stat *st)
{
	return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, 0);
}

#endif
