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
		if err := d.ensureFiles(uid, prepared); err != nil {
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
	prepared := checkpoint.Claim{
		Namespace: claim.Namespace, Name: claim.Name, State: checkpoint.PrepareStarted,
		ReservedFor: reservedFor, Devices: devs,
	}
	if d.cfg.VGPU {
		prepared.Path = d.deps.Paths.ClaimPath(ctx)
	}
	if prepared.Path == contract.PathPerClaim {
		if err := onePerGPU(devs); err != nil {
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
	cdiClaim := d.cdiClaim(uid, prepared)
	ids := d.deps.CDI.DeviceIDs(cdiClaim)
	for i := range prepared.Devices {
		prepared.Devices[i].CDIDeviceIDs = ids[i]
	}

	// Two-phase: PrepareStarted is durable before any file exists, so a crash in between leaves
	// something the next Prepare or the start-up recovery knows to finish or roll back.
	if err := d.deps.Checkpoint.Update(func(data *checkpoint.Data) error {
		if err := d.checkCapacity(data, uid, prepared.Devices); err != nil {
			return err
		}
		if data.Claims == nil {
			data.Claims = map[string]checkpoint.Claim{}
		}
		data.Claims[uid] = prepared
		return nil
	}); err != nil {
		var pe *prepareError
		if errors.As(err, &pe) {
			return checkpoint.Claim{}, nil, fmt.Errorf("claim %s: %w", klog.KObj(claim), err)
		}
		return checkpoint.Claim{}, nil, &prepareError{reason: metrics.ReasonCheckpoint, err: fmt.Errorf("record claim %s as started: %w", klog.KObj(claim), err)}
	}
	if err := d.ensureFiles(uid, prepared); err != nil {
		// Roll back what was made (a full disk, a read-only file system): the checkpoint must
		// not keep a PrepareStarted claim, nor the disk its half-written files, until the next
		// restart; the kubelet's retry starts from scratch.
		if rbErr := d.unprepareOne(uid); rbErr != nil {
			logger.Error(rbErr, "Rolling back a failed preparation failed; start-up recovery retries it", "claim", klog.KObj(claim))
		}
		return checkpoint.Claim{}, nil, fmt.Errorf("prepare claim %s: %w", klog.KObj(claim), err)
	}
	prepared.State = checkpoint.PrepareCompleted
	if err := d.deps.Checkpoint.Update(func(data *checkpoint.Data) error {
		data.Claims[uid] = prepared
		return nil
	}); err != nil {
		return checkpoint.Claim{}, nil, &prepareError{reason: metrics.ReasonCheckpoint, err: fmt.Errorf("record claim %s as completed: %w", klog.KObj(claim), err)}
	}
	logger.V(2).Info("Prepared claim", "claim", klog.KObj(claim), "path", prepared.Path, "devices", len(devs))
	return prepared, resultDevices(prepared.Devices), nil
}

// ensureFiles creates whatever of the claim's directories and CDI spec is missing.
func (d *Driver) ensureFiles(uid string, c checkpoint.Claim) error {
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
			GPUIndex: dev.Index, GPUUUID: dev.GPUUUID, MemoryBytes: dev.MemoryBytes, Cores: dev.Cores,
		})
	}
	return out
}

// perClaimConfig is what every container of a per-claim claim may use (contract §4a): all of
// the claim's GPUs, with the register UUID as identity.
func perClaimConfig(uid string, c checkpoint.Claim) contract.ContainerConfig {
	cfg := contract.ContainerConfig{ClaimUID: uid, RegisterUUID: c.RegisterUUID}
	for _, dev := range c.Devices {
		cfg.GPUs = append(cfg.GPUs, contract.ContainerGPU{Index: dev.Index, UUID: dev.GPUUUID, MemoryBytes: dev.MemoryBytes, Cores: dev.Cores})
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

func onePerGPU(devs []checkpoint.Device) error {
	seen := map[string]string{}
	for _, dev := range devs {
		if other, dup := seen[dev.GPUUUID]; dup {
			return fmt.Errorf("requests %q and %q both got device %s", other, dev.Request, dev.Device)
		}
		seen[dev.GPUUUID] = dev.Request
	}
	return nil
}
