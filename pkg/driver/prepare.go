package driver

import (
	"context"
	"errors"
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/cdi"
	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// PrepareResourceClaims implements kubeletplugin.DRAPlugin. Claims of one call are prepared in
// parallel (the checkpoint's group commit coalesces their writes); each claim under its own lock.
//
// Must be idempotent: the kubelet calls it again after its own restart and after a reboot, and
// retries failures. A claim found completed in the checkpoint gets any missing file re-created
// before the answer (a reboot empties /var/run/cdi; answering from the checkpoint alone leaves
// the pod in CreateContainerError — kubernetes issue 141433).
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	results := perClaim(claims, func(c *resourceapi.ResourceClaim) types.UID { return c.UID },
		func(claim *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
			start := d.now()
			devices, err := d.prepareOne(ctx, claim)
			d.deps.Metrics.PrepareDuration.Observe(d.now().Sub(start).Seconds())
			if err != nil {
				d.deps.Metrics.PrepareErrors.WithLabelValues(reasonOf(err)).Inc()
				klog.FromContext(ctx).Error(err, "Preparing claim failed", "claim", klog.KObj(claim))
			}
			return kubeletplugin.PrepareResult{Devices: devices, Err: err}
		})
	d.updateGauges()
	return results, nil
}

func reasonOf(err error) string {
	var pe *prepareError
	if errors.As(err, &pe) {
		return pe.reason
	}
	return metrics.ReasonFilesystem
}

// prepareOne prepares one claim under its lock and returns the devices the kubelet is told. The
// claim's device status is queued under the same lock, so that an Unprepare that follows drops
// it; it is written in the background, and the kubelet's answer waits for no API round trip.
func (d *Driver) prepareOne(ctx context.Context, claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	uid := string(claim.UID)
	unlock := d.locks.lock(uid)
	defer unlock()
	d.notePrepare(uid)
	prepared, devices, err := d.prepareLocked(ctx, claim)
	switch {
	case d.status == nil:
	case err != nil:
		d.status.enqueue(claim, d.failedStatus(claim, err))
	default:
		d.status.enqueue(claim, d.preparedStatus(claim, prepared))
	}
	if err != nil {
		return nil, err
	}
	return devices, nil
}

func (d *Driver) prepareLocked(ctx context.Context, claim *resourceapi.ResourceClaim) (checkpoint.Claim, []kubeletplugin.Device, error) {
	uid := string(claim.UID)
	logger := klog.FromContext(ctx)

	reservedFor := ReservedPods(claim)
	if prepared, ok := d.deps.Checkpoint.Get(uid); ok && prepared.State == checkpoint.PrepareCompleted {
		if err := d.withFiles(func() error { return d.ensureFiles(uid, prepared) }); err != nil {
			return checkpoint.Claim{}, nil, fmt.Errorf("re-create files of prepared claim %s: %w", klog.KObj(claim), err)
		}
		d.deps.Quarantine.clear(uid) // restored
		if err := d.deps.Checkpoint.SetReservedFor(uid, reservedFor); err != nil {
			return checkpoint.Claim{}, nil, &prepareError{reason: metrics.ReasonCheckpoint, err: fmt.Errorf("record reservedFor of claim %s: %w", klog.KObj(claim), err)}
		}
		logger.V(4).Info("Claim already prepared", "claim", klog.KObj(claim))
		return prepared, resultDevices(prepared.Devices), nil
	}

	devs, err := d.devicesOf(claim)
	if err != nil {
		return checkpoint.Claim{}, nil, err
	}
	if len(devs) == 0 {
		// Only other drivers' results: nothing of ours to prepare, nothing to record.
		return checkpoint.Claim{}, []kubeletplugin.Device{}, nil
	}
	prepared := checkpoint.Claim{Namespace: claim.Namespace, Name: claim.Name, ReservedFor: reservedFor, Devices: devs}
	if d.cfg.VGPU {
		prepared.Path = d.deps.Paths.ClaimPath(ctx)
	}
	// The container's per-GPU limits are named by the GPU's index (contract §3): one
	// partition of a GPU per claim.
	if err := onePerGPU(devs, checkpoint.Device.IsMIG); err != nil {
		return checkpoint.Claim{}, nil, failf(metrics.ReasonInvalidClaim, "claim %s: %v; a claim takes one MIG partition of a GPU", klog.KObj(claim), err)
	}
	if prepared.Path == contract.PathPerClaim {
		if err := onePerGPU(devs, nil); err != nil {
			return checkpoint.Claim{}, nil, failf(metrics.ReasonInvalidClaim, "claim %s: %v; one directory set serves the whole claim on the per-claim path, so it needs the NRI path (NRISupport and a runtime with NRI)", klog.KObj(claim), err)
		}
		prepared.RegisterUUID = d.deps.NewUUID()
	}
	// With --gpu-injection=env each result's CDI device names its own GPU in
	// NVIDIA_VISIBLE_DEVICES, and CDI keeps one value of a variable: a container of several
	// results would see only one of its GPUs. On the NRI path the NRI plugin sets each
	// container's exact list; without it, a claim may hold one GPU only (contract §3).
	if d.cfg.GPUInjection == cdi.InjectionEnv && prepared.Path != contract.PathNRI && len(devs) > 1 {
		return checkpoint.Claim{}, nil, failf(metrics.ReasonInvalidClaim, "claim %s has %d GPUs, but --gpu-injection=env gives a container only one GPU without the NRI path; use --gpu-injection=cdi (the NVIDIA Container Toolkit's CDI devices) or enable NRISupport", klog.KObj(claim), len(devs))
	}
	prepared.State = checkpoint.PrepareCompleted
	if err := d.createAndRecord(ctx, claim, &prepared); err != nil {
		return checkpoint.Claim{}, nil, err
	}
	logger.V(2).Info("Prepared claim", "claim", klog.KObj(claim), "path", prepared.Path, "devices", len(devs))
	return prepared, resultDevices(prepared.Devices), nil
}

// createAndRecord makes the claim's files and records it, completed, in the checkpoint, the
// two at once: the durable write (group-committed with concurrent ones) runs while the claim
// directory and the CDI spec are made, and the kubelet is answered when both are done. A crash
// in between is safe either way (contract §7): a record whose files are not all there yet has
// them restored by start-up recovery, as after a reboot; files without a record are under names
// start-up recognises and removes. The capacity check admits the claim first, so that
// concurrent Prepares see each other (admission.go). A failure of either removes what the other
// made, so the kubelet's retry starts from scratch and nothing waits for the next restart.
func (d *Driver) createAndRecord(ctx context.Context, claim *resourceapi.ResourceClaim, c *checkpoint.Claim) error {
	uid := string(claim.UID)
	release, err := d.admit(uid, c.Devices)
	if err != nil {
		return fmt.Errorf("claim %s: %w", klog.KObj(claim), err)
	}
	defer release()
	d.at(StepPrepareAdmitted)
	// A partition's MIG instance comes first: the record and the CDI spec name its UUID.
	devs, undoMIG, err := d.ensureMIG(ctx, uid, klog.KObj(claim).String(), c.Devices)
	if err != nil {
		return err
	}
	d.at(StepPrepareMIG)
	c.Devices = devs
	c.Devices = d.withCDIIDs(uid, *c)
	prepared := *c
	// Unprepared a moment ago and prepared again: its old directory goes before the record is
	// written, so that no container directory of the earlier pods is carried over, not even by a
	// start-up that restores a recorded claim's files (removal.go).
	if d.removals.take(uid) {
		if err := d.withFiles(func() error { return d.deps.Dirs.RemoveClaim(uid) }); err != nil {
			return fmt.Errorf("prepare claim %s: remove the directory of the claim's earlier preparation: %w", klog.KObj(claim), err)
		}
	}
	recorded := make(chan error, 1)
	go func() { recorded <- d.deps.Checkpoint.Put(uid, prepared) }()
	fileErr := d.withFiles(func() error {
		if err := d.ensureDirs(uid, prepared); err != nil {
			return err
		}
		d.at(StepPrepareClaimDir)
		if err := d.writeSpec(uid, prepared); err != nil {
			return err
		}
		d.at(StepPrepareCDISpec)
		return nil
	})
	putErr := <-recorded
	switch {
	case fileErr != nil:
		if putErr == nil {
			d.unrecord(ctx, claim)
		}
		d.rollBackFiles(ctx, claim)
		undoMIG()
		return fmt.Errorf("prepare claim %s: %w", klog.KObj(claim), fileErr)
	case putErr != nil:
		d.rollBackFiles(ctx, claim)
		undoMIG()
		return &prepareError{reason: metrics.ReasonCheckpoint, err: fmt.Errorf("record claim %s: %w", klog.KObj(claim), putErr)}
	}
	d.at(StepPrepareRecorded)
	return nil
}

// unrecord removes the record of a claim whose files could not be made, durably: the kubelet is
// told Prepare failed. Where that write fails too, the record is removed from memory at once
// and from the disk with the next write; a crash before that leaves a record whose files
// start-up restores, and the kubelet's retry then finds the claim prepared.
func (d *Driver) unrecord(ctx context.Context, claim *resourceapi.ResourceClaim) {
	uid := string(claim.UID)
	if err := d.deps.Checkpoint.Update(func(data *checkpoint.Data) error {
		delete(data.Claims, uid)
		return nil
	}); err != nil {
		klog.FromContext(ctx).Error(err, "Removing the record of a failed preparation failed; it goes with the next write", "claim", klog.KObj(claim))
		d.deps.Checkpoint.RemoveDeferred(uid)
	}
}

// rollBackFiles removes the files of a claim whose Prepare failed before its record was
// written (a full disk, a read-only file system). What it cannot remove, start-up removes.
func (d *Driver) rollBackFiles(ctx context.Context, claim *resourceapi.ResourceClaim) {
	uid := string(claim.UID)
	err := d.withFiles(func() error {
		return errors.Join(d.deps.CDI.Remove(uid), d.deps.Dirs.RemoveClaim(uid))
	})
	if err != nil {
		klog.FromContext(ctx).Error(err, "Removing the files of a failed preparation failed; start-up removes them", "claim", klog.KObj(claim))
	}
}

// ensureFiles creates whatever of the claim's directories and CDI spec is missing.
func (d *Driver) ensureFiles(uid string, c checkpoint.Claim) error {
	if err := d.ensureDirs(uid, c); err != nil {
		return err
	}
	return d.writeSpec(uid, c)
}

// ensureDirs creates whatever of the claim's directory (its tmpfs) and, on the per-claim path,
// its directory set and vgpu.config is missing.
func (d *Driver) ensureDirs(uid string, c checkpoint.Claim) error {
	if err := d.deps.Dirs.EnsureClaimDir(uid); err != nil {
		return fmt.Errorf("create claim directory: %w", err)
	}
	if c.Path == contract.PathPerClaim {
		dirs, err := d.deps.Dirs.EnsurePerClaimDirs(uid)
		if err != nil {
			return fmt.Errorf("create per-claim directories: %w", err)
		}
		if err := d.deps.Dirs.WriteConfig(dirs, perClaimConfig(uid, c).Encode()); err != nil {
			return fmt.Errorf("write the claim's %s: %w", contract.ContainerConfigName, err)
		}
	}
	return nil
}

// writeSpec writes the claim's CDI spec unless it holds the same bytes already.
func (d *Driver) writeSpec(uid string, c checkpoint.Claim) error {
	if err := d.deps.CDI.Write(d.cdiClaim(uid, c)); err != nil {
		return fmt.Errorf("write CDI spec: %w", err)
	}
	return nil
}

func (d *Driver) cdiClaim(uid string, c checkpoint.Claim) cdi.Claim {
	out := cdi.Claim{UID: uid, Path: c.Path, RegisterUUID: c.RegisterUUID}
	if c.Path == contract.PathPerClaim {
		if dirs, err := d.deps.Dirs.PerClaimDirs(uid); err == nil {
			out.PerClaimDirs = cdi.PerClaimDirs{Config: dirs.Config, VGPULock: dirs.VGPULock, VMemNode: dirs.VMemNode}
		}
	}
	for _, dev := range c.Devices {
		out.Results = append(out.Results, cdi.Result{
			Request: dev.Request, Device: dev.Device, ShareID: dev.ShareID,
			GPUIndex: dev.Index, GPUUUID: dev.VisibleUUID(), MemoryBytes: dev.MemoryBytes, Cores: dev.Cores,
		})
	}
	return out
}

// perClaimConfig is what every container of a per-claim claim may use (contract §4a): all of
// the claim's GPUs, with the register UUID as identity.
func perClaimConfig(uid string, c checkpoint.Claim) contract.ContainerConfig {
	cfg := contract.ContainerConfig{ClaimUID: uid, RegisterUUID: c.RegisterUUID}
	for _, dev := range c.Devices {
		cfg.GPUs = append(cfg.GPUs, contract.ContainerGPU{Index: dev.Index, UUID: dev.VisibleUUID(), MemoryBytes: dev.MemoryBytes, Cores: dev.Cores})
	}
	return cfg
}

func resultDevices(devs []checkpoint.Device) []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, 0, len(devs))
	for _, dev := range devs {
		kd := kubeletplugin.Device{
			Requests: []string{dev.Request}, PoolName: dev.Pool, DeviceName: dev.Device,
			CDIDeviceIDs: dev.CDIDeviceIDs,
		}
		if dev.ShareID != "" {
			share := types.UID(dev.ShareID)
			kd.ShareID = &share
		}
		out = append(out, kd)
	}
	return out
}

// ReservedPods lists the UIDs of the pods the claim is reserved for, sorted: the form the
// checkpoint records (and the NRI plugin compares against).
func ReservedPods(claim *resourceapi.ResourceClaim) []string {
	var out []string
	for _, ref := range claim.Status.ReservedFor {
		if ref.Resource == "pods" && ref.APIGroup == "" {
			out = append(out, string(ref.UID))
		}
	}
	slices.Sort(out)
	return out
}

// onePerGPU refuses two results on one GPU, of those that only selects (nil: all).
func onePerGPU(devs []checkpoint.Device, only func(checkpoint.Device) bool) error {
	seen := map[string]string{}
	for _, dev := range devs {
		if only != nil && !only(dev) {
			continue
		}
		if other, dup := seen[dev.GPUUUID]; dup {
			return fmt.Errorf("requests %q and %q both got device %s", other, dev.Request, dev.Device)
		}
		seen[dev.GPUUUID] = dev.Request
	}
	return nil
}
