/* make bench: added cost of libvgpu per call, against the fake driver called directly in
 * the same process and run (targets: <= 50 ns per launch without a limit, <= 100 ns with
 * a core limit, <= 5 us per cuMemAlloc/cuMemFree pair and per cuMemCreate/cuMemMap/cuMemUnmap/
 * cuMemRelease round of the virtual memory API and per cuMemAllocAsync/cuMemFreeAsync pair on a
 * stream); the library's start-up (the first
 * cuInit, which decides the mode, registers, reads pids.config and opens the ledger) in
 * fresh processes against the same cuInit without the library; and the core limit
 * measured end to end (wall clock, fake GPU) at 30 % and 60 %.
 *
 * Without arguments (or with "quick": without the end-to-end run) it is the driver: sets up
 * a container root and the scripted registry, re-runs itself preloaded in each mode (the
 * limits in vgpu.config, and the same in the env the plugin injects next to it), prints a
 * summary. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <dlfcn.h>

#include "../src/hooks.h"
#include "fake/fake_state.h"
#include "server/scripted_registry.h"

CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice dev);
CUresult cuStreamCreate(CUstream *stream, unsigned int flags);
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
			     unsigned long long flags);

static double now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
			      CUstream, void **, void **);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*alloc_async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);
struct vmm_fns {
	__typeof__(&cuMemCreate) create;
	__typeof__(&cuMemMap) map;
	__typeof__(&cuMemUnmap) unmap;
	__typeof__(&cuMemRelease) release;
};

static double time_launch(launch_fn f, long n)
{
	double best = 1e30;
	for (int rep = 0; rep < 5; rep++) {
		double t0 = now_ns();
		for (long i = 0; i < n; i++)
			if (f(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS)
				exit(3);
		double per = (now_ns() - t0) / (double)n;
		if (per < best)
			best = per;
	}
	return best;
}

static double time_alloc(alloc_fn a, free_fn f, long n)
{
	double best = 1e30;
	for (int rep = 0; rep < 5; rep++) {
		double t0 = now_ns();
		for (long i = 0; i < n; i++) {
			CUdeviceptr p;
			if (a(&p, 1 << 20) != CUDA_SUCCESS || f(p) != CUDA_SUCCESS)
				exit(4);
		}
		double per = (now_ns() - t0) / (double)n;
		if (per < best)
			best = per;
	}
	return best;
}

/* Stream-ordered pairs on the default stream, as a caching allocator's slow path makes them:
 * the hooked free records an event behind it and gives the bytes back once it has run. */
static double time_async(alloc_async_fn a, free_async_fn f, CUstream s, long n)
{
	double best = 1e30;
	for (int rep = 0; rep < 5; rep++) {
		double t0 = now_ns();
		for (long i = 0; i < n; i++) {
			CUdeviceptr p;
			if (a(&p, 1 << 20, s) != CUDA_SUCCESS || f(p, s) != CUDA_SUCCESS)
				exit(6);
		}
		double per = (now_ns() - t0) / (double)n;
		if (per < best)
			best = per;
	}
	return best;
}

/* One round of the virtual memory API as the CUDA Programming Guide shows it: physical memory,
 * mapped into a reserved range, its handle released at once, unmapped when done. */
static double time_vmm(const struct vmm_fns *f, CUdeviceptr va, long n)
{
	CUmemAllocationProp prop = { .type = 1, .location = { CU_MEM_LOCATION_TYPE_DEVICE, 0 } };
	double best = 1e30;
	for (int rep = 0; rep < 5; rep++) {
		double t0 = now_ns();
		for (long i = 0; i < n; i++) {
			CUmemGenericAllocationHandle h;
			if (f->create(&h, 2 << 20, &prop, 0) != CUDA_SUCCESS || f->map(va, 2 << 20, 0, h, 0) != CUDA_SUCCESS ||
			    f->release(h) != CUDA_SUCCESS || f->unmap(va, 2 << 20) != CUDA_SUCCESS)
				exit(5);
		}
		double per = (now_ns() - t0) / (double)n;
		if (per < best)
			best = per;
	}
	return best;
}

/* Preloaded child: measure one mode. */
static int measure(const char *mode)
{
	if (strcmp(mode, "startup") == 0) {
		double t0 = now_ns();
		CUresult r = cuInit(0);
		double t1 = now_ns();
		if (r != CUDA_SUCCESS)
			return 2;
		printf("%.0f\n", t1 - t0);
		return 0;
	}
	CUcontext ctx;
	if (cuInit(0) != CUDA_SUCCESS || cuCtxCreate_v2(&ctx, 0, 0) != CUDA_SUCCESS)
		return 2;
	void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	launch_fn direct_launch = (launch_fn)dlsym(drv, "fake_cuLaunchKernel");
	alloc_fn direct_alloc = (alloc_fn)dlsym(drv, "fake_cuMemAlloc_v2");
	free_fn direct_free = (free_fn)dlsym(drv, "fake_cuMemFree_v2");
	if (!direct_launch || !direct_alloc || !direct_free)
		return 2;
	if (strcmp(mode, "launch") == 0) {
		/* warm-up: lets the core-limit controller find its rate. The fake's kernels take no
		 * time here, so NVML never samples the process: after 1 s without a sample the held
		 * launches raise the rate each control step (core_bucket_quiet_util), about 2 s more
		 * from the initial rate to one that holds none. */
		double end = now_ns() + 4e9;
		while (now_ns() < end)
			cuLaunchKernel(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
		double d = time_launch(direct_launch, 2000000);
		double h = time_launch(cuLaunchKernel, 2000000);
		printf("%.1f %.1f\n", d, h);
	} else if (strcmp(mode, "vmm") == 0) {
		struct vmm_fns direct = { (__typeof__(&cuMemCreate))dlsym(drv, "fake_cuMemCreate"),
					  (__typeof__(&cuMemMap))dlsym(drv, "fake_cuMemMap"),
					  (__typeof__(&cuMemUnmap))dlsym(drv, "fake_cuMemUnmap"),
					  (__typeof__(&cuMemRelease))dlsym(drv, "fake_cuMemRelease") };
		struct vmm_fns hooked = { cuMemCreate, cuMemMap, cuMemUnmap, cuMemRelease };
		CUdeviceptr va;
		if (!direct.create || !direct.map || !direct.unmap || !direct.release ||
		    cuMemAddressReserve(&va, 2 << 20, 0, 0, 0) != CUDA_SUCCESS)
			return 2;
		double d = time_vmm(&direct, va, 20000);
		double h = time_vmm(&hooked, va, 20000);
		printf("%.1f %.1f\n", d, h);
	} else if (strcmp(mode, "async") == 0 || strcmp(mode, "asyncstream") == 0) {
		alloc_async_fn da = (alloc_async_fn)dlsym(drv, "fake_cuMemAllocAsync");
		free_async_fn df = (free_async_fn)dlsym(drv, "fake_cuMemFreeAsync");
		CUstream s = NULL; /* async: the legacy default stream; asyncstream: one of the context's */
		if (!da || !df || (strcmp(mode, "asyncstream") == 0 && cuStreamCreate(&s, 0) != CUDA_SUCCESS))
			return 2;
		double d = time_async(da, df, s, 20000);
		double h = time_async(cuMemAllocAsync, cuMemFreeAsync, s, 20000);
		printf("%.1f %.1f\n", d, h);
	} else {
		double d = time_alloc(direct_alloc, direct_free, 20000);
		double h = time_alloc(cuMemAlloc_v2, cuMemFree_v2, 20000);
		printf("%.1f %.1f\n", d, h);
	}
	return 0;
}

static char root[64];

static uint64_t busy_at_sample; /* fake GPU busy time when the sample was taken */
static double sample_after_s;    /* 0: no sample */

static uint64_t fake_busy(void)
{
	char path[128];
	snprintf(path, sizeof(path), "%s/fake.state", root);
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return 0;
	struct fake_state *fs = mmap(NULL, sizeof(*fs), PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (fs == MAP_FAILED)
		return 0;
	uint64_t b = fs->busy_total_ns[0];
	munmap(fs, sizeof(*fs));
	return b;
}

static int run_child(const char *self, const char *preload, char *const argv[], const char *const extra[], char *out,
		     size_t cap)
{
	char path[128];
	snprintf(path, sizeof(path), "%s/out", root);
	pid_t pid = fork();
	if (pid == 0) {
		int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd < 0 || dup2(fd, 1) < 0)
			_exit(126);
		char buf[16][256];
		char *env[24];
		int n = 0;
		snprintf(buf[n], 256, "LD_PRELOAD=%s", preload); env[n] = buf[n]; n++;
		snprintf(buf[n], 256, "LD_LIBRARY_PATH=%s", FAKE_DIR); env[n] = buf[n]; n++;
		snprintf(buf[n], 256, "VGPU_TEST_ROOT=%s", root); env[n] = buf[n]; n++;
		snprintf(buf[n], 256, "FAKE_GPU_STATE=%s/fake.state", root); env[n] = buf[n]; n++;
		snprintf(buf[n], 256, "MANAGER_VISIBLE_DEVICE_0=%s", FAKE_DEFAULT_UUID); env[n] = buf[n]; n++;
		snprintf(buf[n], 256, "VGPU_POD_UID=0b7a2c6e-1f7e-4c9e-9d2a-3f1e5b6c7d8e"); env[n] = buf[n]; n++;
		snprintf(buf[n], 256, "VGPU_CONTAINER_NAME=bench"); env[n] = buf[n]; n++;
		snprintf(buf[n], 256, "FAKE_PID_OFFSET=100000"); env[n] = buf[n]; n++;
		snprintf(buf[n], 256, "ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0"); env[n] = buf[n]; n++;
		for (int i = 0; extra[i]; i++)
			env[n++] = (char *)extra[i];
		env[n] = NULL;
		execve(argv[0], argv, env);
		_exit(127);
	}
	(void)self;
	if (sample_after_s > 0) {
		struct timespec ts = { (time_t)sample_after_s, 0 };
		nanosleep(&ts, NULL);
		busy_at_sample = fake_busy();
	}
	int st;
	waitpid(pid, &st, 0);
	int fd = open(path, O_RDONLY);
	ssize_t got = fd >= 0 ? read(fd, out, cap - 1) : -1;
	out[got > 0 ? got : 0] = '\0';
	if (fd >= 0)
		close(fd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Median of the first cuInit over fresh processes. Returns 0 on failure. */
static double startup_median(const char *self, const char *preload, const char *const env[])
{
	enum { RUNS = 31 };
	double v[RUNS];
	for (int i = 0; i < RUNS; i++) {
		char out[64];
		char *args[] = { (char *)self, "measure", "startup", NULL };
		if (run_child(self, preload, args, env, out, sizeof(out)) != 0 || sscanf(out, "%lf", &v[i]) != 1)
			return 0;
	}
	qsort(v, RUNS, sizeof(v[0]), cmp_double);
	return v[RUNS / 2];
}

/* vgpu.config for the next run: the GPU's memory (bytes) and core (%) limits, 0 = none. */
static void write_config(unsigned long long mem, int core)
{
	char path[128], text[512];
	snprintf(path, sizeof(path), "%s/etc/vgpu-dra/config/vgpu.config", root);
	int len = snprintf(text, sizeof(text),
			   "version 1\npod 0b7a2c6e-1f7e-4c9e-9d2a-3f1e5b6c7d8e\ncontainer bench\ngpu 0 %s %llu %d\n",
			   FAKE_DEFAULT_UUID, mem, core);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0 || write(fd, text, (size_t)len) != len || close(fd) != 0) {
		perror(path);
		exit(2);
	}
}

static void reset_fake(void)
{
	char path[128];
	snprintf(path, sizeof(path), "%s/fake.state", root);
	unlink(path);
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "measure") == 0)
		return measure(argv[2]);
	snprintf(root, sizeof(root), "/tmp/vgb.XXXXXX");
	if (mkdtemp(root) == NULL)
		return 2;
	const char *dirs[] = { "/etc", "/etc/vgpu-dra", "/etc/vgpu-dra/registry", "/etc/vgpu-dra/config", "/tmp",
			       "/tmp/.vgpu_lock", "/tmp/.vmem_node" };
	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
		char p[128];
		snprintf(p, sizeof(p), "%s%s", root, dirs[i]);
		mkdir(p, 0755);
	}
	char sock[128], pids[128];
	snprintf(sock, sizeof(sock), "%s/etc/vgpu-dra/registry/registry.sock", root);
	snprintf(pids, sizeof(pids), "%s/etc/vgpu-dra/config/pids.config", root);
	pid_t srv = scripted_registry_start(sock, "OK", pids, 100000, NULL);

	/* slug: the row's name in the `go test -bench` lines printed after the table, which make
	 * bench's summary reads (hack/bench-targets.txt) */
	struct { const char *label, *slug, *what; const char *env[4]; double target; unsigned long long mem; int core; } modes[] = {
		{ "cuLaunchKernel, no limit", "launch", "launch", { "FAKE_NS_PER_BLOCK=0", NULL }, 50, 0, 0 },
		{ "cuLaunchKernel, core limit 50%", "launch-core-limit", "launch", { "FAKE_NS_PER_BLOCK=0", "CUDA_CORE_LIMIT_0=50", NULL }, 100, 0, 50 },
		{ "cuMemAlloc+cuMemFree, no limit", "alloc", "alloc", { NULL }, 5000, 0, 0 },
		{ "cuMemAlloc+cuMemFree, memory limit", "alloc-mem-limit", "alloc", { "CUDA_MEM_LIMIT_0=4096m", NULL }, 5000, 4096ull << 20, 0 },
		{ "cuMemAllocAsync+cuMemFreeAsync, no limit", "async", "async", { NULL }, 5000, 0, 0 },
		{ "cuMemAllocAsync+cuMemFreeAsync, mem limit", "async-mem-limit", "async", { "CUDA_MEM_LIMIT_0=4096m", NULL }, 5000, 4096ull << 20, 0 },
		{ "the same on a stream of the context", "async-stream-mem-limit", "asyncstream", { "CUDA_MEM_LIMIT_0=4096m", NULL }, 5000, 4096ull << 20, 0 },
		{ "cuMemCreate+Map+Unmap+Release, no limit", "vmm", "vmm", { NULL }, 5000, 0, 0 },
		{ "cuMemCreate+Map+Unmap+Release, mem limit", "vmm-mem-limit", "vmm", { "CUDA_MEM_LIMIT_0=4096m", NULL }, 5000, 4096ull << 20, 0 },
	};
	enum { NMODES = sizeof(modes) / sizeof(modes[0]) };
	double measured[NMODES][2] = { { 0 } };
	int rc = 0;
	printf("%-42s %12s %12s %12s %8s %10s\n", "libvgpu overhead", "driver ns", "hooked ns", "added ns", "ratio",
	       "target ns");
	for (size_t i = 0; i < NMODES; i++) {
		char out[256];
		reset_fake();
		write_config(modes[i].mem, modes[i].core);
		char *args[] = { argv[0], "measure", (char *)modes[i].what, NULL };
		if (run_child(argv[0], LIBVGPU_TEST, args, modes[i].env, out, sizeof(out)) != 0) {
			printf("%-42s failed\n", modes[i].label);
			rc = 1;
			continue;
		}
		double d = 0, h = 0;
		if (sscanf(out, "%lf %lf", &d, &h) != 2)
			rc = 1;
		printf("%-42s %12.1f %12.1f %12.1f %8.2f %10.0f\n", modes[i].label, d, h, h - d, d > 0 ? h / d : 0,
		       modes[i].target);
		measured[i][0] = d;
		measured[i][1] = h;
	}
	printf("\n");
	for (size_t i = 0; i < NMODES; i++)
		if (measured[i][0] > 0)
			printf("BenchmarkLibraryOverhead/%s 1 %.1f added-ns %.1f driver-ns %.1f hooked-ns\n", modes[i].slug,
			       measured[i][1] - measured[i][0], measured[i][0], measured[i][1]);

	printf("\n%-42s %12s %12s %12s\n", "start-up (first cuInit, median of 31)", "driver us", "hooked us",
	       "added us");
	struct { const char *label; const char *env[3]; unsigned long long mem; } starts[] = {
		{ "no limit (pass-through)", { NULL }, 0 },
		{ "memory limit (register, ledger)", { "CUDA_MEM_LIMIT_0=4096m", NULL }, 4096ull << 20 },
	};
	reset_fake();
	const char *none[] = { NULL };
	double base = startup_median(argv[0], "", none);
	for (size_t i = 0; i < sizeof(starts) / sizeof(starts[0]); i++) {
		write_config(starts[i].mem, 0);
		double h = startup_median(argv[0], LIBVGPU_TEST, starts[i].env);
		if (base <= 0 || h <= 0) {
			printf("%-42s failed\n", starts[i].label);
			rc = 1;
			continue;
		}
		printf("%-42s %12.1f %12.1f %12.1f\n", starts[i].label, base / 1e3, h / 1e3, (h - base) / 1e3);
	}

	if (argc == 2 && strcmp(argv[1], "quick") == 0)
		goto done;
	printf("\ncore limit end to end (fake GPU, 1 ms kernels, 12 s run, wall clock; steady state = after 4 s):\n");
	const int targets[] = { 30, 60 };
	for (size_t i = 0; i < 2; i++) {
		char out[256], limit[64];
		reset_fake();
		snprintf(limit, sizeof(limit), "CUDA_CORE_LIMIT_0=%d", targets[i]);
		write_config(0, targets[i]);
		const char *env[] = { limit, "FAKE_NS_PER_BLOCK=1000", NULL };
		char *args[] = { PROBE_BIN, "launch", "12", "1000", NULL };
		sample_after_s = 4;
		int r = run_child(argv[0], LIBVGPU_TEST, args, env, out, sizeof(out));
		sample_after_s = 0;
		char *at = strstr(out, "elapsed=");
		if (r != 0 || at == NULL) {
			printf("  target %d%%: failed\n", targets[i]);
			rc = 1;
			continue;
		}
		double elapsed = atof(at + 8);
		uint64_t busy = fake_busy();
		double whole = 100.0 * (double)busy / (elapsed * 1e9);
		double steady = 100.0 * (double)(busy - busy_at_sample) / ((elapsed - 4) * 1e9);
		printf("  target %d%%: GPU busy %.1f%% in steady state (error %+.1f pp); %.1f%% over the whole run\n",
		       targets[i], steady, steady - targets[i], whole);
	}
done:
	scripted_registry_stop(srv, sock);
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
	if (system(cmd) != 0)
		rc = 1;
	return rc;
}
