package gpu

import "github.com/NVIDIA/go-nvml/pkg/nvml"

// unknownName is published for a brand or architecture that NVML cannot tell or that is newer
// than the tables below.
const unknownName = "Unknown"

// brandNames spells NVML's brand enum the way NVIDIA's own DRA driver publishes its `brand`
// attribute ("Nvidia", "Tesla", ...), so that CEL selectors carry over between the two drivers.
var brandNames = map[nvml.BrandType]string{
	nvml.BRAND_QUADRO:              "Quadro",
	nvml.BRAND_TESLA:               "Tesla",
	nvml.BRAND_NVS:                 "NVS",
	nvml.BRAND_GRID:                "Grid",
	nvml.BRAND_GEFORCE:             "GeForce",
	nvml.BRAND_TITAN:               "Titan",
	nvml.BRAND_NVIDIA_VAPPS:        "NvidiaVApps",
	nvml.BRAND_NVIDIA_VPC:          "NvidiaVPC",
	nvml.BRAND_NVIDIA_VCS:          "NvidiaVCS",
	nvml.BRAND_NVIDIA_VWS:          "NvidiaVWS",
	nvml.BRAND_NVIDIA_CLOUD_GAMING: "NvidiaCloudGaming", // same value as BRAND_NVIDIA_VGAMING
	nvml.BRAND_QUADRO_RTX:          "QuadroRTX",
	nvml.BRAND_NVIDIA_RTX:          "NvidiaRTX",
	nvml.BRAND_NVIDIA:              "Nvidia",
	nvml.BRAND_GEFORCE_RTX:         "GeForceRTX",
	nvml.BRAND_TITAN_RTX:           "TitanRTX",
}

// architectureNames spells NVML's architecture enum as NVIDIA names its GPU generations,
// capitalised ("Hopper", "Ampere"), again as NVIDIA's DRA driver publishes `architecture`.
var architectureNames = map[nvml.DeviceArchitecture]string{
	nvml.DEVICE_ARCH_KEPLER:    "Kepler",
	nvml.DEVICE_ARCH_MAXWELL:   "Maxwell",
	nvml.DEVICE_ARCH_PASCAL:    "Pascal",
	nvml.DEVICE_ARCH_VOLTA:     "Volta",
	nvml.DEVICE_ARCH_TURING:    "Turing",
	nvml.DEVICE_ARCH_AMPERE:    "Ampere",
	nvml.DEVICE_ARCH_ADA:       "Ada Lovelace",
	nvml.DEVICE_ARCH_HOPPER:    "Hopper",
	nvml.DEVICE_ARCH_BLACKWELL: "Blackwell",
	nvml.DEVICE_ARCH_RUBIN:     "Rubin",
}

// brandName returns the published word for an NVML brand; unknownName for any other value.
func brandName(b nvml.BrandType) string {
	if name, ok := brandNames[b]; ok {
		return name
	}
	return unknownName
}

// architectureName returns the published word for an NVML architecture; unknownName for any
// other value (including DEVICE_ARCH_UNKNOWN).
func architectureName(a nvml.DeviceArchitecture) string {
	if name, ok := architectureNames[a]; ok {
		return name
	}
	return unknownName
}
