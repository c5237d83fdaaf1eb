package registry_test

import (
	"testing"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
)

type snapshot checkpoint.Data

func (s snapshot) Snapshot() checkpoint.Data { return checkpoint.Data(s).DeepCopy() }

// TestCheckpointClaims: only a completed per-claim preparation resolves, to its per-claim
// config directory and its reservedFor pods.
func TestCheckpointClaims(t *testing.T) {
	const nriClaim = "6b1a7c8d-9e0f-4a1b-8c2d-3e4f5a6b7c8d"
	const started = "7c2b8d9e-0f1a-4b2c-9d3e-4f5a6b7c8d9e"
	const uuidN = "8d3c9e0f-1a2b-4c3d-ae4f-5a6b7c8d9e0f"
	const uuidS = "9e4d0f1a-2b3c-4d4e-bf5a-6b7c8d9e0f1a"
	layout := claimdir.Layout{StateDir: "/var/lib/vgpu-dra"}
	cc := registry.CheckpointClaims{Layout: layout, Store: snapshot{Claims: map[string]checkpoint.Claim{
		claim:    {State: checkpoint.PrepareCompleted, Path: contract.PathPerClaim, RegisterUUID: uuidR, ReservedFor: []string{podA, podB}},
		nriClaim: {State: checkpoint.PrepareCompleted, Path: contract.PathNRI, RegisterUUID: uuidN},
		started:  {State: checkpoint.PrepareStarted, Path: contract.PathPerClaim, RegisterUUID: uuidS},
	}}}
	got, ok := cc.ClaimByRegisterUUID(uuidR)
	dirs, _ := layout.PerClaimDirs(claim)
	if !ok || got.UID != claim || got.ConfigDir != dirs.Config || len(got.ReservedFor) != 2 {
		t.Fatalf("per-claim claim: %+v, %v", got, ok)
	}
	for _, u := range []string{uuidN, uuidS, "", podA} {
		if c, ok := cc.ClaimByRegisterUUID(u); ok {
			t.Errorf("UUID %q resolved to %+v", u, c)
		}
	}
}
