package driver

import (
	"context"
	"errors"
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
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

// TestReconcileKeepsAClaimInUse: a tenant strips the claim's finalizer and deletes it while its
// pod runs. The reconciliation must not free the capacity the running container still holds:
// the claim stays prepared, a Prepare of another claim that needs that capacity is refused as
// overcommitted, the episode is counted once and told on the pod once. Once the container stops,
// the next pass unprepares it. With --stale-claim-containers=stop the containers are stopped
// first and the claim is unprepared in the same pass.
func TestReconcileKeepsAClaimInUse(t *testing.T) {
	for _, policy := range []StaleInUsePolicy{StaleInUseKeep, StaleInUseStop} {
		t.Run(string(policy), func(t *testing.T) {
			claim := apiClaim("share", uidClaimA, result("gpu", "gpu-1", "60Gi", "30"))
			next := apiClaim("next", uidClaimB, result("gpu", "gpu-1", "40Gi", "30"))
			next.Status.Allocation.Devices.Results[0].ShareID = ptr.To(types.UID("5f1c2d3e-4a5b-4c6d-8e7f-000000000001"))
			api := newFakeClaimAPI() // claim "share" is not in it: deleted
			users := &fakeUsers{running: map[string][]ClaimUser{uidClaimA: {{Namespace: "team", Pod: "share-pod", PodUID: podUID1, Container: "app", Cgroups: []string{"/kubepods/pod" + podUID1 + "/ctr"}}}}}
			d := newTestDriver(t, func(cfg *Config, deps *Deps) { deps.Claims, deps.Users, cfg.StaleInUse = api, users, policy })
			if err := prepare(t, d, claim)[claim.UID]; err != nil {
				t.Fatal(err)
			}
			if policy == StaleInUseStop {
				if n, err := d.Reconcile(context.Background()); n != 1 || err != nil {
					t.Fatalf("Reconcile = %d, %v; want the claim unprepared once its container was stopped", n, err)
				}
				if len(users.stopped) != 1 || users.stopped[0].Container != "app" {
					t.Errorf("stopped %v, want the claim's one container", users.stopped)
				}
				if _, ok := d.deps.Checkpoint.Get(uidClaimA); ok {
					t.Error("the claim is still prepared after its containers were stopped")
				}
				if got := d.metric(t, "vgpu_dra_stale_claim_containers_stopped_total", "", ""); got != 1 {
					t.Errorf("stale_claim_containers_stopped_total = %v, want 1", got)
				}
				return
			}
			users.unknown = true // just restarted: the NRI cache is not rebuilt yet
			if n, err := d.Reconcile(context.Background()); n != 0 || err != nil {
				t.Fatalf("Reconcile before the users are known = %d, %v; want the claim kept", n, err)
			}
			users.unknown = false
			for range 2 {
				if n, err := d.Reconcile(context.Background()); n != 0 || err != nil {
					t.Fatalf("Reconcile = %d, %v; want the claim in use kept", n, err)
				}
			}
			if _, ok := d.deps.Checkpoint.Get(uidClaimA); !ok {
				t.Fatal("the reconciliation unprepared a claim whose container still runs")
			}
			var pe *prepareError
			if err := prepare(t, d, next)[next.UID]; !errors.As(err, &pe) || pe.reason != metrics.ReasonOvercommitted {
				t.Errorf("Prepare of a claim that needs the held capacity = %v, want refused as %s", err, metrics.ReasonOvercommitted)
			}
			if got := d.metric(t, "vgpu_dra_stale_claims_in_use_total", "reason", metrics.ReconcileDeleted); got != 1 {
				t.Errorf("stale_claims_in_use_total{reason=deleted} = %v after two passes, want 1", got)
			}
			if got := d.metric(t, "vgpu_dra_stale_claims_in_use", "", ""); got != 1 {
				t.Errorf("stale_claims_in_use = %v, want 1", got)
			}
			if len(users.warned) != 1 || users.warned[0] != "team/share-pod/app "+EventStaleClaimInUse {
				t.Errorf("events %v, want one %s on the container's pod", users.warned, EventStaleClaimInUse)
			}
			if len(users.stopped) != 0 {
				t.Errorf("stopped %v with the keep policy", users.stopped)
			}

			users.running = nil // the container stops
			if n, err := d.Reconcile(context.Background()); n != 1 || err != nil {
				t.Fatalf("Reconcile after the container stopped = %d, %v; want the claim unprepared", n, err)
			}
			if got := d.metric(t, "vgpu_dra_stale_claims_in_use", "", ""); got != 0 {
				t.Errorf("stale_claims_in_use = %v after the claim went, want 0", got)
			}
			if err := prepare(t, d, next)[next.UID]; err != nil {
				t.Errorf("Prepare once the capacity is free: %v", err)
			}
		})
	}
}

// fakeUsers are the containers of the node as the driver sees them (ClaimUsers): stopping
// them makes them stop running.
type fakeUsers struct {
	running map[string][]ClaimUser // by claim UID
	unknown bool                   // Users cannot tell yet
	stopped []ClaimUser
	warned  []string
}

func (f *fakeUsers) Users(uid string, _ checkpoint.Claim) ([]ClaimUser, error) {
	if f.unknown {
		return nil, errors.New("the NRI cache is not rebuilt yet")
	}
	return f.running[uid], nil
}

func (f *fakeUsers) Stop(_ context.Context, users []ClaimUser) error {
	f.stopped = append(f.stopped, users...)
	for uid := range f.running {
		f.running[uid] = slices.DeleteFunc(f.running[uid], func(u ClaimUser) bool {
			return slices.ContainsFunc(users, func(s ClaimUser) bool { return s.String() == u.String() })
		})
	}
	return nil
}

func (f *fakeUsers) Warn(u ClaimUser, reason, _ string) {
	f.warned = append(f.warned, u.String()+" "+reason)
}
