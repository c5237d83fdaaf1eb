package nri

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// readCgroup reads <procRoot>/<pid>/cgroup and returns the v1 "pids" line's path and the
// unified ("0::") line's path, as the registry's peer check compares them (contract §5).
func readCgroup(procRoot string, pid int) (Cgroup, error) {
	if pid <= 0 {
		return Cgroup{}, fmt.Errorf("no PID")
	}
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return Cgroup{}, fmt.Errorf("read cgroup of PID %d: %w", pid, err)
	}
	return parseCgroup(b), nil
}

// parseCgroup parses the "hierarchy-ID:controllers:path" lines of /proc/<pid>/cgroup.
func parseCgroup(b []byte) Cgroup {
	var cg Cgroup
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		id, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		controllers, path, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		switch {
		case id == "0" && controllers == "":
			cg.Unified = path
		case hasController(controllers, "pids"):
			cg.PIDsV1 = path
		}
	}
	return cg
}

func hasController(list, name string) bool {
	for c := range strings.SplitSeq(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}
