package contract

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// The allowance file (contract §16): the node's compute arbiter publishes, in a container's
// config directory (read-only in the container, beside vgpu.config), the share of each GPU's
// SMs the container may keep busy now; libvgpu.so's core limiter follows it, and falls back to
// vgpu.config's cores when the file is absent or unreadable. library/src/core_allowance.h holds the C twins.
const (
	// CoreAllowanceName is the file's name in the config directory.
	CoreAllowanceName = "cores.allowance"
	// CoreAllowanceMode: written by root, readable by any container user.
	CoreAllowanceMode = 0o644
	// CoreAllowanceVersion is the only format version.
	CoreAllowanceVersion = 1
	// CoreAllowanceMaxBytes bounds the file (the library reads at most this much).
	CoreAllowanceMaxBytes = 4 << 10
)

// EncodeCoreAllowances writes the file:
//
//	version 1
//	gpu <uuid> <percent>
//
// one line per GPU in UUID order (an unchanged division writes the same bytes), each percent
// rounded and bounded to 1–100.
func EncodeCoreAllowances(gpus map[string]float64) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "version %d\n", CoreAllowanceVersion)
	uuids := make([]string, 0, len(gpus))
	for u := range gpus {
		uuids = append(uuids, u)
	}
	slices.Sort(uuids)
	for _, u := range uuids {
		fmt.Fprintf(&b, "gpu %s %d\n", u, int(math.Round(min(max(gpus[u], 1), 100))))
	}
	return b.Bytes()
}

// ParseCoreAllowances reads the file as libvgpu.so does: the first line is the version; unknown
// keys are skipped; a gpu line is a UUID and a percent of 1–100; anything else is an error.
func ParseCoreAllowances(data []byte) (map[string]int, error) {
	if len(data) > CoreAllowanceMaxBytes {
		return nil, fmt.Errorf("%s is %d bytes, more than %d", CoreAllowanceName, len(data), CoreAllowanceMaxBytes)
	}
	out := map[string]int{}
	versioned := false
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		bad := func(format string, args ...any) error {
			return fmt.Errorf("%s line %d: %s", CoreAllowanceName, n, fmt.Sprintf(format, args...))
		}
		if !versioned {
			if len(f) != 2 || f[0] != "version" || f[1] != strconv.Itoa(CoreAllowanceVersion) {
				return nil, bad("want %q first", fmt.Sprintf("version %d", CoreAllowanceVersion))
			}
			versioned = true
			continue
		}
		if f[0] != "gpu" {
			continue
		}
		if len(f) != 3 || f[1] == "" {
			return nil, bad("want gpu <uuid> <percent>")
		}
		pct, err := strconv.Atoi(f[2])
		if err != nil || pct < 1 || pct > 100 {
			return nil, bad("percent %q is not 1-100", f[2])
		}
		if _, dup := out[f[1]]; dup {
			return nil, bad("GPU %s twice", f[1])
		}
		out[f[1]] = pct
	}
	if !versioned {
		return nil, fmt.Errorf("%s: no version line", CoreAllowanceName)
	}
	return out, nil
}

// CoreWakeName is the file in the container's core-limit directory that its library writes when
// it launches work after an idle spell (contract §16, "Waking"); the node watches it and reads
// nothing of it.
const CoreWakeName = "core.wake"
