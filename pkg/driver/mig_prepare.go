package driver

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// MIG instances at Prepare, Unprepare and start-up (contract §18). Prepare creates a
// partition's instance after the capacity check and before the record is written, so the record
// names the instance and its MIG UUID (what the CDI spec gives the container); a crash between
// the two leaves an instance no record names, which start-up destroys. Several claims sharing
// one partition share its instance: the first creates it, the last to go destroys it. All of it
// under migMu: NVML's MIG calls change one GPU's layout and are not made concurrently.

// migOf is the MIG part of a result on a partition: profile and placement; NVML's IDs are
// filled in when the instance exists.
func migOf(m migDevice) checkpoint.MIGInstance {
	return checkpoint.MIGInstance{
		Profile: m.profile.Name, ProfileID: m.profile.ID, Start: m.at.Start, Size: m.at.Size,
		GPUInstanceID: -1, ComputeInstanceID: -1,
	}
}

// migFailf is a Prepare error about MIG.
func migFailf(format string, args ...any) error {
	return failf(metrics.ReasonMIG, format, args...)
}

// ensureMIG makes what the claim's results need of MIG: a partition's instance exists (made
// here, or another claim's), and a whole GPU that is MIG-managed is out of MIG mode. It returns
// the results with their instances (a copy: admitted holds the slice it was given, which other
// Prepares read) and a function that undoes what it made, for a Prepare that fails after it.
func (d *Driver) ensureMIG(ctx context.Context, uid, claimRef string, admitted []checkpoint.Device) (devs []checkpoint.Device, undo func(), err error) {
	if len(d.deps.MIGLayouts) == 0 {
		return admitted, func() {}, nil
	}
	d.migMu.Lock()
	defer d.migMu.Unlock()
	if err := d.checkMIGExclusion(uid, claimRef, admitted); err != nil {
		return nil, nil, err
	}
	devs = slices.Clone(admitted)
	var made []gpu.MIGInstance
	undo = func() {
		d.migMu.Lock()
		defer d.migMu.Unlock()
		d.destroyMade(ctx, claimRef, made)
	}
	for i := range devs {
		dev := &devs[i]
		if _, managed := d.deps.MIGLayouts[dev.GPUUUID]; !managed || dev.AdminAccess {
			continue
		}
		if !dev.IsMIG() {
			if err := d.leaveMIGMode(dev.GPUUUID); err != nil {
				d.destroyMade(ctx, claimRef, made)
				return nil, nil, migFailf("claim %s: device %s: %v", claimRef, dev.Device, err)
			}
			continue
		}
		in, created, err := d.instanceFor(*dev)
		if err != nil {
			d.destroyMade(ctx, claimRef, made)
			return nil, nil, migFailf("claim %s: MIG partition %s (%s at slot %d) on GPU %s: %v", claimRef, dev.Device, dev.MIG.Profile, dev.MIG.Start, dev.GPUUUID, err)
		}
		if created {
			made = append(made, in)
		}
		dev.MIG.GPUInstanceID, dev.MIG.ComputeInstanceID, dev.MIG.UUID = in.GPUInstanceID, in.ComputeInstanceID, in.UUID
	}
	return devs, undo, nil
}

// destroyMade destroys the instances a failed preparation made; what it cannot destroy, start-up
// does. Called under migMu.
func (d *Driver) destroyMade(ctx context.Context, claimRef string, made []gpu.MIGInstance) {
	for _, in := range made {
		if err := d.deps.MIG.DestroyMIGInstance(in.GPUUUID, in.GPUInstanceID); err != nil {
			klog.FromContext(ctx).Error(err, "Destroying the MIG instance of a failed preparation failed; start-up destroys it", "claim", claimRef)
		}
	}
}

// checkMIGExclusion is the last line of defence behind the scheduler's counters: no partition
// on a GPU shared whole by another claim, and no whole-GPU share beside another claim's partition.
// What the others hold comes from the capacity check's own bookkeeping (admission.go).
func (d *Driver) checkMIGExclusion(uid, claimRef string, devs []checkpoint.Device) error {
	for _, dev := range devs {
		l, managed := d.deps.MIGLayouts[dev.GPUUUID]
		if !managed || dev.AdminAccess {
			continue
		}
		if dev.IsMIG() {
			if d.sharesBesides(uid, dev.GPUUUID) > 0 {
				return failf(metrics.ReasonOvercommitted, "claim %s: MIG partition %s: GPU %s is shared whole by another claim", claimRef, dev.Device, dev.GPUUUID)
			}
			continue
		}
		g := d.byName[dev.Device]
		for _, m := range migDevicesOf(g, l) {
			name := MIGDeviceName(g.Index, m.profile.Name, m.at.Start)
			if d.sharesBesides(uid, dev.GPUUUID+"/"+name) > 0 {
				return failf(metrics.ReasonOvercommitted, "claim %s: device %s: GPU %s has a MIG partition of another claim (%s)", claimRef, dev.Device, dev.GPUUUID, name)
			}
		}
	}
	return nil
}

// sharesBesides counts the results of claims other than uid, recorded or being prepared, on a
// capacity key (checkpoint.Device.CapacityKey): a whole GPU's or one partition's.
func (d *Driver) sharesBesides(uid, key string) int {
	d.admitted.mu.Lock()
	defer d.admitted.mu.Unlock()
	return d.admitted.takenBesides(d.deps.Checkpoint.Totals(), uid)(key).Results
}

// instanceFor finds the partition's instance or creates it, turning MIG mode on first.
func (d *Driver) instanceFor(dev checkpoint.Device) (gpu.MIGInstance, bool, error) {
	if in, ok, err := d.findInstance(dev); err != nil || ok {
		return in, false, err
	}
	on, _, err := d.deps.MIG.MIGMode(dev.GPUUUID)
	if err != nil {
		return gpu.MIGInstance{}, false, err
	}
	if !on {
		if err := d.deps.MIG.SetMIGMode(dev.GPUUUID, true); err != nil {
			return gpu.MIGInstance{}, false, err
		}
	}
	in, err := d.deps.MIG.CreateMIGInstance(dev.GPUUUID, dev.MIG.ProfileID, gpu.MIGPlacement{Start: dev.MIG.Start, Size: dev.MIG.Size})
	if err != nil {
		return gpu.MIGInstance{}, false, err
	}
	if in.UUID == "" {
		err := errors.New("NVML names no MIG device for the new instance")
		return gpu.MIGInstance{}, false, errors.Join(err, d.deps.MIG.DestroyMIGInstance(dev.GPUUUID, in.GPUInstanceID))
	}
	return in, true, nil
}

// findInstance returns the instance of the partition's profile at its placement, if there is one.
func (d *Driver) findInstance(dev checkpoint.Device) (gpu.MIGInstance, bool, error) {
	list, err := d.deps.MIG.MIGInstances(dev.GPUUUID)
	if err != nil {
		return gpu.MIGInstance{}, false, err
	}
	for _, in := range list {
		if in.ProfileID == dev.MIG.ProfileID && in.Placement.Start == dev.MIG.Start && in.UUID != "" {
			return in, true, nil
		}
	}
	return gpu.MIGInstance{}, false, nil
}

// leaveMIGMode turns MIG mode off for a whole-GPU result: a GPU in MIG mode runs CUDA only in
// its instances. One that still has instances is refused (the scheduler's counters should
// never allow it).
func (d *Driver) leaveMIGMode(uuid string) error {
	on, _, err := d.deps.MIG.MIGMode(uuid)
	if err != nil || !on {
		return err
	}
	list, err := d.deps.MIG.MIGInstances(uuid)
	if err != nil {
		return err
	}
	if len(list) > 0 {
		return fmt.Errorf("the GPU is in MIG mode with %d MIG instances; the whole GPU cannot be shared beside them", len(list))
	}
	return d.deps.MIG.SetMIGMode(uuid, false)
}

// releaseMIG destroys the instances of the claim's partitions that no other claim, recorded or
// being prepared, still holds. Called with the claim's lock held, before its record goes.
func (d *Driver) releaseMIG(uid string, devs []checkpoint.Device) error {
	if len(d.deps.MIGLayouts) == 0 {
		return nil
	}
	d.migMu.Lock()
	defer d.migMu.Unlock()
	var errs []error
	for _, dev := range devs {
		if !dev.IsMIG() || d.sharesBesides(uid, dev.CapacityKey()) > 0 {
			continue
		}
		in, ok, err := d.findInstance(dev)
		if err == nil && ok {
			err = d.deps.MIG.DestroyMIGInstance(dev.GPUUUID, in.GPUInstanceID)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("destroy the MIG instance of partition %s on GPU %s: %w", dev.Device, dev.GPUUUID, err))
		}
	}
	return errors.Join(errs...)
}

// recoverMIG brings the MIG-managed GPUs in line with the checkpoint at start-up: an instance
// that no recorded partition names is destroyed (a crash of Prepare before its record, or of
// Unprepare after it); a recorded partition whose instance is gone (a reboot) is made again at
// its placement, and its record updated with the new instance's IDs and UUID before its files
// are restored. It returns the claims whose records it changed; a claim whose instance cannot
// be made is quarantined by the caller.
func (d *Driver) recoverMIG(ctx context.Context, claims map[string]checkpoint.Claim) (map[string]error, error) {
	failed := map[string]error{}
	if len(d.deps.MIGLayouts) == 0 {
		return failed, nil
	}
	logger := klog.FromContext(ctx)
	d.migMu.Lock()
	defer d.migMu.Unlock()
	wanted := map[string]bool{} // capacity keys of the recorded partitions
	for _, c := range claims {
		for _, dev := range c.Devices {
			if dev.IsMIG() {
				wanted[dev.CapacityKey()] = true
			}
		}
	}
	for _, g := range d.devices {
		l, ok := d.deps.MIGLayouts[g.UUID]
		if !ok {
			continue
		}
		list, err := d.deps.MIG.MIGInstances(g.UUID)
		if err != nil {
			return nil, fmt.Errorf("list the MIG instances of GPU %s: %w", g.UUID, err)
		}
		for _, in := range list {
			p, _ := l.Profile(in.ProfileID)
			key := g.UUID + "/" + MIGDeviceName(g.Index, p.Name, in.Placement.Start)
			if p.Name != "" && wanted[key] {
				continue
			}
			logger.Info("Destroying a MIG instance that no prepared claim holds", "gpu", g.UUID, "profile", p.Name, "slot", in.Placement.Start, "gpuInstance", in.GPUInstanceID)
			if err := d.deps.MIG.DestroyMIGInstance(g.UUID, in.GPUInstanceID); err != nil {
				return nil, fmt.Errorf("destroy MIG instance %d on GPU %s that no claim holds: %w", in.GPUInstanceID, g.UUID, err)
			}
		}
	}
	for uid, c := range claims {
		c = c.DeepCopy() // the snapshot's records are the store's: never edited in place
		changed := false
		for i, dev := range c.Devices {
			if !dev.IsMIG() {
				continue
			}
			in, created, err := d.instanceFor(dev)
			if err != nil {
				failed[uid] = fmt.Errorf("MIG partition %s on GPU %s: %w", dev.Device, dev.GPUUUID, err)
				break
			}
			if created || in.UUID != dev.MIG.UUID || in.GPUInstanceID != dev.MIG.GPUInstanceID {
				logger.Info("MIG instance of a prepared claim made again", "claim", klog.KRef(c.Namespace, c.Name), "device", dev.Device, "migUUID", in.UUID)
				c.Devices[i].MIG.GPUInstanceID, c.Devices[i].MIG.ComputeInstanceID, c.Devices[i].MIG.UUID = in.GPUInstanceID, in.ComputeInstanceID, in.UUID
				changed = true
			}
		}
		if _, bad := failed[uid]; bad || !changed {
			continue
		}
		c.Devices = d.withCDIIDs(uid, c)
		if err := d.deps.Checkpoint.Put(uid, c); err != nil {
			failed[uid] = fmt.Errorf("record the new MIG instance: %w", err)
			continue
		}
		claims[uid] = c
	}
	return failed, nil
}

// withCDIIDs returns the claim's devices with the CDI device IDs their spec gives them.
func (d *Driver) withCDIIDs(uid string, c checkpoint.Claim) []checkpoint.Device {
	ids := d.deps.CDI.DeviceIDs(d.cdiClaim(uid, c))
	out := make([]checkpoint.Device, len(c.Devices))
	copy(out, c.Devices)
	for i := range out {
		out[i].CDIDeviceIDs = ids[i]
	}
	return out
}
