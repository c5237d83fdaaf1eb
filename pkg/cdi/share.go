package cdi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// shareClass is the class of the device plugin's kind "<driver>/share" (contract §13).
const shareClass = "share"

// ErrInvalidShare marks a Share that cannot be turned into a CDI device. Nothing is written.
var ErrInvalidShare = errors.New("invalid share for CDI spec")

// Share is one share of a GPU that the device plugin offers (contract §13): the kubelet's
// device ID, which is also the CDI device's name, and the host directory set that a container
// holding the share gets.
type Share struct {
	// ID is the device ID, "<GPU UUID>::<n>".
	ID string
	// Dirs is the share's directory set (claimdir.Layout.PerClaimDirs of the share's UID).
	Dirs PerClaimDirs
}

// SharesSpecPath is the device plugin's one spec file, <SpecDir>/<driver>-share.json.
func (w *Writer) SharesSpecPath() string {
	return filepath.Join(w.opts.SpecDir, sharesSpecName(w.opts.DriverName))
}

func sharesSpecName(driver string) string { return driver + "-" + shareClass + ".json" }

// ShareDeviceID is the qualified CDI device ID of a share, "<driver>/share=<id>".
func (w *Writer) ShareDeviceID(id string) string {
	return parser.QualifiedName(w.opts.DriverName, shareClass, id)
}

// GPUDeviceIDs are the GPUs' own CDI devices ("<GPUCDIKind>=<UUID>", contract §3) that a
// container of these GPUs gets next to ours: none unless GPUCDIKind is set and GPUInjection is
// InjectionCDI.
func (w *Writer) GPUDeviceIDs(uuids []string) []string {
	if w.gpuVendor == "" || w.opts.GPUInjection != InjectionCDI {
		return nil
	}
	ids := make([]string, 0, len(uuids))
	for _, u := range uuids {
		ids = append(ids, parser.QualifiedName(w.gpuVendor, w.gpuClass, u))
	}
	return ids
}

// WriteShares writes the spec of the device plugin's shares: one device per share, named by
// its ID, whose edits bind-mount the library and preload file, the registry directory and the
// share's directory set exactly as the per-claim path's claim-common device does (contract §3,
// §13). A share's env is not in the spec: which limits a container gets depends on which
// shares it holds, so the device plugin answers it per container (Env). The file is checked
// by the CDI library's loader and put in place atomically; unchanged bytes are not rewritten.
// With no shares the file is removed (a spec without devices is invalid).
func (w *Writer) WriteShares(shares []Share) error {
	if len(shares) == 0 {
		if err := os.Remove(w.SharesSpecPath()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove the CDI spec of the shares: %w", err)
		}
		return nil
	}
	if !w.opts.VGPU {
		return fmt.Errorf("%w: shares need VGPU support", ErrInvalidShare)
	}
	spec := &cdispec.Spec{
		Version: specVersion,
		Kind:    w.opts.DriverName + "/" + shareClass,
		Devices: make([]cdispec.Device, 0, len(shares)),
	}
	seen := make(map[string]bool, len(shares))
	for _, sh := range shares {
		if err := validateShare(sh); err != nil {
			return err
		}
		if seen[sh.ID] {
			return fmt.Errorf("%w: two shares named %q", ErrInvalidShare, sh.ID)
		}
		seen[sh.ID] = true
		// The per-claim path's claim-common mounts; the UID and UUID are not used by them.
		c := Claim{Path: contract.PathPerClaim, PerClaimDirs: sh.Dirs}
		spec.Devices = append(spec.Devices, cdispec.Device{
			Name:           sh.ID,
			ContainerEdits: cdispec.ContainerEdits{Mounts: w.commonMounts(&c)},
		})
	}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return fmt.Errorf("encode the CDI spec of the shares: %w", err)
	}
	data = append(data, '\n')
	path := w.SharesSpecPath()
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return nil
	}
	if err := writeValidated(path, data); err != nil {
		return fmt.Errorf("write the CDI spec of the shares: %w", err)
	}
	return nil
}

func validateShare(sh Share) error {
	if err := parser.ValidateDeviceName(sh.ID); err != nil {
		return fmt.Errorf("%w: share %q: %v", ErrInvalidShare, sh.ID, err)
	}
	for _, d := range []struct{ what, path string }{
		{"config", sh.Dirs.Config}, {"vgpu_lock", sh.Dirs.VGPULock}, {"vmem_node", sh.Dirs.VMemNode},
	} {
		if err := requireAbs(d.what+" dir", d.path); err != nil {
			return fmt.Errorf("%w: share %s: %v", ErrInvalidShare, sh.ID, err)
		}
	}
	return nil
}

// Env is the whole env of contract §3 that a container of the claim gets — each result's
// per-GPU variables and the claim-common ones, image values neutralised — as one map, for a
// caller that hands env over itself rather than through CDI (the device plugin's Allocate
// answer). With GPUInjection env, NVIDIA_VISIBLE_DEVICES lists every GPU of the claim, in
// result order. The claim is validated as Write validates it; the results must be on distinct
// GPUs (each GPU's variables have one value).
func (w *Writer) Env(c Claim) (map[string]string, error) {
	if err := w.validate(&c); err != nil {
		return nil, err
	}
	env := map[string]string{}
	put := func(kv string) {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	for _, kv := range w.commonEnv(&c) {
		put(kv)
	}
	var uuids []string
	for i := range c.Results {
		r := &c.Results[i]
		if slices.Contains(uuids, r.GPUUUID) {
			return nil, fmt.Errorf("%w: claim %s names GPU %s twice", ErrInvalidClaim, c.UID, r.GPUUUID)
		}
		uuids = append(uuids, r.GPUUUID)
		for _, kv := range w.resultEnv(r) {
			put(kv)
		}
	}
	if w.opts.GPUInjection == InjectionEnv {
		env[contract.EnvNvidiaVisible] = strings.Join(uuids, ",")
	}
	return env, nil
}
