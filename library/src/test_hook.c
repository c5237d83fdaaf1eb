#include "test_hook.h"

#ifdef VGPU_TEST_HOOKS
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const step_names[] = {
	[VGPU_STEP_CREATED] = "created",
	[VGPU_STEP_SIZED] = "sized",
	[VGPU_STEP_INITIALISED] = "initialised",
	[VGPU_STEP_LINKED] = "linked",
};

void vgpu_test_crash_point(const char *file, enum vgpu_create_step step)
{
	const char *at = getenv("VGPU_TEST_CRASH_AT");
	char want[128];
	if (at == NULL || snprintf(want, sizeof(want), "%s:%s", file, step_names[step]) >= (int)sizeof(want))
		return;
	if (strcmp(at, want) == 0)
		(void)raise(SIGKILL); /* does not return */
}
#else
void vgpu_test_crash_point(const char *file, enum vgpu_create_step step)
{
	(void)file;
	(void)step;
}
#endif
