// Package claimdir is the one place that knows the host directory layout under the state
// directory (contract §1, §3, §4): where claim and container directories, the registry
// socket and the installed library live, and how the directories are created and removed.
//
// # Safety
//
// Containers write into the vgpu_lock and vmem_node directories (bind-mounted read-write), and
// a container running as root can also chmod or chown those directories themselves. Nothing
// there may ever make the plugin act outside <state>/claims, so:
//
//   - every name is validated (canonical UUID, DNS label) before any path is built from it;
//   - every disk operation goes through an os.Root opened on <state>/claims, which refuses any
//     path or symlink that leads outside it, even if the tree changes during the operation;
//   - the claims root itself must be a real directory owned by the plugin's user (root);
//   - every component the plugin descends through or fixes up is checked with Lstat to be a
//     real directory, so a symlink is refused even where it stays inside the root; modes and
//     owners are fixed through a file descriptor (fchmod, fchown) that is verified to be the
//     directory that was checked, never by path;
//   - removal uses os.Root.RemoveAll, which unlinks symlinks rather than following them.
//
// The components above the bind-mounted directories are 0700 and root's, so no container
// can swap one of them between the check and its use.
package claimdir

import (
	"path/filepath"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// Names of directories and files inside the state directory (contract §3, §4).
const (
	claimsDirName   = "claims"
	registryDirName = "registry"
	libDirName      = "lib"
	libraryName     = "libvgpu.so"
	preloadName     = "ld.so.preload"
	// perClaimDirName holds the per-claim path's one directory set; it cannot collide with a
	// container directory, whose name always holds '_'.
	perClaimDirName = "claim"
	configDirName   = "config"
	vgpuLockDirName = "vgpu_lock"
	vmemNodeDirName = "vmem_node"
)

// Layout is the host directory layout under one state directory (flag --state-dir,
// contract.DefaultStateDir). The zero value is not useful; StateDir should be absolute.
type Layout struct {
	StateDir string
	// ClaimFSBytes, when positive, puts each claim's directory on a tmpfs of its own of that
	// size (contract §4): the directories containers write into (vgpu_lock, vmem_node) then
	// have a hard bound that a container cannot lift, and filling them harms nobody but the
	// claim's own containers — not the node's disk, the checkpoint or another claim's Prepare.
	// Zero keeps the claim directories on the state directory's file system, unbounded.
	ClaimFSBytes int64
}

// Dirs is one directory set given to containers: Root holds the three directories that are
// bind-mounted into the container (contract §4).
type Dirs struct {
	Root     string // 0700, root only
	Config   string // 0755, read-only in the container; holds pids.config
	VGPULock string // 01777, read-write in the container
	VMemNode string // 01777, read-write in the container
}

// ContainerRef names one container directory of a claim.
type ContainerRef struct {
	PodUID        string
	ContainerName string
}

// ClaimsRoot is <state>/claims, which holds one directory per prepared claim.
func (l Layout) ClaimsRoot() string { return filepath.Join(l.StateDir, claimsDirName) }

// RegistryDir is <state>/registry, mounted read-only into vGPU containers.
func (l Layout) RegistryDir() string { return filepath.Join(l.StateDir, registryDirName) }

// RegistrySocket is the registry server's unix socket (contract §5).
func (l Layout) RegistrySocket() string {
	return filepath.Join(l.RegistryDir(), contract.RegistrySocketName)
}

// LibDir is <state>/lib, where the interception library is installed.
func (l Layout) LibDir() string { return filepath.Join(l.StateDir, libDirName) }

// LibraryPath is the installed libvgpu.so, mounted at contract.ContainerLibraryPath.
func (l Layout) LibraryPath() string { return filepath.Join(l.LibDir(), libraryName) }

// PreloadPath is the ld.so.preload file mounted at contract.ContainerPreloadPath.
func (l Layout) PreloadPath() string { return filepath.Join(l.LibDir(), preloadName) }

// ClaimDir is <state>/claims/<claimUID>.
func (l Layout) ClaimDir(claimUID string) (string, error) {
	rel, err := claimRel(claimUID)
	if err != nil {
		return "", err
	}
	return filepath.Join(l.ClaimsRoot(), rel), nil
}

// PerClaimDirs is the per-claim path's directory set, <claimDir>/claim/{config,vgpu_lock,vmem_node}.
func (l Layout) PerClaimDirs(claimUID string) (Dirs, error) {
	rel, err := perClaimRel(claimUID)
	if err != nil {
		return Dirs{}, err
	}
	return dirsAt(filepath.Join(l.ClaimsRoot(), rel)), nil
}

// ContainerDirs is the NRI path's directory set of one container,
// <claimDir>/<podUID>_<containerName>/{config,vgpu_lock,vmem_node}.
func (l Layout) ContainerDirs(claimUID, podUID, containerName string) (Dirs, error) {
	rel, err := containerRel(claimUID, podUID, containerName)
	if err != nil {
		return Dirs{}, err
	}
	return dirsAt(l.ClaimsRoot() + string(filepath.Separator) + rel), nil
}

// dirsAt is the directory set at root, a clean path. Plain concatenation, not filepath.Join:
// the names are constants and root is clean, and Synchronize builds this for every container
// of the node (BenchmarkSynchronize10k).
func dirsAt(root string) Dirs {
	return Dirs{
		Root:     root,
		Config:   root + string(filepath.Separator) + configDirName,
		VGPULock: root + string(filepath.Separator) + vgpuLockDirName,
		VMemNode: root + string(filepath.Separator) + vmemNodeDirName,
	}
}

// claimRel validates claimUID and returns the claim directory relative to the claims root.
func claimRel(claimUID string) (string, error) {
	if err := contract.ValidateClaimUID(claimUID); err != nil {
		return "", err
	}
	return claimUID, nil
}

// perClaimRel returns the per-claim directory set's root relative to the claims root.
func perClaimRel(claimUID string) (string, error) {
	rel, err := claimRel(claimUID)
	if err != nil {
		return "", err
	}
	return filepath.Join(rel, perClaimDirName), nil
}

// containerRel validates all three names and returns the container directory relative to
// the claims root.
func containerRel(claimUID, podUID, containerName string) (string, error) {
	rel, err := claimRel(claimUID)
	if err != nil {
		return "", err
	}
	if err := contract.ValidatePodUID(podUID); err != nil {
		return "", err
	}
	if err := contract.ValidateContainerName(containerName); err != nil {
		return "", err
	}
	// Validated names hold no separator or dot-dot: concatenation is the join.
	return rel + string(filepath.Separator) + containerDirName(podUID, containerName), nil
}

// containerDirName is "<podUID>_<containerName>"; neither part can hold '_'.
func containerDirName(podUID, containerName string) string {
	return podUID + "_" + containerName
}
