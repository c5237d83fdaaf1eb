package enforce

import (
	"github.com/go-logr/logr"

	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
)

// NodeHooks are the parts of Deps both plugins decide alike from the node (contract §15): the
// throttle's freezer, beside the registry's cgroup hierarchy, with --core-enforcement=throttle
// only (without a freezer the enforcer reports and says so); and the registration rule, off
// (AllRegistered) on a node without libvgpu.so, where no process can register.
func NodeHooks(logger logr.Logger, s Settings, cgroups registry.CgroupHierarchy, libraryInstalled bool,
	registered func(pid int, configDir string) bool) (freeze func(string, bool) error, reg func(int, string) bool) {
	if s.Cores == CoreThrottle {
		if fh, v1, err := registry.FreezerHierarchy(cgroups.Proc, cgroups); err != nil {
			logger.Error(err, "The enforcer cannot throttle containers over their core limit: it only reports them")
		} else {
			freeze = CgroupFreezer{Dir: fh.Dir, V1: v1}.Freeze
		}
	}
	reg = registered
	if !libraryInstalled {
		reg = AllRegistered
		logger.Info("libvgpu.so is not installed: no process can register, so the enforcer holds containers to their memory limits only, not to registration")
	}
	return freeze, reg
}
