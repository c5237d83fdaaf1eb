/* The wake signal (contract §16): a process that starts launching on a GPU after an idle spell
 * writes one byte to core.wake in its core-limit directory, so that the node's arbiter, which
 * watches the directory with inotify, can give a guaranteed share its request at once instead of
 * a compute pass or two later. The node reads nothing of the file; the library never reads it. */
#ifndef VGPU_CORE_WAKE_H
#define VGPU_CORE_WAKE_H

#define VGPU_CORE_WAKE_NAME "core.wake"
#define VGPU_WAKE_IDLE_NS 20000000ull /* a launch after this long without one on a GPU wakes */

/* Writes the byte (offset 0), opening the file on the first call of the process. Never blocks;
 * a failed open or write is ignored (the arbiter's next pass catches up), logged once. */
void vgpu_core_wake(void);

#endif
