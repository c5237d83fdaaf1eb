package registry

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// CgroupHierarchy is the one cgroup hierarchy the registry reads membership from (contract
// §5): the v1 hierarchy of the `pids` controller where one is mounted, else the unified v2
// hierarchy. On a hybrid host (v1 controllers, v2 at /sys/fs/cgroup/unified) that is the v1
// `pids` one: it is where the kubelet and the runtime place every container.
type CgroupHierarchy struct {
	// Mount is where the hierarchy is mounted, e.g. /sys/fs/cgroup/pids.
	Mount string
	// Root is the mount's root inside the hierarchy (mountinfo field 4), usually "/".
	Root string
	// V1Pids selects the "pids" line of /proc/<pid>/cgroup; false selects the "0::" line.
	V1Pids bool
	// Proc is the proc file system, "/proc" unless a test says otherwise.
	Proc string
}

// DetectCgroupHierarchy picks the hierarchy from procRoot/self/mountinfo.
func DetectCgroupHierarchy(procRoot string) (CgroupHierarchy, error) {
	path := filepath.Join(procRoot, "self", "mountinfo")
	f, err := os.Open(path)
	if err != nil {
		return CgroupHierarchy{}, fmt.Errorf("detect cgroup hierarchy: %w", err)
	}
	defer f.Close()
	var v2 *CgroupHierarchy
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		m, ok := parseMountinfoLine(sc.Text())
		if !ok {
			continue
		}
		switch {
		case m.fsType == "cgroup" && slices.Contains(strings.Split(m.superOpts, ","), "pids"):
			return CgroupHierarchy{Mount: m.mountPoint, Root: m.root, V1Pids: true, Proc: procRoot}, nil
		case m.fsType == "cgroup2" && v2 == nil:
			v2 = &CgroupHierarchy{Mount: m.mountPoint, Root: m.root, Proc: procRoot}
		}
	}
	if err := sc.Err(); err != nil {
		return CgroupHierarchy{}, fmt.Errorf("read %s: %w", path, err)
	}
	if v2 == nil {
		return CgroupHierarchy{}, fmt.Errorf("no cgroup v1 pids hierarchy and no cgroup2 mount in %s", path)
	}
	return *v2, nil
}

// FreezerHierarchy returns the hierarchy whose freezer holds h's cgroups at the same paths: h
// itself on cgroup v2 (cgroup.freeze is in every non-root cgroup), the v1 freezer controller's
// mount beside a v1 pids hierarchy (v1 reports whether it is one). The enforcer's throttle
// (pkg/enforce.CgroupFreezer) writes there.
func FreezerHierarchy(procRoot string, h CgroupHierarchy) (freezer CgroupHierarchy, v1 bool, err error) {
	if !h.V1Pids {
		return h, false, nil
	}
	path := filepath.Join(procRoot, "self", "mountinfo")
	b, err := os.ReadFile(path)
	if err != nil {
		return CgroupHierarchy{}, false, fmt.Errorf("find the cgroup v1 freezer: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if m, ok := parseMountinfoLine(line); ok && m.fsType == "cgroup" && slices.Contains(strings.Split(m.superOpts, ","), "freezer") {
			return CgroupHierarchy{Mount: m.mountPoint, Root: m.root, Proc: procRoot}, true, nil
		}
	}
	return CgroupHierarchy{}, false, fmt.Errorf("no cgroup v1 freezer hierarchy in %s (the node's cgroups are v1 pids)", path)
}

// UnifiedMount returns the mount point of a cgroup2 file system mounted with root "/" in
// mountinfo (the content of /proc/<pid>/mountinfo).
func UnifiedMount(mountinfo string) (string, bool) {
	for _, line := range strings.Split(mountinfo, "\n") {
		if m, ok := parseMountinfoLine(line); ok && m.fsType == "cgroup2" && m.root == "/" {
			return m.mountPoint, true
		}
	}
	return "", false
}

// String names the hierarchy for logs.
func (h CgroupHierarchy) String() string {
	if h.V1Pids {
		return "cgroup v1 pids at " + h.Mount
	}
	return "cgroup v2 at " + h.Mount
}

type mountinfo struct{ root, mountPoint, fsType, superOpts string }

// parseMountinfoLine reads "id parent maj:min root mountpoint opts [optional...] - fstype source superopts".
func parseMountinfoLine(line string) (mountinfo, bool) {
	fields := strings.Fields(line)
	sep := slices.Index(fields, "-")
	if sep < 6 || len(fields) < sep+4 {
		return mountinfo{}, false
	}
	return mountinfo{
		root:       unescapeMountinfo(fields[3]),
		mountPoint: unescapeMountinfo(fields[4]),
		fsType:     fields[sep+1],
		superOpts:  fields[sep+3],
	}, true
}

// unescapeMountinfo undoes the kernel's octal escapes (\040 for a space, ...).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// OfPID returns the cgroup of pid in this hierarchy, as /proc/<pid>/cgroup writes it
// ("/kubepods/..."). A process without a line for the hierarchy is an error: unknown never
// passes a check.
func (h CgroupHierarchy) OfPID(pid int) (string, error) {
	if pid <= 0 {
		return "", fmt.Errorf("no cgroup for pid %d", pid)
	}
	path := filepath.Join(h.Proc, strconv.Itoa(pid), "cgroup")
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read cgroup of pid %d: %w", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		id, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		controllers, cg, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		match := id == "0" && controllers == ""
		if h.V1Pids {
			match = slices.Contains(strings.Split(controllers, ","), "pids")
		}
		if !match {
			continue
		}
		if !strings.HasPrefix(cg, "/") || strings.HasSuffix(cg, " (deleted)") {
			return "", fmt.Errorf("pid %d has cgroup %q in %s, not a live absolute path", pid, cg, h)
		}
		return filepath.Clean(cg), nil
	}
	return "", fmt.Errorf("pid %d is in no cgroup of %s", pid, h)
}

// Dir returns the directory of cgroup under the hierarchy's mount.
func (h CgroupHierarchy) Dir(cgroup string) (string, error) {
	cg := filepath.Clean("/" + cgroup)
	root := filepath.Clean("/" + h.Root)
	rel, ok := cutPathPrefix(cg, root)
	if !ok {
		return "", fmt.Errorf("cgroup %s is outside the mount root %s of %s", cg, root, h)
	}
	return filepath.Join(h.Mount, rel), nil
}

// Within reports whether cgroup is ancestor or a descendant of it.
func Within(cgroup, ancestor string) bool {
	_, ok := cutPathPrefix(filepath.Clean(cgroup), filepath.Clean(ancestor))
	return ok && strings.HasPrefix(cgroup, "/") && strings.HasPrefix(ancestor, "/")
}

// cutPathPrefix returns p relative to prefix when p is prefix or below it, by whole components.
func cutPathPrefix(p, prefix string) (string, bool) {
	if prefix == "/" {
		return p, true
	}
	if p == prefix {
		return "/", true
	}
	if strings.HasPrefix(p, prefix+"/") {
		return p[len(prefix):], true
	}
	return "", false
}

// PIDs returns every PID in cgroup and its descendants, ascending, each once. A missing
// cgroup is an error wrapping fs.ErrNotExist; descendants that vanish during the walk are
// skipped.
func (h CgroupHierarchy) PIDs(cgroup string) ([]int, error) {
	dir, err := h.Dir(cgroup)
	if err != nil {
		return nil, err
	}
	var pids []int
	if err := collectPIDs(dir, &pids, true); err != nil {
		return nil, fmt.Errorf("list processes of cgroup %s: %w", cgroup, err)
	}
	slices.Sort(pids)
	return slices.Compact(pids), nil
}

func collectPIDs(dir string, pids *[]int, top bool) error {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		// A child cgroup removed during the walk, or a threaded one (v2) whose processes
		// are listed by its domain: nothing to add.
		if !top && (errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENODEV)) {
			return nil
		}
		return err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" {
			continue
		}
		pid, err := strconv.Atoi(line)
		if err != nil || pid <= 0 {
			return fmt.Errorf("bad pid %q in %s/cgroup.procs", line, dir)
		}
		*pids = append(*pids, pid)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		if !top && errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	for _, e := range entries {
		if e.IsDir() { // cgroupfs holds no symlinks; a Type() of dir is a child cgroup
			if err := collectPIDs(filepath.Join(dir, e.Name()), pids, false); err != nil {
				return err
			}
		}
	}
	return nil
}

// PodOfCgroup finds the pod a cgroup belongs to, from the kubelet's naming of pod cgroups:
// "pod<uid>" (cgroupfs driver) or "...-pod<uid with _>.slice" (systemd driver). It returns the
// pod UID and the container's cgroup: the pod cgroup's child on the way to cgroup. The pod
// component nearest the root wins, so a container that can create cgroups below its own
// cannot pass for another pod. A cgroup that is the pod's own, or outside any pod, is not ok.
func PodOfCgroup(cgroup string) (podUID, container string, ok bool) {
	parts := strings.Split(strings.Trim(filepath.Clean(cgroup), "/"), "/")
	for i, p := range parts {
		uid, isPod := podUIDOfComponent(p)
		if !isPod {
			continue
		}
		if i+1 >= len(parts) {
			return "", "", false
		}
		return uid, "/" + strings.Join(parts[:i+2], "/"), true
	}
	return "", "", false
}

func podUIDOfComponent(c string) (string, bool) {
	if rest, ok := strings.CutPrefix(c, "pod"); ok && contract.ValidateUID(rest) == nil {
		return rest, true
	}
	if base, ok := strings.CutSuffix(c, ".slice"); ok {
		if i := strings.LastIndex(base, "-pod"); i >= 0 {
			uid := strings.ReplaceAll(base[i+len("-pod"):], "_", "-")
			if contract.ValidateUID(uid) == nil {
				return uid, true
			}
		}
	}
	return "", false
}
