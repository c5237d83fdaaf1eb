/* The shared files (the memory ledger, the core-limit buckets) are mapped, and every process
 * of the claim may truncate them: they are mode 0666 in a directory the claim's containers
 * share, so that processes of different users can use them. Touching a mapped page past the
 * file's new end raises SIGBUS, which would kill the process that touches it, not the one that
 * truncated. A size check before each access cannot prevent that (the file can shrink right
 * after it), so every access is made inside a guard instead: the library's SIGBUS handler turns
 * a fault inside the guarded mapping into a return through sigsetjmp of that guard, and hands
 * every other SIGBUS on to the handler that was installed before it (or the default action).
 *
 * Use:
 *	struct vgpu_guard g;
 *	vgpu_guard_enter(&g, map, size);
 *	if (sigsetjmp(g.env, 0) != 0) { vgpu_guard_leave(&g); ... the file was truncated ... }
 *	... accesses ...
 *	vgpu_guard_leave(&g);
 * Locals changed after sigsetjmp and read on the fault path must be volatile.
 *
 * The handler is installed (sigaction, SA_NODEFER so that leaving it by siglongjmp leaves
 * SIGBUS unblocked) when the first shared file is mapped. An application that installs its
 * own SIGBUS handler afterwards replaces it: a truncation then reaches that handler as before. */
#ifndef VGPU_SHM_GUARD_H
#define VGPU_SHM_GUARD_H

#include <setjmp.h>
#include <stddef.h>

struct vgpu_guard {
	sigjmp_buf env;
	const char *start;
	size_t len;
	struct vgpu_guard *outer;
};

/* Installs the SIGBUS handler once per process. 0, or -1 if sigaction failed. */
int vgpu_guard_install(void);

void vgpu_guard_enter(struct vgpu_guard *g, const void *start, size_t len);
void vgpu_guard_leave(struct vgpu_guard *g);

#endif
