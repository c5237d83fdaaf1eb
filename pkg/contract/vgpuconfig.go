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

// ContainerConfigName is the configuration file's name in a container's config directory
// (contract §4a): /etc/vgpu-dra/config/vgpu.config inside the container, read-only there.
// libvgpu.so takes limits, GPU map and registration identity from it alone, never from env.
const ContainerConfigName = "vgpu.config"

// ContainerConfigMode is the file's mode, owned by root: readable by any container user.
const ContainerConfigMode = 0o644

// Limits of the configuration file (contract §4a); library/src holds the same values.
const (
	// ContainerConfigVersion is the only format version.
	ContainerConfigVersion = 1
	// ContainerConfigMaxBytes bounds the whole file.
	ContainerConfigMaxBytes = 64 << 10
	// ContainerConfigMaxGPUs bounds the gpu lines: the library's per-container arrays are
	// indexed by a GPU's position in the file, not by its NVML index, which has no bound.
	ContainerConfigMaxGPUs = 16
	// ContainerConfigMaxLine bounds one line, its newline excluded.
	ContainerConfigMaxLine = 1023
)

// ContainerConfig is what one container (NRI path) or every container of a claim (per-claim
// path) may use: written by the plugin, read by libvgpu.so (contract §4a).
type ContainerConfig struct {
	// ClaimUID is informational.
	ClaimUID string
	// PodUID and ContainerName are the NRI path's registration identity.
	PodUID        string
	ContainerName string
	// RegisterUUID is the per-claim path's registration identity; when set, the library
	// registers with it alone.
	RegisterUUID string
	// GPUs are the GPUs the container may use, in the order the library indexes them.
	GPUs []ContainerGPU
}

// ContainerGPU is one GPU a container may use, with its limits.
type ContainerGPU struct {
	// Index is the GPU's NVML index (any non-negative number).
	Index int
	// UUID is the GPU's UUID; the library matches CUDA devices by it.
	UUID string
	// MemoryBytes is the memory limit; 0 is unlimited.
	MemoryBytes int64
	// Cores is the percentage of SMs, 1–99; 0 (or 100) is unlimited.
	Cores int64
}

// Encode writes the file's content:
//
//	version 1
//	claim <claimUID>
//	pod <podUID>                 (NRI path)
//	container <containerName>    (NRI path)
//	register <registerUUID>      (per-claim path)
//	gpu <index> <uuid> <memoryBytes> <cores>
func (c ContainerConfig) Encode() []byte {
	var b bytes.Buffer
	b.WriteString("# vgpu-dra container configuration (contract §4a); written by the node's plugin\n")
	fmt.Fprintf(&b, "version %d\n", ContainerConfigVersion)
	line := func(key, value string) {
		if value != "" {
			fmt.Fprintf(&b, "%s %s\n", key, value)
		}
	}
	line("claim", c.ClaimUID)
	line("pod", c.PodUID)
	line("container", c.ContainerName)
	line("register", c.RegisterUUID)
	for _, g := range c.GPUs {
		fmt.Fprintf(&b, "gpu %d %s %d %d\n", g.Index, g.UUID, g.MemoryBytes, g.Cores)
	}
	return b.Bytes()
}

// Validate checks what Encode would write against the rules the library enforces.
func (c ContainerConfig) Validate() error {
	_, err := ParseContainerConfig(c.Encode())
	return err
}

// ParseContainerConfig reads a configuration file as libvgpu.so does (library/src holds the C
// twin of these rules): comments and blank lines are skipped, the first line is the version,
// unknown keys are skipped, and everything else that is wrong is an error naming the line.
func ParseContainerConfig(data []byte) (ContainerConfig, error) {
	var c ContainerConfig
	if len(data) > ContainerConfigMaxBytes {
		return c, fmt.Errorf("%s is %d bytes, more than %d", ContainerConfigName, len(data), ContainerConfigMaxBytes)
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		return c, fmt.Errorf("%s: the last line does not end with a newline", ContainerConfigName)
	}
	seen := map[string]bool{}
	uuids := map[string]bool{}
	indices := map[int]bool{}
	versioned := false
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), ContainerConfigMaxBytes)
	for n := 1; sc.Scan(); n++ {
		text := sc.Text()
		bad := func(format string, args ...any) error {
			return fmt.Errorf("%s line %d: %s", ContainerConfigName, n, fmt.Sprintf(format, args...))
		}
		if len(text) > ContainerConfigMaxLine {
			return c, bad("longer than %d bytes", ContainerConfigMaxLine)
		}
		if text == "" || text[0] == '#' {
			continue
		}
		if strings.IndexFunc(text, func(r rune) bool { return r < ' ' || r > '~' }) >= 0 {
			return c, bad("holds a control or non-ASCII character")
		}
		fields := strings.Split(text, " ")
		if slices.Contains(fields, "") {
			return c, bad("fields must be separated by exactly one space")
		}
		key := fields[0]
		if !versioned {
			if key != "version" || len(fields) != 2 {
				return c, bad("the first line must be \"version %d\"", ContainerConfigVersion)
			}
			if fields[1] != strconv.Itoa(ContainerConfigVersion) {
				return c, bad("version %q, this reader knows only %d", fields[1], ContainerConfigVersion)
			}
			versioned = true
			continue
		}
		switch key {
		case "version":
			return c, bad("a second version line")
		case "claim", "pod", "container", "register":
			if len(fields) != 2 || fields[1] == "" {
				return c, bad("%s takes one value", key)
			}
			if seen[key] {
				return c, bad("%s appears twice", key)
			}
			seen[key] = true
			v := fields[1]
			var err error
			switch key {
			case "claim":
				c.ClaimUID, err = v, ValidateClaimUID(v)
			case "pod":
				c.PodUID, err = v, ValidatePodUID(v)
			case "container":
				c.ContainerName, err = v, ValidateContainerName(v)
			case "register":
				c.RegisterUUID, err = v, ValidateUID(v)
			}
			if err != nil {
				return c, bad("%v", err)
			}
		case "gpu":
			g, err := parseGPU(fields)
			if err != nil {
				return c, bad("%v", err)
			}
			if len(c.GPUs) == ContainerConfigMaxGPUs {
				return c, bad("more than %d gpu lines", ContainerConfigMaxGPUs)
			}
			if uuids[strings.ToLower(g.UUID)] || indices[g.Index] {
				return c, bad("GPU %d (%s) appears twice", g.Index, g.UUID)
			}
			uuids[strings.ToLower(g.UUID)], indices[g.Index] = true, true
			c.GPUs = append(c.GPUs, g)
		}
	}
	if err := sc.Err(); err != nil {
		return c, fmt.Errorf("read %s: %w", ContainerConfigName, err)
	}
	if !versioned {
		return c, fmt.Errorf("%s has no version line", ContainerConfigName)
	}
	if (c.PodUID == "") != (c.ContainerName == "") {
		return c, fmt.Errorf("%s: pod and container go together", ContainerConfigName)
	}
	return c, nil
}

func parseGPU(f []string) (ContainerGPU, error) {
	if len(f) != 5 {
		return ContainerGPU{}, fmt.Errorf("gpu takes <index> <uuid> <memoryBytes> <cores>")
	}
	index, err := strconv.Atoi(f[1])
	if err != nil || index < 0 || index > math.MaxInt32 || f[1] != strconv.Itoa(index) {
		return ContainerGPU{}, fmt.Errorf("GPU index %q is not a non-negative number", f[1])
	}
	for _, r := range f[2] {
		if r <= ' ' || r > '~' {
			return ContainerGPU{}, fmt.Errorf("GPU UUID %q holds a character that is not printable ASCII", f[2])
		}
	}
	if f[2] == "" || len(f[2]) >= 80 {
		return ContainerGPU{}, fmt.Errorf("GPU UUID %q is empty or longer than 79 bytes", f[2])
	}
	mem, err := strconv.ParseInt(f[3], 10, 64)
	if err != nil || mem < 0 || f[3] != strconv.FormatInt(mem, 10) {
		return ContainerGPU{}, fmt.Errorf("memory limit %q is not a number of bytes", f[3])
	}
	cores, err := strconv.ParseInt(f[4], 10, 64)
	if err != nil || cores < 0 || cores > 100 || f[4] != strconv.FormatInt(cores, 10) {
		return ContainerGPU{}, fmt.Errorf("core limit %q is not a percentage 0–100", f[4])
	}
	return ContainerGPU{Index: index, UUID: f[2], MemoryBytes: mem, Cores: cores}, nil
}
