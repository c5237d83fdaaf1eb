package deviceplugin

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/vgpu-dra/vgpu-dra/pkg/cdi"
	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// Errors of an allocation that the kubelet asked for; Allocate answers them with a gRPC status
// that names the device ID.
var (
	ErrNoShares        = errors.New("no device IDs")
	ErrDuplicateShare  = errors.New("device ID given twice")
	ErrUnhealthyShare  = errors.New("the share's GPU is unhealthy")
	errTooManyGPUsLine = errors.New("more GPUs than vgpu.config holds")
)

// allocation is what one container holding a set of shares gets (contract §13): the shares in
// GPU order, its lead (the first: it names the container's directory set and its register
// UUID) and one vgpu.config line per GPU, whose limits are the sum of the container's shares
// on it — two shares of one GPU in one container are merged, not refused.
type allocation struct {
	lead   *Share
	shares []*Share
	gpus   []contract.ContainerGPU
}

// gpuHealth reports whether a GPU (by UUID) is healthy, and why not.
type gpuHealth func(uuid string) (healthy bool, reason string)

// allocation validates ids (known, distinct, on healthy GPUs; health nil skips that check) and
// merges them. Errors wrap ErrNoShares, ErrUnknownShare, ErrDuplicateShare or
// ErrUnhealthyShare and name the device ID.
func (inv *Inventory) allocation(ids []string, health gpuHealth) (allocation, error) {
	if len(ids) == 0 {
		return allocation{}, ErrNoShares
	}
	shares := make([]*Share, 0, len(ids))
	for _, id := range ids {
		sh, err := inv.Lookup(id)
		if err != nil {
			return allocation{}, err
		}
		if slices.Contains(shares, sh) {
			return allocation{}, fmt.Errorf("device ID %q: %w", id, ErrDuplicateShare)
		}
		if health != nil {
			if ok, reason := health(inv.GPUOf(sh).Device.UUID); !ok {
				return allocation{}, fmt.Errorf("device ID %q: %w (%s)", id, ErrUnhealthyShare, reason)
			}
		}
		shares = append(shares, sh)
	}
	slices.SortFunc(shares, less)
	al := allocation{lead: shares[0], shares: shares}
	for i := 0; i < len(shares); {
		g := inv.GPUOf(shares[i])
		k := 1
		for i+k < len(shares) && shares[i+k].GPU == shares[i].GPU {
			k++
		}
		mem, cores := merged(g, k)
		al.gpus = append(al.gpus, contract.ContainerGPU{Index: g.Device.Index, UUID: g.Device.UUID, MemoryBytes: mem, Cores: cores})
		i += k
	}
	if len(al.gpus) > contract.ContainerConfigMaxGPUs {
		return allocation{}, fmt.Errorf("device IDs %v: %d GPUs: %w (%d)", ids, len(al.gpus), errTooManyGPUsLine, contract.ContainerConfigMaxGPUs)
	}
	return al, nil
}

// merged is the limits of k shares of one GPU in one container: k times a share's memory and
// cores, cores unlimited when a share's are or the sum reaches the whole GPU.
func merged(g *GPUShares, k int) (memory, cores int64) {
	memory = g.MemoryBytes * int64(k)
	if g.Cores != 0 {
		cores = g.Cores * int64(k)
		if cores >= unlimitedCores {
			cores = 0
		}
	}
	return memory, cores
}

// config is the container's vgpu.config (contract §4a): the lead's UID as claim and register
// UUID, one line per GPU.
func (al allocation) config() contract.ContainerConfig {
	return contract.ContainerConfig{ClaimUID: al.lead.UID, RegisterUUID: al.lead.UID, GPUs: al.gpus}
}

// cdiClaim is the allocation as the CDI package's per-claim claim, for its env.
func (al allocation) cdiClaim(dirs claimdir.Dirs) cdi.Claim {
	c := cdi.Claim{
		UID: al.lead.UID, Path: contract.PathPerClaim, RegisterUUID: al.lead.UID,
		PerClaimDirs: cdi.PerClaimDirs{Config: dirs.Config, VGPULock: dirs.VGPULock, VMemNode: dirs.VMemNode},
	}
	for _, g := range al.gpus {
		c.Results = append(c.Results, cdi.Result{Request: "vgpu", Device: "gpu-" + strconv.Itoa(g.Index),
			GPUIndex: g.Index, GPUUUID: g.UUID, MemoryBytes: g.MemoryBytes, Cores: g.Cores})
	}
	return c
}

// allocator answers Allocate and keeps the share directories: it is the only writer of them,
// so that a directory set is never reset by Allocate while the keeper rebuilds or removes it.
type allocator struct {
	inv    *Inventory
	layout claimdir.Layout
	cdi    *cdi.Writer
	health gpuHealth
	now    func() time.Time

	mu sync.Mutex
	// allocated is when each lead was last allocated: the keeper leaves a set alone for a
	// while after, until the kubelet has recorded the allocation (contract §13).
	allocated map[string]time.Time
	// onAllocate is told the device IDs of every Allocate that succeeds (holderAnswers.forget:
	// a share given to a container again has a new holder).
	onAllocate func(ids []string)
}

func newAllocator(inv *Inventory, layout claimdir.Layout, w *cdi.Writer, health gpuHealth, now func() time.Time) *allocator {
	return &allocator{inv: inv, layout: layout, cdi: w, health: health, now: now, allocated: map[string]time.Time{}}
}

// FilesystemError says that a share's directory set or vgpu.config could not be made.
type FilesystemError struct {
	ShareID string
	Err     error
}

func (e *FilesystemError) Error() string {
	return fmt.Sprintf("prepare the directories of share %s: %v", e.ShareID, e.Err)
}

func (e *FilesystemError) Unwrap() error { return e.Err }

// allocate answers one container's request: the kubelet has chosen the device IDs, so it only
// validates them (never re-picks), gives the container a fresh directory set with its
// vgpu.config (whatever an earlier holder of the lead left there is gone: a new tmpfs) and
// answers the lead's CDI device, the GPUs' own CDI devices and the env of contract §3.
func (a *allocator) allocate(ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	al, err := a.inv.allocation(ids, a.health)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	dirs, err := a.writeDirs(al, true)
	if err == nil {
		a.allocated[al.lead.UID] = a.now()
	}
	a.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if a.onAllocate != nil {
		a.onAllocate(ids)
	}
	env, err := a.cdi.Env(al.cdiClaim(dirs))
	if err != nil {
		return nil, fmt.Errorf("env of share %s: %w", al.lead.ID, err)
	}
	resp := &pluginapi.ContainerAllocateResponse{
		Envs:       env,
		CdiDevices: []*pluginapi.CDIDevice{{Name: a.cdi.ShareDeviceID(al.lead.ID)}},
	}
	uuids := make([]string, len(al.gpus))
	for i, g := range al.gpus {
		uuids[i] = g.UUID
	}
	for _, id := range a.cdi.GPUDeviceIDs(uuids) {
		resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: id})
	}
	return resp, nil
}

// writeDirs makes the lead's directory set on a tmpfs of its own and writes the allocation's
// vgpu.config into it; reset first removes what is there (a new holder must not inherit a
// full tmpfs or planted files from the last one). Call with a.mu held.
func (a *allocator) writeDirs(al allocation, reset bool) (claimdir.Dirs, error) {
	uid := al.lead.UID
	fail := func(err error) (claimdir.Dirs, error) {
		return claimdir.Dirs{}, &FilesystemError{ShareID: al.lead.ID, Err: err}
	}
	if reset {
		if err := a.layout.RemoveClaim(uid); err != nil {
			return fail(err)
		}
	}
	if err := a.layout.EnsureClaimDir(uid); err != nil {
		return fail(err)
	}
	dirs, err := a.layout.EnsurePerClaimDirs(uid)
	if err != nil {
		return fail(err)
	}
	if err := a.layout.WriteConfig(dirs, al.config().Encode()); err != nil {
		return fail(err)
	}
	return dirs, nil
}
