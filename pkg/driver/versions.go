package driver

import (
	"fmt"
	"strconv"
	"strings"
)

// semverFromDotted turns a dotted numeric version into strict semver MAJOR.MINOR.PATCH.
// The API server rejects a whole ResourceSlice when one version attribute is not strict semver,
// and real NVIDIA strings are not: driver "535.104.05" has a leading zero, compute capability
// "9.0" has two parts. Leading zeros are dropped, missing parts become 0; more than three parts,
// empty parts or non-digits are an error (the attribute is then left out, not guessed).
func semverFromDotted(raw string) (string, error) {
	parts := strings.Split(strings.TrimSpace(raw), ".")
	if len(parts) == 0 || len(parts) > 3 {
		return "", fmt.Errorf("version %q: want 1 to 3 dot-separated numbers", raw)
	}
	nums := [3]uint64{}
	for i, p := range parts {
		if p == "" || strings.TrimLeft(p, "0123456789") != "" {
			return "", fmt.Errorf("version %q: part %q is not a number", raw, p)
		}
		n, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return "", fmt.Errorf("version %q: %w", raw, err)
		}
		nums[i] = n
	}
	return fmt.Sprintf("%d.%d.%d", nums[0], nums[1], nums[2]), nil
}

// semverFromCUDA turns NVML's integer CUDA driver version (1000*major + 10*minor, e.g. 12040)
// into semver ("12.4.0").
func semverFromCUDA(v int) (string, error) {
	if v <= 0 {
		return "", fmt.Errorf("CUDA driver version %d is not positive", v)
	}
	return fmt.Sprintf("%d.%d.0", v/1000, (v%1000)/10), nil
}
