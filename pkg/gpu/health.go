package gpu

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
)

// WatchHealth sends health changes until ctx ends. Every NVML failure — creating the event set,
// registering GPUs, waiting — is logged and retried with capped backoff on a fresh event set;
// WatchHealth itself returns nil when ctx ends, and an error only for a nil channel.
func (s *nvmlSource) WatchHealth(ctx context.Context, events chan<- HealthEvent) error {
	if events == nil {
		return errors.New("watch GPU health: nil events channel")
	}
	w := &healthWatch{
		src:    s,
		out:    events,
		logger: klog.FromContext(ctx).WithName("gpu-health"),
		state:  map[string]gpuHealth{},
	}
	delay := s.health.retryMin
	for {
		waited, err := w.run(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if waited {
			delay = s.health.retryMin
		}
		w.logger.Error(err, "GPU health watch interrupted, retrying", "after", delay)
		timer := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C:
		}
		delay = min(2*delay, s.health.retryMax)
	}
}

// gpuHealth is the last state WatchHealth reported for one GPU; the zero value is "not reported",
// which counts as healthy.
type gpuHealth struct {
	unhealthy, fatal bool
	// decayAt is set while the GPU is unhealthy only for XIDs outside both lists that came
	// with NVML's recovery action at none: nothing will ever say it recovered, so it is
	// healthy again once no such XID has come for the quiet period (decayAt). One tenant's
	// odd XID must not take a shared GPU out of every new allocation for good.
	decayAt time.Time
	// cause and repeats are the decaying fault's first reason and how often it came again.
	cause   string
	repeats int
}

// healthWatch is one WatchHealth call.
type healthWatch struct {
	src    *nvmlSource
	out    chan<- HealthEvent
	logger logr.Logger
	state  map[string]gpuHealth // by UUID, across retries
}

// run watches on one event set until ctx ends (nil) or NVML fails (the error). waited reports
// whether at least one wait succeeded, so that the caller restarts its backoff.
func (w *healthWatch) run(ctx context.Context) (waited bool, err error) {
	set, ret := w.src.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return false, fmt.Errorf("create NVML event set: %w", ret)
	}
	defer func() {
		if ret := set.Free(); ret != nvml.SUCCESS {
			w.logger.Error(ret, "Free NVML event set")
		}
	}()
	registered, err := w.register(ctx, set)
	if err != nil {
		return false, err
	}
	if registered == 0 {
		w.logger.Info("No GPU supports NVML health events; health watch idle")
		<-ctx.Done()
		return false, nil
	}
	waitMs := uint32(w.src.health.wait.Milliseconds())
	for ctx.Err() == nil {
		data, ret := set.Wait(waitMs)
		switch ret {
		case nvml.SUCCESS:
			w.handle(ctx, data)
		case nvml.ERROR_TIMEOUT:
		default:
			return waited, fmt.Errorf("wait for NVML events: %w", ret)
		}
		waited = true
		w.decay(ctx, time.Now())
	}
	return waited, nil
}

// register adds every GPU that supports health events to set and returns how many it added.
// A GPU that cannot be registered is logged and left out; one that NVML reports lost is
// reported unhealthy (fatal) at once. An error is returned only when no GPU could be
// registered because of failures (not because none supports events).
func (w *healthWatch) register(ctx context.Context, set nvml.EventSet) (int, error) {
	count, ret := w.src.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return 0, fmt.Errorf("count GPUs: %w", ret)
	}
	registered, failed := 0, 0
	var lastErr error
	for i := range count {
		err := w.registerDevice(ctx, set, i)
		switch {
		case err == nil:
			registered++
		case errors.Is(err, errNoHealthEvents):
			w.logger.Info("GPU has no health events; not watched", "position", i, "reason", err)
		default:
			failed++
			lastErr = err
			w.logger.Error(err, "GPU not watched for health", "position", i)
		}
	}
	if registered == 0 && failed > 0 {
		return 0, fmt.Errorf("register %d GPUs for health events: all failed, last: %w", failed, lastErr)
	}
	return registered, nil
}

// errNoHealthEvents marks a GPU that supports none of healthEventTypes.
var errNoHealthEvents = errors.New("GPU supports no health event type")

// registerDevice registers the health events of the GPU at position i that it supports.
func (w *healthWatch) registerDevice(ctx context.Context, set nvml.EventSet, i int) error {
	dev, ret := w.src.lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("open GPU %d: %w", i, ret)
	}
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("read UUID of GPU %d: %w", i, ret)
	}
	supported, ret := dev.GetSupportedEventTypes()
	if err := w.registrationError(ctx, uuid, "read supported events", ret); err != nil {
		return err
	}
	if supported&healthEventTypes == 0 {
		return fmt.Errorf("%w (supported %#x)", errNoHealthEvents, supported)
	}
	mask := supported & healthEventTypes
	ret = dev.RegisterEvents(mask, set)
	if ret == nvml.ERROR_NOT_SUPPORTED && mask&nvml.EventTypeGpuRecoveryAction != 0 && mask != nvml.EventTypeGpuRecoveryAction {
		// Recovery-action events are the newest type: a driver that lists it but refuses it
		// must not cost the GPU its XID events.
		mask &^= nvml.EventTypeGpuRecoveryAction
		ret = dev.RegisterEvents(mask, set)
	}
	if err := w.registrationError(ctx, uuid, "register events", ret); err != nil {
		return err
	}
	if mask&nvml.EventTypeGpuRecoveryAction != 0 {
		// A GPU that already waits for a reset when the watch starts (the plugin restarted
		// after the fault) sends no event until that changes.
		if verdict, reason := classifyRecoveryAction(recoveryAction(dev, uint64(nvml.GPU_RECOVERY_ACTION_NONE))); verdict != verdictRecovered {
			w.logger.Info("GPU waits for a recovery action", "uuid", uuid, "reason", reason)
			w.report(ctx, uuid, verdict, reason)
		}
	}
	return nil
}

// registrationError turns the result of one registration step into an error. NOT_SUPPORTED
// means the GPU has no usable events (vGPU guests and some boards refuse them although they
// list them); a GPU that NVML reports lost is reported fatal at once.
func (w *healthWatch) registrationError(ctx context.Context, uuid, step string, ret nvml.Return) error {
	switch ret {
	case nvml.SUCCESS:
		return nil
	case nvml.ERROR_NOT_SUPPORTED:
		return fmt.Errorf("%w: %s of GPU %s: %w", errNoHealthEvents, step, uuid, ret)
	case nvml.ERROR_GPU_IS_LOST:
		w.report(ctx, uuid, verdictFatal, "GPU is lost (NVML ERROR_GPU_IS_LOST)")
	}
	return fmt.Errorf("%s of GPU %s: %w", step, uuid, ret)
}

// handle classifies one NVML event and reports it when it changes the GPU's state.
func (w *healthWatch) handle(ctx context.Context, data nvml.EventData) {
	if data.Device == nil {
		w.logger.Info("NVML event without a GPU ignored", "eventType", data.EventType, "data", data.EventData)
		return
	}
	uuid, ret := data.Device.GetUUID()
	if ret != nvml.SUCCESS {
		w.logger.Error(ret, "NVML event for a GPU without UUID ignored", "eventType", data.EventType, "data", data.EventData)
		return
	}
	verdict, reason := classifyEvent(data.EventType, data.EventData)
	if data.EventType == nvml.EventTypeGpuRecoveryAction {
		verdict, reason = classifyRecoveryAction(recoveryAction(data.Device, data.EventData))
	}
	if verdict == verdictIgnore {
		// Application XIDs come with every crashing CUDA program: not worth a line by default.
		w.logger.V(1).Info("NVML event ignored", "uuid", uuid, "eventType", data.EventType, "data", data.EventData, "reason", reason)
		return
	}
	w.logger.Info("NVML health event", "uuid", uuid, "eventType", data.EventType, "data", data.EventData, "reason", reason)
	if verdict == verdictUnhealthy && data.EventType == nvml.EventTypeXidCriticalError && w.src.health.xidQuiet > 0 &&
		recoveryAction(data.Device, uint64(nvml.GPU_RECOVERY_ACTION_NONE)) == nvml.GPU_RECOVERY_ACTION_NONE {
		w.reportDecaying(ctx, uuid, reason, time.Now())
		return
	}
	w.report(ctx, uuid, verdict, reason)
}

// reportDecaying records an XID outside both lists that came with the recovery action at none:
// the GPU is unhealthy until the quiet period passes without another. A GPU unhealthy for a
// cause that does not decay (a recovery action pending) or fatal stays so.
func (w *healthWatch) reportDecaying(ctx context.Context, uuid, reason string, now time.Time) {
	prev := w.state[uuid]
	if prev.unhealthy && prev.decayAt.IsZero() {
		return
	}
	next := gpuHealth{unhealthy: true, decayAt: now.Add(w.src.health.xidQuiet), cause: reason}
	if prev.unhealthy {
		next.cause, next.repeats = prev.cause, prev.repeats+1
		w.state[uuid] = next
		w.logger.Info("GPU's XID came again: its quiet period starts over", "uuid", uuid, "reason", reason, "repeats", next.repeats, "healthyAt", next.decayAt)
		return
	}
	ev := HealthEvent{UUID: uuid, Healthy: false, Reason: reason}
	select {
	case w.out <- ev:
		w.state[uuid] = next
	case <-ctx.Done():
	}
}

// decay marks healthy again the GPUs whose decaying fault had its quiet period.
func (w *healthWatch) decay(ctx context.Context, now time.Time) {
	for uuid, st := range w.state {
		if !st.unhealthy || st.fatal || st.decayAt.IsZero() || now.Before(st.decayAt) {
			continue
		}
		reason := fmt.Sprintf("no XID for %s after %s (%d repeats), NVML recovery action none", w.src.health.xidQuiet, st.cause, st.repeats)
		w.logger.Info("GPU healthy again", "uuid", uuid, "reason", reason)
		w.report(ctx, uuid, verdictRecovered, reason)
	}
}

// report sends the GPU's new state if the verdict changes it: first fault, escalation to fatal,
// or recovery. A fatal GPU stays fatal until it recovers.
func (w *healthWatch) report(ctx context.Context, uuid string, verdict healthVerdict, reason string) {
	prev := w.state[uuid]
	next := prev
	switch verdict {
	case verdictIgnore:
		return
	case verdictUnhealthy:
		// A cause that does not decay ends a decaying fault's countdown.
		next = gpuHealth{unhealthy: true, fatal: prev.fatal}
	case verdictFatal:
		next = gpuHealth{unhealthy: true, fatal: true}
	case verdictRecovered:
		next = gpuHealth{}
	}
	if next.unhealthy == prev.unhealthy && next.fatal == prev.fatal {
		w.state[uuid] = next
		return
	}
	ev := HealthEvent{UUID: uuid, Healthy: !next.unhealthy, Fatal: next.fatal, Reason: reason}
	select {
	case w.out <- ev:
		w.state[uuid] = next
	case <-ctx.Done():
	}
}
