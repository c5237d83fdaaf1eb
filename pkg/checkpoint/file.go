package checkpoint

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
)

// Format versions of the file (contract §7). A new version is added only when the meaning of
// the data changes in a way an older reader would get wrong; each reader keeps reading every
// older version.
const (
	// VersionV1 is the first format.
	VersionV1 = "v1"
	// VersionV2 adds Device.AdminAccess: a v1 reader would take an admin-access device for a
	// whole-GPU share and count it against the GPU's capacity.
	VersionV2 = "v2"
)

// CurrentVersion is the newest format this package reads and writes.
const CurrentVersion = VersionV2

// readableVersions are the formats decode accepts, oldest first.
var readableVersions = []string{VersionV1, VersionV2}

// versionFor is the format a file holding d is written in: the oldest that can hold it, so that
// a rollback to a plugin that reads only v1 keeps working until a claim needs v2 (that plugin
// then refuses the file, naming its version, instead of misreading an admin-access claim).
func versionFor(d Data) string {
	for _, c := range d.Claims {
		for _, dev := range c.Devices {
			if dev.AdminAccess {
				return VersionV2
			}
		}
	}
	return VersionV1
}

// VersionError says that the checkpoint was written in a format newer than this plugin reads,
// by the writer it names (a plugin rolled back past a format change). The file is left as it
// is: the plugin that wrote it can read it, and resetting it would strand every claim on the
// node.
type VersionError struct {
	// Path is the checkpoint file.
	Path string
	// Version is the file's format version, e.g. "v3".
	Version string
	// Writer is what the file says wrote it; empty when it does not say.
	Writer string
}

// Error names the file, its version, its writer and what this plugin reads.
func (e *VersionError) Error() string {
	writer := e.Writer
	if writer == "" {
		writer = "a writer it does not name"
	}
	return fmt.Sprintf("checkpoint %s has format %s, written by %s; this plugin reads formats %s only: run a plugin that reads %s (the file is left untouched)",
		e.Path, e.Version, writer, strings.Join(readableVersions, " and "), e.Version)
}

// DefaultWriter names this build in the files it writes ("writer"): the main module's
// version, and its VCS revision when the build recorded one.
func DefaultWriter() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "vgpu-dra (unknown version)"
	}
	w := "vgpu-dra " + bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && s.Value != "" {
			w += " (" + s.Value + ")"
		}
	}
	return w
}

// CorruptError says that the checkpoint file exists but cannot be trusted: it does not parse,
// its checksum does not match, or its version is unknown. The store never resets such a file
// silently; whoever opens it decides (typically: fail start-up and let an operator look).
type CorruptError struct {
	// Path is the checkpoint file.
	Path string
	// Reason says what is wrong with it.
	Reason string
}

// Error names the file and what is wrong with it.
func (e *CorruptError) Error() string {
	return fmt.Sprintf("checkpoint %s is corrupt: %s", e.Path, e.Reason)
}

// envelope is the outer object of the file. Data stays raw so that the bytes the checksum is
// verified over are exactly the bytes in the file.
type envelope struct {
	Version string `json:"version"`
	// Writer names the build that wrote the file (DefaultWriter); read only to say who wrote a
	// file of a newer version. A v1-only reader ignores it.
	Writer   string          `json:"writer,omitempty"`
	Checksum *uint32         `json:"checksum"`
	Data     json.RawMessage `json:"data"`
}

// encode returns the data value as written (the checksummed bytes, a part of file) and the
// whole file content.
// The file is assembled by hand rather than by marshalling an envelope with a RawMessage so
// that no re-encoding can change a byte between the checksum and the file. The data value is
// encoded by enc, which re-encodes only the claims that changed (encoder.go).
func encode(enc *claimEncoder, d Data, writer string) (dataBytes, file []byte, err error) {
	if d.Claims == nil {
		d.Claims = map[string]Claim{} // the contract shows an object, never null
	}
	encoded, err := enc.encode(d)
	if err != nil {
		return nil, nil, fmt.Errorf("encode checkpoint data: %w", err)
	}
	var b bytes.Buffer
	b.Grow(len(encoded) + len(writer) + 80)
	b.WriteString(`{"version":`)
	b.WriteString(strconv.Quote(versionFor(d)))
	if writer != "" {
		b.WriteString(`,"writer":`)
		b.WriteString(strconv.Quote(writer))
	}
	b.WriteString(`,"checksum":`)
	b.WriteString(strconv.FormatUint(uint64(crc32.ChecksumIEEE(encoded)), 10))
	b.WriteString(`,"data":`)
	start := b.Len()
	b.Write(encoded)
	b.WriteString("}\n")
	file = b.Bytes()
	return file[start : start+len(encoded)], file, nil
}

// decode parses a checkpoint file's content; path is only used in errors. Any defect is
// reported as a *CorruptError.
func decode(path string, content []byte) (Data, error) {
	corrupt := func(format string, args ...any) (Data, error) {
		return Data{}, &CorruptError{Path: path, Reason: fmt.Sprintf(format, args...)}
	}
	var env envelope
	if err := json.Unmarshal(content, &env); err != nil {
		return corrupt("unparsable JSON: %v", err)
	}
	if !slices.Contains(readableVersions, env.Version) {
		if isNewer(env.Version) {
			return Data{}, &VersionError{Path: path, Version: env.Version, Writer: env.Writer}
		}
		return corrupt("unknown version %q (this plugin reads %s)", env.Version, strings.Join(readableVersions, " and "))
	}
	if env.Checksum == nil {
		return corrupt("no checksum")
	}
	if len(env.Data) == 0 || bytes.Equal(env.Data, []byte("null")) {
		return corrupt("no data")
	}
	if sum := crc32.ChecksumIEEE(env.Data); sum != *env.Checksum {
		return corrupt("checksum mismatch: file says %d, data hashes to %d", *env.Checksum, sum)
	}
	var d Data
	if err := json.Unmarshal(env.Data, &d); err != nil {
		return corrupt("unparsable data: %v", err)
	}
	if d.Claims == nil {
		d.Claims = map[string]Claim{}
	}
	if env.Version == VersionV1 && versionFor(d) != VersionV1 {
		return corrupt("a %s file holds an admin-access device, which only %s can record", VersionV1, VersionV2)
	}
	return d, nil
}

// ReadFile reads and checks the checkpoint at path without changing anything on disk — unlike
// Open, which removes the temporary files of a write that a crash interrupted, and would remove
// a running plugin's: it is for tools and tests that look at the file while a plugin writes it.
// Unlike Load, a missing file is an error (fs.ErrNotExist): a checker must not take a file that
// is gone for an empty node. A file that cannot be trusted is a *CorruptError, one of a newer
// format a *VersionError.
func ReadFile(path string) (Data, error) {
	content, err := os.ReadFile(path)
	if err != nil {
		return Data{}, fmt.Errorf("read checkpoint: %w", err)
	}
	return decode(path, content)
}

// isNewer reports whether version is "v<N>" with N above every version this package reads.
func isNewer(version string) bool {
	n, err := strconv.Atoi(strings.TrimPrefix(version, "v"))
	if err != nil || !strings.HasPrefix(version, "v") || strconv.Itoa(n) != version[1:] {
		return false
	}
	latest, _ := strconv.Atoi(strings.TrimPrefix(CurrentVersion, "v"))
	return n > latest
}
