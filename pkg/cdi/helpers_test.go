package cdi

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

const (
	testDriver    = "vgpu.dra.dev"
	claimUID      = "0b9d3f2e-6a7c-4f21-9e0d-3c5b7a1f8e42"
	claimUID2     = "f1e2d3c4-b5a6-4978-8a9b-0c1d2e3f4a5b"
	registerUUID  = "7c1e5a2b-3d4f-4e6a-8b9c-0d1e2f3a4b5c"
	shareID       = "a1b2c3d4-e5f6-4a7b-8c9d-0e1f2a3b4c5d"
	gpu0UUID      = "GPU-11111111-2222-3333-4444-555555555555"
	gpu3UUID      = "GPU-33333333-2222-3333-4444-555555555555"
	fourGiB       = 4 << 30
	stateDir      = "/var/lib/vgpu-dra"
	hostRegistry  = stateDir + "/registry"
	hostLibrary   = stateDir + "/lib/libvgpu.so"
	hostPreload   = stateDir + "/lib/ld.so.preload"
	hostClaimDir  = stateDir + "/claims/" + claimUID + "/claim"
	hostConfig    = hostClaimDir + "/config"
	hostVGPULock  = hostClaimDir + "/vgpu_lock"
	hostVMemNode  = hostClaimDir + "/vmem_node"
	commonName    = claimUID + "-common"
	qualifiedKind = testDriver + "/claim"
)

// testOptions are the production defaults with a temporary spec dir.
func testOptions(t testing.TB) Options {
	return Options{
		DriverName:       testDriver,
		SpecDir:          filepath.Join(t.TempDir(), "cdi"),
		RegistryDir:      hostRegistry,
		LibraryPath:      hostLibrary,
		PreloadPath:      hostPreload,
		LibraryInstalled: true,
		VGPU:             true,
		GPUInjection:     InjectionCDI,
		GPUCDIKind:       contract.DefaultGPUCDIKind,
	}
}

func newTestWriter(t testing.TB, mutate func(*Options)) *Writer {
	t.Helper()
	o := testOptions(t)
	if mutate != nil {
		mutate(&o)
	}
	w, err := NewWriter(o)
	if err != nil {
		t.Fatalf("NewWriter: %v", err)
	}
	return w
}

func gpu0Result() Result {
	return Result{Request: "gpu", Device: "gpu-0", GPUIndex: 0, GPUUUID: gpu0UUID, MemoryBytes: fourGiB, Cores: 30}
}

func gpu3Result() Result {
	return Result{Request: "gpu", Device: "gpu-3", GPUIndex: 3, GPUUUID: gpu3UUID}
}

func nriClaim(results ...Result) Claim {
	return Claim{UID: claimUID, Path: contract.PathNRI, Results: results}
}

func perClaimClaim(results ...Result) Claim {
	return Claim{
		UID:          claimUID,
		Path:         contract.PathPerClaim,
		RegisterUUID: registerUUID,
		PerClaimDirs: PerClaimDirs{Config: hostConfig, VGPULock: hostVGPULock, VMemNode: hostVMemNode},
		Results:      results,
	}
}

// neutralised is the empty per-GPU env for every index in 0–15 except used.
func neutralised(used ...int) []string {
	var env []string
	for j := range contract.MaxNeutralisedIndices {
		if slices.Contains(used, j) {
			continue
		}
		i := strconv.Itoa(j)
		env = append(env, "MANAGER_VISIBLE_DEVICE_"+i+"=", "CUDA_MEM_LIMIT_"+i+"=", "CUDA_CORE_LIMIT_"+i+"=")
	}
	return env
}

// sorted returns the concatenation of parts, sorted.
func sorted(parts ...[]string) []string {
	out := slices.Concat(parts...)
	slices.Sort(out)
	return out
}

// specFiles lists the names in dir.
func specFiles(t testing.TB, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}
