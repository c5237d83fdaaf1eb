package toolkitconfig

import (
	"errors"
	"fmt"
	"os"
)

// DefaultPath is where the toolkit reads its configuration (--toolkit-config).
const DefaultPath = "/etc/nvidia-container-runtime/config.toml"

// KeyAcceptEnvvarUnprivileged is the top-level key that decides whether the toolkit takes the
// GPUs an unprivileged container names in NVIDIA_VISIBLE_DEVICES (true, its default) or ignores
// the variable there (false). The toolkit cannot tell who set the variable: the pod spec, the
// image, or a CDI device of ours all end up in the same process env.
const KeyAcceptEnvvarUnprivileged = "accept-nvidia-visible-devices-envvar-when-unprivileged"

// Settings are the toolkit's settings this package reads; a key the file does not set has the
// toolkit's default.
type Settings struct {
	// AcceptEnvvarUnprivileged is KeyAcceptEnvvarUnprivileged.
	AcceptEnvvarUnprivileged bool
}

// Default is what the toolkit does without a config file, or without the key.
func Default() Settings { return Settings{AcceptEnvvarUnprivileged: true} }

// ErrNotBoolean says that the key has a value other than true or false: the toolkit would
// refuse the file.
var ErrNotBoolean = errors.New("not a boolean")

// Read parses the file at path. A missing file is an error that wraps os.ErrNotExist.
func Read(path string) (Settings, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Settings{}, err
	}
	s, err := Parse(b)
	if err != nil {
		return Settings{}, fmt.Errorf("parse %s: %w", path, err)
	}
	return s, nil
}

// Parse reads the settings from a TOML document.
func Parse(doc []byte) (Settings, error) {
	s := Default()
	seen := false
	err := scanTopLevel(doc, func(key, value string) error {
		if key != KeyAcceptEnvvarUnprivileged {
			return nil
		}
		if seen {
			return fmt.Errorf("key %q is defined twice", key)
		}
		seen = true
		switch value {
		case "true":
			s.AcceptEnvvarUnprivileged = true
		case "false":
			s.AcceptEnvvarUnprivileged = false
		default:
			return fmt.Errorf("key %q is %s: %w", key, value, ErrNotBoolean)
		}
		return nil
	})
	return s, err
}
