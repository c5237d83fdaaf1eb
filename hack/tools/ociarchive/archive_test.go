package ociarchive

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestNormalizeName(t *testing.T) {
	tests := []struct {
		in, want string
		wantErr  bool
	}{
		{in: "busybox:1", want: "docker.io/library/busybox:1"},
		{in: "vgpu-dra/test-workload:dev", want: "docker.io/vgpu-dra/test-workload:dev"},
		{in: "registry.example:5000/a/b:v1", want: "registry.example:5000/a/b:v1"},
		{in: "localhost/a:v1", want: "localhost/a:v1"},
		{in: "vgpu-dra/untagged", wantErr: true},
		{in: "registry.example:5000/untagged", wantErr: true},
		{in: "vgpu-dra/x:latest", wantErr: true},
	}
	for _, tt := range tests {
		got, err := NormalizeName(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("NormalizeName(%q) = %q, %v; want %q, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestParseModeRoundTrip(t *testing.T) {
	for _, octal := range []string{"755", "644", "1777", "4755"} {
		mode, err := ParseMode(octal)
		if err != nil {
			t.Fatalf("ParseMode(%s): %v", octal, err)
		}
		if got := tarMode(mode); got != mustOctal(t, octal) {
			t.Errorf("tarMode(ParseMode(%s)) = %o", octal, got)
		}
	}
	if _, err := ParseMode("99"); err == nil {
		t.Error("ParseMode(99) accepted a non-octal mode")
	}
}

func mustOctal(t *testing.T, s string) uint32 {
	t.Helper()
	var v uint32
	for _, c := range s {
		v = v*8 + uint32(c-'0')
	}
	return v
}

// TestWriteArchiveLayout writes an image and reads it back the way `ctr images import` does:
// index.json names the image, the manifest points at the config and one gzip layer, and the
// layer holds the files with their modes, implied parents and symlinks.
func TestWriteArchiveLayout(t *testing.T) {
	dir := t.TempDir()
	hostFile := filepath.Join(dir, "hello")
	if err := os.WriteFile(hostFile, []byte("hi\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	root := NewRootFS()
	must(t, root.AddFile(hostFile, "/usr/bin/hello", 0))
	must(t, root.AddSymlink("/bin/hi", "/usr/bin/hello"))
	must(t, root.AddDir("/tmp", fs.ModeSticky|0o777))
	out := filepath.Join(dir, "image.tar")
	cfg := ImageConfig{Name: "vgpu-dra/test:dev", Entrypoint: []string{"/bin/hi"}, Env: []string{"A=b"}}
	must(t, WriteArchive(out, root, cfg))

	files := readTar(t, mustOpen(t, out))
	var index struct {
		Manifests []struct {
			Digest      string
			Annotations map[string]string
		}
	}
	mustJSON(t, files["index.json"], &index)
	if len(index.Manifests) != 1 {
		t.Fatalf("index has %d manifests, want 1", len(index.Manifests))
	}
	if got := index.Manifests[0].Annotations[containerdImageNameAnnotation]; got != "docker.io/vgpu-dra/test:dev" {
		t.Errorf("image name annotation = %q", got)
	}
	var manifest struct {
		MediaType string
		Config    struct{ Digest string }
		Layers    []struct{ MediaType, Digest string }
	}
	mustJSON(t, files[blobPath(index.Manifests[0].Digest)], &manifest)
	if manifest.MediaType != "application/vnd.oci.image.manifest.v1+json" || len(manifest.Layers) != 1 {
		t.Fatalf("manifest = %+v, want one OCI layer", manifest)
	}
	var config struct {
		Architecture, OS string
		Config           struct{ Entrypoint, Env []string }
	}
	mustJSON(t, files[blobPath(manifest.Config.Digest)], &config)
	if config.OS != "linux" || strings.Join(config.Config.Entrypoint, " ") != "/bin/hi" {
		t.Errorf("config = %+v", config)
	}
	if len(config.Config.Env) != 2 || !strings.HasPrefix(config.Config.Env[0], "PATH=") {
		t.Errorf("env = %q, want PATH added before A=b", config.Config.Env)
	}

	gz, err := gzip.NewReader(bytes.NewReader(files[blobPath(manifest.Layers[0].Digest)]))
	must(t, err)
	headers := readTarHeaders(t, gz)
	wantModes := map[string]int64{"usr/": 0o755, "usr/bin/": 0o755, "usr/bin/hello": 0o700, "tmp/": 0o1777}
	for name, mode := range wantModes {
		if h, ok := headers[name]; !ok || h.Mode != mode {
			t.Errorf("layer entry %s: %+v, want mode %o", name, h, mode)
		}
	}
	if h := headers["bin/hi"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "/usr/bin/hello" {
		t.Errorf("layer entry bin/hi = %+v, want symlink to /usr/bin/hello", h)
	}
}

func TestAddTwiceFails(t *testing.T) {
	root := NewRootFS()
	must(t, root.AddSymlink("/bin/sh", "busybox"))
	if err := root.AddSymlink("/bin/sh", "dash"); err == nil {
		t.Error("adding /bin/sh twice succeeded")
	}
	if err := root.AddDir("relative", 0o755); err == nil {
		t.Error("a relative image path was accepted")
	}
}

func blobPath(digest string) string { return "blobs/" + strings.Replace(digest, ":", "/", 1) }

func readTar(t *testing.T, r io.Reader) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		must(t, err)
		b, err := io.ReadAll(tr)
		must(t, err)
		files[h.Name] = b
	}
}

func readTarHeaders(t *testing.T, r io.Reader) map[string]*tar.Header {
	t.Helper()
	headers := map[string]*tar.Header{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return headers
		}
		must(t, err)
		headers[h.Name] = h
	}
}

func mustOpen(t *testing.T, p string) io.Reader {
	t.Helper()
	b, err := os.ReadFile(p)
	must(t, err)
	return bytes.NewReader(b)
}

func mustJSON(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("decode %q: %v", b, err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
