package contract

// Names of the device-plugin mode (contract §12).
const (
	// DefaultResourceName is the extended resource the device plugin offers its shares as: the
	// name the DeviceClass maps to DRA (extendedResourceName), so manifests carry over.
	DefaultResourceName = DefaultDriverName + "/vgpu"
	// ShareIDSeparator separates the GPU's UUID from the share's number in a device ID:
	// "GPU-…::3".
	ShareIDSeparator = "::"
	// DevicePluginDirName is the kubelet's device-plugin directory in the kubelet dir: the
	// kubelet's registration socket and the plugins' own sockets live there.
	DevicePluginDirName = "device-plugins"
	// KubeletRegistrationSocketName is the kubelet's Registration socket in that directory.
	KubeletRegistrationSocketName = "kubelet.sock"
	// PodResourcesSocketRel is the kubelet's pod-resources socket, relative to the kubelet dir.
	PodResourcesSocketRel = "pod-resources/kubelet.sock"
	// DevicePluginDebugSocketName is the device plugin's debug endpoint in the state dir.
	DevicePluginDebugSocketName = "device-plugin-debug.sock"
)

// Node labels and the annotation the device plugin publishes its share sizes with; each key
// is "<resource name>.<suffix>", e.g. "vgpu.dra.dev/vgpu.memory-mib" (contract §12).
const (
	LabelSuffixSharesPerGPU = "shares-per-gpu"
	LabelSuffixMemoryMiB    = "memory-mib"
	LabelSuffixCores        = "cores"
	AnnotationSuffixShares  = "shares"
)
