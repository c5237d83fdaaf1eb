/* TEST DOUBLE as a process: scripted_registry_main <socket> <script> <pids.config> <pid offset>
 * Serves until killed (used by hack/gpu-check.sh). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "scripted_registry.h"

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: %s <socket> <script> <pids.config> <pid offset>\n", argv[0]);
		return 2;
	}
	pid_t server = scripted_registry_start(argv[1], argv[2], argv[3], (unsigned)strtoul(argv[4], NULL, 10), NULL);
	if (server < 0)
		return 1;
	int st;
	waitpid(server, &st, 0); /* killing this process's group stops both */
	return 0;
}
