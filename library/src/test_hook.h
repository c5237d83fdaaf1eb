/* Fault injection for the suite, compiled in only with VGPU_TEST_HOOKS (libvgpu-test.so and
 * the unit tests, like VGPU_TEST_ROOT in paths.c). The shipped libvgpu.so has an empty
 * vgpu_test_crash_point and neither the variable's name nor the steps'. */
#ifndef VGPU_TEST_HOOK_H
#define VGPU_TEST_HOOK_H

/* Steps of creating a shared file (shm_file.c). */
enum vgpu_create_step {
	VGPU_STEP_CREATED,     /* the temporary file exists, empty */
	VGPU_STEP_SIZED,       /* sized, all zeros */
	VGPU_STEP_INITIALISED, /* header and contents written, not yet under its name */
	VGPU_STEP_LINKED,      /* under its name; the temporary name not yet removed */
};

/* Test builds: SIGKILLs the process when VGPU_TEST_CRASH_AT is "<file>:<step>", e.g.
 * "ledger.v2:sized". A no-op otherwise. */
void vgpu_test_crash_point(const char *file, enum vgpu_create_step step);

#endif
