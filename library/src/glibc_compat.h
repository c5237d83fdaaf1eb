/* Pin every dynamic-loader symbol to the version it has carried since before glibc 2.28.
 *
 * Why: libvgpu.so is preloaded into every process of images built on older
 * distributions (Ubuntu 20.04 / glibc 2.31, UBI 8 / glibc 2.28). Built on glibc >= 2.34,
 * dlopen & co. would bind to their new GLIBC_2.34 versions, and the dynamic loader would
 * then refuse to load the library -- killing every process of the image. The library also
 * names libdl.so.2 as NEEDED (see CMakeLists.txt) because before 2.34 these symbols live
 * there, not in libc.so.6. A ctest (glibc_versions) checks the built .so.
 *
 * Include this first in every file that calls a dl* function. */
#ifndef VGPU_GLIBC_COMPAT_H
#define VGPU_GLIBC_COMPAT_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>

#if defined(__x86_64__)
#define VGPU_GLIBC_BASE "GLIBC_2.2.5"
#define VGPU_GLIBC_DL_EXT "GLIBC_2.3.3"
#elif defined(__aarch64__)
#define VGPU_GLIBC_BASE "GLIBC_2.17"
#define VGPU_GLIBC_DL_EXT "GLIBC_2.17"
#else
#error "unsupported architecture: add its base glibc symbol versions here"
#endif

__asm__(".symver dlopen, dlopen@" VGPU_GLIBC_BASE);
__asm__(".symver dlclose, dlclose@" VGPU_GLIBC_BASE);
__asm__(".symver dlerror, dlerror@" VGPU_GLIBC_BASE);
__asm__(".symver dladdr1, dladdr1@" VGPU_GLIBC_DL_EXT);

/* The library defines its own dlsym and dlvsym (dlsym_hook.c), and an unversioned
 * definition wins the dynamic lookup of every versioned reference, our own included.
 * libc's dlvsym is therefore read from the loaded objects' symbol tables, and libc's dlsym
 * fetched with it by version (GLIBC_2.34 in libc.so.6, the base version in libdl.so.2
 * before) -- see real_dlsym.c. The library calls no dl* function that it defines. */
void *vgpu_libc_dlsym(void *handle, const char *name);
void *vgpu_libc_dlsym_fn(void);
void *vgpu_libc_dlvsym(void *handle, const char *name, const char *version);
void *vgpu_libc_dlvsym_fn(void);

/* dlsym runs before anything else is set up: a sanitizer runtime calls it from its own
 * initialisation, before its shadow memory exists. The dlsym path is never instrumented. */
#define VGPU_EARLY __attribute__((no_sanitize_address, no_sanitize_undefined))

#endif
