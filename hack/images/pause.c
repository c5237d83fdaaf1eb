// pause: the sandbox ("infra") process of the local test cluster's pods. There is no registry to
// pull registry.k8s.io/pause from, so hack/images.sh builds this one with gcc -static.
//
// It holds the pod's namespaces open by staying alive, reaps orphaned children when it is PID 1
// of a shared PID namespace, and exits 0 on SIGTERM or SIGINT (the runtime's stop signal).
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>

static volatile sig_atomic_t stop_requested;

static void on_stop(int sig) {
    (void)sig;
    stop_requested = 1;
}

static void on_child(int sig) {
    (void)sig;
    int saved_errno = errno;  // waitpid must not clobber the interrupted code's errno
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved_errno;
}

static int install(int sig, void (*handler)(int), int flags) {
    struct sigaction sa = {0};
    sa.sa_handler = handler;
    sa.sa_flags = flags;
    if (sigemptyset(&sa.sa_mask) != 0) {
        return -1;
    }
    return sigaction(sig, &sa, NULL);
}

int main(void) {
    sigset_t stop_signals, waiting_mask;
    if (sigemptyset(&stop_signals) != 0 || sigaddset(&stop_signals, SIGTERM) != 0 ||
        sigaddset(&stop_signals, SIGINT) != 0) {
        perror("pause: sigset");
        return 1;
    }
    // Block the stop signals outside sigsuspend, so one arriving between the check of
    // stop_requested and the wait is delivered inside the wait instead of being missed.
    if (sigprocmask(SIG_BLOCK, &stop_signals, &waiting_mask) != 0) {
        perror("pause: sigprocmask");
        return 1;
    }
    if (sigdelset(&waiting_mask, SIGTERM) != 0 || sigdelset(&waiting_mask, SIGINT) != 0) {
        perror("pause: sigset");
        return 1;
    }
    if (install(SIGTERM, on_stop, 0) != 0 || install(SIGINT, on_stop, 0) != 0 ||
        install(SIGCHLD, on_child, SA_NOCLDSTOP | SA_RESTART) != 0) {
        perror("pause: sigaction");
        return 1;
    }
    while (!stop_requested) {
        sigsuspend(&waiting_mask);  // always returns -1/EINTR once a handler ran
    }
    return 0;
}
