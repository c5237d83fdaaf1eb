package cdi

import (
	"errors"
	"fmt"

	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// ErrInvalidClaim marks a Claim that cannot be turned into a CDI spec. Nothing is written.
var ErrInvalidClaim = errors.New("invalid claim for CDI spec")

const (
	mib = 1 << 20
	// unlimitedCores is the whole GPU; written as an empty CUDA_CORE_LIMIT_<i>.
	unlimitedCores = 100
)

// Result is one allocation result of a claim: one CDI device.
type Result struct {
	// Request is the request name; a sub-request "req/sub" becomes "req_sub" in device names.
	Request string
	// Device is the allocated device's name, e.g. "gpu-0".
	Device string
	// ShareID is the allocation's share ID; empty when none. Its first 8 characters
	// disambiguate several results on one device.
	ShareID string
	// GPUIndex is the GPU's NVML index, the <i> of the per-GPU env names.
	GPUIndex int
	// GPUUUID is the GPU's UUID, e.g. "GPU-…".
	GPUUUID string
	// MemoryBytes is the consumed memory; 0 is unlimited (whole GPU). A multiple of 1 MiB.
	MemoryBytes int64
	// Cores is the consumed share of compute, 1–99; 0 or 100 is unlimited.
	Cores int64
}

// PerClaimDirs are the host directories that the per-claim path mounts into every container of
// the claim (contract §3–§4). Absolute paths.
type PerClaimDirs struct {
	Config, VGPULock, VMemNode string
}

// Claim is what the spec is built from: one prepared claim and its allocation results.
type Claim struct {
	// UID is the claim's UID, a canonical lower-case UUID.
	UID string
	// Path is how the claim's containers get their directories; not used when VGPU is off.
	Path contract.ClaimPath
	// RegisterUUID is minted at Prepare on the per-claim path; empty on the NRI path.
	RegisterUUID string
	// PerClaimDirs are set on the per-claim path only.
	PerClaimDirs PerClaimDirs
	// Results are the claim's allocation results, in allocation order.
	Results []Result
}

// validate checks c against what this writer needs before any name or path is built.
func (w *Writer) validate(c *Claim) error {
	if err := contract.ValidateUID(c.UID); err != nil {
		return fmt.Errorf("%w: claim UID: %v", ErrInvalidClaim, err)
	}
	if len(c.Results) == 0 {
		return fmt.Errorf("%w: claim %s has no allocation results", ErrInvalidClaim, c.UID)
	}
	if w.opts.VGPU {
		if err := validatePath(c); err != nil {
			return err
		}
	}
	names := make(map[string]bool, len(c.Results))
	byIndex := make(map[int]string, len(c.Results))
	byUUID := make(map[string]int, len(c.Results))
	for i := range c.Results {
		r := &c.Results[i]
		if err := w.validateResult(c.UID, r); err != nil {
			return err
		}
		name := resultDeviceName(c.UID, r)
		if names[name] {
			return fmt.Errorf("%w: claim %s: two results named %q", ErrInvalidClaim, c.UID, name)
		}
		names[name] = true
		if uuid, ok := byIndex[r.GPUIndex]; ok {
			if uuid != r.GPUUUID {
				return fmt.Errorf("%w: claim %s: GPU index %d has UUIDs %s and %s",
					ErrInvalidClaim, c.UID, r.GPUIndex, uuid, r.GPUUUID)
			}
			// Contract §3: one directory set serves the whole claim on the per-claim path,
			// so two results on one GPU would share one ledger.
			if w.opts.VGPU && c.Path == contract.PathPerClaim {
				return fmt.Errorf("%w: claim %s has two results on GPU %s: that needs the NRI path",
					ErrInvalidClaim, c.UID, r.GPUUUID)
			}
		}
		if idx, ok := byUUID[r.GPUUUID]; ok && idx != r.GPUIndex {
			return fmt.Errorf("%w: claim %s: GPU %s has indices %d and %d",
				ErrInvalidClaim, c.UID, r.GPUUUID, idx, r.GPUIndex)
		}
		byIndex[r.GPUIndex] = r.GPUUUID
		byUUID[r.GPUUUID] = r.GPUIndex
	}
	return nil
}

func validatePath(c *Claim) error {
	switch c.Path {
	case contract.PathNRI:
		if c.RegisterUUID != "" || c.PerClaimDirs != (PerClaimDirs{}) {
			return fmt.Errorf("%w: claim %s on the NRI path carries per-claim register UUID or directories",
				ErrInvalidClaim, c.UID)
		}
	case contract.PathPerClaim:
		if err := contract.ValidateUID(c.RegisterUUID); err != nil {
			return fmt.Errorf("%w: claim %s: register UUID: %v", ErrInvalidClaim, c.UID, err)
		}
		for _, d := range []struct{ what, path string }{
			{"config", c.PerClaimDirs.Config},
			{"vgpu_lock", c.PerClaimDirs.VGPULock},
			{"vmem_node", c.PerClaimDirs.VMemNode},
		} {
			if err := requireAbs(d.what+" dir", d.path); err != nil {
				return fmt.Errorf("%w: claim %s: %v", ErrInvalidClaim, c.UID, err)
			}
		}
	default:
		return fmt.Errorf("%w: claim %s: unknown path %q", ErrInvalidClaim, c.UID, c.Path)
	}
	return nil
}

func (w *Writer) validateResult(claimUID string, r *Result) error {
	if r.Request == "" || r.Device == "" {
		return fmt.Errorf("%w: claim %s: result %q/%q lacks a request or device name",
			ErrInvalidClaim, claimUID, r.Request, r.Device)
	}
	if err := parser.ValidateDeviceName(resultDeviceName(claimUID, r)); err != nil {
		return fmt.Errorf("%w: claim %s: request %q device %q: %v", ErrInvalidClaim, claimUID, r.Request, r.Device, err)
	}
	if r.GPUIndex < 0 {
		return fmt.Errorf("%w: claim %s: negative GPU index %d", ErrInvalidClaim, claimUID, r.GPUIndex)
	}
	// The UUID is an env value, an entry of a comma-separated list and a CDI device name.
	if err := parser.ValidateDeviceName(r.GPUUUID); err != nil {
		return fmt.Errorf("%w: claim %s: GPU UUID %q: %v", ErrInvalidClaim, claimUID, r.GPUUUID, err)
	}
	if !w.opts.VGPU {
		return nil // whole GPUs: limits are not written, so not checked
	}
	if r.MemoryBytes < 0 || r.MemoryBytes%mib != 0 {
		return fmt.Errorf("%w: claim %s: memory %d bytes is not a non-negative multiple of 1 MiB",
			ErrInvalidClaim, claimUID, r.MemoryBytes)
	}
	if r.Cores < 0 || r.Cores > unlimitedCores {
		return fmt.Errorf("%w: claim %s: cores %d outside 0–100", ErrInvalidClaim, claimUID, r.Cores)
	}
	return nil
}
