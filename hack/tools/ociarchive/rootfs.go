// Package ociarchive assembles container images for the local test cluster without a container
// engine or registry: a root file system listed entry by entry from host files, written as one
// layer of an OCI image archive that `ctr images import` reads.
package ociarchive

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// epoch is the modification time of every entry, so that the same inputs give the same layer
// digest and re-importing an unchanged image is a no-op for containerd.
var epoch = time.Unix(0, 0).UTC()

// entryKind says what an image path becomes in the layer.
type entryKind int

const (
	kindDir entryKind = iota
	kindFile
	kindSymlink
)

// entry is one path of the image's root file system.
type entry struct {
	kind entryKind
	// mode holds the permission bits (and sticky/setuid bits) of the entry.
	mode fs.FileMode
	// source is the host file whose content a kindFile entry gets.
	source string
	// target is where a kindSymlink entry points.
	target string
}

// RootFS is the content of an image's only layer, keyed by clean image path without the leading
// slash. Parent directories are implied: they are written with mode 0755 unless added explicitly.
type RootFS struct {
	entries map[string]entry
}

// NewRootFS returns an empty root file system.
func NewRootFS() *RootFS {
	return &RootFS{entries: map[string]entry{}}
}

// imagePath turns an absolute image path into the key used in the layer ("/bin/sh" -> "bin/sh").
func imagePath(p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("image path %q is not absolute", p)
	}
	clean := strings.TrimPrefix(path.Clean(p), "/")
	if clean == "" {
		return "", fmt.Errorf("image path %q names the root directory", p)
	}
	return clean, nil
}

func (r *RootFS) add(p string, e entry) error {
	key, err := imagePath(p)
	if err != nil {
		return err
	}
	if old, ok := r.entries[key]; ok && !(old.kind == kindDir && e.kind == kindDir) {
		return fmt.Errorf("image path %q added twice", p)
	}
	r.entries[key] = e
	return nil
}

// AddFile copies the host file source (following symlinks, so that a library's soname link
// brings its content) to the image path dst. A zero mode keeps the host file's permission bits.
func (r *RootFS) AddFile(source, dst string, mode fs.FileMode) error {
	info, err := os.Stat(source)
	if err != nil {
		return fmt.Errorf("add %s to image: %w", source, err)
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("add %s to image: not a regular file", source)
	}
	if mode == 0 {
		mode = info.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	}
	return r.add(dst, entry{kind: kindFile, mode: mode, source: source})
}

// AddTree copies every regular file under the host directory source to the same relative path
// under dst, keeping permission bits. Symlinks inside the tree are followed.
func (r *RootFS) AddTree(source, dst string) error {
	return filepath.WalkDir(source, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(source, p)
		if err != nil {
			return err
		}
		target := path.Join(dst, filepath.ToSlash(rel))
		if d.IsDir() {
			if rel == "." {
				return r.AddDir(dst, 0o755)
			}
			return r.AddDir(target, 0o755)
		}
		return r.AddFile(p, target, 0)
	})
}

// AddDir adds the directory dst with the given mode (e.g. 01777 for /tmp).
func (r *RootFS) AddDir(dst string, mode fs.FileMode) error {
	return r.add(dst, entry{kind: kindDir, mode: mode})
}

// AddSymlink adds a symbolic link at dst pointing at target (e.g. busybox applets).
func (r *RootFS) AddSymlink(dst, target string) error {
	if target == "" {
		return fmt.Errorf("symlink %q has an empty target", dst)
	}
	return r.add(dst, entry{kind: kindSymlink, mode: 0o777, target: target})
}

// withParents returns every entry plus the implied parent directories, sorted so that a
// directory precedes what it contains.
func (r *RootFS) withParents() ([]string, map[string]entry) {
	all := make(map[string]entry, len(r.entries))
	for p, e := range r.entries {
		all[p] = e
		for dir := path.Dir(p); dir != "."; dir = path.Dir(dir) {
			if _, ok := all[dir]; !ok {
				if explicit, ok := r.entries[dir]; ok {
					all[dir] = explicit
				} else {
					all[dir] = entry{kind: kindDir, mode: 0o755}
				}
			}
		}
	}
	paths := make([]string, 0, len(all))
	for p := range all {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	return paths, all
}

// WriteTar writes the root file system as an uncompressed layer tar, owned by root, with fixed
// timestamps.
func (r *RootFS) WriteTar(w io.Writer) error {
	tw := tar.NewWriter(w)
	paths, all := r.withParents()
	for _, p := range paths {
		if err := writeEntry(tw, p, all[p]); err != nil {
			return fmt.Errorf("write layer entry /%s: %w", p, err)
		}
	}
	return tw.Close()
}

func writeEntry(tw *tar.Writer, p string, e entry) error {
	hdr := &tar.Header{Name: p, Mode: int64(tarMode(e.mode)), ModTime: epoch, Format: tar.FormatPAX}
	switch e.kind {
	case kindDir:
		hdr.Typeflag, hdr.Name = tar.TypeDir, p+"/"
		return tw.WriteHeader(hdr)
	case kindSymlink:
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, e.target
		return tw.WriteHeader(hdr)
	case kindFile:
		f, err := os.Open(e.source)
		if err != nil {
			return err
		}
		defer f.Close()
		info, err := f.Stat()
		if err != nil {
			return err
		}
		hdr.Typeflag, hdr.Size = tar.TypeReg, info.Size()
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := io.Copy(tw, f); err != nil {
			return fmt.Errorf("copy %s: %w", e.source, err)
		}
		return nil
	default:
		return fmt.Errorf("unknown entry kind %d", e.kind)
	}
}

// ParseMode reads Unix octal permission bits ("1777", "755") into a Go file mode.
func ParseMode(octal string) (fs.FileMode, error) {
	bits, err := strconv.ParseUint(octal, 8, 32)
	if err != nil || bits > 0o7777 {
		return 0, fmt.Errorf("bad octal mode %q", octal)
	}
	mode := fs.FileMode(bits & 0o777)
	for _, special := range specialBits {
		if uint32(bits)&special.unix != 0 {
			mode |= special.mode
		}
	}
	return mode, nil
}

// specialBits maps the setuid, setgid and sticky bits between Unix and Go.
var specialBits = []struct {
	unix uint32
	mode fs.FileMode
}{{0o4000, fs.ModeSetuid}, {0o2000, fs.ModeSetgid}, {0o1000, fs.ModeSticky}}

// tarMode converts Go's file mode bits to the Unix bits a tar header carries.
func tarMode(m fs.FileMode) uint32 {
	bits := uint32(m.Perm())
	for _, special := range specialBits {
		if m&special.mode != 0 {
			bits |= special.unix
		}
	}
	return bits
}
