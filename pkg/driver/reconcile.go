package driver

import (
	"context"
	"fmt"
	"slices"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// The kubelet unprepares a claim when its last pod on the node is gone; it misses that when the
// plugin is not there to be called (a node drained while the plugin was down, a plugin
// uninstalled and installed again), and the claim's directories, CDI spec, capacity and
// checkpoint entry stay for ever. The reconciliation asks the API server about every claim
// prepared here, once at start-up and then periodically, and unprepares those that are no
// longer in use on this node.

// RunReconcile reconciles at once and then every interval until ctx ends (interval ≤ 0: once).
// API errors are counted and logged; the next pass tries again.
// A pass that had to leave stale claims because it could not tell yet whether containers use
// them (the NRI cache is rebuilt only once the runtime has synchronized, which may come after
// the start-up pass) runs again after deferredRetry, for at most deferredRetries passes, before
// the regular interval takes over.
const (
	deferredRetry   = time.Second
	deferredRetries = 120
)

func (d *Driver) RunReconcile(ctx context.Context, interval time.Duration) {
	logger := klog.FromContext(ctx).WithName("reconcile")
	ctx = klog.NewContext(ctx, logger)
	retries := 0
	for {
		n, deferred, err := d.reconcile(ctx)
		switch {
		case err != nil:
			logger.Error(err, "Reconciling prepared claims with the API server failed; the next pass tries again", "unprepared", n)
		case n > 0:
			logger.Info("Unprepared claims that are no longer in use on this node", "unprepared", n)
		}
		wait := interval
		if deferred > 0 && retries < deferredRetries {
			retries++
			wait = deferredRetry
		} else if deferred == 0 {
			retries = 0
		}
		if wait <= 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// Reconcile checks every completed claim of the checkpoint against the API server and
// unprepares those that are no longer in use on this node (staleReason) — unless a container
// of the node still runs with it (inuse.go). One pass runs at a time. It returns how many
// it unprepared and the first error (each claim is tried whatever happened to the others).
func (d *Driver) Reconcile(ctx context.Context) (int, error) {
	n, _, err := d.reconcile(ctx)
	return n, err
}

// reconcile is Reconcile; deferred counts the stale claims left because whether containers
// use them was not known yet.
func (d *Driver) reconcile(ctx context.Context) (unprepared, deferred int, firstErr error) {
	if d.deps.Claims == nil {
		return 0, 0, nil
	}
	kept := map[string]bool{} // stale claims kept for their running containers
	defer d.forgetInUse(kept)
	for uid, c := range d.deps.Checkpoint.Snapshot().Claims {
		if c.State != checkpoint.PrepareCompleted {
			continue // a Prepare in flight; start-up recovery rolls back a crashed one
		}
		seen := d.prepareCount(uid)
		api, err := d.deps.Claims.Get(ctx, c.Namespace, c.Name)
		if err != nil && !apierrors.IsNotFound(err) {
			d.dra.ReconcileErrors.Inc()
			firstErr = cmpErr(firstErr, fmt.Errorf("read claim %s/%s: %w", c.Namespace, c.Name, err))
			continue
		}
		if err != nil {
			api = nil
		}
		reason := d.staleReason(uid, c, api)
		if reason == "" {
			continue
		}
		if d.deps.Users != nil {
			users, err := d.deps.Users.Users(uid, c)
			if err != nil {
				klog.FromContext(ctx).V(2).Info("Leaving a stale claim for the next pass: whether containers still use it is not known yet", "claim", klog.KRef(c.Namespace, c.Name), "uid", uid, "reason", reason, "cause", err.Error())
				kept[uid] = d.isKeptInUse(uid)
				deferred++
				continue
			}
			if len(users) > 0 {
				stopped, err := d.keepInUse(ctx, uid, c, reason, users)
				if err != nil {
					d.dra.ReconcileErrors.Inc()
					firstErr = cmpErr(firstErr, err)
				}
				if !stopped {
					kept[uid] = true
					continue
				}
			}
		}
		done, err := d.unprepareStale(ctx, uid, c, seen, reason)
		if err != nil {
			d.dra.ReconcileErrors.Inc()
			firstErr = cmpErr(firstErr, err)
		}
		if done {
			unprepared++
		}
	}
	return unprepared, deferred, firstErr
}

// staleReason says why a claim prepared here is no longer in use on this node, "" when it is:
//   - deleted: the API server has no claim of that name, or one with another UID;
//   - deallocated: it is no longer allocated the devices it was prepared with (deallocated, or
//     allocated again elsewhere or to other shares — the kubelet prepares that anew);
//   - not_reserved: it is reserved for no consumer. A claim allocated to this node's devices
//     can only be reserved for pods of this node, and the claim controller removes a pod from
//     reservedFor only once it will not run any more.
func (d *Driver) staleReason(uid string, prepared checkpoint.Claim, api *resourceapi.ResourceClaim) string {
	switch {
	case api == nil || string(api.UID) != uid:
		return metrics.ReconcileDeleted
	case api.Status.Allocation == nil || !sameAllocation(d.cfg.DriverName, prepared, api.Status.Allocation):
		return metrics.ReconcileDeallocated
	case len(api.Status.ReservedFor) == 0:
		return metrics.ReconcileNotReserved
	}
	return ""
}

// sameAllocation reports whether every device the claim was prepared with is still one of its
// allocation results of this driver (same request, pool, device and share).
func sameAllocation(driverName string, prepared checkpoint.Claim, alloc *resourceapi.AllocationResult) bool {
	for _, dev := range prepared.Devices {
		if !slices.ContainsFunc(alloc.Devices.Results, func(r resourceapi.DeviceRequestAllocationResult) bool {
			share := ""
			if r.ShareID != nil {
				share = string(*r.ShareID)
			}
			return r.Driver == driverName && r.Request == dev.Request && r.Pool == dev.Pool && r.Device == dev.Device && share == dev.ShareID
		}) {
			return false
		}
	}
	return true
}

// unprepareStale unprepares a claim found stale, unless a Prepare of it ran since seen was
// taken (the API server was read before that Prepare: what it said is out of date).
func (d *Driver) unprepareStale(ctx context.Context, uid string, c checkpoint.Claim, seen uint64, reason string) (bool, error) {
	unlock := d.locks.lock(uid)
	defer unlock()
	if d.prepareCount(uid) != seen {
		return false, nil
	}
	if _, ok := d.deps.Checkpoint.Get(uid); !ok {
		return false, nil // the kubelet unprepared it meanwhile
	}
	if err := d.unprepareOne(uid); err != nil {
		return false, fmt.Errorf("unprepare stale claim %s/%s (%s): %w", c.Namespace, c.Name, uid, err)
	}
	d.status.forget(uid)
	d.dra.ReconciledClaims.WithLabelValues(reason).Inc()
	d.updateGauges()
	klog.FromContext(ctx).Info("Unprepared a claim that is no longer in use on this node", "claim", klog.KRef(c.Namespace, c.Name), "uid", uid, "reason", reason)
	return true, nil
}

// notePrepare records a Prepare of the claim with a number no Prepare had before; the caller
// holds the claim's lock.
func (d *Driver) notePrepare(uid string) {
	d.preparesMu.Lock()
	d.prepareSeq++
	d.prepares[uid] = d.prepareSeq
	d.preparesMu.Unlock()
}

// forgetPrepares drops the claim's record once it is unprepared (the map stays as small as the
// checkpoint); a later Prepare gets a new number, so a reconciliation pass that saw the old one
// still leaves the claim alone.
func (d *Driver) forgetPrepares(uid string) {
	d.preparesMu.Lock()
	delete(d.prepares, uid)
	d.preparesMu.Unlock()
}

func (d *Driver) prepareCount(uid string) uint64 {
	d.preparesMu.Lock()
	defer d.preparesMu.Unlock()
	return d.prepares[uid]
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}
