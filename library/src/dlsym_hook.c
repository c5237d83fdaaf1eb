/* The library's dlsym and dlvsym: the routes by which a statically linked CUDA runtime
 * (which dlopen()s libcuda.so.1) and NVML users reach the driver. dlvsym answers exactly
 * as dlsym does (the driver's symbols carry no versions: any version finds them), so that
 * a versioned lookup of a hooked name is no way around the hooks.
 *
 *  - Only names shaped like cu[A-Z]... or nvml[A-Z]... are looked at. For a hooked name the
 *    hook is returned: always for RTLD_DEFAULT and RTLD_NEXT (libvgpu exports it), and for
 *    a handle when the handle's lookup finds the name (a miss stays a miss).
 *  - Every other lookup is handed to the next dlsym (libc's) *as if the caller had called
 *    it*: on x86_64 by a tail jump, so the return address glibc uses to resolve RTLD_NEXT is
 *    the caller's, not libvgpu's. Forwarding with an ordinary call would make RTLD_NEXT
 *    relative to libvgpu: another preloaded interposer asking for its "next" function
 *    would get itself back (endless recursion) or skip objects between it and us.
 *    Elsewhere RTLD_NEXT is emulated by walking the link map after the caller's object.
 *  - Real functions are looked up through libc's dlsym (real_dlsym.c), never through this
 *    function, so the library cannot recurse into itself.
 *  - Nothing here is instrumented or allocates: dlsym is called from sanitizer runtimes'
 *    initialisation and from other libraries' constructors. */
#include "glibc_compat.h"

#include <link.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/auxv.h>

#include "hook_table.h"

#define FORWARD ((void *)1) /* "not ours: hand the call to the next dlsym" */

VGPU_EARLY static int looks_like_driver_symbol(const char *n)
{
	if (n[0] == 'c' && n[1] == 'u' && n[2] >= 'A' && n[2] <= 'Z')
		return 1;
	return n[0] == 'n' && n[1] == 'v' && n[2] == 'm' && n[3] == 'l' && n[4] >= 'A' && n[4] <= 'Z';
}

/* The hook table's index of a driver name we hook, -1 for everything else. */
VGPU_EARLY static int hooked(const char *name)
{
	if (name == NULL || !looks_like_driver_symbol(name))
		return -1;
	return vgpu_hook_find(name);
}

/* The answer for names we hook, FORWARD for everything else. */
VGPU_EARLY __attribute__((visibility("hidden"), used)) void *vgpu_dlsym_answer(void *handle, const char *name)
{
	int id = hooked(name);
	if (id < 0)
		return FORWARD;
	if (handle == RTLD_NEXT || handle == RTLD_DEFAULT)
		return vgpu_hooks[id].hook;
	return vgpu_libc_dlsym(handle, name) != NULL ? vgpu_hooks[id].hook : NULL;
}

/* dlvsym's answer: the same, with the handle's lookup done by version. */
VGPU_EARLY __attribute__((visibility("hidden"), used)) void *vgpu_dlvsym_answer(void *handle, const char *name,
										 const char *version)
{
	int id = hooked(name);
	if (id < 0)
		return FORWARD;
	if (handle == RTLD_NEXT || handle == RTLD_DEFAULT)
		return vgpu_hooks[id].hook;
	return vgpu_libc_dlvsym(handle, name, version) != NULL ? vgpu_hooks[id].hook : NULL;
}

#if defined(__x86_64__)
/* dlvsym(handle, name, version): as dlsym below, with a third argument to keep. */
__asm__(".text\n"
	".globl dlvsym\n"
	".type dlvsym, @function\n"
	"dlvsym:\n"
#ifdef __CET__
	"	endbr64\n"
#endif
	"	push %rdi\n"
	"	push %rsi\n"
	"	push %rdx\n" /* three pushes: 16-byte alignment for the calls */
	"	call vgpu_dlvsym_answer\n"
	"	cmp $1, %rax\n"
	"	je 1f\n"
	"	pop %rdx\n"
	"	pop %rsi\n"
	"	pop %rdi\n"
	"	ret\n"
	"1:	call vgpu_libc_dlvsym_fn\n"
	"	mov %rax, %r11\n"
	"	pop %rdx\n"
	"	pop %rsi\n"
	"	pop %rdi\n"
	"	test %r11, %r11\n"
	"	jz 2f\n"
	"	jmp *%r11\n"
	"2:	xor %eax, %eax\n"
	"	ret\n"
	".size dlvsym, .-dlvsym\n");

/* dlsym(handle, name): ask vgpu_dlsym_answer; on FORWARD restore the arguments and jump
 * to the next dlsym with the caller's return address still on the stack. */
__asm__(".text\n"
	".globl dlsym\n"
	".type dlsym, @function\n"
	"dlsym:\n"
#ifdef __CET__
	"	endbr64\n"
#endif
	"	push %rdi\n"
	"	push %rsi\n"
	"	sub $8, %rsp\n" /* 16-byte alignment for the calls */
	"	call vgpu_dlsym_answer\n"
	"	cmp $1, %rax\n"
	"	je 1f\n"
	"	add $8, %rsp\n"
	"	pop %rsi\n"
	"	pop %rdi\n"
	"	ret\n"
	"1:	call vgpu_libc_dlsym_fn\n"
	"	mov %rax, %r11\n"
	"	add $8, %rsp\n"
	"	pop %rsi\n"
	"	pop %rdi\n"
	"	test %r11, %r11\n"
	"	jz 2f\n"
	"	jmp *%r11\n"
	"2:	xor %eax, %eax\n"
	"	ret\n"
	".size dlsym, .-dlsym\n");
#else
VGPU_EARLY static struct link_map *object_of(const void *addr)
{
	Dl_info info;
	struct link_map *map = NULL;
	if (dladdr1(addr, &info, (void **)&map, RTLD_DL_LINKMAP) == 0)
		return NULL;
	return map;
}

/* The vDSO sits in the link map but in no search scope. */
VGPU_EARLY static int is_vdso(const struct link_map *m)
{
	unsigned long base = getauxval(AT_SYSINFO_EHDR);
	return (base != 0 && m->l_addr == base) || strncmp(m->l_name, "linux-vdso", 10) == 0;
}

/* glibc's RTLD_NEXT for a given caller: the first definition in the objects after the
 * caller's. Known difference: an object dlopen()ed RTLD_LOCAL after the caller is
 * considered here, where glibc skips it. */
VGPU_EARLY static void *next_after(const void *caller, const char *name, const char *version)
{
	struct link_map *self = object_of(caller);
	for (struct link_map *m = self ? self->l_next : NULL; m != NULL; m = m->l_next) {
		if (m->l_name == NULL || m->l_name[0] == '\0' || is_vdso(m))
			continue;
		void *h = dlopen(m->l_name, RTLD_LAZY | RTLD_NOLOAD);
		if (h == NULL)
			continue;
		void *p = version ? vgpu_libc_dlvsym(h, name, version) : vgpu_libc_dlsym(h, name);
		struct link_map *owner = p ? object_of(p) : NULL;
		if (dlclose(h) != 0) {
			/* still loaded: it was loaded before we looked */
		}
		if (p != NULL && owner == m)
			return p;
	}
	return version ? vgpu_libc_dlvsym(RTLD_NEXT, name, version) : vgpu_libc_dlsym(RTLD_NEXT, name);
}

#pragma GCC diagnostic ignored "-Wnonnull-compare"
VGPU_EARLY __attribute__((visibility("default"))) void *dlsym(void *handle, const char *name)
{
	const void *caller = __builtin_return_address(0);
	void *answer = vgpu_dlsym_answer(handle, name);
	if (answer != FORWARD)
		return answer;
	return handle == RTLD_NEXT ? next_after(caller, name, NULL) : vgpu_libc_dlsym(handle, name);
}

VGPU_EARLY __attribute__((visibility("default"))) void *dlvsym(void *handle, const char *name, const char *version)
{
	const void *caller = __builtin_return_address(0);
	void *answer = vgpu_dlvsym_answer(handle, name, version);
	if (answer != FORWARD)
		return answer;
	return handle == RTLD_NEXT ? next_after(caller, name, version) : vgpu_libc_dlvsym(handle, name, version);
}
#endif
