package handover

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"time"
)

// Markers record, per container ID, that the owner has decided an NRI CreateContainer
// (contract §14, "Exactly once"). containerd calls two NRI plugins of one name one after the
// other for the same container; when ownership moves between the two calls, the instance called
// second must know that the first already decided, or the container would get its mounts twice
// (containerd then fails it: a mount destination claimed by two plugins). A marker is an empty
// file named after the container ID, created before the owner answers, and removed by the
// instance called second.
type Markers struct {
	dir string
}

// containerID is what a marker may be named after: the runtime's container IDs are hex; tests
// use short names. Nothing that could climb out of the directory.
var containerID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// NewMarkers uses dir (created 0700) for the markers.
func NewMarkers(dir string) (*Markers, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create NRI decision markers directory %s: %w", dir, err)
	}
	return &Markers{dir: dir}, nil
}

// Dir is where the markers are.
func (m *Markers) Dir() string { return m.dir }

func (m *Markers) path(id string) (string, bool) {
	if !containerID.MatchString(id) {
		return "", false
	}
	return filepath.Join(m.dir, id), true
}

// Mark records that the container's creation was decided. It is written before the decision is
// answered, and need not be durable: the other instance reads it within the same runtime call
// sequence, and a node reboot ends every such sequence.
func (m *Markers) Mark(id string) error {
	p, ok := m.path(id)
	if !ok {
		return fmt.Errorf("container ID %q cannot name a marker", id)
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("mark container %s decided: %w", id, err)
	}
	return f.Close()
}

// Consume removes the container's marker and reports whether there was one.
func (m *Markers) Consume(id string) bool {
	p, ok := m.path(id)
	if !ok {
		return false
	}
	return os.Remove(p) == nil
}

// Sweep removes markers older than age (a call sequence that never reached its second instance:
// the instance died) and every file that is not a marker; it returns how many it removed.
func (m *Markers) Sweep(age time.Duration) (int, error) {
	entries, err := os.ReadDir(m.dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0, nil
		}
		return 0, fmt.Errorf("list NRI decision markers: %w", err)
	}
	n := 0
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			continue
		}
		if containerID.MatchString(e.Name()) && info.Mode().IsRegular() && time.Since(info.ModTime()) < age {
			continue
		}
		if os.RemoveAll(filepath.Join(m.dir, e.Name())) == nil {
			n++
		}
	}
	return n, nil
}
