package gpu

import (
	"fmt"
	"strconv"
	"strings"
)

// newNVML is NewNVML; tests replace it to check ParseSource's dispatch on any machine.
var newNVML = NewNVML

// sourceSpecHelp is the syntax ParseSource accepts, for its error messages.
const sourceSpecHelp = `"nvml" or "simulated:<profile>[:<count>]"`

// ParseSource opens the source a flag value names: "nvml" for the real driver, or
// "simulated:<profile>[:<count>]" for go-nvml's mock of a DGX system (profiles: see
// SimulatedProfiles; count 1..8 keeps the first count GPUs, absent or 0 keeps all) on the node
// named node. The real driver ignores node: its UUIDs are the GPUs' own.
func ParseSource(spec, node string) (Source, error) {
	kind, args, hasArgs := strings.Cut(spec, ":")
	switch kind {
	case "nvml":
		if hasArgs {
			return nil, fmt.Errorf("GPU source %q: nvml takes no arguments", spec)
		}
		return newNVML()
	case "simulated":
		if args == "" {
			return nil, fmt.Errorf("GPU source %q: want simulated:<profile>[:<count>], profile one of %s",
				spec, strings.Join(SimulatedProfiles(), ", "))
		}
		profile, countArg, hasCount := strings.Cut(args, ":")
		count := 0
		if hasCount {
			n, err := strconv.Atoi(countArg)
			if err != nil {
				return nil, fmt.Errorf("GPU source %q: count %q is not a whole number", spec, countArg)
			}
			count = n
		}
		sim, err := NewSimulated(profile, count, node)
		if err != nil {
			return nil, fmt.Errorf("GPU source %q: %w", spec, err)
		}
		return sim, nil
	default:
		return nil, fmt.Errorf("unknown GPU source %q: want %s", spec, sourceSpecHelp)
	}
}
