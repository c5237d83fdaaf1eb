package nri

import (
	"context"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// Claims is what the plugin asks about prepared claims. pkg/plugin satisfies it from the
// checkpoint (loaded before NRI connects) and the API server.
type Claims interface {
	// Prepared returns the claim as this node prepared it, from memory (no I/O): it runs on
	// the CreateContainer fast path.
	Prepared(claimUID string) (Claim, bool)
	// List returns every claim this node has prepared (Synchronize, debug).
	List() []Claim
	// ReservedFor reads the claim once from the API server and returns the UIDs of the pods
	// it is reserved for. ctx carries the deadline. An implementation may record the list.
	ReservedFor(ctx context.Context, claimUID string) ([]string, error)
}

// Claim is a prepared claim as the NRI plugin needs it.
type Claim struct {
	UID       string             `json:"uid"`
	Namespace string             `json:"namespace"`
	Name      string             `json:"name"`
	Path      contract.ClaimPath `json:"path"`
	// Completed is true once Prepare finished; a claim still being prepared is not prepared.
	Completed bool `json:"completed"`
	// ReservedFor are the pod UIDs recorded at Prepare (or refreshed since).
	ReservedFor []string `json:"reservedFor"`
	// CommonCDIDevice is the qualified ID of the claim-common CDI device ("<claimUID>-common").
	CommonCDIDevice string `json:"commonCDIDevice"`
	// Quarantined says why start-up recovery could not restore the claim's files; its
	// containers fail with that reason until a Prepare restores them.
	Quarantined string   `json:"quarantined,omitempty"`
	Results     []Result `json:"results"`
}

// Result is one allocation result of a claim.
type Result struct {
	Request string `json:"request"`
	Device  string `json:"device"`
	ShareID string `json:"shareID,omitempty"`
	GPUUUID string `json:"gpuUUID"`
	// Index is the GPU's NVML index (the <i> of MANAGER_VISIBLE_DEVICE_<i>).
	Index int `json:"index"`
	// CDIDevice is the qualified ID of the result's own CDI device.
	CDIDevice string `json:"cdiDevice"`
	// MemoryBytes and Cores are the result's limits; 0 is unlimited (the whole GPU).
	MemoryBytes int64 `json:"memoryBytes"`
	Cores       int64 `json:"cores"`
	// AdminAccess marks a result of an adminAccess request: no limits, no ledger, and not
	// subject to the one-running-container rule of contract §3 (its users share nothing that
	// a ledger would have to divide).
	AdminAccess bool `json:"adminAccess,omitempty"`
}
