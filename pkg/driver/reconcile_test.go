package driver

import (
	"context"
	"errors"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// TestReconcile: a claim prepared here is unprepared, with the reason counted, when the API
// server says it is gone, allocated otherwise or reserved for nobody; it is kept while in use and
// while the API server cannot be asked.
func TestReconcile(t *testing.T) {
	tests := []struct {
		name       string
		api        func(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim // nil: deleted
		getErr     error
		wantReason string // "" keeps the claim
		wantErr    bool
	}{
		{name: "in use", api: func(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim { return c }},
		{name: "deleted", api: nil, wantReason: metrics.ReconcileDeleted},
		{name: "deleted and created again with another UID", api: func(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
			c.UID = "c1a10000-0000-4000-8000-0000000000ff"
			return c
		}, wantReason: metrics.ReconcileDeleted},
		{name: "deallocated", api: func(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
			c.Status.Allocation, c.Status.ReservedFor = nil, nil
			return c
		}, wantReason: metrics.ReconcileDeallocated},
		{name: "allocated again to another share", api: func(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
			c.Status.Allocation.Devices.Results[0].ShareID = ptr.To(types.UID("5f1c2d3e-4a5b-4c6d-8e7f-000000000000"))
			return c
		}, wantReason: metrics.ReconcileDeallocated},
		{name: "reserved for nobody", api: func(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
			c.Status.ReservedFor = nil
			return c
		}, wantReason: metrics.ReconcileNotReserved},
		{name: "API server unreachable: kept", getErr: errors.New("connection refused"), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			claim := apiClaim("share", uidClaimA, result("gpu", "gpu-1", "10Gi", "30"))
			api := newFakeClaimAPI()
			d := newTestDriver(t, func(_ *Config, deps *Deps) { deps.Claims = api })
			if err := prepare(t, d, claim)[claim.UID]; err != nil {
				t.Fatal(err)
			}
			if tt.api != nil {
				api.claims["team/share"] = tt.api(claim.DeepCopy())
			}
			api.getErr = tt.getErr
			n, err := d.Reconcile(context.Background())
			if (err != nil) != tt.wantErr {
				t.Fatalf("Reconcile error %v, want error %v", err, tt.wantErr)
			}
			_, prepared := d.deps.Checkpoint.Get(uidClaimA)
			specGone := d.deps.CDI.SpecPath(uidClaimA) != "" && !fileExists(d.deps.CDI.SpecPath(uidClaimA))
			if tt.wantReason == "" {
				if n != 0 || !prepared || specGone {
					t.Errorf("unprepared %d, still prepared %v, spec gone %v: want the claim kept", n, prepared, specGone)
				}
				if tt.wantErr && d.metric(t, "vgpu_dra_reconcile_errors_total", "", "") != 1 {
					t.Error("reconcile_errors_total not counted")
				}
				return
			}
			if n != 1 || prepared || !specGone {
				t.Errorf("unprepared %d, still prepared %v, spec gone %v: want it unprepared", n, prepared, specGone)
			}
			if got := d.metric(t, "vgpu_dra_reconciled_claims_total", "reason", tt.wantReason); got != 1 {
				t.Errorf("reconciled_claims_total{reason=%s} = %v, want 1", tt.wantReason, got)
			}
		})
	}
}

// TestReconcileLeavesAClaimPreparedMeanwhile: a Prepare that runs while the API server is being
// read (the claim was just reserved for a new pod) wins over what the read said.
func TestReconcileLeavesAClaimPreparedMeanwhile(t *testing.T) {
	claim := apiClaim("share", uidClaimA, result("gpu", "gpu-1", "10Gi", "30"))
	api := &preparingAPI{fakeClaimAPI: newFakeClaimAPI()} // the claim looks deleted
	d := newTestDriver(t, func(_ *Config, deps *Deps) { deps.Claims = api })
	api.during = func() { prepare(t, d, claim) }
	if err := prepare(t, d, claim)[claim.UID]; err != nil {
		t.Fatal(err)
	}
	if n, err := d.Reconcile(context.Background()); n != 0 || err != nil {
		t.Fatalf("Reconcile = %d, %v; want nothing unprepared", n, err)
	}
	if _, ok := d.deps.Checkpoint.Get(uidClaimA); !ok {
		t.Error("the claim a Prepare touched during the read was unprepared")
	}
}

// preparingAPI runs during inside Get, as a Prepare that the kubelet sends meanwhile.
type preparingAPI struct {
	*fakeClaimAPI
	during func()
}

func (p *preparingAPI) Get(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error) {
	if p.during != nil {
		p.during()
	}
	return p.fakeClaimAPI.Get(ctx, namespace, name)
}
