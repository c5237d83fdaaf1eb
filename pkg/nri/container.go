package nri

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/vgpu-dra/vgpu-dra/pkg/cdi"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// vgpuEnv is what a container's env says about vGPUs.
type vgpuEnv struct {
	claimUID string
	// conflicting is set when the claim variable appears with two different values.
	conflicting bool
	// visible maps an NVML index to the GPU UUID of MANAGER_VISIBLE_DEVICE_<index>.
	visible               map[int]string
	podUID, containerName string // VGPU_POD_UID, VGPU_CONTAINER_NAME (replayed containers)
}

// parseEnv reads every variable the plugin cares about in one pass. It runs for every
// container on the node (most carry no claim UID): it allocates nothing unless the container
// names visible devices.
func parseEnv(env []string) vgpuEnv {
	var e vgpuEnv
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		switch {
		case k == contract.EnvClaimUID:
			if v != "" {
				if e.claimUID != "" && e.claimUID != v {
					e.conflicting = true
				}
				e.claimUID = v
			}
		case k == contract.EnvPodUID:
			e.podUID = v
		case k == contract.EnvContainerName:
			e.containerName = v
		case strings.HasPrefix(k, contract.EnvVisibleDevicePfx) && v != "":
			i, err := strconv.Atoi(k[len(contract.EnvVisibleDevicePfx):])
			if err != nil || i < 0 {
				continue
			}
			if e.visible == nil {
				e.visible = map[int]string{}
			}
			e.visible[i] = v
		}
	}
	return e
}

// cdiDevices returns the container's CDI device IDs; empty when the runtime does not report
// them (containerd fills Container.CDIDevices from 2.3 on).
func cdiDevices(ctr *api.Container) []string {
	out := make([]string, 0, len(ctr.GetCDIDevices()))
	for _, d := range ctr.GetCDIDevices() {
		if d.GetName() != "" {
			out = append(out, d.GetName())
		}
	}
	return out
}

// CollisionError says that one container holds what CDI cannot give it without one device
// silently replacing another (contract §3): two vGPU claims, or two results on one GPU.
type CollisionError struct{ Message string }

func (e *CollisionError) Error() string { return e.Message }

// checkCollisions looks at the container's CDI devices for two of our claim-common devices
// or two of our result devices on one GPU. Our devices are recognised by pkg/cdi's parser of
// its own names and looked up in the prepared claims; nothing else is parsed out of a name.
func checkCollisions(driverName string, claims Claims, devices []string) error {
	var commons []string
	type use struct{ claim, request string }
	byGPU := map[string]use{}
	seen := map[string]Claim{}
	for _, id := range devices {
		uid, ok := cdi.ClaimUIDOf(driverName, id)
		if !ok {
			continue
		}
		c, ok := seen[uid]
		if !ok {
			if c, ok = claims.Prepared(uid); !ok {
				continue
			}
			seen[uid] = c
		}
		if id == c.CommonCDIDevice {
			// Every result lists the common device: count claims, not mentions.
			if !slices.Contains(commons, claimRef(c)) {
				commons = append(commons, claimRef(c))
			}
			continue
		}
		for _, r := range c.Results {
			if r.CDIDevice != id {
				continue
			}
			if prev, ok := byGPU[r.GPUUUID]; ok {
				return &CollisionError{Message: fmt.Sprintf("requests %q (claim %s) and %q (claim %s) are both on GPU %s in one container; CDI would let one replace the other: constrain the requests with distinctAttribute on uuid",
					prev.request, prev.claim, r.Request, claimRef(c), r.GPUUUID)}
			}
			byGPU[r.GPUUUID] = use{claimRef(c), r.Request}
		}
	}
	if len(commons) > 1 {
		return &CollisionError{Message: fmt.Sprintf("one container uses vGPU claims %s; a container may use at most one vGPU claim (CDI would let one replace the other)", strings.Join(commons, " and "))}
	}
	return nil
}

func claimRef(c Claim) string { return c.Namespace + "/" + c.Name }

// splitResults separates the result indices the container uses (resultsOf) into those with
// limits, which the one-running-container rule of contract §3 covers, and admin-access ones.
func splitResults(c Claim, used []int) (limited, admin []int) {
	for _, i := range used {
		if c.Results[i].AdminAccess {
			admin = append(admin, i)
		} else {
			limited = append(limited, i)
		}
	}
	return limited, admin
}

// resultsOf returns the indices of the claim's results that the container uses: from its
// CDI devices where the runtime reports them, else from MANAGER_VISIBLE_DEVICE_<i> (every
// result of the claim on a GPU the container sees — all of them when the env names none).
func resultsOf(c Claim, devices []string, env vgpuEnv) []int {
	var out []int
	if len(devices) > 0 {
		for i, r := range c.Results {
			if slices.Contains(devices, r.CDIDevice) {
				out = append(out, i)
			}
		}
		return out
	}
	for i, r := range c.Results {
		if env.visible[r.Index] == r.GPUUUID {
			out = append(out, i)
		}
	}
	if len(out) == 0 {
		for i := range c.Results {
			out = append(out, i)
		}
	}
	return out
}
