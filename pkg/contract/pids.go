package contract

import (
	"bytes"
	"fmt"
	"strconv"
)

// MaxPIDsConfigBytes bounds what a reader of pids.config reads: 64 KiB is over 8,000 PIDs, far
// more than one container runs.
const MaxPIDsConfigBytes = 64 << 10

// ParsePIDs parses pids.config's content (contract §6: one decimal host PID a line, each line
// ending in a newline). Anything else is an error: the file is the registry's, and one that is not
// what it writes lists nothing.
func ParsePIDs(data []byte) ([]int, error) {
	pids := make([]int, 0, bytes.Count(data, []byte{'\n'}))
	for line := range bytes.Lines(data) {
		pid, err := strconv.Atoi(string(bytes.TrimSuffix(line, []byte{'\n'})))
		if err != nil || pid <= 0 {
			return nil, fmt.Errorf("%q is not a PID", line)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}
