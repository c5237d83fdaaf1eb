package registry

import (
	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// CheckpointSnapshotter is the part of *checkpoint.Store that CheckpointClaims reads.
type CheckpointSnapshotter interface {
	Snapshot() checkpoint.Data
}

// CheckpointClaims is the ClaimResolver of the kubelet plugin: the checkpoint is the record
// of which claims took the per-claim path, their register UUIDs and their reservedFor pods.
// Only completed per-claim preparations resolve: a container cannot run before Prepare has
// answered the kubelet.
type CheckpointClaims struct {
	Store  CheckpointSnapshotter
	Layout claimdir.Layout
}

// ClaimByRegisterUUID scans the prepared claims; the checkpoint keeps no index by UUID and
// a node holds few claims, and registrations are rare (one per process start).
func (c CheckpointClaims) ClaimByRegisterUUID(uuid string) (Claim, bool) {
	if uuid == "" {
		return Claim{}, false
	}
	for uid, cl := range c.Store.Snapshot().Claims {
		if cl.RegisterUUID != uuid || cl.Path != contract.PathPerClaim || cl.State != checkpoint.PrepareCompleted {
			continue
		}
		dirs, err := c.Layout.PerClaimDirs(uid)
		if err != nil {
			return Claim{}, false
		}
		return Claim{UID: uid, ReservedFor: cl.ReservedFor, ConfigDir: dirs.Config}, true
	}
	return Claim{}, false
}
