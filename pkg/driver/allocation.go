package driver

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/vgpu-dra/vgpu-dra/pkg/api/v1alpha1"
	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// prepareError carries the metric reason of a failed preparation.
type prepareError struct {
	reason string
	err    error
}

func (e *prepareError) Error() string { return e.err.Error() }
func (e *prepareError) Unwrap() error { return e.err }

func failf(reason, format string, args ...any) error {
	return &prepareError{reason: reason, err: fmt.Errorf(format, args...)}
}

// devicesOf maps the claim's allocation results of this driver to checkpoint devices.
// Memory and cores are recorded as consumed; 0 means the whole GPU (no limit): an unsized
// request consumes the published default, which is the whole capacity, and VGPUSupport off
// allocates whole GPUs only. An admin-access result gets no limit whatever the scheduler
// computed as consumed (contract §3, "Admin access").
func (d *Driver) devicesOf(claim *resourceapi.ResourceClaim) ([]checkpoint.Device, error) {
	ref := claim.Namespace + "/" + claim.Name
	if claim.Status.Allocation == nil {
		return nil, failf(metrics.ReasonInvalidClaim, "claim %s is not allocated", ref)
	}
	var out []checkpoint.Device
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != d.cfg.DriverName {
			continue // another driver's result in a claim shared with it
		}
		if r.Pool != d.cfg.NodeName {
			return nil, failf(metrics.ReasonInvalidClaim, "claim %s: device %s of pool %s is not on this node (%s)", ref, r.Device, r.Pool, d.cfg.NodeName)
		}
		g, ok := d.byName[r.Device]
		if !ok {
			return nil, failf(metrics.ReasonInvalidClaim, "claim %s: device %s is not a GPU of node %s", ref, r.Device, d.cfg.NodeName)
		}
		admin := ptr.Deref(r.AdminAccess, false)
		// An operator inspects a faulty GPU through an admin-access claim (diagnostics, DCGM):
		// it takes no share and runs nothing of a tenant's, so the GPU's health does not stop it.
		if ev, bad := d.health.unhealthy(g.UUID); bad && !admin {
			return nil, failf(metrics.ReasonUnhealthyDevice, "claim %s: device %s (%s) is unhealthy: %s", ref, r.Device, g.UUID, ev.Reason)
		}
		dev := checkpoint.Device{
			Request: r.Request, Pool: r.Pool, Device: r.Device,
			GPUUUID: g.UUID, Index: g.Index, AdminAccess: admin,
		}
		if r.ShareID != nil {
			dev.ShareID = string(*r.ShareID)
		}
		if m, ok := d.migByName[r.Device]; ok {
			dev.MIG = migOf(m)
		}
		if d.cfg.VGPU && !admin {
			mem, err := consumedMemory(r, d.deviceMemory(r.Device))
			if err != nil {
				return nil, failf(metrics.ReasonInvalidClaim, "claim %s: device %s: %v", ref, r.Device, err)
			}
			cores, err := consumedCores(r)
			if err != nil {
				return nil, failf(metrics.ReasonInvalidClaim, "claim %s: device %s: %v", ref, r.Device, err)
			}
			dev.MemoryBytes, dev.Cores = mem, cores
			if err := applyConfig(&dev, claim.Status.Allocation.Devices.Config, r.Request); err != nil {
				return nil, failf(metrics.ReasonInvalidClaim, "claim %s: device %s: %v", ref, r.Device, err)
			}
		}
		out = append(out, dev)
	}
	return out, nil
}

// applyConfig records the request's VGPUConfig (contract §17) on dev, validated against its
// consumed cores: the class, and the ceiling when it lets the share burst above its request.
func applyConfig(dev *checkpoint.Device, configs []resourceapi.DeviceAllocationConfiguration, request string) error {
	cfg, err := v1alpha1.ForRequest(configs, request, dev.Cores)
	if err != nil {
		return err
	}
	dev.Class = string(cfg.Class)
	request100 := dev.Cores
	if request100 == 0 {
		request100 = coresTotal
	}
	if c := cfg.Ceiling(request100); c > request100 {
		dev.CoresCeiling = c
	}
	return nil
}

// consumedMemory returns the bytes to limit the container to, 0 for the whole GPU.
func consumedMemory(r resourceapi.DeviceRequestAllocationResult, published int64) (int64, error) {
	q, ok := r.ConsumedCapacity[contract.CapacityMemory]
	if !ok {
		return 0, nil
	}
	v, ok := q.AsInt64()
	if !ok || v <= 0 {
		return 0, fmt.Errorf("consumed memory %s is not a positive whole number of bytes", q.String())
	}
	if v%memoryStep != 0 {
		return 0, fmt.Errorf("consumed memory %s is not a multiple of 1Mi", q.String())
	}
	if v >= published {
		return 0, nil
	}
	return v, nil
}

// consumedCores returns the percentage of SMs to limit the container to, 0 for all of them.
func consumedCores(r resourceapi.DeviceRequestAllocationResult) (int64, error) {
	q, ok := r.ConsumedCapacity[contract.CapacityCores]
	if !ok {
		return 0, nil
	}
	v, ok := q.AsInt64()
	if !ok || v <= 0 || v > coresTotal {
		return 0, fmt.Errorf("consumed cores %s is not a whole number in 1–%d", q.String(), coresTotal)
	}
	if v == coresTotal {
		return 0, nil
	}
	return v, nil
}

// checkCapacity is the last line of defence against a double allocation: the scheduler should
// never hand out more of a GPU than it has, but if it does (a stale slice, a bug), the claim
// that would exceed it is refused here rather than silently overcommitting the GPU. others
// returns what every other claim prepared or being prepared takes of a GPU (admission.go: the
// checkpoint's running totals and the Prepares in flight, which see each other). Admin-access
// results are not counted, as the scheduler does not count them: they take no share.
func (d *Driver) checkCapacity(others func(capacityKey string) checkpoint.GPUTotals, devs []checkpoint.Device) error {
	for _, dev := range devs {
		if dev.AdminAccess {
			continue
		}
		published := d.deviceMemory(dev.Device)
		t := others(dev.CapacityKey())
		for _, own := range devs {
			if own.CapacityKey() == dev.CapacityKey() {
				t.Add(own)
			}
		}
		mem, cores := takenOf(t, published)
		if mem > published || cores > coresTotal {
			return failf(metrics.ReasonOvercommitted,
				"device %s would be overcommitted (%s memory and %d%% cores allocated in all, of %s and 100%%)",
				dev.Device, resource.NewQuantity(mem, resource.BinarySI), cores,
				resource.NewQuantity(published, resource.BinarySI))
		}
	}
	return nil
}
