#include "shm_guard.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "log.h"

static __thread struct vgpu_guard *current;
static struct sigaction previous;
static _Atomic int installed; /* 0 no, 1 being installed, 2 yes */

static void pass_on(int sig, siginfo_t *si, void *uc)
{
	if (previous.sa_flags & SA_SIGINFO) {
		if (previous.sa_sigaction != NULL)
			previous.sa_sigaction(sig, si, uc);
		return;
	}
	int sent = si == NULL || si->si_code <= 0; /* kill(), not a fault */
	if (previous.sa_handler == SIG_IGN && sent)
		return;
	if (previous.sa_handler == SIG_DFL || previous.sa_handler == SIG_IGN) {
		/* the default action, as without the library: a fault happens again on return (the
		 * kernel never ignores a fault's SIGBUS), a sent signal is raised again */
		struct sigaction dfl;
		memset(&dfl, 0, sizeof(dfl));
		dfl.sa_handler = SIG_DFL;
		sigemptyset(&dfl.sa_mask);
		sigaction(sig, &dfl, NULL);
		if (sent)
			raise(sig);
		return;
	}
	previous.sa_handler(sig);
}

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
	if (si != NULL && si->si_code > 0) {
		const char *addr = si->si_addr;
		for (struct vgpu_guard *g = current; g != NULL; g = g->outer) {
			if (addr >= g->start && (size_t)(addr - g->start) < g->len) {
				current = g->outer;
				siglongjmp(g->env, 1);
			}
		}
	}
	pass_on(sig, si, uc);
}

int vgpu_guard_install(void)
{
	int expected = 0;
	if (!atomic_compare_exchange_strong(&installed, &expected, 1)) {
		while (atomic_load(&installed) == 1)
			; /* another thread is installing: a few instructions */
		return atomic_load(&installed) == 2 ? 0 : -1;
	}
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_sigbus;
	sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK | SA_RESTART;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGBUS, &sa, &previous) != 0) {
		vgpu_log_error("cannot install the SIGBUS handler that guards the shared files");
		atomic_store(&installed, 0);
		return -1;
	}
	atomic_store(&installed, 2);
	return 0;
}

void vgpu_guard_enter(struct vgpu_guard *g, const void *start, size_t len)
{
	g->start = start;
	g->len = len;
	g->outer = current;
	current = g;
	__atomic_signal_fence(__ATOMIC_SEQ_CST); /* set before any guarded access */
}

void vgpu_guard_leave(struct vgpu_guard *g)
{
	__atomic_signal_fence(__ATOMIC_SEQ_CST); /* cleared after every guarded access */
	if (current == g)
		current = g->outer;
}
