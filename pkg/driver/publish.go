package driver

import (
	"context"
	"fmt"
	"time"

	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
)

// Defaults of PublishTiming (contract §2).
const (
	defaultPublishRetryMin = time.Second
	defaultPublishRetryMax = 30 * time.Second
	defaultPublishResync   = 30 * time.Second
)

// PublishTiming paces ResourceSlice publishing.
type PublishTiming struct {
	// RetryMin and RetryMax bound the backoff between failed attempts (1 s doubling to 30 s).
	RetryMin, RetryMax time.Duration
	// Resync hands the current slice to the helper again this often, although nothing
	// changed (30 s). The helper's controller retries a failed API write by itself, but its
	// backoff grows to about 17 minutes; a fresh hand-over makes it try again at once, so a
	// taint or its removal reaches the API server within Resync of the API server's return.
	Resync time.Duration
}

func (t PublishTiming) withDefaults() PublishTiming {
	if t.RetryMin <= 0 {
		t.RetryMin = defaultPublishRetryMin
	}
	if t.RetryMax < t.RetryMin {
		t.RetryMax = max(defaultPublishRetryMax, t.RetryMin)
	}
	if t.Resync <= 0 {
		t.Resync = defaultPublishResync
	}
	return t
}

// Start publishes the ResourceSlice through p and follows GPU health events (when events is
// not nil) until ctx ends. Publishing runs in the background and is retried: the first publish
// waits for the API server (the helper syncs an informer), and a plugin that cannot reach it
// yet should still answer the kubelet and its probes, and shut down promptly on SIGTERM.
func (d *Driver) Start(ctx context.Context, p Publisher, events <-chan gpu.HealthEvent) {
	d.StartPublishing(ctx, p, events)
	d.StartStatusWriter(ctx)
}

// StartPublishing is Start without the claim status writer: what an owner of the node runs, and
// stops when it hands the node over (contract §14), while the status writes it queued for the
// claims it prepared go on (StartStatusWriter, on a context of their own).
func (d *Driver) StartPublishing(ctx context.Context, p Publisher, events <-chan gpu.HealthEvent) {
	d.publisher = p
	go d.runPublisher(ctx)
	d.requestPublish()
	if events != nil {
		go d.runHealthEvents(ctx, events)
	}
}

// StartStatusWriter writes the claims' device status in the background until ctx ends.
func (d *Driver) StartStatusWriter(ctx context.Context) { go d.status.run(ctx) }

// requestPublish asks the publishing loop to publish the current state; it never blocks.
func (d *Driver) requestPublish() {
	select {
	case d.publishKick <- struct{}{}:
	default: // a request is already pending; it will read the state as it is then
	}
}

// runPublisher is the one writer of the ResourceSlice: every request publishes the state as it
// is at that moment, and a failed attempt is retried with backoff until one succeeds — a health
// change is never lost to a failed republish, and two changes never race each other to the
// helper.
func (d *Driver) runPublisher(ctx context.Context) {
	timing := d.cfg.Publish.withDefaults()
	logger := klog.FromContext(ctx)
	resync := time.NewTicker(timing.Resync)
	defer resync.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.publishKick:
		case <-resync.C:
		}
		backoff := timing.RetryMin
		for {
			err := d.publish(ctx)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return
			}
			d.dra.SlicePublishErrors.Inc()
			logger.Error(err, "Publishing ResourceSlice failed; retrying", "after", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, timing.RetryMax)
		}
	}
}

func (d *Driver) publish(ctx context.Context) error {
	if d.publisher == nil {
		return nil
	}
	res := d.buildResources(klog.FromContext(ctx))
	if err := d.publisher.PublishResources(ctx, res); err != nil {
		return fmt.Errorf("publish ResourceSlice for node %s: %w", d.cfg.NodeName, err)
	}
	d.deps.Metrics.PublishedDevices.Set(float64(len(d.devices)))
	klog.FromContext(ctx).V(5).Info("Handed the ResourceSlice to the helper", "node", d.cfg.NodeName, "devices", len(d.devices))
	return nil
}
