/* Where vgpu.config comes from (contract §4, threat-model.md): the node bind-mounts the
 * container's config directory read-only at /etc/vgpu-dra/config. A root tenant on a writable
 * root file system can rename /etc/vgpu-dra away and plant a directory of its own there, with
 * a vgpu.config without limits; or point the path through a symlink at a read-only volume it
 * filled itself (a ConfigMap). The library believes only a file on a read-only mount whose
 * mount point, in the process's own mount namespace, is the config directory's path: the
 * planted file is on the root file system, the volume's mount point is elsewhere, and the
 * node's real mount, moved with its renamed parent, is no longer at that path. */
#ifndef VGPU_CONFIG_MOUNT_H
#define VGPU_CONFIG_MOUNT_H

#include <stddef.h>

/* Finds the mount point of the mount with this ID in mountinfo's content (/proc/<pid>/mountinfo:
 * "id parent major:minor root mountpoint options ..."), its octal escapes (\040 for a space,
 * \011, \012, \134) undone, into out. Returns 0, or -1 when no line has the ID, a matching line
 * is malformed, or the mount point does not fit. */
int vgpu_mountinfo_mount_point(const char *mountinfo, size_t len, int mnt_id, char *out, size_t outlen);

/* Checks that the open file fd is on a read-only mount whose mount point is mount_point, from
 * fstatvfs and this process's /proc/self/fdinfo/<fd> ("mnt_id:") and /proc/self/mountinfo.
 * Returns 0, or -1 with a message in err naming what is wrong. */
int vgpu_config_mount_check(int fd, const char *mount_point, char *err, size_t errlen);

#endif
