#ifndef VGPU_PROC_STAT_H
#define VGPU_PROC_STAT_H

#include <stdint.h>

/* Reads field 22 (start time, clock ticks since boot) and field 3 (state) of
 * /proc/<pid>/stat. state may be NULL. Returns 0, or -1 if the file cannot be read. */
int vgpu_proc_start_time(int pid, uint64_t *start_time, char *state);

#endif
