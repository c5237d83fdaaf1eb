package contract

import "testing"

// TestIsContractEnv: every variable that CDI or NRI writes is one of the contract's, and
// nothing else is (contract §3, §4).
func TestIsContractEnv(t *testing.T) {
	ours := []string{
		EnvClaimUID, EnvRegisterUUID, EnvVisibleDevicePfx + "0", EnvMemLimitPfx + "15", EnvCoreLimitPfx + "3",
		EnvVisibleDevices, EnvMemLimit, EnvCoreLimit, EnvPodUID, EnvContainerName, "MANAGER_ANYTHING",
	}
	for _, name := range ours {
		if !IsContractEnv(name) {
			t.Errorf("IsContractEnv(%q) = false, want true", name)
		}
	}
	theirs := []string{"", "PATH", "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "VGPU_POD_UID_X", "MY_MANAGER_X", "CUDA_MEM", "manager_vgpu_claim_uid"}
	for _, name := range theirs {
		if IsContractEnv(name) {
			t.Errorf("IsContractEnv(%q) = true, want false", name)
		}
	}
}
