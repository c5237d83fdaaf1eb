/* The allowance file (contract §16): parsed as the Go twin (pkg/contract) writes it, forgeries
 * refused, and the core limiter's target follows it, falling back to vgpu.config's cores. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../src/core_allowance.h"
#include "../src/runtime.h"
#include "test_util.h"

struct vgpu_runtime vgpu_rt;

static int parse(const char *s, int out[VGPU_MAX_DEVICES])
{
	return vgpu_core_allowance_parse(s, strlen(s), &vgpu_rt.cfg, out);
}

static void write_file(const char *dir, const char *content)
{
	char tmp[600], path[600];
	snprintf(tmp, sizeof(tmp), "%s/etc/vgpu-dra/config/.tmp", dir);
	snprintf(path, sizeof(path), "%s/etc/vgpu-dra/config/" VGPU_CORE_ALLOWANCE_NAME, dir);
	FILE *f = fopen(tmp, "w");
	CHECK(f != NULL, "create %s", tmp);
	if (f == NULL)
		return;
	fputs(content, f);
	fclose(f);
	CHECK(rename(tmp, path) == 0, "rename to %s", path); /* as the node writes it: a new inode */
}

int main(void)
{
	vgpu_rt.cfg.ndevices = 2;
	strcpy(vgpu_rt.cfg.dev[0].uuid, "GPU-a");
	vgpu_rt.cfg.dev[0].core_limit = 30;
	strcpy(vgpu_rt.cfg.dev[1].uuid, "GPU-b");
	vgpu_rt.cfg.dev[1].core_limit = 20;

	int out[VGPU_MAX_DEVICES];
	CHECK_EQ_INT(parse("version 1\ngpu GPU-b 100\ngpu GPU-a 30\ngpu GPU-other 5\nfuture key\n", out), 0);
	CHECK_EQ_INT(out[0], 30);
	CHECK_EQ_INT(out[1], 100);
	CHECK_EQ_INT(parse("# comment\nversion 1\n", out), 0);
	CHECK_EQ_INT(out[0], -1);
	const char *forged[] = {
		"gpu GPU-a 100\n", "version 2\ngpu GPU-a 100\n", "version 1\ngpu GPU-a 101\n",
		"version 1\ngpu GPU-a 0\n", "version 1\ngpu GPU-a 50x\n", "version 1\ngpu GPU-a\n",
		"version 1\ngpu GPU-a 5\ngpu GPU-a 100\n", "version 1\ngpu GPU-a 5 6\n", "",
	};
	for (size_t i = 0; i < sizeof(forged) / sizeof(forged[0]); i++)
		CHECK(parse(forged[i], out) != 0, "accepted %s", forged[i]);

	char root[] = "/tmp/vgpu-allowance-XXXXXX";
	CHECK(mkdtemp(root) != NULL, "mkdtemp");
	char dir[600];
	snprintf(dir, sizeof(dir), "%s/etc", root);
	mkdir(dir, 0755);
	snprintf(dir, sizeof(dir), "%s/etc/vgpu-dra", root);
	mkdir(dir, 0755);
	snprintf(dir, sizeof(dir), "%s/etc/vgpu-dra/config", root);
	mkdir(dir, 0755);
	setenv("VGPU_TEST_ROOT", root, 1);

	CHECK_EQ_INT(vgpu_core_target(0), 30); /* no file: vgpu.config's cores */
	write_file(root, "version 1\ngpu GPU-a 100\n");
	CHECK_EQ_INT(vgpu_core_target(0), 100); /* a burst */
	CHECK_EQ_INT(vgpu_core_target(1), 20);  /* no line: its cores */
	write_file(root, "version 1\ngpu GPU-a 35\n");
	CHECK_EQ_INT(vgpu_core_target(0), 35); /* the change is followed */
	write_file(root, "version 1\ngpu GPU-a 1000\n");
	CHECK_EQ_INT(vgpu_core_target(0), 30); /* malformed: its cores, never the forged figure */
	char path[700];
	snprintf(path, sizeof(path), "%s/" VGPU_CORE_ALLOWANCE_NAME, dir);
	unlink(path);
	CHECK_EQ_INT(vgpu_core_target(0), 30); /* gone: its cores */
	rmdir(dir);
	snprintf(dir, sizeof(dir), "%s/etc/vgpu-dra", root);
	rmdir(dir);
	snprintf(dir, sizeof(dir), "%s/etc", root);
	rmdir(dir);
	rmdir(root);
	return test_finish("core_allowance");
}
