package cdi

import (
	"slices"
	"strconv"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// specVersion is the CDI spec version written. 0.5.0 is the lowest that allows what we use:
// device names that start with a digit (claim UIDs are hex) need 0.5.0, the mount "type" field
// 0.4.0. Fixed rather than computed per spec (a UID that starts with a letter would need only
// 0.4.0), so every claim's file reads the same way; the lowest version keeps runtimes with an
// older CDI library able to read it. The loader's version check (ValidateVersion) fails the
// write if a later change uses a feature that needs more.
const specVersion = "0.5.0"

var (
	// Mount options (contract §3). No noexec: libvgpu.so is mapped executable.
	roMountOptions = []string{"ro", "nosuid", "nodev", "bind"}
	rwMountOptions = []string{"rw", "nosuid", "nodev", "bind"}
)

// buildSpec turns a validated claim into its CDI spec. The output is a pure function of the
// claim and the options (env sorted, devices in result order, mounts in a fixed order), so a
// re-write of an unchanged claim produces identical bytes.
func (w *Writer) buildSpec(c *Claim) *cdispec.Spec {
	spec := &cdispec.Spec{
		Version: specVersion,
		Kind:    w.opts.DriverName + "/" + specClass,
		Devices: make([]cdispec.Device, 0, len(c.Results)+1),
	}
	for i := range c.Results {
		r := &c.Results[i]
		spec.Devices = append(spec.Devices, cdispec.Device{
			Name:           resultDeviceName(c.UID, r),
			ContainerEdits: cdispec.ContainerEdits{Env: w.resultEnv(r)},
		})
	}
	spec.Devices = append(spec.Devices, cdispec.Device{
		Name: commonDeviceName(c.UID),
		ContainerEdits: cdispec.ContainerEdits{
			Env:    w.commonEnv(c),
			Mounts: w.commonMounts(c),
		},
	})
	return spec
}

// resultEnv is the per-GPU env of one result (contract §3). VGPU off: whole GPU, so the limits
// are written empty, which also neutralises any value the image carries for this index.
func (w *Writer) resultEnv(r *Result) []string {
	idx := strconv.Itoa(r.GPUIndex)
	mem, cores := "", ""
	if w.opts.VGPU {
		mem, cores = memLimit(r.MemoryBytes), coreLimit(r.Cores)
	}
	// Sorted by name.
	env := []string{
		contract.EnvCoreLimitPfx + idx + "=" + cores,
		contract.EnvMemLimitPfx + idx + "=" + mem,
		contract.EnvVisibleDevicePfx + idx + "=" + r.GPUUUID,
	}
	// With env injection the result's own device names its GPU, so a container sees the GPUs of
	// the requests it references and no other (on the claim-common device every container of
	// the claim would see all of them). CDI keeps one value per variable: a container of
	// several results gets its exact list from the NRI plugin, and the per-claim path refuses
	// such claims (contract §3).
	if w.opts.GPUInjection == InjectionEnv {
		env = append(env, contract.EnvNvidiaVisible+"="+r.GPUUUID)
	}
	return env
}

// memLimit is "<MiB>m", or "" for unlimited (0).
func memLimit(bytes int64) string {
	if bytes == 0 {
		return ""
	}
	return strconv.FormatInt(bytes/mib, 10) + "m"
}

// coreLimit is "1".."99", or "" for unlimited (0 or 100).
func coreLimit(cores int64) string {
	if cores == 0 || cores == unlimitedCores {
		return ""
	}
	return strconv.FormatInt(cores, 10)
}

// commonEnv is the claim-common env (contract §3), sorted by name.
func (w *Writer) commonEnv(c *Claim) []string {
	claimUID, registerUUID := "", ""
	if w.opts.VGPU {
		// The per-claim path sets the claim UID empty, so that a value in the image cannot pass
		// for ours and make the NRI plugin adopt the container; the NRI path the other way round.
		if c.Path == contract.PathNRI {
			claimUID = c.UID
		} else {
			registerUUID = c.RegisterUUID
		}
	}
	env := make([]string, 0, 3*contract.MaxNeutralisedIndices+6)
	env = append(env,
		contract.EnvClaimUID+"="+claimUID,
		contract.EnvRegisterUUID+"="+registerUUID,
		contract.EnvVisibleDevices+"=",
		contract.EnvMemLimit+"=",
		contract.EnvCoreLimit+"=",
	)

	used := make(map[int]bool, len(c.Results))
	for i := range c.Results {
		used[c.Results[i].GPUIndex] = true
	}
	for j := range contract.MaxNeutralisedIndices {
		if used[j] {
			continue
		}
		idx := strconv.Itoa(j)
		env = append(env,
			contract.EnvVisibleDevicePfx+idx+"=",
			contract.EnvMemLimitPfx+idx+"=",
			contract.EnvCoreLimitPfx+idx+"=",
		)
	}
	slices.Sort(env)
	return env
}

// commonMounts are the claim-common bind mounts (contract §3), in a fixed order.
func (w *Writer) commonMounts(c *Claim) []*cdispec.Mount {
	if !w.opts.VGPU {
		return nil
	}
	var mounts []*cdispec.Mount
	if w.opts.LibraryInstalled {
		mounts = append(mounts,
			bindMount(w.opts.LibraryPath, contract.ContainerLibraryPath, roMountOptions),
			bindMount(w.opts.PreloadPath, contract.ContainerPreloadPath, roMountOptions),
		)
	}
	mounts = append(mounts, bindMount(w.opts.RegistryDir, contract.ContainerRegistryDir, roMountOptions))
	if c.Path == contract.PathPerClaim {
		mounts = append(mounts,
			bindMount(c.PerClaimDirs.Config, contract.ContainerConfigDir, roMountOptions),
			bindMount(c.PerClaimDirs.VGPULock, contract.ContainerVGPULockDir, rwMountOptions),
			bindMount(c.PerClaimDirs.VMemNode, contract.ContainerVMemNodeDir, rwMountOptions),
		)
	}
	return mounts
}

func bindMount(host, container string, options []string) *cdispec.Mount {
	return &cdispec.Mount{
		HostPath:      host,
		ContainerPath: container,
		Options:       slices.Clone(options),
		Type:          "bind",
	}
}
