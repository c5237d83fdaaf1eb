package driver

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	metaac "k8s.io/client-go/applyconfigurations/meta/v1"
	resourceac "k8s.io/client-go/applyconfigurations/resource/v1"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// A GPU's health reaches the kubelet through WatchHealthStatus, which the kubelet shows in
// status.containerStatuses[].allocatedResourcesStatus — for the pods that named a claim only:
// Kubernetes 1.37 leaves it empty for a pod that asked through the DeviceClass's extended
// resource (kubernetes/kubernetes#139939). So the claims on the GPU say it themselves, for both
// paths: a Healthy condition in each result's device status, kept current on every change, and an
// event on each pod the claim is reserved for, a Warning when the GPU becomes unhealthy and a
// Normal one when it recovers, once per pod and transition (contract §3, "Claim device status").

// PodEvents raises events on pods; pkg/plugin supplies the API server's event recorder.
type PodEvents interface {
	// PodEvent raises an event of eventType (corev1.EventTypeWarning or EventTypeNormal).
	PodEvent(namespace, pod, podUID, eventType, reason, message string)
}

// Attempts and first delay of reading a claim whose GPU's health changed: a claim the API server
// cannot be asked about now is tried again, doubling the delay (0.5 s … 8 s), then left.
const (
	healthReadAttempts = 5
	healthReadRetry    = 500 * time.Millisecond
)

// healthNotice is one change of a GPU's health for its claims to be told.
type healthNotice struct {
	event gpu.HealthEvent
	// transition: the GPU went from healthy to unhealthy or back, not only to a new reason;
	// the pods get an event.
	transition bool
}

// healthNotices is the queue between runHealthEvents, which must not wait for the API server,
// and runHealthNotices, which tells the claims one change after another, in order.
type healthNotices struct {
	mu      sync.Mutex
	pending []healthNotice
	kick    chan struct{}
}

func newHealthNotices() *healthNotices { return &healthNotices{kick: make(chan struct{}, 1)} }

func (q *healthNotices) add(n healthNotice) {
	q.mu.Lock()
	q.pending = append(q.pending, n)
	q.mu.Unlock()
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

func (q *healthNotices) take() []healthNotice {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.pending
	q.pending = nil
	return out
}

// runHealthNotices tells the claims of each change until ctx ends.
func (d *Driver) runHealthNotices(ctx context.Context, q *healthNotices) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-q.kick:
		}
		for _, n := range q.take() {
			d.tellClaims(ctx, n)
			if d.healthNoticed != nil {
				d.healthNoticed(n.event)
			}
		}
	}
}

// tellClaims writes the new Healthy condition of every claim prepared with a result on the GPU
// and, for a transition, raises one event on each pod they are reserved for.
func (d *Driver) tellClaims(ctx context.Context, n healthNotice) {
	if d.deps.Claims == nil {
		return
	}
	logger := klog.FromContext(ctx).WithValues("uuid", n.event.UUID)
	told := map[types.UID]bool{} // one event per pod and transition, whatever its claims
	for _, ref := range d.claimsOnGPU(n.event.UUID) {
		claim, err := d.readClaim(ctx, ref)
		if err != nil {
			if ctx.Err() == nil {
				logger.Error(err, "Cannot tell a claim that its GPU's health changed", "claim", klog.KRef(ref.namespace, ref.name))
			}
			continue
		}
		if claim == nil {
			continue // gone or replaced: the reconciliation unprepares it
		}
		d.writeHealthStatus(claim)
		if n.transition {
			d.raiseHealthEvents(claim, n.event, told)
		}
	}
}

type claimRef struct{ uid, namespace, name string }

// claimsOnGPU are the prepared claims with a result on the GPU, in UID order.
func (d *Driver) claimsOnGPU(uuid string) []claimRef {
	var out []claimRef
	d.deps.Checkpoint.Range(func(uid string, c *checkpoint.Claim) {
		if c.State != checkpoint.PrepareCompleted {
			return
		}
		if slices.ContainsFunc(c.Devices, func(dev checkpoint.Device) bool { return dev.GPUUUID == uuid }) {
			out = append(out, claimRef{uid: uid, namespace: c.Namespace, name: c.Name})
		}
	})
	slices.SortFunc(out, func(a, b claimRef) int { return cmp.Compare(a.uid, b.uid) })
	return out
}

// readClaim reads the claim from the API server (its generation, its reservedFor with the pods'
// names), retrying errors that can pass; nil, nil when it is gone or has another UID.
func (d *Driver) readClaim(ctx context.Context, ref claimRef) (*resourceapi.ResourceClaim, error) {
	delay := d.healthRetry
	for attempt := 1; ; attempt++ {
		claim, err := d.deps.Claims.Get(ctx, ref.namespace, ref.name)
		switch {
		case apierrors.IsNotFound(err):
			return nil, nil
		case err == nil && string(claim.UID) != ref.uid:
			return nil, nil
		case err == nil:
			return claim, nil
		case attempt == healthReadAttempts || permanentStatusError(err):
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(delay):
		}
		delay *= 2
	}
}

// writeHealthStatus queues the claim's device status again, with the current Healthy condition,
// under the claim's lock: an Unprepare that came first leaves nothing to write, one that comes
// later drops it.
func (d *Driver) writeHealthStatus(claim *resourceapi.ResourceClaim) {
	uid := string(claim.UID)
	unlock := d.locks.lock(uid)
	defer unlock()
	prepared, ok := d.deps.Checkpoint.Get(uid)
	if !ok || prepared.State != checkpoint.PrepareCompleted {
		return
	}
	devices := d.preparedStatus(claim, prepared)
	keepTransitionTimes(claim.Status.Devices, devices)
	d.status.enqueue(claim, devices)
}

// keepTransitionTimes gives each condition whose status is what the API server holds already
// the time it holds: a condition's lastTransitionTime moves only when its status does (Ready
// stays as Prepare wrote it while Healthy changes).
func keepTransitionTimes(current []resourceapi.AllocatedDeviceStatus, devices []*resourceac.AllocatedDeviceStatusApplyConfiguration) {
	for _, dev := range devices {
		i := slices.IndexFunc(current, func(c resourceapi.AllocatedDeviceStatus) bool {
			return c.Driver == *dev.Driver && c.Pool == *dev.Pool && c.Device == *dev.Device &&
				(c.ShareID == nil && dev.ShareID == nil || c.ShareID != nil && dev.ShareID != nil && *c.ShareID == *dev.ShareID)
		})
		if i < 0 {
			continue
		}
		for j := range dev.Conditions {
			cond := &dev.Conditions[j]
			if old := findCondition(current[i].Conditions, *cond.Type); old != nil && old.Status == *cond.Status {
				cond.LastTransitionTime = &old.LastTransitionTime
			}
		}
	}
}

func findCondition(conds []metav1.Condition, condType string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == condType {
			return &conds[i]
		}
	}
	return nil
}

// raiseHealthEvents raises the transition's event on each pod the claim is reserved for that
// told does not hold yet.
func (d *Driver) raiseHealthEvents(claim *resourceapi.ResourceClaim, ev gpu.HealthEvent, told map[types.UID]bool) {
	if d.deps.Events == nil {
		return
	}
	eventType, reason := corev1.EventTypeWarning, contract.EventReasonDeviceUnhealthy
	if ev.Healthy {
		eventType, reason = corev1.EventTypeNormal, contract.EventReasonDeviceRecovered
	}
	msg := d.healthEventMessage(ev)
	for _, ref := range claim.Status.ReservedFor {
		if ref.Resource != "pods" || ref.APIGroup != "" || told[ref.UID] {
			continue
		}
		told[ref.UID] = true
		d.deps.Events.PodEvent(claim.Namespace, ref.Name, string(ref.UID), eventType, reason, truncateUTF8(msg, statusMessageMax))
	}
}

// withHealthCondition adds the result's Healthy condition to its Ready condition, with
// DeviceHealthCheck on (without it nothing watches the GPU's health).
func (d *Driver) withHealthCondition(ready *metaac.ConditionApplyConfiguration, gpuUUID string, generation int64) []*metaac.ConditionApplyConfiguration {
	if !d.cfg.HealthCheck {
		return []*metaac.ConditionApplyConfiguration{ready}
	}
	since, ok := d.health.lastTransition(gpuUUID)
	if !ok {
		since = d.now()
	}
	cond := metaac.Condition().WithType(contract.DeviceConditionHealthy).
		WithLastTransitionTime(metav1.NewTime(since)).WithObservedGeneration(generation)
	if ev, bad := d.health.unhealthy(gpuUUID); bad {
		reason := contract.DeviceReasonGPUUnhealthy
		if ev.Fatal {
			reason = contract.DeviceReasonGPUNeedsReset
		}
		cond.WithStatus(metav1.ConditionFalse).WithReason(reason).WithMessage(truncateUTF8(d.healthEventMessage(ev), statusMessageMax))
	} else {
		cond.WithStatus(metav1.ConditionTrue).WithReason(contract.DeviceReasonGPUHealthy).
			WithMessage(fmt.Sprintf("GPU %s is healthy", gpuUUID))
	}
	return []*metaac.ConditionApplyConfiguration{ready, cond}
}

// healthEventMessage says what happened to the GPU, what it means for the pod and what to do.
func (d *Driver) healthEventMessage(ev gpu.HealthEvent) string {
	which := ev.UUID
	if g, ok := d.gpuByUUID(ev.UUID); ok {
		which = fmt.Sprintf("%s (%s on node %s)", ev.UUID, DeviceName(g.Index), d.cfg.NodeName)
	}
	taint := d.cfg.DriverName + "/" + contract.UnhealthyTaintKeySuffix
	switch {
	case ev.Healthy:
		return fmt.Sprintf("GPU %s is healthy again (%s): the taint %s is gone and new shares may be allocated on it; "+
			"a pod whose work failed on it can be recreated", which, ev.Reason, taint)
	case ev.Fatal:
		return fmt.Sprintf("GPU %s needs a reset: %s. The work on it is lost; its pods are evicted where DRA device taints "+
			"are enabled (taint %s, NoExecute). Delete the pod so that its controller recreates it on a healthy GPU; "+
			"the GPU is healthy again once it has been reset (NVML recovery action none)", which, ev.Reason, taint)
	default:
		return fmt.Sprintf("GPU %s is unhealthy: %s. Containers on it keep running but may fail; no new share is "+
			"allocated on it until it recovers (taint %s, NoSchedule). To move the pod to a healthy GPU, delete it and "+
			"let its controller recreate it", which, ev.Reason, taint)
	}
}

func (d *Driver) gpuByUUID(uuid string) (gpu.Device, bool) {
	i := slices.IndexFunc(d.devices, func(g gpu.Device) bool { return g.UUID == uuid })
	if i < 0 {
		return gpu.Device{}, false
	}
	return d.devices[i], true
}

// countTransition counts a change between healthy and unhealthy (gpu_health_transitions_total).
func (d *Driver) countTransition(ev gpu.HealthEvent) {
	g, ok := d.gpuByUUID(ev.UUID)
	if !ok {
		return
	}
	to := metrics.HealthTransitionUnhealthy
	if ev.Healthy {
		to = metrics.HealthTransitionHealthy
	}
	d.dra.GPUHealthTransitions.WithLabelValues(g.UUID, DeviceName(g.Index), to).Inc()
}

// initTransitionCounts makes every GPU's transition counters exist at 0, so that the first
// transition is an increase a query sees.
func (d *Driver) initTransitionCounts() {
	for _, g := range d.devices {
		for _, to := range []string{metrics.HealthTransitionUnhealthy, metrics.HealthTransitionHealthy} {
			d.dra.GPUHealthTransitions.WithLabelValues(g.UUID, DeviceName(g.Index), to).Add(0)
		}
	}
}
