/* A process that never touches CUDA or NVML but does what ordinary programs do with the
 * dynamic loader: dlopen, dlsym (handles, RTLD_DEFAULT, RTLD_NEXT), fork. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void)
{
	void *m = dlopen("libm.so.6", RTLD_NOW);
	double (*cosine)(double) = m ? (double (*)(double))dlsym(m, "cos") : NULL;
	void *(*next_malloc)(size_t) = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
	void *getpid_fn = dlsym(RTLD_DEFAULT, "getpid");
	if (cosine == NULL || next_malloc == NULL || getpid_fn == NULL || dlsym(m, "no_such_symbol") != NULL)
		return 3;
	void *p = next_malloc(16);
	free(p);
	pid_t kid = fork();
	if (kid == 0)
		_exit(cosine(0.0) == 1.0 ? 0 : 4);
	int st;
	if (waitpid(kid, &st, 0) != kid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		return 5;
	printf("nocuda ok\n");
	return 0;
}
