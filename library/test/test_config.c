/* vgpu.config's parser and reader, the comparison of the env with it, the env's limit
 * parsers, pids.config: table cases, then properties over generated input (round trips,
 * and corrupted input that must parse or be refused without crashing). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <strings.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../src/config.h"
#include "../src/config_mount.h"
#include "../src/env_config.h"
#include "../src/pids_config.h"
#include "test_util.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }

static void test_mem_limit(void)
{
	const struct { const char *s; int ok; uint64_t v; } cases[] = {
		{ "4096m", 1, 4096ull << 20 }, { "4096M", 1, 4096ull << 20 }, { "1g", 1, 1ull << 30 },
		{ "512k", 1, 512ull << 10 }, { "1048576", 1, 1048576 }, { "0m", 0, 0 }, { "", 0, 0 },
		{ "m", 0, 0 }, { "-1m", 0, 0 }, { "1.5g", 0, 0 }, { " 12m", 0, 0 }, { "12m ", 0, 0 },
		{ "12mb", 0, 0 }, { "12x", 0, 0 }, { "18446744073709551615", 1, UINT64_MAX },
		{ "18446744073709551616", 0, 0 }, { "17592186044416m", 0, 0 }, { "17592186044415m", 1, 17592186044415ull << 20 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint64_t v = 0;
		int ok = vgpu_parse_mem_limit(cases[i].s, &v) == 0;
		CHECK(ok == cases[i].ok, "\"%s\": ok=%d", cases[i].s, ok);
		if (ok && cases[i].ok)
			CHECK(v == cases[i].v, "\"%s\" = %" PRIu64, cases[i].s, v);
	}
	for (int i = 0; i < 100000; i++) { /* round trip of the plugin's form */
		uint64_t mib = next() % (UINT64_MAX >> 20) + 1;
		char s[40];
		snprintf(s, sizeof(s), "%" PRIu64 "m", mib);
		uint64_t v = 0;
		CHECK(vgpu_parse_mem_limit(s, &v) == 0 && v == mib << 20, "%s", s);
	}
	const char alphabet[] = "0123456789mMgGkK -.x\t";
	for (int i = 0; i < 200000; i++) { /* random strings: accepted ones are exactly digits+suffix */
		char s[24];
		size_t n = next() % 22;
		for (size_t k = 0; k < n; k++)
			s[k] = alphabet[next() % (sizeof(alphabet) - 1)];
		s[n] = '\0';
		uint64_t v;
		if (vgpu_parse_mem_limit(s, &v) == 0) {
			size_t d = strspn(s, "0123456789");
			CHECK(d > 0 && (s[d] == '\0' || (strchr("mMgGkK", s[d]) && s[d + 1] == '\0')) && v > 0,
			      "accepted \"%s\"", s);
		}
	}
}

static void test_core_limit(void)
{
	for (int i = -5; i < 300; i++) {
		char s[16];
		snprintf(s, sizeof(s), "%d", i);
		int v = 0;
		int ok = vgpu_parse_core_limit(s, &v) == 0;
		CHECK(ok == (i >= 1 && i <= 100) && (!ok || v == i), "\"%s\"", s);
	}
	const char *bad[] = { "", "30%", " 30", "3 0", "0x1e", "+30", "30.0", "99999999999999999999" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int v;
		CHECK(vgpu_parse_core_limit(bad[i], &v) != 0, "\"%s\" accepted", bad[i]);
	}
}

#define UUID0 "GPU-0b1c2d3e-0000-1111-2222-333344445555"
#define UUID1 "GPU-aa1c2d3e-0000-1111-2222-333344445555"
#define POD "0b7a2c6e-1f7e-4c9e-9d2a-3f1e5b6c7d8e"
#define REG "5f0c3a1e-8d2b-4e6f-9a1c-2b3d4e5f6a7b"

static int parse(const char *text, struct vgpu_config *c, char *err, size_t errlen)
{
	return vgpu_config_parse(text, strlen(text), c, err, errlen);
}

static void test_file(void)
{
	char err[400];
	struct vgpu_config c;
	const char *good = "# written by the plugin\n"
			   "\n"
			   "version 1\n"
			   "claim c1a2b3c4-d5e6-4f70-8192-a3b4c5d6e7f8\n"
			   "pod " POD "\n"
			   "container app-1\n"
			   "gpu 17 " UUID0 " 4294967296 30\n"
			   "future-key with any fields at all\n"
			   "gpu 3 " UUID1 " 0 100\n";
	CHECK(parse(good, &c, err, sizeof(err)) == 0, "parse: %s", err);
	CHECK_EQ_INT(c.ndevices, 2);
	CHECK(c.dev[0].nvml_index == 17 && strcmp(c.dev[0].uuid, UUID0) == 0 && c.dev[0].mem_limit == 4ull << 30 &&
	      c.dev[0].core_limit == 30 && c.dev[0].line == 7, "GPU at index 17 is the first entry");
	CHECK(c.dev[1].nvml_index == 3 && c.dev[1].mem_limit == 0 && c.dev[1].core_limit == 100, "second entry");
	CHECK(c.any_limit && c.any_core_limit, "limits");
	CHECK(strcmp(c.pod_uid, POD) == 0 && strcmp(c.container_name, "app-1") == 0 && c.register_uuid[0] == '\0' &&
	      strcmp(c.claim_uid, "c1a2b3c4-d5e6-4f70-8192-a3b4c5d6e7f8") == 0, "identity");
	CHECK_EQ_INT(vgpu_config_find_uuid(&c, "gpu-AA1C2D3E-0000-1111-2222-333344445555"), 1);
	CHECK_EQ_INT(vgpu_config_find_uuid(&c, "GPU-other"), -1);
	/* A MIG device's gpu line names it "MIG-…"; CUDA's 16 bytes, which the library spells
	 * "GPU-…", are the same device (contract §18). */
	CHECK_EQ_INT(vgpu_config_find_uuid(&c, "MIG-aa1c2d3e-0000-1111-2222-333344445555"), 1);
	CHECK_EQ_INT(vgpu_config_find_index(&c, 17), 0);
	CHECK_EQ_INT(vgpu_config_find_index(&c, 0), -1);

	/* no limit anywhere: pass-through (0 and 100 both mean unlimited cores) */
	CHECK(parse("version 1\ngpu 0 " UUID0 " 0 0\ngpu 1 " UUID1 " 0 100\n", &c, err, sizeof(err)) == 0 &&
	      !c.any_limit && !c.any_core_limit && c.dev[0].core_limit == 100, "unlimited: %s", err);
	CHECK(parse("version 1\nregister " REG "\n", &c, err, sizeof(err)) == 0 && c.ndevices == 0 &&
	      strcmp(c.register_uuid, REG) == 0, "per-claim identity, no GPU: %s", err);

	/* what a user reads when the file is wrong: the line and the reason */
	static const struct { const char *text, *message; } bad[] = {
		{ "", "has no \"version 1\" line" },
		{ "# only a comment\n", "has no \"version 1\" line" },
		{ "gpu 0 " UUID0 " 0 0\nversion 1\n", "line 1: the first line must be \"version 1\"" },
		{ "version 2\n", "has version 2; this library reads version 1" },
		{ "version one\n", "has version one; this library reads version 1" },
		{ "version 1\nversion 1\n", "line 2: version appears twice" },
		{ "version 1", "line 1 does not end with a newline" },
		{ "version 1\r\n", "line 1 holds a control character (0x0d)" },
		{ "version 1\ngpu\t0 " UUID0 " 0 0\n", "line 2 holds a control character (0x09)" },
		{ "version 1\ngpu 0  " UUID0 " 0 0\n", "line 2: fields are separated by exactly one space" },
		{ "version 1\ngpu 0 " UUID0 " 0 0 \n", "line 2: fields are separated by exactly one space" },
		{ "version 1\n gpu 0 " UUID0 " 0 0\n", "line 2: fields are separated by exactly one space" },
		{ "version 1\ngpu 0 " UUID0 " 0\n", "line 2: a gpu line is \"gpu <NVML index> <GPU UUID>" },
		{ "version 1\ngpu 0 " UUID0 " 0 0 extra\n", "line 2: a gpu line is" },
		{ "version 1\ngpu -1 " UUID0 " 0 0\n", "line 2: the NVML index \"-1\" is not a non-negative number" },
		{ "version 1\ngpu 2147483648 " UUID0 " 0 0\n", "line 2: the NVML index \"2147483648\"" },
		{ "version 1\ngpu 0 " UUID0 " 4096m 0\n", "line 2: the memory limit \"4096m\" is not a number of bytes" },
		{ "version 1\ngpu 0 " UUID0 " 18446744073709551616 0\n", "line 2: the memory limit" },
		{ "version 1\ngpu 0 " UUID0 " 0 101\n", "line 2: the core limit \"101\" is not a percentage 0-100" },
		{ "version 1\ngpu 0 " UUID0 " 0 +5\n", "line 2: the core limit" },
		{ "version 1\ngpu 0 " UUID0 " 0 0\ngpu 1 gpu-0B1C2D3E-0000-1111-2222-333344445555 0 0\n",
		  "line 3: GPU gpu-0B1C2D3E-0000-1111-2222-333344445555 is listed twice (also on line 2)" },
		{ "version 1\ngpu 5 " UUID0 " 0 0\n#\ngpu 5 " UUID1 " 0 0\n",
		  "line 4: NVML index 5 is listed twice (also on line 2)" },
		{ "version 1\npod " POD "\npod " POD "\n", "line 3: pod appears twice" },
		{ "version 1\nregister " REG "\nregister " REG "\n", "line 3: register appears twice" },
		{ "version 1\nclaim x\n", "line 2: claim \"x\" is not a lower-case UUID" },
		{ "version 1\npod 0B7A2C6E-1F7E-4C9E-9D2A-3F1E5B6C7D8E\n",
		  "line 2: pod \"0B7A2C6E-1F7E-4C9E-9D2A-3F1E5B6C7D8E\" is not a lower-case UUID" },
		{ "version 1\npod\n", "line 2: pod \"\" is not a lower-case UUID" },
		{ "version 1\ncontainer App_1\n", "line 2: container \"App_1\" is not a DNS label" },
		{ "version 1\ncontainer app extra\n", "line 2: container \"app\" is not a DNS label" },
		{ "version 1\nregister not-a-uuid\n", "line 2: register \"not-a-uuid\" is not a lower-case UUID" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		CHECK(parse(bad[i].text, &c, err, sizeof(err)) != 0, "accepted \"%s\"", bad[i].text);
		CHECK(strstr(err, bad[i].message) != NULL, "\"%s\": said \"%s\", want \"%s\"", bad[i].text, err, bad[i].message);
	}

	/* 16 gpu lines, with indices far above 15, are fine; a 17th is refused by line */
	char text[4096] = "version 1\n";
	for (int i = 0; i < 17; i++)
		snprintf(text + strlen(text), sizeof(text) - strlen(text), "gpu %d GPU-%08d-0000-0000-0000-000000000000 %d 0\n",
			 1000 + i, i, i + 1);
	CHECK(parse(text, &c, err, sizeof(err)) != 0 && strstr(err, "line 18: more than 16 gpu lines"), "17 GPUs: %s", err);
	*strstr(text, "gpu 1016") = '\0';
	CHECK(parse(text, &c, err, sizeof(err)) == 0 && c.ndevices == 16 && c.dev[15].nvml_index == 1015 &&
	      c.dev[15].mem_limit == 16, "16 GPUs: %s", err);

	/* the size bound: 64 KiB is read, one byte more is not */
	static char big[VGPU_CONFIG_MAX_BYTES + 2];
	memset(big, '#', sizeof(big));
	memcpy(big, "version 1\n", 10);
	for (size_t k = 10 + 99; k < sizeof(big); k += 100)
		big[k] = '\n';
	big[VGPU_CONFIG_MAX_BYTES - 1] = '\n';
	CHECK(vgpu_config_parse(big, VGPU_CONFIG_MAX_BYTES, &c, err, sizeof(err)) == 0, "64 KiB: %s", err);
	big[VGPU_CONFIG_MAX_BYTES] = '\n';
	CHECK(vgpu_config_parse(big, VGPU_CONFIG_MAX_BYTES + 1, &c, err, sizeof(err)) != 0 &&
	      strstr(err, "is larger than 64 KiB"), "64 KiB + 1: %s", err);
}

/* Property: a valid file, corrupted at random (bytes flipped, lines cut, duplicated or
 * swapped), either parses into a config the rules allow or is refused with a line
 * number or reason; never a crash, never two entries for one GPU. Round trip of what the
 * plugin writes. */
static void test_file_properties(void)
{
	char err[400];
	struct vgpu_config c;
	for (int round = 0; round < 20000; round++) {
		int n = (int)(next() % 18);
		char text[4096];
		int len = snprintf(text, sizeof(text), "version 1\npod " POD "\ncontainer app\n");
		uint64_t mem[18], core[18];
		for (int i = 0; i < n; i++) {
			mem[i] = next() % 3 == 0 ? 0 : next();
			core[i] = next() % 101;
			len += snprintf(text + len, sizeof(text) - (size_t)len, "gpu %d GPU-%08x-aaaa-bbbb-cccc-%012d %llu %llu\n",
					(int)(next() % 64) * 64 + i, (unsigned)next(), i, (unsigned long long)mem[i],
					(unsigned long long)core[i]);
		}
		int ok = parse(text, &c, err, sizeof(err)) == 0;
		CHECK(ok == (n <= 16), "%d GPUs: %s", n, err);
		for (int i = 0; ok && i < n; i++)
			CHECK(c.dev[i].mem_limit == mem[i] && c.dev[i].core_limit == (core[i] == 0 ? 100 : (int)core[i]),
			      "round trip of GPU %d", i);
		/* corrupt it */
		int edits = 1 + (int)(next() % 4);
		for (int e = 0; e < edits && len > 0; e++) {
			size_t at = next() % (size_t)len;
			switch (next() % 4) {
			case 0: text[at] = (char)(next() % 256); break;
			case 1: text[at] = " \n0#"[next() % 4]; break;
			case 2: len = (int)at; break;
			default: {
				size_t from = next() % (size_t)len, k = next() % 80;
				char chunk[80];
				if ((size_t)len + k < sizeof(text) && from + k <= (size_t)len) { /* duplicate a piece */
					memcpy(chunk, text + from, k);
					memmove(text + at + k, text + at, (size_t)len - at);
					memcpy(text + at, chunk, k);
					len += (int)k;
				}
			}
			}
		}
		err[0] = '\0';
		if (vgpu_config_parse(text, (size_t)len, &c, err, sizeof(err)) == 0) {
			CHECK(c.ndevices <= VGPU_MAX_DEVICES, "%d GPUs accepted", c.ndevices);
			for (int i = 0; i < c.ndevices; i++) {
				CHECK(c.dev[i].core_limit >= 1 && c.dev[i].core_limit <= 100 && c.dev[i].uuid[0] != '\0', "entry %d", i);
				for (int j = 0; j < i; j++)
					CHECK(strcasecmp(c.dev[i].uuid, c.dev[j].uuid) != 0 && c.dev[i].nvml_index != c.dev[j].nvml_index,
					      "GPU listed twice accepted");
			}
		} else {
			CHECK(err[0] != '\0', "refused without a reason");
		}
	}
}

/* vgpu_config_read: what a missing, odd or unreadable file looks like to the runtime. */
static void test_read(void)
{
	char dir[] = "/tmp/vgpu-cfg.XXXXXX", path[64], link_path[64], err[600];
	struct vgpu_config c;
	CHECK(mkdtemp(dir) != NULL, "mkdtemp");
	snprintf(path, sizeof(path), "%s/vgpu.config", dir);
	errno = 0;
	CHECK(vgpu_config_read(path, &c, err, sizeof(err)) != 0 && errno == ENOENT, "missing: errno %d", errno);
	CHECK(mkdir(path, 0755) == 0, "mkdir");
	CHECK(vgpu_config_read(path, &c, err, sizeof(err)) != 0 && errno != ENOENT && strstr(err, "is not a regular file"),
	      "a directory: %s", err);
	CHECK(rmdir(path) == 0, "rmdir");
	int fd = open(path, O_WRONLY | O_CREAT, 0644);
	const char *text = "version 1\npod " POD "\ncontainer app\ngpu 0 " UUID0 " 1048576 0\n";
	CHECK(fd >= 0 && write(fd, text, strlen(text)) == (ssize_t)strlen(text) && close(fd) == 0, "write");
	CHECK(vgpu_config_read(path, &c, err, sizeof(err)) == 0 && c.dev[0].mem_limit == 1048576, "read: %s", err);
	snprintf(link_path, sizeof(link_path), "%s/link", dir);
	CHECK(symlink(path, link_path) == 0, "symlink");
	CHECK(vgpu_config_read(link_path, &c, err, sizeof(err)) != 0 && errno != ENOENT, "a symlink was followed");
	fd = open(path, O_WRONLY | O_APPEND);
	CHECK(fd >= 0 && write(fd, "gpu 0", 5) == 5 && close(fd) == 0, "append");
	CHECK(vgpu_config_read(path, &c, err, sizeof(err)) != 0 && errno == EINVAL && strstr(err, path) &&
	      strstr(err, "line 5 does not end with a newline"), "malformed: %s", err);
	unlink(link_path);
	unlink(path);
	rmdir(dir);
}

/* mountinfo's mount point by ID: escapes undone, other lines and malformed ones skipped. */
static void test_mountinfo_parse(void)
{
	const char *mi = "22 1 0:21 / / rw,relatime - overlay overlay rw\n"
			 "garbage line\n"
			 "\n"
			 "31 22 0:30 /claims/c1/config /etc/vgpu-dra/config ro,nosuid,nodev - tmpfs tmpfs ro\n"
			 "32 22 0:30 /x /etc/with\\040space\\134and\\011tab ro - tmpfs tmpfs ro\n"
			 "33 22 0:30 /short\n"
			 "34 22 0:30 / /last ro - tmpfs tmpfs ro";
	char mp[64];
	CHECK(vgpu_mountinfo_mount_point(mi, strlen(mi), 31, mp, sizeof(mp)) == 0 && strcmp(mp, "/etc/vgpu-dra/config") == 0,
	      "id 31: %s", mp);
	CHECK(vgpu_mountinfo_mount_point(mi, strlen(mi), 32, mp, sizeof(mp)) == 0 &&
		      strcmp(mp, "/etc/with space\\and\ttab") == 0, "escapes: %s", mp);
	CHECK(vgpu_mountinfo_mount_point(mi, strlen(mi), 34, mp, sizeof(mp)) == 0 && strcmp(mp, "/last") == 0,
	      "last line without a newline: %s", mp);
	CHECK(vgpu_mountinfo_mount_point(mi, strlen(mi), 33, mp, sizeof(mp)) != 0, "a line of too few fields matched");
	CHECK(vgpu_mountinfo_mount_point(mi, strlen(mi), 3, mp, sizeof(mp)) != 0, "id 3 is not listed (31, 32, 33, 34 are)");
	CHECK(vgpu_mountinfo_mount_point(mi, strlen(mi), 99, mp, sizeof(mp)) != 0, "an unknown id matched");
	CHECK(vgpu_mountinfo_mount_point(mi, strlen(mi), 31, mp, 8) != 0, "a mount point that does not fit was cut");
	for (int i = 0; i < 100000; i++) { /* random bytes: never a crash, a found point always fits */
		char buf[200];
		size_t n = next() % sizeof(buf);
		for (size_t k = 0; k < n; k++)
			buf[k] = " 0123456789\\\n/ab-"[next() % 17];
		char out[32];
		if (vgpu_mountinfo_mount_point(buf, n, (int)(next() % 40), out, sizeof(out)) == 0)
			CHECK(strlen(out) < sizeof(out), "overlong result");
	}
}

static int write_config(const char *path)
{
	const char *text = "version 1\npod " POD "\ncontainer app\ngpu 0 " UUID0 " 0 0\n";
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	int ok = fd >= 0 && write(fd, text, strlen(text)) == (ssize_t)strlen(text);
	return (fd >= 0 && close(fd) == 0 && ok) ? 0 : -1;
}

static int bind_ro(const char *dir)
{
	return (mount(dir, dir, NULL, MS_BIND, NULL) == 0 &&
		mount(NULL, dir, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) == 0)
		       ? 0
		       : -1;
}

/* The tenant's ways to a forged vgpu.config, in a mount namespace of its own laid out as the
 * node lays out a container's: the node's read-only mount is believed; a file on a writable file
 * system, the node's mount moved with its renamed parent, and a read-only volume reached
 * through a symlink are not. */
static void mount_check_child(void)
{
	char dir[] = "/tmp/vgpu-mnt.XXXXXX", p[6][300], err[1800];
	struct vgpu_config c;
	CHECK(unshare(CLONE_NEWNS) == 0 && mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0,
	      "a mount namespace of its own: %s", strerror(errno));
	CHECK(mkdtemp(dir) != NULL, "mkdtemp");
	snprintf(p[0], sizeof(p[0]), "%s/etc", dir);
	snprintf(p[1], sizeof(p[1]), "%s/etc/vgpu-dra", dir);
	snprintf(p[2], sizeof(p[2]), "%s/etc/vgpu-dra/config", dir); /* the node's mount point */
	snprintf(p[3], sizeof(p[3]), "%s/etc/vgpu-dra/config/vgpu.config", dir);
	snprintf(p[4], sizeof(p[4]), "%s/volume", dir); /* a read-only volume the tenant filled */
	snprintf(p[5], sizeof(p[5]), "%s/volume/vgpu.config", dir);
	CHECK(mkdir(p[0], 0755) == 0 && mkdir(p[1], 0755) == 0 && mkdir(p[2], 0755) == 0 && mkdir(p[4], 0755) == 0, "mkdir");
	CHECK(write_config(p[3]) == 0 && write_config(p[5]) == 0, "write");

	CHECK(vgpu_config_read_mounted(p[3], p[2], &c, err, sizeof(err)) != 0 && errno == EPERM &&
		      test_contains(err, "is on a writable file system"), "an ordinary directory: %s", err);
	CHECK(bind_ro(p[2]) == 0 && bind_ro(p[4]) == 0, "bind mounts: %s", strerror(errno));
	CHECK(vgpu_config_read_mounted(p[3], p[2], &c, err, sizeof(err)) == 0 && c.ndevices == 1,
	      "the node's read-only mount: %s", err);
	CHECK(vgpu_config_read_mounted(p[3], "/etc/vgpu-dra/config", &c, err, sizeof(err)) != 0 && errno == EPERM &&
		      test_contains(err, "not the node's mount at /etc/vgpu-dra/config"),
	      "a read-only mount elsewhere: %s", err);

	/* mv /etc/vgpu-dra /etc/x, and a planted directory in its place */
	char moved[300], moved_cfg[300];
	snprintf(moved, sizeof(moved), "%s/etc/x", dir);
	snprintf(moved_cfg, sizeof(moved_cfg), "%s/etc/x/config/vgpu.config", dir);
	CHECK(rename(p[1], moved) == 0, "the parent of a mount point renames: %s", strerror(errno));
	CHECK(vgpu_config_read_mounted(moved_cfg, p[2], &c, err, sizeof(err)) != 0 && errno == EPERM &&
		      test_contains(err, "/etc/x/config, not the node's mount"),
	      "the node's file at its moved path: %s", err);
	CHECK(mkdir(p[1], 0755) == 0 && mkdir(p[2], 0755) == 0 && write_config(p[3]) == 0, "plant");
	CHECK(vgpu_config_read_mounted(p[3], p[2], &c, err, sizeof(err)) != 0 && errno == EPERM &&
		      test_contains(err, "writable file system"), "the planted file: %s", err);
	/* the planted config directory a symlink to the tenant's read-only volume */
	CHECK(unlink(p[3]) == 0 && rmdir(p[2]) == 0 && symlink(p[4], p[2]) == 0, "symlink");
	CHECK(vgpu_config_read_mounted(p[3], p[2], &c, err, sizeof(err)) != 0 && errno == EPERM &&
		      test_contains(err, "/volume, not the node's mount"), "the volume through a symlink: %s", err);
	_exit(test_failures ? 1 : 0);
}

static void test_config_mount(void)
{
	CHECK(geteuid() == 0, "this test makes bind mounts in a mount namespace of its own: it must run as root (euid %d)",
	      (int)geteuid());
	if (geteuid() != 0)
		return;
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0)
		mount_check_child();
	int status = 0;
	CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "the mount namespace cases failed (status %d)", status);
}

/* The env is compared with the file, never read for limits: set values that say something
 * else are named; unset ones, and the identity of the other path, are not. */
static void test_env_differences(void)
{
	char err[400], names[256];
	struct vgpu_config c;
	CHECK(parse("version 1\npod " POD "\ncontainer app\ngpu 17 " UUID0 " 4294967296 30\ngpu 2 " UUID1 " 0 0\n", &c, err,
		    sizeof(err)) == 0, "parse: %s", err);
	char *same[] = { "MANAGER_VISIBLE_DEVICE_17=" UUID0, "CUDA_MEM_LIMIT_17=4096m", "CUDA_CORE_LIMIT_17=30",
			 "MANAGER_VISIBLE_DEVICE_2=gpu-aa1c2d3e-0000-1111-2222-333344445555", "CUDA_MEM_LIMIT_2=",
			 "CUDA_CORE_LIMIT_2=", "MANAGER_VISIBLE_DEVICE_0=", "CUDA_MEM_LIMIT_0=", "CUDA_CORE_LIMIT_5=",
			 "MANAGER_CLIENT_REGISTER_UUID=", "VGPU_POD_UID=" POD, "VGPU_CONTAINER_NAME=app", "PATH=/bin",
			 "CUDA_MEM_LIMIT_170=", "CUDA_MEM_LIMIT_=1m", "CUDA_MEM_LIMIT_1x=1m", NULL };
	CHECK(vgpu_env_differences(&c, same, names, sizeof(names)) == 0 && names[0] == '\0', "the plugin's env: %s", names);
	char *other[] = { "CUDA_MEM_LIMIT_17=", "CUDA_CORE_LIMIT_17=100", "MANAGER_VISIBLE_DEVICE_2=", "CUDA_MEM_LIMIT_2=1g",
			  "MANAGER_VISIBLE_DEVICE_3=" UUID1, "CUDA_CORE_LIMIT_2=junk", "VGPU_POD_UID=", "VGPU_CONTAINER_NAME=x",
			  "MANAGER_CLIENT_REGISTER_UUID=" REG, "PATH=/bin", NULL };
	CHECK_EQ_INT(vgpu_env_differences(&c, other, names, sizeof(names)), 9);
	CHECK(strcmp(names, "CUDA_MEM_LIMIT_17, CUDA_CORE_LIMIT_17, MANAGER_VISIBLE_DEVICE_2, CUDA_MEM_LIMIT_2, "
			    "MANAGER_VISIBLE_DEVICE_3, CUDA_CORE_LIMIT_2, VGPU_POD_UID, VGPU_CONTAINER_NAME, "
			    "MANAGER_CLIENT_REGISTER_UUID") == 0, "names: %s", names);
	char small[40];
	CHECK_EQ_INT(vgpu_env_differences(&c, other, small, sizeof(small)), 9);
	CHECK(strlen(small) == sizeof(small) - 1 && strcmp(small + sizeof(small) - 4, "...") == 0, "cut: %s", small);

	/* per-claim path: an image's VGPU_POD_UID / VGPU_CONTAINER_NAME are not its identity */
	CHECK(parse("version 1\nregister " REG "\ngpu 0 " UUID0 " 1 0\n", &c, err, sizeof(err)) == 0, "parse: %s", err);
	char *image[] = { "VGPU_POD_UID=stale", "VGPU_CONTAINER_NAME=Stale_Name", "MANAGER_CLIENT_REGISTER_UUID=" REG, NULL };
	CHECK(vgpu_env_differences(&c, image, names, sizeof(names)) == 0, "per-claim: %s", names);
	char *blank[] = { "MANAGER_CLIENT_REGISTER_UUID=", NULL };
	CHECK(vgpu_env_differences(&c, blank, names, sizeof(names)) == 1 && strcmp(names, "MANAGER_CLIENT_REGISTER_UUID") == 0,
	      "per-claim blanked: %s", names);
}

static void test_pids(void)
{
	struct vgpu_pids p;
	CHECK(vgpu_pids_parse("12\n100034\n7\n", 12, &p) == 0 && p.n == 3, "parse");
	CHECK(vgpu_pids_contains(&p, 7) && vgpu_pids_contains(&p, 100034) && !vgpu_pids_contains(&p, 8), "contains");
	const char *bad[] = { "12", "12\n\n", "a\n", "0\n", "-1\n", "12 \n", "99999999999\n" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		CHECK(vgpu_pids_parse(bad[i], strlen(bad[i]), &p) != 0, "\"%s\" accepted", bad[i]);
	CHECK(vgpu_pids_parse("", 0, &p) == 0 && p.n == 0, "empty");
}

/* A reader takes LOCK_SH: while the writer holds LOCK_EX it waits, then reads the new list. */
static void test_pids_lock(void)
{
	char path[] = "/tmp/vgpu-pids.XXXXXX";
	int fd = mkstemp(path);
	CHECK(fd >= 0 && write(fd, "5\n", 2) == 2, "temp pids file");
	int ready[2];
	CHECK(pipe(ready) == 0, "pipe");
	pid_t w = fork();
	if (w == 0) {
		int f = open(path, O_WRONLY);
		if (f < 0 || flock(f, LOCK_EX) != 0 || write(ready[1], "L", 1) != 1)
			_exit(1);
		usleep(300000);
		if (pwrite(f, "6\n7\n", 4, 0) != 4 || ftruncate(f, 4) != 0)
			_exit(1);
		_exit(0); /* the lock goes with the process */
	}
	char b;
	CHECK(read(ready[0], &b, 1) == 1, "writer did not lock");
	struct vgpu_pids p;
	CHECK(vgpu_pids_read(path, &p) == 0, "read: %s", strerror(errno));
	CHECK(p.n == 2 && p.pid[0] == 6 && p.pid[1] == 7, "read under the writer's LOCK_EX: %zu pids, first %u", (size_t)p.n,
	      p.n ? p.pid[0] : 0);
	int st;
	waitpid(w, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "writer failed");
	close(fd);
	close(ready[0]);
	close(ready[1]);
	unlink(path);
}

int main(void)
{
	test_file();
	test_file_properties();
	test_read();
	test_mountinfo_parse();
	test_config_mount();
	test_env_differences();
	test_pids_lock();
	test_mem_limit();
	test_core_limit();
	test_pids();
	return test_finish("config");
}
