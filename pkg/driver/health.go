package driver

import (
	"context"
	"sync"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
)

// healthResendInterval re-sends the full report well inside the kubelet's 30 s staleness window.
const healthResendInterval = 10 * time.Second

// healthCheckTimeout tells the kubelet how long a report stays valid.
const healthCheckTimeout = 30 * time.Second

// deviceHealth tracks which GPUs are unhealthy and wakes watchers on every change.
type deviceHealth struct {
	mu      sync.Mutex
	bad     map[string]gpu.HealthEvent // by GPU UUID; absent = healthy
	changed chan struct{}              // closed and replaced on every change
	// transitionAt is, by GPU UUID, when the GPU last went from healthy to unhealthy or back
	// (absent: never, in this process): the Healthy condition's lastTransitionTime.
	transitionAt map[string]time.Time
}

func newDeviceHealth() *deviceHealth {
	return &deviceHealth{bad: map[string]gpu.HealthEvent{}, changed: make(chan struct{}), transitionAt: map[string]time.Time{}}
}

// set records an event; changed reports whether the device's health changed (a new reason of an
// unhealthy GPU too), transition whether it went from healthy to unhealthy or back.
func (h *deviceHealth) set(ev gpu.HealthEvent, now time.Time) (changed, transition bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	old, wasBad := h.bad[ev.UUID]
	if ev.Healthy {
		if !wasBad {
			return false, false
		}
		delete(h.bad, ev.UUID)
	} else {
		if wasBad && old == ev {
			return false, false
		}
		h.bad[ev.UUID] = ev
	}
	transition = wasBad == ev.Healthy
	if transition {
		h.transitionAt[ev.UUID] = now
	}
	close(h.changed)
	h.changed = make(chan struct{})
	return true, transition
}

// lastTransition is when the GPU last went from healthy to unhealthy or back; false if never.
func (h *deviceHealth) lastTransition(uuid string) (time.Time, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	at, ok := h.transitionAt[uuid]
	return at, ok
}

func (h *deviceHealth) unhealthy(uuid string) (gpu.HealthEvent, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ev, ok := h.bad[uuid]
	return ev, ok
}

func (h *deviceHealth) watch() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.changed
}

// runHealthEvents consumes the GPU source's health events until ctx ends: it records them,
// asks for the ResourceSlice to be published again (taints; retried until it succeeds), wakes
// WatchHealthStatus streams, counts the transitions and hands the change to the claims on the
// GPU (healthstatus.go), which never holds up the next event.
func (d *Driver) runHealthEvents(ctx context.Context, events <-chan gpu.HealthEvent) {
	logger := klog.FromContext(ctx)
	d.initTransitionCounts()
	notices := newHealthNotices()
	go d.runHealthNotices(ctx, notices)
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-events:
			changed, transition := d.health.set(ev, d.now())
			if !changed {
				continue
			}
			logger.Info("GPU health changed", "uuid", ev.UUID, "healthy", ev.Healthy, "fatal", ev.Fatal, "reason", ev.Reason)
			d.requestPublish()
			if transition {
				d.countTransition(ev)
			}
			notices.add(healthNotice{event: ev, transition: transition})
		}
	}
}

// WatchHealthStatus implements kubeletplugin.DRAPlugin: a full report first, a report of the
// changed devices on every change, and the full report again before the kubelet's staleness
// window closes.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	send := func(r kubeletplugin.DeviceHealthReport) bool {
		select {
		case <-ctx.Done():
			return false
		case reports <- r:
			return true
		}
	}
	ticker := time.NewTicker(healthResendInterval)
	defer ticker.Stop()
	last := d.healthReport(nil)
	if !send(last) {
		return nil
	}
	for {
		changed := d.health.watch()
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
			last = d.healthReport(nil)
			if !send(last) {
				return nil
			}
		case <-changed:
			full := d.healthReport(nil)
			if diff := changedDevices(last, full); len(diff.Devices) > 0 && !send(diff) {
				return nil
			}
			last = full
		}
	}
}

// healthReport covers every published device (only is nil) or the named ones: each GPU and
// each of its MIG partitions, which are as healthy as their GPU.
func (d *Driver) healthReport(only map[string]bool) kubeletplugin.DeviceHealthReport {
	now := d.now()
	var r kubeletplugin.DeviceHealthReport
	for _, g := range d.devices {
		names := []string{DeviceName(g.Index)}
		if l, ok := d.deps.MIGLayouts[g.UUID]; ok {
			for _, m := range migDevicesOf(g, l) {
				names = append(names, MIGDeviceName(g.Index, m.profile.Name, m.at.Start))
			}
		}
		for _, name := range names {
			if only == nil || only[name] {
				r.Devices = append(r.Devices, d.deviceHealth(g, name, now))
			}
		}
	}
	return r
}

func (d *Driver) deviceHealth(g gpu.Device, name string, now time.Time) kubeletplugin.DeviceHealth {
	dh := kubeletplugin.DeviceHealth{
		PoolName: d.cfg.NodeName, DeviceName: name, Health: kubeletplugin.HealthStatusHealthy,
		LastUpdated: now, HealthCheckTimeout: healthCheckTimeout,
	}
	if ev, bad := d.health.unhealthy(g.UUID); bad {
		dh.Health = kubeletplugin.HealthStatusUnhealthy
		dh.Message = ev.Reason
	}
	return dh
}

func changedDevices(before, after kubeletplugin.DeviceHealthReport) kubeletplugin.DeviceHealthReport {
	old := map[string]kubeletplugin.DeviceHealth{}
	for _, dh := range before.Devices {
		old[dh.DeviceName] = dh
	}
	var out kubeletplugin.DeviceHealthReport
	for _, dh := range after.Devices {
		if o, ok := old[dh.DeviceName]; !ok || o.Health != dh.Health || o.Message != dh.Message {
			out.Devices = append(out.Devices, dh)
		}
	}
	return out
}
