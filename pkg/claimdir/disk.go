package claimdir

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// EnsureClaimDir creates the claims root and the claim's directory, both 0700 and root's, as
// needed. It is idempotent and repairs modes and owners.
func (l Layout) EnsureClaimDir(claimUID string) error {
	rel, err := claimRel(claimUID)
	if err != nil {
		return err
	}
	if err := l.ensure(l.claimSpec(rel)); err != nil {
		return fmt.Errorf("ensure directory of claim %s: %w", claimUID, err)
	}
	return nil
}

// EnsurePerClaimDirs creates the per-claim path's directory set in the claim directory
// (EnsureClaimDir first), with the modes of contract §4. It is idempotent and repairs modes and
// owners.
func (l Layout) EnsurePerClaimDirs(claimUID string) (Dirs, error) {
	rel, err := perClaimRel(claimUID)
	if err != nil {
		return Dirs{}, err
	}
	if err := l.ensure(l.setSpecs(rel)...); err != nil {
		return Dirs{}, fmt.Errorf("ensure per-claim directories of claim %s: %w", claimUID, err)
	}
	return dirsAt(filepath.Join(l.ClaimsRoot(), rel)), nil
}

// EnsureContainerDirs creates one container's directory set in the claim directory, which
// Prepare made (a missing one, or one whose tmpfs is gone, is an error: the claim was
// unprepared meanwhile), with the modes of contract §4. It is idempotent and repairs modes and
// owners; a restarted container gets the same directories, with what its predecessor left in
// them.
func (l Layout) EnsureContainerDirs(claimUID, podUID, containerName string) (Dirs, error) {
	rel, err := containerRel(claimUID, podUID, containerName)
	if err != nil {
		return Dirs{}, err
	}
	if err := l.ensureBelowExisting(l.setSpecs(rel)...); err != nil {
		return Dirs{}, fmt.Errorf("ensure directories of claim %s, pod %s, container %s: %w", claimUID, podUID, containerName, err)
	}
	return dirsAt(filepath.Join(l.ClaimsRoot(), rel)), nil
}

// setSpecs lists a directory set at rel, with its parents, parent first. The claim directory
// (the first parent) must exist already, on its tmpfs when ClaimFSBytes is set: Prepare makes
// it (EnsureClaimDir), and a directory set is never the thing that brings a claim back.
func (l Layout) setSpecs(rel string) []dirSpec {
	var specs []dirSpec
	for p := filepath.Dir(rel); p != "."; p = filepath.Dir(p) {
		specs = append(specs, dirSpec{rel: p, mode: modePrivate})
	}
	slices.Reverse(specs)
	specs[0].existing, specs[0].fsBytes = true, l.ClaimFSBytes
	return append(specs,
		dirSpec{rel: rel, mode: modePrivate},
		dirSpec{rel: filepath.Join(rel, configDirName), mode: modeConfig},
		dirSpec{rel: filepath.Join(rel, vgpuLockDirName), mode: modeShared},
		dirSpec{rel: filepath.Join(rel, vmemNodeDirName), mode: modeShared},
	)
}

// claimSpec is the claim directory at rel: private, on its own tmpfs when ClaimFSBytes is set.
func (l Layout) claimSpec(rel string) dirSpec {
	return dirSpec{rel: rel, mode: modePrivate, fsBytes: l.ClaimFSBytes}
}

func (l Layout) ensure(dirs ...dirSpec) error {
	t, err := l.openClaims(true)
	if err != nil {
		return err
	}
	defer t.close()
	return t.ensureDirs(dirs...)
}

// ensureBelowExisting is ensure in a claims root that Prepare made: it is opened and checked
// (a real directory of this user) but neither created nor repaired. This is the NRI
// CreateContainer path, where creating the claims root would be wrong anyway (the claim
// directory below it must exist) and each system call avoided counts.
func (l Layout) ensureBelowExisting(dirs ...dirSpec) error {
	t, err := l.openClaims(false)
	if err != nil {
		return err
	}
	defer t.close()
	return t.ensureDirs(dirs...)
}

// RemoveClaim removes the claim's directory with everything in it. A missing directory is
// not an error; symlinks inside are removed, never followed.
func (l Layout) RemoveClaim(claimUID string) error {
	rel, err := claimRel(claimUID)
	if err != nil {
		return err
	}
	if err := l.removeClaimFS(rel); err != nil {
		return fmt.Errorf("remove directory of claim %s: %w", claimUID, err)
	}
	if err := l.remove(rel); err != nil {
		return fmt.Errorf("remove directory of claim %s: %w", claimUID, err)
	}
	return nil
}

// RemoveContainerDirs removes one container's directory set. A missing one is not an error.
func (l Layout) RemoveContainerDirs(claimUID, podUID, containerName string) error {
	rel, err := containerRel(claimUID, podUID, containerName)
	if err != nil {
		return err
	}
	if err := l.remove(rel); err != nil {
		return fmt.Errorf("remove directories of claim %s, pod %s, container %s: %w", claimUID, podUID, containerName, err)
	}
	return nil
}

func (l Layout) remove(rel string) error {
	t, err := l.openClaims(false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer t.close()
	return t.removeAll(rel)
}

// ListContainerDirs lists the container directories of a claim, ordered by pod UID and
// container name. The per-claim directory set and entries that are not directories named
// "<podUID>_<containerName>" are skipped. A missing claim directory lists as empty.
func (l Layout) ListContainerDirs(claimUID string) ([]ContainerRef, error) {
	all, err := l.ListContainerDirsOf([]string{claimUID})
	return all[claimUID], err
}

// ListContainerDirsOf is ListContainerDirs for many claims, with the claims root opened and
// checked once (Synchronize lists every claim of the node). A claim that cannot be listed is
// left out, and its error is joined into the one returned.
func (l Layout) ListContainerDirsOf(claimUIDs []string) (map[string][]ContainerRef, error) {
	out := make(map[string][]ContainerRef, len(claimUIDs))
	var valid []string
	var invalid []error
	for _, uid := range claimUIDs {
		if _, err := claimRel(uid); err != nil {
			invalid = append(invalid, err) // no path is built from it
			continue
		}
		valid = append(valid, uid)
	}
	if len(valid) == 0 {
		return out, errors.Join(invalid...)
	}
	t, err := l.openClaims(false)
	if errors.Is(err, fs.ErrNotExist) {
		return out, errors.Join(invalid...)
	}
	if err != nil {
		return out, errors.Join(append(invalid, err)...)
	}
	defer t.close()
	listErrs := invalid
	for _, uid := range valid {
		refs, err := t.containerDirs(uid)
		if err != nil {
			listErrs = append(listErrs, err)
			continue
		}
		out[uid] = refs
	}
	return out, errors.Join(listErrs...)
}

// containerDirs lists one claim's container directories below the open claims root.
func (t *claimsTree) containerDirs(claimUID string) ([]ContainerRef, error) {
	rel, err := claimRel(claimUID)
	if err != nil {
		return nil, err
	}
	entries, err := t.readDir(rel)
	if err != nil {
		return nil, fmt.Errorf("list container directories of claim %s: %w", claimUID, err)
	}
	var refs []ContainerRef
	for _, e := range entries {
		if ref, ok := parseContainerDirName(e.Name()); ok && e.Type().IsDir() {
			refs = append(refs, ref)
		}
	}
	slices.SortFunc(refs, func(a, b ContainerRef) int {
		return strings.Compare(containerDirName(a.PodUID, a.ContainerName), containerDirName(b.PodUID, b.ContainerName))
	})
	return refs, nil
}

// ListClaims lists the UIDs of the claims that have a directory, in ascending order.
// Entries that are not directories named by a canonical UID are skipped.
func (l Layout) ListClaims() ([]string, error) {
	entries, err := l.list(".")
	if err != nil {
		return nil, fmt.Errorf("list claim directories: %w", err)
	}
	var uids []string
	for _, e := range entries {
		if e.Type().IsDir() && contract.ValidateUID(e.Name()) == nil {
			uids = append(uids, e.Name())
		}
	}
	slices.Sort(uids)
	return uids, nil
}

func (l Layout) list(rel string) ([]fs.DirEntry, error) {
	t, err := l.openClaims(false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer t.close()
	return t.readDir(rel)
}

// parseContainerDirName splits "<podUID>_<containerName>" and validates both parts.
func parseContainerDirName(name string) (ContainerRef, bool) {
	podUID, containerName, ok := strings.Cut(name, "_")
	if !ok || contract.ValidateUID(podUID) != nil || contract.ValidateContainerName(containerName) != nil {
		return ContainerRef{}, false
	}
	return ContainerRef{PodUID: podUID, ContainerName: containerName}, true
}
