// Package contract holds every name that crosses a process or language boundary: environment
// variables, container paths, annotations, default host paths and metric-visible strings.
// It is the code twin of docs/design/contract.md; change both together, with a test on each
// side of the boundary. Host paths that depend on flags are built by pkg/claimdir.
package contract

// DefaultDriverName is the DRA driver name used when --driver-name is not set (contract §1).
const DefaultDriverName = "vgpu.dra.dev"

// Default host locations (contract §1).
const (
	DefaultStateDir   = "/var/lib/vgpu-dra"
	DefaultKubeletDir = "/var/lib/kubelet"
	DefaultCDIDir     = "/var/run/cdi"
	// CheckpointFile is the checkpoint's name inside the kubelet plugin data directory.
	CheckpointFile = "checkpoint.json"
	// InstanceLockFile is the instance lock's name inside the kubelet plugin data directory.
	InstanceLockFile = "instance.lock"
	// HandoverSocketName is the owner's handover socket in the kubelet plugin data directory
	// (contract §14).
	HandoverSocketName = "handover.sock"
	// NRIDecisionsDir holds the owner's per-container NRI decision marks while a successor is
	// registered with NRI, in the kubelet plugin data directory (contract §14).
	NRIDecisionsDir = "nri-decided"
	// DefaultGPUCDIKind is the CDI kind of the NVIDIA Container Toolkit's per-GPU devices.
	DefaultGPUCDIKind = "nvidia.com/gpu"
	// DefaultLibrarySource is where the plugin image carries libvgpu.so (contract §10), from
	// which both plugins install it into <state>/lib.
	DefaultLibrarySource = "/usr/local/lib/vgpu-dra/libvgpu.so"
)

// Paths inside a vGPU container (contract §3–§4).
const (
	ContainerConfigRoot  = "/etc/vgpu-dra"
	ContainerLibraryPath = "/etc/vgpu-dra/lib/libvgpu.so"
	ContainerPreloadPath = "/etc/ld.so.preload"
	ContainerRegistryDir = "/etc/vgpu-dra/registry"
	ContainerConfigDir   = "/etc/vgpu-dra/config"
	ContainerVGPULockDir = "/tmp/.vgpu_lock"
	ContainerVMemNodeDir = "/tmp/.vmem_node"
	// RegistrySocketName is the registry socket's name in the registry directory (host and container).
	RegistrySocketName = "registry.sock"
	// PIDsConfigName is the PID list's name inside a container's config directory (contract §6).
	PIDsConfigName = "pids.config"
	// LedgerFileName is libvgpu.so's memory ledger inside a container's vmem_node directory
	// (contract §4a; library/src/ledger.h). The plugin only reads it, for its metrics.
	LedgerFileName = "ledger.v2"
)

// Environment variables set through CDI (contract §3) and NRI (contract §4).
const (
	EnvClaimUID           = "MANAGER_VGPU_CLAIM_UID"
	EnvRegisterUUID       = "MANAGER_CLIENT_REGISTER_UUID"
	EnvVisibleDevicePfx   = "MANAGER_VISIBLE_DEVICE_" // + NVML index
	EnvMemLimitPfx        = "CUDA_MEM_LIMIT_"         // + NVML index
	EnvCoreLimitPfx       = "CUDA_CORE_LIMIT_"        // + NVML index
	EnvVisibleDevices     = "MANAGER_VISIBLE_DEVICES"
	EnvMemLimit           = "CUDA_MEM_LIMIT"
	EnvCoreLimit          = "CUDA_CORE_LIMIT"
	EnvNvidiaVisible      = "NVIDIA_VISIBLE_DEVICES"
	EnvPodUID             = "VGPU_POD_UID"
	EnvContainerName      = "VGPU_CONTAINER_NAME"
	MaxNeutralisedIndices = 16 // indices 0–15 are neutralised on the claim-common device
)

// RequiredPluginsAnnotationPrefix is followed by the container name; the value is a JSON list of
// NRI plugin names that containerd's default validator requires before it creates the container
// (contract §1; the webhook adds it, contract §12).
const RequiredPluginsAnnotationPrefix = "required-plugins.noderesource.dev/container."

// Pod-scoped forms of the required-plugins annotation. containerd's default validator reads the
// container key first, then RequiredPluginsPodAnnotation, then RequiredPluginsAnnotationBase: the
// first one present is the container's whole list.
const (
	RequiredPluginsAnnotationBase = "required-plugins.noderesource.dev"
	RequiredPluginsPodAnnotation  = "required-plugins.noderesource.dev/pod"
)

// Capacity names published in ResourceSlices (contract §2).
const (
	CapacityMemory = "memory"
	CapacityCores  = "cores"
	// UnhealthyTaintKeySuffix follows "<driver>/" in the device taint key.
	UnhealthyTaintKeySuffix = "unhealthy"
)

// The request policy of every published GPU (contract §2). A request for memory is valid from
// MemoryMinimum in steps of MemoryStep, one for cores from CoresMinimum to CoresTotal (percent of
// the GPU's SMs). The plugin publishes them; the webhook refuses requests outside them (§12).
const (
	MemoryMinimum int64 = 256 << 20
	MemoryStep    int64 = 1 << 20
	CoresMinimum  int64 = 1
	CoresTotal    int64 = 100
)

// AttributeUUID is the device attribute that holds the GPU's UUID (contract §2). Claims name it
// qualified with the driver name ("vgpu.dra.dev/uuid"), e.g. in a distinctAttribute constraint.
const AttributeUUID = "uuid"

// ExtendedResourceSuffix follows "<driver>/" in the extended resource name of the chart's
// DeviceClass ("vgpu.dra.dev/vgpu", contract §1).
const ExtendedResourceSuffix = "vgpu"

// ClaimPath says how a prepared claim's containers get their directories (contract §3, §7).
type ClaimPath string

const (
	// PathNRI: per-container directories and identity come from the embedded NRI plugin.
	PathNRI ClaimPath = "nri"
	// PathPerClaim: one directory set for the whole claim, mounted through CDI; the registry
	// resolves the claim by MANAGER_CLIENT_REGISTER_UUID.
	PathPerClaim ClaimPath = "per-claim"
)

// NRI rejection reasons (contract §8).
const (
	RejectClaimNotPrepared = "claim_not_prepared"
	RejectPodNotReserved   = "pod_not_reserved"
	RejectInvalidValue     = "invalid_value"
	RejectWrongPath        = "wrong_path"
)
