package enforce

import (
	"fmt"
	"os"
	"path/filepath"
)

// CgroupFreezer freezes and thaws a container's cgroup for the compute rule's throttle: cgroup
// v2's cgroup.freeze ("1"/"0"), or cgroup v1's freezer.state ("FROZEN"/"THAWED") in the v1
// freezer hierarchy, where container runtimes create a container's cgroup at the same path as in
// every other v1 hierarchy. Both freeze the cgroup's descendants too. A frozen process keeps its
// memory and its GPU context; its threads stop, so it launches nothing until it is thawed.
type CgroupFreezer struct {
	// Dir returns the cgroup's directory in the freezer's hierarchy
	// (registry.CgroupHierarchy.Dir of the hierarchy registry.FreezerHierarchy finds).
	Dir func(cgroup string) (string, error)
	// V1 selects freezer.state; false selects cgroup.freeze.
	V1 bool
}

// Freeze freezes (frozen) or thaws the cgroup. The root cgroup is refused: the enforcer only
// ever freezes a container's.
func (f CgroupFreezer) Freeze(cgroup string, frozen bool) error {
	if cgroup == "" || filepath.Clean(cgroup) == "/" {
		return fmt.Errorf("refusing to freeze cgroup %q: not a container's", cgroup)
	}
	dir, err := f.Dir(cgroup)
	if err != nil {
		return err
	}
	file, value := "cgroup.freeze", "0"
	if f.V1 {
		file, value = "freezer.state", "THAWED"
		if frozen {
			value = "FROZEN"
		}
	} else if frozen {
		value = "1"
	}
	// The file exists in every cgroup of the hierarchy: never create one (a vanished cgroup
	// is an error, not a new file).
	fd, err := os.OpenFile(filepath.Join(dir, file), os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("freeze cgroup %s: %w", cgroup, err)
	}
	_, err = fd.WriteString(value)
	if cerr := fd.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s of cgroup %s: %w", file, cgroup, err)
	}
	return nil
}
