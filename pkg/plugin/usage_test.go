package plugin

import (
	"path/filepath"
	"reflect"
	"testing"

	"github.com/vgpu-dra/vgpu-dra/pkg/arbiter"
	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/usage"
)

// TestUsageTargetsCarryTheArbitersTerms: a per-claim claim's usage target goes by the key the
// enforcer gives the arbiter, so its allowance series finds the arbiter's figure, and carries the
// class and ceiling the enforcer divides by on each GPU with a core limit; a whole GPU has none.
func TestUsageTargetsCarryTheArbitersTerms(t *testing.T) {
	store, err := checkpoint.Open(filepath.Join(t.TempDir(), "checkpoint.json"))
	if err != nil {
		t.Fatal(err)
	}
	devs := []checkpoint.Device{
		{GPUUUID: "GPU-a", Cores: 20, Class: "BestEffort"},
		{GPUUUID: "GPU-b", Cores: 30, Class: "Guaranteed", CoresCeiling: 70},
		{GPUUUID: "GPU-c", MemoryBytes: 1 << 30}, // all the SMs: nothing to divide
	}
	if err := store.Update(func(d *checkpoint.Data) error {
		d.Claims[testClaim] = checkpoint.Claim{Namespace: "batch", Name: "c", State: checkpoint.PrepareCompleted, Path: contract.PathPerClaim, Devices: devs}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	layout := claimdir.Layout{StateDir: t.TempDir()}
	targets := usageTargets(nil, store, layout)()
	enforced := enforceTargets(nil, store, layout, false)
	if len(targets) != 1 || len(enforced) != 1 {
		t.Fatalf("usage targets %+v, enforcer targets %+v; want the claim in both", targets, enforced)
	}
	if targets[0].Key != enforced[0].Key || targets[0].Key != "claim/"+testClaim {
		t.Errorf("usage key %q, enforcer key %q; want both claim/%s", targets[0].Key, enforced[0].Key, testClaim)
	}
	want := map[string]usage.ComputeTerms{"GPU-a": {Class: "BestEffort", Ceiling: 100}, "GPU-b": {Class: "Guaranteed", Ceiling: 70}}
	if !reflect.DeepEqual(targets[0].Compute, want) {
		t.Errorf("compute terms %v, want %v", targets[0].Compute, want)
	}
}

// TestOwnerAllowance: the usage metrics read the owner's arbiter after its pass; an instance that
// does not own the node, or whose enforcer does not run, has no allowance to show.
func TestOwnerAllowance(t *testing.T) {
	p := &Plugin{}
	if _, ok := p.ownerAllowance("ctr", "GPU-a"); ok {
		t.Error("an observer has an allowance")
	}
	term := &ownerTerm{}
	p.term.Store(term)
	if _, ok := p.ownerAllowance("ctr", "GPU-a"); ok {
		t.Error("an owner without an enforcer has an allowance")
	}
	a := arbiter.New(nil)
	term.arbiter.Store(a)
	if _, ok := p.ownerAllowance("ctr", "GPU-a"); ok {
		t.Error("an allowance before the arbiter's first pass")
	}
	a.Divide("GPU-a", []arbiter.Input{{Share: arbiter.Share{Key: "ctr", Request: 30, Ceiling: 30}}})
	a.EndPass()
	if got, ok := p.ownerAllowance("ctr", "GPU-a"); !ok || got != 30 {
		t.Errorf("allowance %v, %v; want the arbiter's 30", got, ok)
	}
	if _, ok := p.ownerAllowance("ctr", "GPU-b"); ok {
		t.Error("an allowance on a GPU the arbiter did not divide for the container")
	}
}
