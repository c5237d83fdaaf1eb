package toolkitconfig

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The toolkit's own default file (nvidia-ctk config default), abridged: the key commented out.
const shippedDefault = `#accept-nvidia-visible-devices-as-volume-mounts = false
#accept-nvidia-visible-devices-envvar-when-unprivileged = true
disable-require = false
supported-driver-capabilities = "compat32,compute,display,graphics,ngx,utility,video"
#swarm-resource = "DOCKER_RESOURCE_GPU"

[nvidia-container-cli]
#debug = "/var/log/nvidia-container-toolkit.log"
environment = []
ldconfig = "@/sbin/ldconfig.real"
load-kmods = true

[nvidia-container-runtime]
log-level = "info"
mode = "auto"
runtimes = ["docker-runc", "runc", "crun"]
`

// TestParse: the key is read from the top level in every form TOML allows it, keeps the
// toolkit's default (true) when absent — under a table, in a comment, inside another value —
// and a value the toolkit would refuse is an error naming the line.
func TestParse(t *testing.T) {
	const key = KeyAcceptEnvvarUnprivileged
	tests := []struct {
		name string
		doc  string
		want bool   // AcceptEnvvarUnprivileged
		err  string // a substring of the error; empty: none
	}{
		{name: "the toolkit's default file", doc: shippedDefault, want: true},
		{name: "empty file", doc: "", want: true},
		{name: "false", doc: key + " = false\n" + shippedDefault, want: false},
		{name: "true", doc: key + " = true\n", want: true},
		{name: "false after other keys, with a comment, no newline at the end", doc: "disable-require = false\n" + key + "=false # locked down", want: false},
		{name: "quoted key", doc: `"` + key + `" = false`, want: false},
		{name: "literal-quoted key, CRLF, BOM", doc: "\xef\xbb\xbf'" + key + "' = false\r\nx = 1\r\n", want: false},
		{name: "only under a table: not the toolkit's key", doc: "[nvidia-container-runtime]\n" + key + " = false\n", want: true},
		{name: "dotted key", doc: "nvidia." + key + " = false\n", want: true},
		{name: "a multi-line string holding a header and the key", doc: "x = \"\"\"\n[t]\n" + key + " = true\n\"\"\"\n" + key + " = false\n", want: false},
		{name: "a multi-line literal string holding the key", doc: "x = '''\n" + key + " = false\n'''\n", want: true},
		{name: "a multi-line string ending in extra quotes", doc: "x = \"\"\"a\"\"\"\"\"\n" + key + " = false\n", want: false},
		{name: "an array over lines, with nested arrays and comments", doc: "x = [\n  [1, 2], # [t]\n  \"]\",\n]\n" + key + " = false\n", want: false},
		{name: "an inline table", doc: "x = { a = \"}\", b = [1] }\n" + key + " = false\n", want: false},
		{name: "a date-time with a space", doc: "d = 1979-05-27 07:32:00Z\n" + key + " = false\n", want: false},
		{name: "a string value is no boolean", doc: key + ` = "false"`, err: `line 1: key "` + key + `" is "false": not a boolean`},
		{name: "a number is no boolean", doc: "a = 1\n" + key + " = 0\n", err: "line 2:"},
		{name: "defined twice", doc: key + " = false\n" + key + " = true\n", err: "defined twice"},
		{name: "a key without a value", doc: "x =\n", err: "a key without a value"},
		{name: "a string that does not end", doc: "x = \"abc\n" + key + " = false\n", err: "does not end"},
		{name: "an array that does not end", doc: "x = [1,\n", err: "does not end"},
		{name: "no equals sign", doc: key + " false\n", err: "want '='"},
		{name: "junk after a value", doc: key + " = false true\n", err: "not a boolean"},
		{name: "junk after a string", doc: "x = \"a\" b\n", err: "after a value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.doc))
			switch {
			case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
				t.Errorf("err = %v, want one with %q", err, tt.err)
			case tt.err == "" && err != nil:
				t.Errorf("err = %v", err)
			case tt.err == "" && got.AcceptEnvvarUnprivileged != tt.want:
				t.Errorf("AcceptEnvvarUnprivileged = %v, want %v", got.AcceptEnvvarUnprivileged, tt.want)
			}
		})
	}
	if _, err := Parse([]byte(key + " = 1")); !errors.Is(err, ErrNotBoolean) {
		t.Errorf("err = %v, want ErrNotBoolean", err)
	}
}

// TestRead: a missing file is os.ErrNotExist; a file's error names its path.
func TestRead(t *testing.T) {
	dir := t.TempDir()
	if _, err := Read(filepath.Join(dir, "none.toml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v, want os.ErrNotExist", err)
	}
	path := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(path, []byte(KeyAcceptEnvvarUnprivileged+" = false\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if s, err := Read(path); err != nil || s.AcceptEnvvarUnprivileged {
		t.Errorf("Read = %+v, %v", s, err)
	}
	if err := os.WriteFile(path, []byte("x = [\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("a bad file: %v, want an error naming %s", err, path)
	}
}

// FuzzParse: no document makes the scanner panic or loop; go test runs the seeds.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{shippedDefault, "x = \"\"\"\\", "x = [\"\\", "a.'b\" = 1", "x = {[", "\"k", "x = '''", KeyAcceptEnvvarUnprivileged + " = false"} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		_, _ = Parse(doc)
	})
}
