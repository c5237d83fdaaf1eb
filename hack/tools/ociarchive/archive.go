package ociarchive

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// defaultPath is the PATH of an image whose Env does not set one (the value Docker uses).
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// ImageConfig is what the runtime needs besides the files: the image's name and how its
// process starts.
type ImageConfig struct {
	// Name is the image reference as the kubelet asks for it, e.g. "vgpu-dra/pause:dev"; it is
	// stored fully qualified ("docker.io/vgpu-dra/pause:dev"), the form containerd's CRI
	// looks up.
	Name       string
	Entrypoint []string
	Cmd        []string
	// Env holds KEY=VALUE pairs; PATH is added when missing.
	Env        []string
	WorkingDir string
}

// containerdImageNameAnnotation names the image when `ctr images import` reads the archive.
const containerdImageNameAnnotation = "io.containerd.image.name"

// NormalizeName qualifies a reference the way the kubelet and containerd do: "busybox:1" becomes
// "docker.io/library/busybox:1", "vgpu-dra/x:dev" becomes "docker.io/vgpu-dra/x:dev". A tag is
// required: an untagged name would mean ":latest", which the kubelet always tries to pull.
func NormalizeName(ref string) (string, error) {
	nameOnly := ref
	if i := strings.LastIndex(ref, "/"); i >= 0 {
		nameOnly = ref[i+1:]
	}
	if !strings.Contains(nameOnly, ":") || strings.HasSuffix(ref, ":") {
		return "", fmt.Errorf("image name %q has no tag", ref)
	}
	if strings.HasSuffix(ref, ":latest") {
		return "", fmt.Errorf("image name %q: the kubelet always pulls :latest, use another tag", ref)
	}
	first, _, hasSlash := strings.Cut(ref, "/")
	switch {
	case !hasSlash:
		return "docker.io/library/" + ref, nil
	case strings.ContainsAny(first, ".:") || first == "localhost":
		return ref, nil
	default:
		return "docker.io/" + ref, nil
	}
}

// buildImage turns the root file system and config into a one-layer OCI image.
func buildImage(root *RootFS, cfg ImageConfig) (v1.Image, error) {
	var layerTar bytes.Buffer
	if err := root.WriteTar(&layerTar); err != nil {
		return nil, err
	}
	layerBytes := layerTar.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerBytes)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("create layer: %w", err)
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return nil, fmt.Errorf("append layer: %w", err)
	}
	configFile, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("read image config: %w", err)
	}
	configFile = configFile.DeepCopy()
	configFile.OS, configFile.Architecture = "linux", runtime.GOARCH
	configFile.Created = v1.Time{Time: epoch}
	configFile.Config.Entrypoint = cfg.Entrypoint
	configFile.Config.Cmd = cfg.Cmd
	configFile.Config.Env = withDefaultPath(cfg.Env)
	configFile.Config.WorkingDir = cfg.WorkingDir
	img, err = mutate.ConfigFile(img, configFile)
	if err != nil {
		return nil, fmt.Errorf("set image config: %w", err)
	}
	return img, nil
}

func withDefaultPath(env []string) []string {
	for _, kv := range env {
		if strings.HasPrefix(kv, "PATH=") {
			return env
		}
	}
	return append([]string{defaultPath}, env...)
}

// WriteArchive writes the image as an OCI image layout packed in a tar file at out, with its
// index entry annotated so that `ctr -n k8s.io images import` registers it under cfg.Name.
func WriteArchive(out string, root *RootFS, cfg ImageConfig) error {
	fullName, err := NormalizeName(cfg.Name)
	if err != nil {
		return err
	}
	img, err := buildImage(root, cfg)
	if err != nil {
		return fmt.Errorf("build image %s: %w", fullName, err)
	}
	layoutDir, err := os.MkdirTemp(filepath.Dir(out), ".imagetool-layout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(layoutDir)
	lp, err := layout.Write(layoutDir, empty.Index)
	if err != nil {
		return fmt.Errorf("create OCI layout: %w", err)
	}
	tag := fullName[strings.LastIndex(fullName, ":")+1:]
	err = lp.AppendImage(img, layout.WithAnnotations(map[string]string{
		containerdImageNameAnnotation:       fullName,
		"org.opencontainers.image.ref.name": tag,
	}))
	if err != nil {
		return fmt.Errorf("write image %s to OCI layout: %w", fullName, err)
	}
	return tarDirectory(layoutDir, out)
}

// tarDirectory packs dir's content (not dir itself) into the tar file out, replacing it
// atomically so that a failed run never leaves a truncated archive behind.
func tarDirectory(dir, out string) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(out), ".imagetool-archive-")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	// CreateTemp makes the file 0600; an image archive is not a secret.
	if err = tmp.Chmod(0o644); err != nil {
		return err
	}
	tw := tar.NewWriter(tmp)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, walkErr error) error {
		if walkErr != nil || p == dir {
			return walkErr
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		hdr.Name, hdr.ModTime = filepath.ToSlash(rel), epoch
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		if d.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return fmt.Errorf("pack OCI layout into %s: %w", out, err)
	}
	if err = tw.Close(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), out)
}
