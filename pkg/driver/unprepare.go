package driver

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin: it removes the CDI spec, the claim
// directory (with every container directory the NRI plugin missed) and the checkpoint entry.
// Idempotent: a claim that is unknown or only half prepared is not an error.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	results := perClaim(claims, func(c kubeletplugin.NamespacedObject) types.UID { return c.UID },
		func(claim kubeletplugin.NamespacedObject) error {
			start := d.now()
			unlock := d.locks.lock(string(claim.UID))
			err := d.unprepareOne(string(claim.UID))
			unlock()
			d.deps.Metrics.UnprepareDuration.Observe(d.now().Sub(start).Seconds())
			if err != nil {
				d.deps.Metrics.UnprepareErrors.WithLabelValues(metrics.ReasonUnprepareFailure).Inc()
				klog.FromContext(ctx).Error(err, "Unpreparing claim failed", "claim", claim.NamespacedName, "uid", claim.UID)
			} else {
				klog.FromContext(ctx).V(2).Info("Unprepared claim", "claim", claim.NamespacedName, "uid", claim.UID)
			}
			return err
		})
	d.updateGauges()
	return results, nil
}

// unprepareOne removes the CDI spec, then the checkpoint record, and leaves the claim
// directory to the background (removal.go). The record's removal is not waited for on disk
// (RemoveDeferred): the kubelet never asks about an unprepared claim again, and the next write
// carries it. A crash at any point leaves either a record that start-up recovery restores and
// the reconciliation with the API server unprepares, or files of a claim the checkpoint does
// not know, which start-up removes.
func (d *Driver) unprepareOne(uid string) error {
	d.status.forget(uid)
	d.forgetPrepares(uid)
	if err := d.withFiles(func() error { return d.deps.CDI.Remove(uid) }); err != nil {
		return fmt.Errorf("remove CDI spec of claim %s: %w", uid, err)
	}
	d.at(StepUnprepareCDISpec)
	if c, ok := d.deps.Checkpoint.Get(uid); ok {
		if err := d.releaseMIG(uid, c.Devices); err != nil {
			return fmt.Errorf("unprepare claim %s: %w", uid, err)
		}
	}
	d.at(StepUnprepareMIG)
	d.deps.Checkpoint.RemoveDeferred(uid)
	d.deps.Quarantine.clear(uid)
	d.at(StepUnprepareRemoved)
	d.removals.add(uid)
	return nil
}
