#include "proc_stat.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int vgpu_proc_start_time(int pid, uint64_t *start_time, char *state)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	int saved = close(fd);
	if (n <= 0 || saved != 0)
		return -1;
	buf[n] = '\0';
	/* comm (field 2) may contain spaces and parentheses: parse after the last ')' */
	char *p = strrchr(buf, ')');
	if (p == NULL || p[1] != ' ')
		return -1;
	p += 2;
	if (state != NULL)
		*state = *p;
	for (int field = 3; field < 22; field++) {
		p = strchr(p, ' ');
		if (p == NULL)
			return -1;
		p++;
	}
	uint64_t v = 0;
	if (*p < '0' || *p > '9')
		return -1;
	for (; *p >= '0' && *p <= '9'; p++)
		v = v * 10 + (uint64_t)(*p - '0');
	*start_time = v;
	return 0;
}
