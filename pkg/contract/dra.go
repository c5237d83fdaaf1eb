package contract

// Names of the DRA features around Prepare: a claim's device status, the simulated GPUs'
// control socket (contract §3 "Claim device status", §11).

// SimulatedControlSocketName is the simulated GPUs' control socket in the state directory
// (contract §11); served only when --device-source is simulated.
const SimulatedControlSocketName = "simulated-gpu.sock"

// Claim device status (ResourceClaim status.devices, contract §3 "Claim device status").
const (
	// DeviceConditionReady says whether the result is prepared.
	DeviceConditionReady = "Ready"
	// DeviceReasonPrepared is the Ready=True reason.
	DeviceReasonPrepared = "Prepared"
	// DeviceConditionHealthy is the health of the result's GPU, written with DeviceHealthCheck
	// on and again on every change of that health: the one place a pod that asked through the
	// extended resource can see it (Kubernetes 1.37 leaves allocatedResourcesStatus empty for
	// that path, kubernetes/kubernetes#139939).
	DeviceConditionHealthy = "Healthy"
	// DeviceReasonGPUHealthy is the Healthy=True reason.
	DeviceReasonGPUHealthy = "GPUHealthy"
	// DeviceReasonGPUUnhealthy is the Healthy=False reason of a fault after which the GPU's
	// running work may go on (taint effect NoSchedule).
	DeviceReasonGPUUnhealthy = "GPUUnhealthy"
	// DeviceReasonGPUNeedsReset is the Healthy=False reason of a fatal fault: the GPU needs a
	// reset, its running work is lost (taint effect NoExecute).
	DeviceReasonGPUNeedsReset = "GPUNeedsReset"
	// DeviceFieldManagerPrefix + node name is the server-side-apply field manager of the
	// plugin's status writes: one per node, so no node's apply removes another's entries.
	DeviceFieldManagerPrefix = "vgpu-dra-kubelet-plugin/"
)

// DeviceStatusData is the data of one result in status.devices[].data, as a user reads it with
// kubectl get resourceclaim -o yaml.
type DeviceStatusData struct {
	// Request is the request the result answers, "<request>/<sub-request>" for a prioritized list.
	Request string `json:"request"`
	// GPUUUID and ProductName identify the GPU.
	GPUUUID     string `json:"gpuUUID"`
	ProductName string `json:"productName"`
	// Index is the GPU's NVML index on the node.
	Index int `json:"index"`
	// Memory is the granted memory as a quantity ("10Gi"); the whole published memory of the GPU
	// for an unlimited result; absent for admin access.
	Memory string `json:"memory,omitempty"`
	// Cores is the granted percentage of SMs, 100 for an unlimited result; absent for admin access.
	Cores int64 `json:"cores,omitempty"`
	// Class is the share's compute class ("Guaranteed" or "BestEffort", contract §16-17);
	// CoresCeiling the percent it may burst to when the GPU has idle time, present only above
	// Cores (a best-effort share without a configured ceiling: 100). Both are absent for a
	// result without a core limit: a whole GPU, admin access, VGPUSupport off.
	Class        string `json:"class,omitempty"`
	CoresCeiling int64  `json:"coresCeiling,omitempty"`
	// AdminAccess marks a result of an adminAccess request: no limits.
	AdminAccess bool `json:"adminAccess,omitempty"`
	// MIGProfile and MIGUUID name the MIG partition of a result on one (contract §18): its
	// profile ("1g.18gb") and the MIG device the container is given; Memory is then the
	// partition's share.
	MIGProfile string `json:"migProfile,omitempty"`
	MIGUUID    string `json:"migUUID,omitempty"`
	// Path is how the claim's containers get their directories: "nri" or "per-claim"; empty
	// with VGPUSupport off.
	Path ClaimPath `json:"path,omitempty"`
}

// Events the kubelet plugin raises on the pods a claim is reserved for when the health of one of
// the claim's GPUs changes (contract §3, "Claim device status"); source component
// vgpu-dra-kubelet-plugin.
const (
	// EventReasonDeviceUnhealthy is the Warning event's reason: the GPU became unhealthy.
	EventReasonDeviceUnhealthy = "VGPUDeviceUnhealthy"
	// EventReasonDeviceRecovered is the Normal event's reason: the GPU is healthy again.
	EventReasonDeviceRecovered = "VGPUDeviceRecovered"
)
