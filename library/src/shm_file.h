/* The container's shared files in its writable directories (the memory ledger, the
 * core-limit buckets): opened by every process, created by the first, crash-safely.
 *
 * A file is built complete under a temporary name "<name>.tmp.XXXXXX" (sized, contents
 * written by init) and only then link()ed to its name, so the name never refers to a file
 * that a SIGKILL left half-written (issue 9: a file sized but without its header made every
 * later process refuse, and the directory outlives the container). Concurrent creators agree
 * on whichever link came first; the others drop their copy and open that one. While building,
 * a creator holds an open-file-description lock on the byte just past the file's end; a
 * temporary file whose byte nobody holds is a dead creator's leftover, removed by the next
 * creator. */
#ifndef VGPU_SHM_FILE_H
#define VGPU_SHM_FILE_H

#include <stddef.h>

struct vgpu_shm_spec {
	const char *name;         /* file name in the directory, with its layout version */
	const char *what;         /* for messages: "memory ledger" */
	size_t size;              /* the file's exact size */
	void (*init)(void *map);  /* fills a new, zeroed file; writes its magic last */
};

struct vgpu_shm {
	int fd;    /* O_RDWR, close-on-exec */
	void *map; /* size bytes, shared */
};

/* Opens dir/<name> read-write and maps it, creating it if missing. The caller checks the
 * contents (a file of the right size from another library build). Returns 0, or -1 with a
 * message in err. */
int vgpu_shm_open(const struct vgpu_shm_spec *spec, const char *dir, struct vgpu_shm *out, char *err, size_t errlen);

/* Unmaps and closes. */
void vgpu_shm_close(const struct vgpu_shm_spec *spec, struct vgpu_shm *shm);

#endif
