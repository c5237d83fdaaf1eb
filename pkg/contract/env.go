package contract

import "strings"

// contractEnvPrefixes and contractEnvNames are the variables vgpu-dra writes into a vGPU
// container (contract §3, §4). A pod spec that sets one of them on a container that uses a vGPU
// would have its value mistaken for ours, so the webhook refuses it (contract §12).
var (
	contractEnvPrefixes = []string{"MANAGER_", EnvMemLimit, EnvCoreLimit}
	contractEnvNames    = []string{EnvPodUID, EnvContainerName}
)

// IsContractEnv reports whether name is a variable of the contract: MANAGER_*, CUDA_MEM_LIMIT*,
// CUDA_CORE_LIMIT*, VGPU_POD_UID or VGPU_CONTAINER_NAME.
func IsContractEnv(name string) bool {
	for _, p := range contractEnvPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	for _, n := range contractEnvNames {
		if name == n {
			return true
		}
	}
	return false
}
