package driver

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	metaac "k8s.io/client-go/applyconfigurations/meta/v1"
	resourceac "k8s.io/client-go/applyconfigurations/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

const (
	uidClaimA = "c1a10000-0000-4000-8000-00000000000a"
	uidClaimB = "c1a10000-0000-4000-8000-00000000000b"
	podUID1   = "90d00000-0000-4000-8000-000000000001"
)

// apiClaim is an allocated claim reserved for one pod, as the kubelet hands it to Prepare.
func apiClaim(name, uid string, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	c := allocatedClaim(results...)
	c.Name, c.UID, c.Generation = name, types.UID(uid), 3
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: name + "-pod", UID: podUID1}}
	return c
}

// startedDriver is a test driver with api as its ClaimAPI, started (status writer running).
// Every update the writer is done with (written, dropped or put back) is sent on processed.
func startedDriver(t *testing.T, api *fakeClaimAPI) (*testDriver, <-chan struct{}) {
	t.Helper()
	d := newTestDriver(t, func(_ *Config, deps *Deps) { deps.Claims = api })
	processed := make(chan struct{}, 100)
	d.status.retryMin, d.status.retryMax = time.Millisecond, 2*time.Millisecond
	d.status.processed = func() { processed <- struct{}{} }
	d.Start(t.Context(), nil, nil)
	return d, processed
}

// waitProcessed waits until the writer is done with n more updates.
func waitProcessed(t *testing.T, processed <-chan struct{}, n int) {
	t.Helper()
	for range n {
		select {
		case <-processed:
		case <-time.After(10 * time.Second):
			t.Fatalf("the status writer did not get through %d updates", n)
		}
	}
}

func prepare(t *testing.T, d *testDriver, claims ...*resourceapi.ResourceClaim) map[types.UID]error {
	t.Helper()
	res, err := d.PrepareResourceClaims(context.Background(), claims)
	if err != nil {
		t.Fatal(err)
	}
	out := map[types.UID]error{}
	for uid, r := range res {
		out[uid] = r.Err
	}
	return out
}

func readyCondition(t *testing.T, d resourceac.AllocatedDeviceStatusApplyConfiguration) (status metav1.ConditionStatus, reason string) {
	t.Helper()
	if len(d.Conditions) != 1 || *d.Conditions[0].Type != contract.DeviceConditionReady {
		t.Fatalf("conditions %+v, want one Ready", d.Conditions)
	}
	return *d.Conditions[0].Status, *d.Conditions[0].Reason
}

// TestDeviceStatusAfterPrepare: a prepared claim's results get Ready=True with the GPU, the
// granted memory and cores, a share's class and burst ceiling, and the path; a failed Prepare
// gets Ready=False with the reason; both are written after Prepare answered, as this node's
// entries. The data has exactly the fields listed: a whole GPU and admin access have no class.
func TestDeviceStatusAfterPrepare(t *testing.T) {
	tests := []struct {
		name       string
		claim      *resourceapi.ResourceClaim
		wantStatus metav1.ConditionStatus
		wantReason string
		wantData   map[string]any
	}{
		{name: "a share", claim: apiClaim("share", uidClaimA, result("gpu/small", "gpu-1", "10Gi", "30")),
			wantStatus: metav1.ConditionTrue, wantReason: contract.DeviceReasonPrepared,
			wantData: map[string]any{"request": "gpu/small", "gpuUUID": uuidGPU1, "productName": "NVIDIA H100 80GB HBM3", "index": float64(1), "memory": "10Gi", "cores": float64(30), "class": "Guaranteed", "path": "nri"}},
		{name: "a guaranteed share that may burst", claim: configured(apiClaim("burst", uidClaimA, result("gpu", "gpu-1", "10Gi", "30")), vgpuConfigHead+`"coresCeiling":80}`),
			wantStatus: metav1.ConditionTrue, wantReason: contract.DeviceReasonPrepared,
			wantData: map[string]any{"request": "gpu", "gpuUUID": uuidGPU1, "productName": "NVIDIA H100 80GB HBM3", "index": float64(1), "memory": "10Gi", "cores": float64(30), "class": "Guaranteed", "coresCeiling": float64(80), "path": "nri"}},
		{name: "a best-effort share without a ceiling: up to the whole GPU", claim: configured(apiClaim("be", uidClaimA, result("gpu", "gpu-1", "10Gi", "30")), vgpuConfigHead+`"class":"BestEffort"}`),
			wantStatus: metav1.ConditionTrue, wantReason: contract.DeviceReasonPrepared,
			wantData: map[string]any{"request": "gpu", "gpuUUID": uuidGPU1, "productName": "NVIDIA H100 80GB HBM3", "index": float64(1), "memory": "10Gi", "cores": float64(30), "class": "BestEffort", "coresCeiling": float64(100), "path": "nri"}},
		{name: "a whole GPU: granted all of it", claim: apiClaim("whole", uidClaimA, result("gpu", "gpu-0", "", "")),
			wantStatus: metav1.ConditionTrue, wantReason: contract.DeviceReasonPrepared,
			wantData: map[string]any{"request": "gpu", "gpuUUID": uuidGPU0, "productName": "NVIDIA H100 80GB HBM3", "index": float64(0), "memory": "80Gi", "cores": float64(100), "path": "nri"}},
		{name: "admin access: no limits", claim: apiClaim("mon", uidClaimA, admin(result("mon", "gpu-0", "256Mi", "1"))),
			wantStatus: metav1.ConditionTrue, wantReason: contract.DeviceReasonPrepared,
			wantData: map[string]any{"request": "mon", "gpuUUID": uuidGPU0, "productName": "NVIDIA H100 80GB HBM3", "index": float64(0), "adminAccess": true, "path": "nri"}},
		{name: "failed: the reason", claim: apiClaim("bad", uidClaimA, result("gpu", "gpu-0", "0.5", "")),
			wantStatus: metav1.ConditionFalse, wantReason: "InvalidClaim", wantData: map[string]any{"request": "gpu", "index": float64(0), "gpuUUID": "", "productName": ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeClaimAPI()
			d, _ := startedDriver(t, api)
			prepare(t, d, tt.claim)
			applied := api.waitApplied(t, 1)[0]
			if *applied.Name != tt.claim.Name || *applied.Namespace != tt.claim.Namespace || *applied.UID != tt.claim.UID {
				t.Errorf("applied to %s/%s %s, want the claim", *applied.Namespace, *applied.Name, *applied.UID)
			}
			devs := applied.Status.Devices
			if len(devs) != 1 || *devs[0].Driver != contract.DefaultDriverName || *devs[0].Pool != "node-1" || *devs[0].Device != *ptrTo(tt.claim.Status.Allocation.Devices.Results[0].Device) || *devs[0].ShareID != shareA {
				t.Fatalf("status devices %+v, want this node's entry of the result", devs)
			}
			status, reason := readyCondition(t, devs[0])
			if status != tt.wantStatus || reason != tt.wantReason || *devs[0].Conditions[0].ObservedGeneration != 3 {
				t.Errorf("Ready %s %s (generation %d), want %s %s for generation 3", status, reason, *devs[0].Conditions[0].ObservedGeneration, tt.wantStatus, tt.wantReason)
			}
			got := deviceData(t, devs[0])
			for k, want := range tt.wantData {
				if got[k] != want && !(want == "" && got[k] == nil) {
					t.Errorf("data %s = %v, want %v (data %v)", k, got[k], want, got)
				}
			}
			for k, v := range got {
				if _, ok := tt.wantData[k]; !ok {
					t.Errorf("data has %s = %v, want no such field (data %v)", k, v, got)
				}
			}
		})
	}
}

func ptrTo[T any](v T) *T { return &v }

// TestDeviceStatusWrites: transient API errors are retried, refusals for good dropped, an
// unchanged status is not written again, and nothing is written for a claim unprepared before
// its turn came.
func TestDeviceStatusWrites(t *testing.T) {
	gone := apierrors.NewNotFound(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}, "share")
	tests := []struct {
		name        string
		errs        []error
		wantApplied int
		wantCount   map[string]float64
	}{
		{name: "written", wantApplied: 1, wantCount: map[string]float64{metrics.StatusWritten: 1}},
		{name: "retried until written", errs: []error{apierrors.NewServiceUnavailable("etcd"), errors.New("connection refused")},
			wantApplied: 1, wantCount: map[string]float64{metrics.StatusRetried: 2, metrics.StatusWritten: 1}},
		{name: "claim gone: dropped, written by the next Prepare", errs: []error{gone},
			wantCount: map[string]float64{metrics.StatusDropped: 1, metrics.StatusWritten: 1, metrics.StatusRetried: 0}},
		{name: "forbidden: dropped, written by the next Prepare", errs: []error{apierrors.NewForbidden(schema.GroupResource{Resource: "resourceclaims"}, "share", errors.New("another node's claim"))},
			wantCount: map[string]float64{metrics.StatusDropped: 1, metrics.StatusWritten: 1, metrics.StatusRetried: 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeClaimAPI()
			api.applyErr = tt.errs
			d, processed := startedDriver(t, api)
			claim := apiClaim("share", uidClaimA, result("gpu", "gpu-1", "10Gi", "30"))
			prepare(t, d, claim)
			waitProcessed(t, processed, len(tt.errs)+tt.wantApplied)
			// The same Prepare again (the kubelet after a restart) and a second claim: the first
			// is written again only when it did not land, the second is; it marks the end.
			prepare(t, d, claim)
			prepare(t, d, apiClaim("other", uidClaimB, result("gpu", "gpu-0", "1Gi", "1")))
			want := max(tt.wantApplied, 1) + 1
			waitProcessed(t, processed, want-tt.wantApplied)
			applied := api.waitApplied(t, want)
			if len(applied) != want || *applied[len(applied)-1].Name != "other" {
				t.Errorf("%d writes, the last to %s; want %d, the last to other", len(applied), *applied[len(applied)-1].Name, want)
			}
			for outcome, want := range tt.wantCount {
				if outcome == metrics.StatusWritten {
					want++ // the second claim
				}
				if got := d.metric(t, "vgpu_dra_claim_status_writes_total", "outcome", outcome); got != want {
					t.Errorf("claim_status_writes_total{outcome=%s} = %v, want %v", outcome, got, want)
				}
			}
		})
	}
}

// TestDeviceStatusNotWrittenAfterUnprepare: an update still waiting when its claim is
// unprepared is dropped.
func TestDeviceStatusNotWrittenAfterUnprepare(t *testing.T) {
	api := newFakeClaimAPI()
	d := newTestDriver(t, func(_ *Config, deps *Deps) { deps.Claims = api }) // not started: nothing is written yet
	claim := apiClaim("share", uidClaimA, result("gpu", "gpu-1", "10Gi", "30"))
	prepare(t, d, claim)
	if _, err := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{
		NamespacedName: types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name}, UID: claim.UID,
	}}); err != nil {
		t.Fatal(err)
	}
	d.Start(t.Context(), nil, nil)
	prepare(t, d, apiClaim("other", uidClaimB, result("gpu", "gpu-0", "1Gi", "1")))
	if applied := api.waitApplied(t, 1); len(applied) != 1 || *applied[0].Name != "other" {
		t.Errorf("writes %d, first to %s; want only the claim still prepared", len(applied), *applied[0].Name)
	}
}

// TestDeviceStatusBackToAnEarlierContent: an update that brings a claim's status back to what
// was written before (a GPU that recovers: Healthy=True again) is written although it equals
// that content, when it comes while a write of other content (Healthy=False) is under way —
// that write lands after it was queued, and the claim would stay unhealthy.
func TestDeviceStatusBackToAnEarlierContent(t *testing.T) {
	api := newFakeClaimAPI()
	w := newStatusWriter(api, "node-1", time.Now, newTestDriver(t).dra)
	w.settle = 0
	claim := apiClaim("share", uidClaimA, result("gpu", "gpu-1", "10Gi", "30"))
	status := func(healthy metav1.ConditionStatus) []*resourceac.AllocatedDeviceStatusApplyConfiguration {
		return []*resourceac.AllocatedDeviceStatusApplyConfiguration{deviceStatus(contract.DefaultDriverName, "node-1", "gpu-1", shareA).
			WithConditions(metaac.Condition().WithType(contract.DeviceConditionHealthy).WithStatus(healthy).WithReason("R").WithMessage("m"))}
	}
	w.enqueue(claim, status(metav1.ConditionTrue))
	w.writeDue(t.Context(), klog.Background())

	inWrite, release := make(chan struct{}), make(chan struct{})
	api.onApply = func() {
		inWrite <- struct{}{}
		<-release
	}
	w.enqueue(claim, status(metav1.ConditionFalse))
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.writeDue(t.Context(), klog.Background())
	}()
	<-inWrite                                      // Healthy=False is being written
	w.enqueue(claim, status(metav1.ConditionTrue)) // and the GPU recovered meanwhile
	close(release)
	go func() {
		for range inWrite {
		}
	}()
	<-done
	close(inWrite)
	api.onApply = nil
	applied := api.waitApplied(t, 2)
	last := applied[len(applied)-1].Status.Devices[0].Conditions[0]
	if len(applied) != 3 || *last.Status != metav1.ConditionTrue {
		t.Errorf("%d writes, the last Healthy=%s; want 3, the last True", len(applied), *last.Status)
	}
}

// TestDeviceStatusWaitsForTheBurst: writes wait until no update was queued for the settle time,
// so a burst of Prepares is not slowed by the applies; an update never waits longer than
// settleMax for a burst that does not end, and a claim unprepared meanwhile is not written.
func TestDeviceStatusWaitsForTheBurst(t *testing.T) {
	api := newFakeClaimAPI()
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	now := t0
	w := newStatusWriter(api, "node-1", func() time.Time { return now }, newTestDriver(t).dra)
	status := []*resourceac.AllocatedDeviceStatusApplyConfiguration{deviceStatus(contract.DefaultDriverName, "node-1", "gpu-1", shareA)}
	claim := func(i int) *resourceapi.ResourceClaim {
		return apiClaim(fmt.Sprintf("share-%d", i), fmt.Sprintf("c1a10000-0000-4000-8000-%012d", i), result("gpu", "gpu-1", "1Gi", "1"))
	}
	writes := func() int {
		api.mu.Lock()
		defer api.mu.Unlock()
		return len(api.applied)
	}
	at := func(d time.Duration) time.Time {
		now = t0.Add(d)
		return w.writeDue(t.Context(), klog.Background())
	}

	w.enqueue(claim(1), status)
	if next := at(5 * time.Millisecond); writes() != 0 || !next.Equal(t0.Add(statusSettle)) {
		t.Fatalf("5 ms after an update: %d writes, next at %v; want none until %v", writes(), next.Sub(t0), statusSettle)
	}
	now = t0.Add(10 * time.Millisecond)
	w.enqueue(claim(2), status)
	if next := at(25 * time.Millisecond); writes() != 0 || !next.Equal(t0.Add(10*time.Millisecond+statusSettle)) {
		t.Fatalf("a second update 10 ms in: %d writes at 25 ms, next at %v; want none until %v", writes(), next.Sub(t0), 10*time.Millisecond+statusSettle)
	}
	if at(30 * time.Millisecond); writes() != 2 {
		t.Fatalf("the burst settled: %d writes, want 2", writes())
	}

	// A burst that does not end: an update every 10 ms for 2 s. The first is written at
	// settleMax after it was queued, each later one at most settleMax after its own.
	start := 40 * time.Millisecond
	now = t0.Add(start)
	w.enqueue(claim(100), status)
	var firstAt time.Duration
	for i := 1; i <= 200; i++ {
		d := start + time.Duration(i)*10*time.Millisecond
		now = t0.Add(d)
		w.enqueue(claim(100+i), status)
		before := writes()
		at(d)
		if writes() > before && firstAt == 0 {
			firstAt = d - start
		}
	}
	if firstAt != statusSettleMax {
		t.Errorf("in a burst that does not end the first update was written %v after it was queued, want %v", firstAt, statusSettleMax)
	}
	if got, want := writes(), 2+200-int(statusSettleMax/(10*time.Millisecond))+1; got != want {
		t.Errorf("%d writes during the burst, want %d (every update queued at least settleMax before)", got, want)
	}

	// Unprepared before the burst ended: never written.
	now = t0.Add(5 * time.Second)
	gone := claim(999)
	w.enqueue(gone, status)
	w.forget(string(gone.UID))
	at(10 * time.Second)
	api.mu.Lock()
	defer api.mu.Unlock()
	for _, a := range api.applied {
		if *a.Name == gone.Name {
			t.Errorf("the status of a claim unprepared before it was written was written")
		}
	}
}
