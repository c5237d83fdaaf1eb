/* TEST DOUBLE of the node's registry server (contract.md §5), scripted: each connection
 * gets the next action of a comma-separated script, the last one repeating:
 *   OK | RETRY[:ms] | BUSY[:ms] | NOT_FOUND | DENIED | INVALID | INTERNAL | STATUS:<n>
 *   CLOSE (close without answering) | GARBAGE (answer with a broken frame)
 * It decodes and logs each request ("<n> pid=.. pod=.. name=.. uuid=.. version=..") and,
 * on OK, adds the caller's SO_PEERCRED pid + pid_offset to pids.config the way the real
 * server writes it (O_NOFOLLOW, LOCK_EX, pwrite, ftruncate). Not the project's server:
 * the registration tests against the real Go server are test_real_registry.c. */
#ifndef SCRIPTED_REGISTRY_H
#define SCRIPTED_REGISTRY_H

#include <sys/types.h>

/* Binds and listens now (so a connect succeeds as soon as this returns), serves in a
 * child process until it is killed. pids_path and log_path may be NULL. Returns the
 * child's pid, or -1. */
pid_t scripted_registry_start(const char *sock_path, const char *script, const char *pids_path,
			      unsigned pid_offset, const char *log_path);

/* Kills and reaps the server, removes the socket. */
void scripted_registry_stop(pid_t pid, const char *sock_path);

#endif
