package registry

import (
	"context"
	"errors"
)

// Container is the target of an NRI-path registration: the newest instance of one
// (pod UID, container name), as the NRI plugin's cache knows it.
type Container struct {
	// ID is the container ID (logs).
	ID string
	// ClaimUID is the vGPU claim the container uses (logs).
	ClaimUID string
	// ConfigDir is the host directory mounted at /etc/vgpu-dra/config in the container
	// (claimdir.Layout.ContainerDirs(...).Config); pids.config is written there.
	ConfigDir string
	// InitPID is the container's init PID as recorded at StartContainer; 0 while the
	// container is created but not started.
	InitPID int
	// Cgroup is the container's cgroup in the registry's hierarchy (CgroupHierarchy.OfPID of
	// the init PID, taken at StartContainer, when the PID is certainly the container's).
	// It is trusted as given: every caller at or below it passes the peer check. Empty:
	// the registry derives it from InitPID on each registration and refuses a result that
	// is the hierarchy's root (a reused PID).
	Cgroup string
}

// ContainerResolver answers "which container is this?" for the NRI path. The NRI plugin's
// cache satisfies it through a thin adapter.
type ContainerResolver interface {
	// Synced reports whether the cache has completed its first Synchronize with the runtime:
	// before that, a miss may only mean "not rebuilt yet" and is answered RETRY.
	Synced() bool
	// Container returns the newest instance of (podUID, containerName).
	Container(podUID, containerName string) (Container, bool)
}

// Claim is the target of a per-claim registration.
type Claim struct {
	// UID is the claim's UID.
	UID string
	// ReservedFor are the UIDs of the pods the claim is reserved for.
	ReservedFor []string
	// ConfigDir is the claim's one config directory (claimdir.Layout.PerClaimDirs(...).Config).
	ConfigDir string
	// VerifyHolder, when set, decides in place of ReservedFor whether the caller's pod holds
	// the claim. The device plugin sets it: a share's holder is known only to the kubelet, at
	// the moment of the registration (contract §13).
	VerifyHolder HolderCheck
}

// HolderCheck reports nil when the pod with the given UID holds the claim now. An error that
// wraps ErrNotHolder is a definite "no" (DENIED); any other error means it could not tell
// (the kubelet or the API server did not answer), which is answered RETRY.
type HolderCheck func(ctx context.Context, podUID string) error

// ErrNotHolder is wrapped by a HolderCheck's definite "this pod does not hold the claim".
var ErrNotHolder = errors.New("the pod does not hold this claim")

// ClaimResolver answers "which claim is this?" for the per-claim path. The kubelet plugin
// adapts its checkpoint to it (pkg/plugin).
type ClaimResolver interface {
	// ClaimByRegisterUUID returns the claim prepared on the per-claim path whose register
	// UUID is uuid.
	ClaimByRegisterUUID(uuid string) (Claim, bool)
}

// ReservationReader re-reads the pods a claim is reserved for from the API server and records
// the answer where ClaimResolver reads it (the plugin's adapter is the one the NRI hook uses:
// contract §4, §5). A second pod may share a claim the kubelet prepared for the first and does
// not prepare again: only the API server knows it.
type ReservationReader interface {
	ReservedFor(ctx context.Context, claimUID string) ([]string, error)
}
