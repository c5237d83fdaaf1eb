package driver

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	metaac "k8s.io/client-go/applyconfigurations/meta/v1"
	resourceac "k8s.io/client-go/applyconfigurations/resource/v1"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/api/v1alpha1"
	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// Defaults of the status writer's retries.
const (
	statusRetryMin = 500 * time.Millisecond
	statusRetryMax = 30 * time.Second
	// statusMessageMax bounds a condition's message (the API allows 32 KiB).
	statusMessageMax = 1024
	// statusSettle: writes wait until no update was queued for this long, so that a burst of
	// Prepares (a Job's pods, a node's restart) does not share the node's and the API server's
	// CPU with server-side applies; an update waits at most statusSettleMax for the burst to
	// end. A claim unprepared meanwhile is not written at all (forget).
	statusSettle    = 20 * time.Millisecond
	statusSettleMax = time.Second
)

// statusWriter writes the claims' device status (contract §3, "Claim device status") in the
// background: Prepare only records what to write and answers the kubelet without an API round
// trip. A claim's newest update replaces an older one still waiting; a write the API server
// refuses for a reason that can pass (conflict, timeout, unavailable) is retried with backoff, one
// it refuses for good (the claim is gone, the write is not allowed or invalid) is dropped.
type statusWriter struct {
	api      ClaimAPI
	manager  string // field manager: contract.DeviceFieldManagerPrefix + node
	now      func() time.Time
	metrics  *metrics.DRAMetrics
	retryMin time.Duration
	retryMax time.Duration
	// settle and settleMax: statusSettle and statusSettleMax (0 in tests that write at once)
	settle, settleMax time.Duration
	kick              chan struct{}
	mu                sync.Mutex
	pending           map[string]*statusUpdate // by claim UID
	written           map[string][32]byte      // by claim UID: the last content written (times left out)
	// inflight are the claims (UIDs) whose write is under way: what lands may differ from
	// written, so an update is not compared with it meanwhile.
	inflight map[string]struct{}
	// lastQueued is when enqueue last queued an update.
	lastQueued time.Time
	// processed, when set (tests), is called after each update was written, dropped or put
	// back for a retry.
	processed func()
}

// statusUpdate is one claim's device status waiting to be written.
type statusUpdate struct {
	namespace, name string
	uid             types.UID
	devices         []*resourceac.AllocatedDeviceStatusApplyConfiguration
	digest          [32]byte
	queued          time.Time // when the claim's first update still waiting was queued
	attempts        int
	notBefore       time.Time
}

func newStatusWriter(api ClaimAPI, node string, now func() time.Time, m *metrics.DRAMetrics) *statusWriter {
	return &statusWriter{
		api: api, manager: contract.DeviceFieldManagerPrefix + node, now: now, metrics: m,
		retryMin: statusRetryMin, retryMax: statusRetryMax, settle: statusSettle, settleMax: statusSettleMax,
		kick:    make(chan struct{}, 1),
		pending: map[string]*statusUpdate{}, written: map[string][32]byte{}, inflight: map[string]struct{}{},
	}
}

// enqueue records the claim's device status to be written; it never blocks and does no I/O.
func (w *statusWriter) enqueue(claim *resourceapi.ResourceClaim, devices []*resourceac.AllocatedDeviceStatusApplyConfiguration) {
	if w == nil || w.api == nil || len(devices) == 0 {
		return
	}
	digest := statusDigest(devices)
	uid := string(claim.UID)
	w.mu.Lock()
	if _, busy := w.inflight[uid]; !busy {
		if last, ok := w.written[uid]; ok && last == digest {
			delete(w.pending, uid)
			w.mu.Unlock()
			return // already there: a repeated Prepare of a claim costs no write
		}
	}
	now := w.now()
	queued := now
	if older, ok := w.pending[uid]; ok {
		queued = older.queued // a newer update of the claim does not wait longer than the first
	}
	w.pending[uid] = &statusUpdate{namespace: claim.Namespace, name: claim.Name, uid: claim.UID, devices: devices, digest: digest, queued: queued}
	w.lastQueued = now
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// forget drops what is known of a claim being unprepared: nothing more is written for it.
func (w *statusWriter) forget(uid string) {
	if w == nil {
		return
	}
	w.mu.Lock()
	delete(w.pending, uid)
	delete(w.written, uid)
	w.mu.Unlock()
}

// run writes pending updates until ctx ends.
func (w *statusWriter) run(ctx context.Context) {
	if w == nil || w.api == nil {
		return
	}
	logger := klog.FromContext(ctx)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := w.writeDue(ctx, logger)
		wait := time.Hour
		if !next.IsZero() {
			wait = max(next.Sub(w.now()), time.Millisecond)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
		case <-timer.C:
		}
	}
}

// writeDue writes every pending update whose time has come and returns when the next one is
// due (zero when none waits).
func (w *statusWriter) writeDue(ctx context.Context, logger klog.Logger) time.Time {
	for {
		now := w.now()
		var next time.Time
		var due *statusUpdate
		w.mu.Lock()
		settled := w.lastQueued.Add(w.settle)
		for _, u := range w.pending {
			at := u.notBefore
			if now.Before(settled) { // a burst is under way: wait for its end, or settleMax
				at = later(at, earlier(settled, u.queued.Add(w.settleMax)))
			}
			if !at.After(now) {
				if due == nil || u.queued.Before(due.queued) {
					due = u // the oldest first: a burst's statuses land in the order they came
				}
				continue
			}
			if next.IsZero() || at.Before(next) {
				next = at
			}
		}
		if due != nil {
			delete(w.pending, string(due.uid))
			w.inflight[string(due.uid)] = struct{}{}
		}
		w.mu.Unlock()
		if due == nil {
			return next
		}
		if ctx.Err() != nil {
			w.landed(due)
			return next
		}
		w.write(ctx, logger, due)
		w.landed(due)
		if w.processed != nil {
			w.processed()
		}
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// landed ends the update's write: later updates of the claim compare with written again.
func (w *statusWriter) landed(u *statusUpdate) {
	w.mu.Lock()
	delete(w.inflight, string(u.uid))
	w.mu.Unlock()
}

// write applies one update and decides what a failure means.
func (w *statusWriter) write(ctx context.Context, logger klog.Logger, u *statusUpdate) {
	apply := resourceac.ResourceClaim(u.name, u.namespace).WithUID(u.uid).
		WithStatus(resourceac.ResourceClaimStatus().WithDevices(u.devices...))
	err := w.api.ApplyStatus(ctx, apply)
	logger = logger.WithValues("claim", klog.KRef(u.namespace, u.name), "uid", u.uid)
	switch {
	case err == nil:
		w.metrics.ClaimStatusWrites.WithLabelValues(metrics.StatusWritten).Inc()
		w.mu.Lock()
		w.written[string(u.uid)] = u.digest
		w.mu.Unlock()
		logger.V(4).Info("Wrote the claim's device status", "devices", len(u.devices))
	case permanentStatusError(err):
		w.metrics.ClaimStatusWrites.WithLabelValues(metrics.StatusDropped).Inc()
		logger.Error(err, "The API server refused the claim's device status; not retried")
	default:
		w.metrics.ClaimStatusWrites.WithLabelValues(metrics.StatusRetried).Inc()
		u.attempts++
		delay := min(w.retryMin<<min(u.attempts-1, 16), w.retryMax)
		u.notBefore = w.now().Add(delay)
		logger.Error(err, "Writing the claim's device status failed; retrying", "after", delay)
		w.mu.Lock()
		if _, newer := w.pending[string(u.uid)]; !newer {
			w.pending[string(u.uid)] = u
		}
		w.mu.Unlock()
	}
}

// permanentStatusError says that writing again cannot help: the claim is gone or was replaced
// (a UID that does not match is a conflict on apply), the caller may not write it (RBAC, the
// node policy), or the content is invalid.
func permanentStatusError(err error) bool {
	return apierrors.IsNotFound(err) || apierrors.IsForbidden(err) || apierrors.IsInvalid(err) ||
		apierrors.IsConflict(err) || apierrors.IsGone(err) || apierrors.IsMethodNotSupported(err)
}

// statusDigest hashes what the devices say, transition times left out, so that an unchanged
// status is not written again.
func statusDigest(devices []*resourceac.AllocatedDeviceStatusApplyConfiguration) [32]byte {
	h := sha256.New()
	for _, d := range devices {
		c := *d
		c.Conditions = nil
		b, _ := json.Marshal(c)
		h.Write(b)
		for _, cond := range d.Conditions {
			cc := cond // a copy (Conditions holds values): the caller's keeps its time
			cc.LastTransitionTime = nil
			b, _ := json.Marshal(cc)
			h.Write(b)
		}
	}
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

// preparedStatus is the status of every result of a prepared claim: Ready with the data a user
// reads (GPU, granted memory and cores, a share's class and burst ceiling, path).
func (d *Driver) preparedStatus(claim *resourceapi.ResourceClaim, prepared checkpoint.Claim) []*resourceac.AllocatedDeviceStatusApplyConfiguration {
	now := metav1.NewTime(d.now())
	out := make([]*resourceac.AllocatedDeviceStatusApplyConfiguration, 0, len(prepared.Devices))
	for _, dev := range prepared.Devices {
		g := d.byName[dev.Device]
		data := contract.DeviceStatusData{
			Request: dev.Request, GPUUUID: dev.GPUUUID, ProductName: g.ProductName, Index: dev.Index,
			AdminAccess: dev.AdminAccess, Path: prepared.Path, MIGProfile: dev.MIG.Profile, MIGUUID: dev.MIG.UUID,
		}
		if !dev.AdminAccess {
			mem, cores := dev.MemoryBytes, dev.Cores
			if mem == 0 {
				mem = d.deviceMemory(dev.Device)
			}
			if cores == 0 {
				cores = coresTotal
			}
			data.Memory, data.Cores = resource.NewQuantity(mem, resource.BinarySI).String(), cores
		}
		if !dev.AdminAccess && dev.Cores > 0 {
			// Only a share with a core limit has compute terms (contract §16): a whole GPU and
			// admin access are not divided.
			data.Class = cmp.Or(dev.Class, string(v1alpha1.Guaranteed))
			if c := dev.Ceiling(); c > dev.Cores {
				data.CoresCeiling = c
			}
		}
		raw, _ := json.Marshal(data)
		msg := fmt.Sprintf("prepared on node %s: GPU %s", d.cfg.NodeName, dev.GPUUUID)
		cond := metaac.Condition().WithType(contract.DeviceConditionReady).WithStatus(metav1.ConditionTrue).
			WithReason(contract.DeviceReasonPrepared).WithMessage(msg).WithLastTransitionTime(now).
			WithObservedGeneration(claim.Generation)
		out = append(out, deviceStatus(d.cfg.DriverName, dev.Pool, dev.Device, dev.ShareID).
			WithConditions(d.withHealthCondition(cond, dev.GPUUUID, claim.Generation)...).WithData(runtime.RawExtension{Raw: raw}))
	}
	return out
}

// failedStatus is the status of a claim whose Prepare failed: Ready=False with the reason, for
// every result of this driver in this node's pool.
func (d *Driver) failedStatus(claim *resourceapi.ResourceClaim, err error) []*resourceac.AllocatedDeviceStatusApplyConfiguration {
	if claim.Status.Allocation == nil {
		return nil
	}
	now := metav1.NewTime(d.now())
	reason := conditionReason(reasonOf(err))
	msg := truncateUTF8(err.Error(), statusMessageMax)
	var out []*resourceac.AllocatedDeviceStatusApplyConfiguration
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != d.cfg.DriverName || r.Pool != d.cfg.NodeName {
			continue // another driver's, or another node's: not this plugin's to write
		}
		share := ""
		if r.ShareID != nil {
			share = string(*r.ShareID)
		}
		raw, _ := json.Marshal(contract.DeviceStatusData{Request: r.Request})
		cond := metaac.Condition().WithType(contract.DeviceConditionReady).WithStatus(metav1.ConditionFalse).
			WithReason(reason).WithMessage(msg).WithLastTransitionTime(now).WithObservedGeneration(claim.Generation)
		out = append(out, deviceStatus(d.cfg.DriverName, r.Pool, r.Device, share).
			WithConditions(cond).WithData(runtime.RawExtension{Raw: raw}))
	}
	return out
}

func deviceStatus(driver, pool, device, shareID string) *resourceac.AllocatedDeviceStatusApplyConfiguration {
	s := resourceac.AllocatedDeviceStatus().WithDriver(driver).WithPool(pool).WithDevice(device)
	if shareID != "" {
		s = s.WithShareID(shareID)
	}
	return s
}

// conditionReason turns a metric reason ("unhealthy_device") into a condition reason
// ("UnhealthyDevice"), which must be CamelCase.
func conditionReason(metricReason string) string {
	var b strings.Builder
	for _, part := range strings.Split(metricReason, "_") {
		if part != "" {
			b.WriteString(strings.ToUpper(part[:1]) + part[1:])
		}
	}
	if b.Len() == 0 {
		return "PrepareFailed"
	}
	return b.String()
}

func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}
