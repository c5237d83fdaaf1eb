/* Fuzz target for the vgpu.config reader (contract §4a): whatever the bytes, the parser must
 * not crash, overrun or hang, and what it accepts must hold to the format's limits.
 *
 * Built two ways (test/CMakeLists.txt):
 *  - with clang and -fsanitize=fuzzer (cmake -DVGPU_FUZZ=ON, `make fuzz-long`): libFuzzer drives
 *    LLVMFuzzerTestOneInput;
 *  - in every build, with the replay driver below: CTest runs each file of corpus/config once,
 *    so any input a fuzzer ever found stays a regression test. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

static void check(int cond, const char *what)
{
	if (!cond) {
		fprintf(stderr, "invariant broken: %s\n", what);
		abort();
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct vgpu_config cfg;
	char err[512];
	if (vgpu_config_parse((const char *)data, size, &cfg, err, sizeof(err)) != 0) {
		check(memchr(err, '\0', sizeof(err)) != NULL && err[0] != '\0', "an error has a message");
		return 0;
	}
	check(size <= VGPU_CONFIG_MAX_BYTES, "accepted size within 64 KiB");
	check(cfg.ndevices >= 0 && cfg.ndevices <= VGPU_MAX_DEVICES, "at most 16 GPUs");
	for (int i = 0; i < cfg.ndevices; i++) {
		const struct vgpu_device_cfg *d = &cfg.dev[i];
		check(memchr(d->uuid, '\0', sizeof(d->uuid)) != NULL && d->uuid[0] != '\0', "UUID terminated, not empty");
		check(d->core_limit >= 1 && d->core_limit <= VGPU_CORE_UNLIMITED, "core limit 1-100");
		check(d->nvml_index >= 0, "NVML index not negative");
		check(vgpu_config_find_uuid(&cfg, d->uuid) == i, "UUIDs unique");
		check(vgpu_config_find_index(&cfg, d->nvml_index) == i, "indices unique");
	}
	check(memchr(cfg.pod_uid, '\0', sizeof(cfg.pod_uid)) != NULL, "pod UID terminated");
	check(memchr(cfg.container_name, '\0', sizeof(cfg.container_name)) != NULL, "container name terminated");
	check(memchr(cfg.register_uuid, '\0', sizeof(cfg.register_uuid)) != NULL, "register UUID terminated");
	return 0;
}

#ifndef VGPU_LIBFUZZER
/* Replay driver: each argument is a file of the corpus. */
int main(int argc, char **argv)
{
	static uint8_t buf[2 * VGPU_CONFIG_MAX_BYTES];
	for (int i = 1; i < argc; i++) {
		FILE *f = fopen(argv[i], "rb");
		if (f == NULL) {
			perror(argv[i]);
			return 2;
		}
		size_t n = fread(buf, 1, sizeof(buf), f);
		fclose(f);
		LLVMFuzzerTestOneInput(buf, n);
	}
	printf("replayed %d inputs\n", argc - 1);
	return 0;
}
#endif
