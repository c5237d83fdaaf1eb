package driver

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	resourceac "k8s.io/client-go/applyconfigurations/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
)

const (
	podUID2   = "90d00000-0000-4000-8000-000000000002"
	podUID3   = "90d00000-0000-4000-8000-000000000003"
	uidClaimC = "c1a10000-0000-4000-8000-00000000000c"
)

// podEvent is one event a fakePodEvents was asked to raise.
type podEvent struct{ namespace, pod, podUID, eventType, reason, message string }

type fakePodEvents struct {
	mu     sync.Mutex
	events []podEvent
}

func (f *fakePodEvents) PodEvent(namespace, pod, podUID, eventType, reason, message string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, podEvent{namespace, pod, podUID, eventType, reason, message})
}

// take returns the events raised since the last call.
func (f *fakePodEvents) take() []podEvent {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.events
	f.events = nil
	return out
}

// testClock is a clock the test moves.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// healthDriver is a driver with health watched, a fake API server, a fake event sink and a
// clock. Its status writer does not run on its own: flush writes what is queued, so that a test
// knows when nothing more is to come. send delivers a health event and returns once the claims
// on its GPU were told.
type healthDriver struct {
	*testDriver
	api     *fakeClaimAPI
	events  *fakePodEvents
	clock   *testClock
	health  chan gpu.HealthEvent
	noticed chan gpu.HealthEvent
}

func newHealthDriver(t *testing.T, api *fakeClaimAPI) *healthDriver {
	t.Helper()
	h := &healthDriver{api: api, events: &fakePodEvents{}, clock: &testClock{t: time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)},
		health: make(chan gpu.HealthEvent), noticed: make(chan gpu.HealthEvent, 10)}
	h.testDriver = newTestDriver(t, func(c *Config, deps *Deps) {
		c.HealthCheck = true
		c.Publish = PublishTiming{Resync: time.Hour}
		deps.Claims, deps.Events, deps.Now = api, h.events, h.clock.now
	})
	h.healthRetry = time.Millisecond
	h.status.settle = 0 // flush writes what is queued at once
	h.healthNoticed = func(ev gpu.HealthEvent) { h.noticed <- ev }
	h.StartPublishing(t.Context(), newFlakyPublisher(0), h.health)
	return h
}

func (h *healthDriver) send(t *testing.T, ev gpu.HealthEvent) {
	t.Helper()
	h.health <- ev
	select {
	case <-h.noticed:
	case <-time.After(10 * time.Second):
		t.Fatalf("the claims were not told of %+v", ev)
	}
}

// flush writes every queued status update and returns all writes so far.
func (h *healthDriver) flush(t *testing.T) []*resourceac.ResourceClaimApplyConfiguration {
	t.Helper()
	h.status.writeDue(t.Context(), klog.Background())
	h.api.mu.Lock()
	defer h.api.mu.Unlock()
	return append([]*resourceac.ResourceClaimApplyConfiguration(nil), h.api.applied...)
}

// latest flushes and returns, by claim name, the last write of each claim and how many writes
// there were in all.
func (h *healthDriver) latest(t *testing.T) (map[string]*resourceac.ResourceClaimApplyConfiguration, int) {
	t.Helper()
	all := h.flush(t)
	out := map[string]*resourceac.ResourceClaimApplyConfiguration{}
	for _, a := range all {
		out[*a.Name] = a
	}
	return out, len(all)
}

// conditionOf returns the entry's condition of that type; it fails the test when there is none.
func conditionOf(t *testing.T, a *resourceac.ResourceClaimApplyConfiguration, condType string) metav1.Condition {
	t.Helper()
	if len(a.Status.Devices) != 1 {
		t.Fatalf("claim %s: %d status entries, want 1", *a.Name, len(a.Status.Devices))
	}
	for _, c := range a.Status.Devices[0].Conditions {
		if *c.Type == condType {
			out := metav1.Condition{Type: *c.Type, Status: *c.Status, Reason: *c.Reason, Message: *c.Message}
			if c.LastTransitionTime != nil {
				out.LastTransitionTime = *c.LastTransitionTime
			}
			return out
		}
	}
	t.Fatalf("claim %s has no %s condition: %+v", *a.Name, condType, a.Status.Devices[0].Conditions)
	return metav1.Condition{}
}

// withPods reserves the claim for these pods (UID → name).
func withPods(c *resourceapi.ResourceClaim, pods ...[2]string) *resourceapi.ResourceClaim {
	c.Status.ReservedFor = nil
	for _, p := range pods {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p[1], UID: types.UID(p[0])})
	}
	return c
}

// TestHealthReachesClaimsAndPods: a GPU that fails and recovers says so in the Healthy
// condition of every claim prepared on it (Ready left as it was), with one Warning event on
// each pod those claims are reserved for when it fails and one Normal event when it recovers —
// one per pod, however many of its claims are on the GPU; a new reason of a GPU already
// unhealthy updates the condition and raises no event; claims on the other GPU hear nothing;
// every transition is counted.
func TestHealthReachesClaimsAndPods(t *testing.T) {
	api := newFakeClaimAPI()
	h := newHealthDriver(t, api)
	// a and b on gpu-1: pod one holds both, pod two b only; c on gpu-0.
	claims := []*resourceapi.ResourceClaim{
		withPods(apiClaim("a", uidClaimA, result("gpu", "gpu-1", "10Gi", "30")), [2]string{podUID1, "one"}),
		withPods(apiClaim("b", uidClaimB, result("gpu", "gpu-1", "10Gi", "30")), [2]string{podUID1, "one"}, [2]string{podUID2, "two"}),
		withPods(apiClaim("c", uidClaimC, result("gpu", "gpu-0", "10Gi", "30")), [2]string{podUID3, "three"}),
	}
	for _, c := range claims {
		api.claims[c.Namespace+"/"+c.Name] = c
		if err := prepare(t, h.testDriver, c)[c.UID]; err != nil {
			t.Fatal(err)
		}
	}
	preparedAt := h.clock.now()
	got, written := h.latest(t)
	if written != 3 {
		t.Fatalf("%d writes after three Prepares", written)
	}
	for name, a := range got {
		if c := conditionOf(t, a, contract.DeviceConditionHealthy); c.Status != metav1.ConditionTrue || c.Reason != contract.DeviceReasonGPUHealthy {
			t.Errorf("claim %s after Prepare: Healthy %s %s, want True %s", name, c.Status, c.Reason, contract.DeviceReasonGPUHealthy)
		}
	}
	// The API server holds what the writer wrote: Ready since the Prepare.
	for _, c := range claims {
		c.Status.Devices = []resourceapi.AllocatedDeviceStatus{{Driver: contract.DefaultDriverName, Pool: "node-1", Device: c.Status.Allocation.Devices.Results[0].Device,
			ShareID: ptrTo(shareA), Conditions: []metav1.Condition{{Type: contract.DeviceConditionReady, Status: metav1.ConditionTrue, Reason: contract.DeviceReasonPrepared, LastTransitionTime: metav1.NewTime(preparedAt)}}}}
	}

	steps := []struct {
		name       string
		event      gpu.HealthEvent
		wantStatus metav1.ConditionStatus
		wantReason string
		wantText   []string
		wantEvent  string // the event's type on pods one and two; "" for none
	}{
		{name: "XID 92: unhealthy", event: gpu.HealthEvent{UUID: uuidGPU1, Reason: "XID 92 (high single-bit ECC error rate)"},
			wantStatus: metav1.ConditionFalse, wantReason: contract.DeviceReasonGPUUnhealthy,
			wantText: []string{uuidGPU1, "gpu-1 on node node-1", "XID 92", "NoSchedule", "delete it"}, wantEvent: corev1.EventTypeWarning},
		{name: "another XID while unhealthy: new message, no event", event: gpu.HealthEvent{UUID: uuidGPU1, Reason: "XID 94 (contained ECC error)"},
			wantStatus: metav1.ConditionFalse, wantReason: contract.DeviceReasonGPUUnhealthy, wantText: []string{"XID 94"}},
		{name: "recovered", event: gpu.HealthEvent{UUID: uuidGPU1, Healthy: true, Reason: "NVML recovery action none"},
			wantStatus: metav1.ConditionTrue, wantReason: contract.DeviceReasonGPUHealthy, wantText: []string{"healthy"}, wantEvent: corev1.EventTypeNormal},
		{name: "XID 79: needs a reset", event: gpu.HealthEvent{UUID: uuidGPU1, Fatal: true, Reason: "XID 79 (GPU has fallen off the bus)"},
			wantStatus: metav1.ConditionFalse, wantReason: contract.DeviceReasonGPUNeedsReset,
			wantText: []string{"needs a reset", "XID 79", "NoExecute", "Delete the pod"}, wantEvent: corev1.EventTypeWarning},
	}
	for _, st := range steps {
		h.clock.advance(time.Minute)
		changedAt := h.clock.now()
		h.send(t, st.event)
		got, n := h.latest(t)
		if n != written+2 {
			t.Errorf("%s: %d writes, want the two claims on gpu-1 written again", st.name, n-written)
		}
		written = n
		for _, name := range []string{"a", "b"} {
			c := conditionOf(t, got[name], contract.DeviceConditionHealthy)
			if c.Status != st.wantStatus || c.Reason != st.wantReason {
				t.Errorf("%s: claim %s Healthy %s %s, want %s %s", st.name, name, c.Status, c.Reason, st.wantStatus, st.wantReason)
			}
			for _, text := range st.wantText {
				if !strings.Contains(c.Message, text) {
					t.Errorf("%s: claim %s Healthy message %q lacks %q", st.name, name, c.Message, text)
				}
			}
			if st.wantEvent != "" && !c.LastTransitionTime.Time.Equal(changedAt) {
				t.Errorf("%s: claim %s Healthy since %v, want the transition's %v", st.name, name, c.LastTransitionTime, changedAt)
			}
			if r := conditionOf(t, got[name], contract.DeviceConditionReady); !r.LastTransitionTime.Time.Equal(preparedAt) {
				t.Errorf("%s: claim %s Ready since %v, want the Prepare's %v: it did not change", st.name, name, r.LastTransitionTime, preparedAt)
			}
		}
		if c := conditionOf(t, got["c"], contract.DeviceConditionHealthy); c.Status != metav1.ConditionTrue {
			t.Errorf("%s: claim c on gpu-0 Healthy %s", st.name, c.Status)
		}
		events := h.events.take()
		if st.wantEvent == "" {
			if len(events) != 0 {
				t.Errorf("%s: events %+v, want none", st.name, events)
			}
			continue
		}
		byPod := map[string]int{}
		for _, e := range events {
			byPod[e.pod]++
			wantReason := contract.EventReasonDeviceUnhealthy
			if st.event.Healthy {
				wantReason = contract.EventReasonDeviceRecovered
			}
			if e.eventType != st.wantEvent || e.reason != wantReason || e.namespace != "team" || !strings.Contains(e.message, uuidGPU1) {
				t.Errorf("%s: event %+v, want %s %s in team naming the GPU", st.name, e, st.wantEvent, wantReason)
			}
		}
		if len(byPod) != 2 || byPod["one"] != 1 || byPod["two"] != 1 {
			t.Errorf("%s: events per pod %v, want one on one and one on two", st.name, byPod)
		}
	}
	for _, m := range []struct {
		gpu, to string
		want    float64
	}{{uuidGPU1, "unhealthy", 2}, {uuidGPU1, "healthy", 1}, {uuidGPU0, "unhealthy", 0}, {uuidGPU0, "healthy", 0}} {
		got, ok := counterWith(t, h.testDriver, "vgpu_dra_gpu_health_transitions_total", map[string]string{"gpu_uuid": m.gpu, "to": m.to})
		if !ok || got != m.want {
			t.Errorf("gpu_health_transitions_total{gpu_uuid=%s,to=%s} = %v (present: %v), want %v", m.gpu, m.to, got, ok, m.want)
		}
	}
}

// counterWith returns the counter sample of name with all these labels, and whether there is one.
func counterWith(t *testing.T, d *testDriver, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	families, err := d.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			matched := 0
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v == l.GetValue() {
					matched++
				}
			}
			if matched == len(labels) {
				return m.GetCounter().GetValue(), true
			}
		}
	}
	return 0, false
}

// TestHealthNoticeAndTheAPIServer: a claim whose read fails for a while is told once it can be
// read; a claim the API server no longer has (or has with another UID), one it refuses to show
// and one unprepared before the change are not written, nor are their pods told.
func TestHealthNoticeAndTheAPIServer(t *testing.T) {
	gone := apierrors.NewNotFound(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}, "a")
	tests := []struct {
		name       string
		getErrs    []error
		change     func(h *healthDriver, c *resourceapi.ResourceClaim)
		wantTold   bool
		wantMaxGet int
	}{
		{name: "read at once", wantTold: true, wantMaxGet: 1},
		{name: "read after two passing errors", getErrs: []error{apierrors.NewServiceUnavailable("etcd"), errors.New("connection refused")}, wantTold: true, wantMaxGet: 3},
		{name: "unavailable for good: left after the last attempt", getErrs: repeat(apierrors.NewServiceUnavailable("etcd"), healthReadAttempts), wantMaxGet: healthReadAttempts},
		{name: "forbidden: not retried", getErrs: []error{apierrors.NewForbidden(schema.GroupResource{Resource: "resourceclaims"}, "a", errors.New("no"))}, wantMaxGet: 1},
		{name: "deleted", getErrs: []error{gone}, wantMaxGet: 1},
		{name: "replaced by a claim of the same name", change: func(_ *healthDriver, c *resourceapi.ResourceClaim) { c.UID = uidClaimB }, wantMaxGet: 1},
		{name: "unprepared before the change", change: func(h *healthDriver, c *resourceapi.ResourceClaim) {
			if _, err := h.UnprepareResourceClaims(t.Context(), []kubeletplugin.NamespacedObject{{
				NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, UID: c.UID}}); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeClaimAPI()
			h := newHealthDriver(t, api)
			claim := withPods(apiClaim("a", uidClaimA, result("gpu", "gpu-1", "10Gi", "30")), [2]string{podUID1, "one"})
			if err := prepare(t, h.testDriver, claim)[claim.UID]; err != nil {
				t.Fatal(err)
			}
			h.flush(t)
			stored := claim.DeepCopy()
			if tt.change != nil {
				tt.change(h, stored)
			}
			api.mu.Lock()
			api.claims["team/a"], api.getErrs, api.gets = stored, tt.getErrs, 0
			api.mu.Unlock()

			h.send(t, gpu.HealthEvent{UUID: uuidGPU1, Reason: "XID 92"})
			applied := h.flush(t)
			told := len(applied) == 2
			events := h.events.take()
			if told != tt.wantTold || len(events) != map[bool]int{true: 1}[tt.wantTold] {
				t.Errorf("%d writes, events %+v; want the claim told: %v", len(applied), events, tt.wantTold)
			}
			if told {
				if c := conditionOf(t, applied[1], contract.DeviceConditionHealthy); c.Status != metav1.ConditionFalse {
					t.Errorf("Healthy %s after the XID", c.Status)
				}
			}
			api.mu.Lock()
			gets := api.gets
			api.mu.Unlock()
			if gets > tt.wantMaxGet {
				t.Errorf("%d reads of the claim, want at most %d", gets, tt.wantMaxGet)
			}
		})
	}
}

func repeat(err error, n int) []error {
	out := make([]error, n)
	for i := range out {
		out[i] = err
	}
	return out
}
