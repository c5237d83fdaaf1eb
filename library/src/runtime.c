#include "runtime.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc_map.h"
#include "clock.h"
#include "sys_stat.h"
#include "core_file.h"
#include "env_config.h"
#include "free_queue.h"
#include "pool_map.h"
#include "graph_account.h"
#include "hook_table.h"
#include "hooks.h"
#include "log.h"
#include "paths.h"
#include "registry_client.h"
#include "vmm_account.h"

#ifndef VGPU_VERSION
#define VGPU_VERSION "dev"
#endif

struct vgpu_runtime vgpu_rt;

static _Atomic int init_busy;
static _Atomic int atfork_registered;
static _Atomic uint64_t pids_checked_ns;
static struct timespec pids_mtime;
static vgpu_spinlock pids_lock = VGPU_SPINLOCK_INIT;

extern char **environ;

/* A forked child is a new process: it reads vgpu.config, registers again and takes its own
 * ledger slot on its next CUDA call. The parent's slot and ledger locks live on the shared
 * open file description, so the child closes the inherited descriptor and never uses it. */
static void after_fork_in_child(void)
{
	vgpu_ledger_forget(&vgpu_rt.ledger);
	vgpu_alloc_map_reset();
	vgpu_graph_reset();
	vgpu_vmm_reset();
	vgpu_free_queue_reset();
	vgpu_pool_map_reset();
	atomic_store(&vgpu_rt.cuda_mapped, 0);
	atomic_store(&vgpu_rt.launch_gate, VGPU_GATE_UNKNOWN);
	atomic_store(&vgpu_rt.refusal_printed, 0);
	atomic_store(&init_busy, 0);
	atomic_store(&pids_checked_ns, 0);
	vgpu_spin_reset(&pids_lock);
	atomic_store(&vgpu_rt.mode, VGPU_MODE_UNINIT);
}

static int refuse(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int refuse(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(vgpu_rt.refusal, sizeof(vgpu_rt.refusal), fmt, ap);
	va_end(ap);
	return VGPU_MODE_REFUSED;
}

static int require_dir(enum vgpu_path which, const char *what)
{
	char path[512];
	struct stat st;
	if (vgpu_path(which, path, sizeof(path)) != 0)
		return refuse("the %s path is too long", what);
	if (vgpu_stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
		return refuse("%s %s is missing: the container was created without its vGPU directories "
			      "(was the node's NRI plugin connected?)",
			      what, path);
	return 0;
}

/* The only source of limits, GPUs and identity (contract §4): the read-only vgpu.config. */
static int read_config(void)
{
	char path[512], dir[512], err[1800];
	if (vgpu_path(VGPU_PATH_VGPU_CONFIG, path, sizeof(path)) != 0 ||
	    vgpu_path(VGPU_PATH_CONFIG_DIR, dir, sizeof(dir)) != 0)
		return refuse("the vgpu.config path is too long");
	const char *mount_point = vgpu_config_mount_required() ? dir : NULL;
	if (vgpu_config_read_mounted(path, mount_point, &vgpu_rt.cfg, err, sizeof(err)) == 0)
		return 0;
	if (errno == ENOENT) {
		struct stat st;
		if (vgpu_stat(dir, &st) != 0)
			return refuse("the vGPU config directory %s is missing: the container was created without its "
				      "vGPU configuration (was the node's vGPU plugin running?)",
				      dir);
		return refuse("%s is missing: the container was created without its vGPU configuration "
			      "(was the node's vGPU plugin running?)",
			      path);
	}
	return refuse("%s", err);
}

/* The env the plugin injects is for people and tools; a process can change its own. Say once
 * when it differs from the file, naming the variables, so nobody is misled by it. */
static void compare_env(void)
{
	char names[400], path[512];
	int n = vgpu_env_differences(&vgpu_rt.cfg, environ, names, sizeof(names));
	if (n > 0 && vgpu_path(VGPU_PATH_VGPU_CONFIG, path, sizeof(path)) == 0)
		vgpu_log_warn("%s %s from %s and %s ignored: limits, GPUs and identity come only from that file", names,
			      n == 1 ? "differs" : "differ", path, n == 1 ? "is" : "are");
}

static int do_register(void)
{
	const struct vgpu_config *c = &vgpu_rt.cfg;
	struct reg_request req = { .client_version = "libvgpu/" VGPU_VERSION };
	if (c->register_uuid[0] != '\0') {
		/* per-claim path: tags 3 and 4 only. pod_uid and container_name are optional there
		 * and the server decides the pod by the caller's cgroup; values from an image's env
		 * are stale and, malformed, would make the whole request INVALID. */
		req.register_uuid = c->register_uuid;
	} else if (c->pod_uid[0] != '\0' && c->container_name[0] != '\0') {
		req.pod_uid = c->pod_uid; /* NRI path */
		req.container_name = c->container_name;
	} else {
		return refuse("vgpu.config names no registration identity: neither \"pod\" and \"container\" "
			      "(NRI path) nor \"register\" (per-claim path)");
	}
	char sock[512], detail[1200];
	if (vgpu_path(VGPU_PATH_REGISTRY_SOCKET, sock, sizeof(sock)) != 0)
		return refuse("the registry socket path is too long");
	struct reg_response res;
	enum reg_outcome o = reg_register(sock, &req, REG_BUDGET_MS, NULL, &res, NULL, detail, sizeof(detail));
	if (o != REG_OUTCOME_OK)
		return refuse("registration with the node's vGPU registry failed: %s", detail);
	return 0;
}

static int open_core_buckets(void)
{
	char dir[512], err[600];
	if (vgpu_path(VGPU_PATH_VGPU_LOCK_DIR, dir, sizeof(dir)) != 0)
		return refuse("the core-limit directory path is too long");
	vgpu_rt.buckets = vgpu_core_file_open(dir, err, sizeof(err));
	if (vgpu_rt.buckets == NULL)
		return refuse("%s", err);
	return 0;
}

static int read_pids(void)
{
	char path[512];
	if (vgpu_path(VGPU_PATH_PIDS_CONFIG, path, sizeof(path)) != 0)
		return refuse("the pids.config path is too long");
	struct stat st;
	if (vgpu_stat(path, &st) == 0)
		pids_mtime = st.st_mtim;
	if (vgpu_pids_read(path, &vgpu_rt.pids) != 0)
		return refuse("cannot read %s after registering: %s", path, strerror(errno));
	if (vgpu_rt.pids.n == 0)
		return refuse("%s lists no process after registering", path);
	atomic_store(&pids_checked_ns, vgpu_now_ns());
	return 0;
}

static int decide(void)
{
	struct vgpu_config *c = &vgpu_rt.cfg;
	vgpu_rt.only_index = -1;
	int rc;
	if ((rc = read_config()) != 0)
		return rc;
	compare_env();
	if (c->ndevices == 1)
		vgpu_rt.only_index = 0;
	if (!c->any_limit)
		return VGPU_MODE_PASSTHROUGH;

	if ((rc = require_dir(VGPU_PATH_VMEM_NODE_DIR, "the memory ledger directory")) != 0 ||
	    (rc = require_dir(VGPU_PATH_VGPU_LOCK_DIR, "the core-limit directory")) != 0)
		return rc;
	if ((rc = do_register()) != 0 || (rc = read_pids()) != 0)
		return rc;
	char dir[512], lerr[600];
	if (vgpu_path(VGPU_PATH_VMEM_NODE_DIR, dir, sizeof(dir)) != 0)
		return refuse("the memory ledger path is too long");
	if (vgpu_ledger_open(&vgpu_rt.ledger, dir, lerr, sizeof(lerr)) != 0)
		return refuse("%s", lerr);
	if (c->any_core_limit && (rc = open_core_buckets()) != 0)
		return rc;
	return VGPU_MODE_ENFORCE;
}

int vgpu_runtime_mode(void)
{
	int m = atomic_load_explicit(&vgpu_rt.mode, memory_order_acquire);
	if (m != VGPU_MODE_UNINIT)
		return m;
	/* One thread decides (registration may take up to the registration budget, 30 s); the others wait
	 * without spinning. */
	for (;;) {
		int expected = 0;
		if (atomic_compare_exchange_strong(&init_busy, &expected, 1))
			break;
		vgpu_sleep_ns(1000000);
		m = atomic_load_explicit(&vgpu_rt.mode, memory_order_acquire);
		if (m != VGPU_MODE_UNINIT)
			return m;
	}
	m = atomic_load(&vgpu_rt.mode);
	if (m == VGPU_MODE_UNINIT) {
		int expected = 0;
		if (atomic_compare_exchange_strong(&atfork_registered, &expected, 1) &&
		    pthread_atfork(NULL, NULL, after_fork_in_child) != 0)
			vgpu_log_warn("cannot register the fork handler: a forked child would share the ledger lock");
		vgpu_ledger_forget(&vgpu_rt.ledger);
		vgpu_rt.refusal[0] = '\0';
		m = decide();
		atomic_store_explicit(&vgpu_rt.mode, m, memory_order_release);
		if (m == VGPU_MODE_REFUSED)
			vgpu_runtime_report_refusal();
		else
			vgpu_log_debug("mode %s", m == VGPU_MODE_ENFORCE ? "enforce" : "passthrough");
	}
	atomic_store(&init_busy, 0);
	return m;
}

void vgpu_runtime_report_refusal(void)
{
	int expected = 0;
	if (atomic_compare_exchange_strong(&vgpu_rt.refusal_printed, &expected, 1))
		vgpu_log_error("refusing to run CUDA without the container's vGPU limits: %s", vgpu_rt.refusal);
}

static void format_uuid(const CUuuid *u, char *out, size_t len)
{
	const unsigned char *b = (const unsigned char *)u->bytes;
	snprintf(out, len,
		 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
		 b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
		 b[14], b[15]);
}

/* Refuses the process for what mapping CUDA's devices found (contract §9). */
__attribute__((format(printf, 1, 2))) static int refuse_mapping(const char *fmt, ...)
{
	char why[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	refuse("%s", why);
	atomic_store(&vgpu_rt.mode, VGPU_MODE_REFUSED);
	atomic_store(&vgpu_rt.launch_gate, VGPU_GATE_REFUSED);
	vgpu_runtime_report_refusal();
	return VGPU_MODE_REFUSED;
}

int vgpu_runtime_map_cuda(void)
{
	int m = vgpu_runtime_mode();
	if (m == VGPU_MODE_REFUSED || atomic_load(&vgpu_rt.cuda_mapped))
		return m;
	int count = 0;
	if (USED(cuDeviceGetCount) == NULL || USED(cuDeviceGetUuid) == NULL)
		return m; /* not a driver we can map; the calls that need it fail on their own */
	CUresult r = USED(cuDeviceGetCount)(&count);
	if (r != CUDA_SUCCESS)
		return m;
	/* Every visible device needs a gpu line of its own: past the devices the library maps, or
	 * one whose UUID the driver does not give, cannot be matched to one. Either way the process
	 * would run a GPU unaccounted: refused. */
	if (count > VGPU_MAX_CUDA_DEVICES)
		return refuse_mapping("CUDA sees %d devices, more than the %d the library maps (vgpu.config has %d gpu "
				      "lines)", count, VGPU_MAX_CUDA_DEVICES, vgpu_rt.cfg.ndevices);
	int index[VGPU_MAX_CUDA_DEVICES];
	for (int d = 0; d < count; d++) {
		CUuuid u;
		char text[64];
		if ((r = USED(cuDeviceGetUuid)(&u, d)) != CUDA_SUCCESS)
			return refuse_mapping("cuDeviceGetUuid(%d) failed with %d: the device cannot be matched to a "
					      "gpu line", d, r);
		format_uuid(&u, text, sizeof(text));
		index[d] = vgpu_config_find_uuid(&vgpu_rt.cfg, text);
		if (index[d] < 0)
			return refuse_mapping("CUDA device %d (%s) is visible but vgpu.config has no gpu line for it", d,
					      text);
	}
	memcpy(vgpu_rt.cuda_index, index, sizeof(int) * (size_t)count);
	vgpu_rt.cuda_count = count;
	atomic_store_explicit(&vgpu_rt.cuda_mapped, 1, memory_order_release);
	return m;
}

int vgpu_runtime_index_of_ordinal(int ordinal)
{
	if (!atomic_load_explicit(&vgpu_rt.cuda_mapped, memory_order_acquire)) {
		if (vgpu_runtime_map_cuda() != VGPU_MODE_ENFORCE || !atomic_load(&vgpu_rt.cuda_mapped))
			return -1;
	}
	if (ordinal < 0 || ordinal >= vgpu_rt.cuda_count)
		return -1;
	return vgpu_rt.cuda_index[ordinal];
}

int vgpu_runtime_current_index(void)
{
	CUdevice dev;
	if (USED(cuCtxGetDevice) == NULL || USED(cuCtxGetDevice)(&dev) != CUDA_SUCCESS)
		return -1;
	return vgpu_runtime_index_of_ordinal(dev);
}

int vgpu_runtime_index_of_nvml(nvmlDevice_t dev)
{
	static struct { nvmlDevice_t dev; int index; } cache[VGPU_MAX_CUDA_DEVICES];
	static _Atomic int ncache;
	static vgpu_spinlock lock = VGPU_SPINLOCK_INIT;
	int n = atomic_load_explicit(&ncache, memory_order_acquire);
	for (int i = 0; i < n; i++)
		if (cache[i].dev == dev)
			return cache[i].index;
	char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
	if (USED(nvmlDeviceGetUUID) == NULL || USED(nvmlDeviceGetUUID)(dev, uuid, sizeof(uuid)) != NVML_SUCCESS)
		return -1;
	int index = vgpu_config_find_uuid(&vgpu_rt.cfg, uuid);
	vgpu_spin_lock(&lock);
	n = atomic_load(&ncache);
	if (n < VGPU_MAX_CUDA_DEVICES) {
		cache[n].dev = dev;
		cache[n].index = index;
		atomic_store_explicit(&ncache, n + 1, memory_order_release);
	}
	vgpu_spin_unlock(&lock);
	return index;
}

void vgpu_runtime_refresh_pids(void)
{
	uint64_t now = vgpu_now_ns();
	uint64_t last = atomic_load(&pids_checked_ns);
	if (now - last < 200000000ull || !atomic_compare_exchange_strong(&pids_checked_ns, &last, now))
		return;
	char path[512];
	struct stat st;
	if (vgpu_path(VGPU_PATH_PIDS_CONFIG, path, sizeof(path)) != 0 || vgpu_stat(path, &st) != 0)
		return;
	vgpu_spin_lock(&pids_lock);
	if (st.st_mtim.tv_sec != pids_mtime.tv_sec || st.st_mtim.tv_nsec != pids_mtime.tv_nsec) {
		static struct vgpu_pids fresh;
		if (vgpu_pids_read(path, &fresh) == 0 && fresh.n > 0) {
			vgpu_rt.pids = fresh; /* readers may see a mix for an instant: only sums are off */
			pids_mtime = st.st_mtim;
		}
	}
	vgpu_spin_unlock(&pids_lock);
}
