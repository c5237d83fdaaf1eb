package driver

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
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

// unprepareOne removes files first and the checkpoint entry last, so that a crash in between
// leaves an entry that the next Unprepare (or start-up recovery) completes.
func (d *Driver) unprepareOne(uid string) error {
	d.status.forget(uid)
	d.forgetPrepares(uid)
	if err := d.deps.CDI.Remove(uid); err != nil {
		return fmt.Errorf("remove CDI spec of claim %s: %w", uid, err)
	}
	if err := d.deps.Dirs.RemoveClaim(uid); err != nil {
		return fmt.Errorf("remove directory of claim %s: %w", uid, err)
	}
	if _, ok := d.deps.Checkpoint.Get(uid); !ok {
		d.deps.Quarantine.clear(uid)
		return nil
	}
	if err := d.deps.Checkpoint.Update(func(data *checkpoint.Data) error {
		delete(data.Claims, uid)
		return nil
	}); err != nil {
		return fmt.Errorf("remove claim %s from checkpoint: %w", uid, err)
	}
	d.deps.Quarantine.clear(uid)
	return nil
}
