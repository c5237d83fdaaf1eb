package checkpoint

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"os"
	"strconv"
)

// Version is the only checkpoint format version this package reads and writes.
const Version = "v1"

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
	Version  string          `json:"version"`
	Checksum *uint32         `json:"checksum"`
	Data     json.RawMessage `json:"data"`
}

// encode returns the data value as written (the checksummed bytes) and the whole file content.
// The file is assembled by hand rather than by marshalling an envelope with a RawMessage so
// that no re-encoding can change a byte between the checksum and the file.
func encode(d Data) (dataBytes, file []byte, err error) {
	if d.Claims == nil {
		d.Claims = map[string]Claim{} // the contract shows an object, never null
	}
	dataBytes, err = json.Marshal(d)
	if err != nil {
		return nil, nil, fmt.Errorf("encode checkpoint data: %w", err)
	}
	var b bytes.Buffer
	b.Grow(len(dataBytes) + 64)
	b.WriteString(`{"version":`)
	b.WriteString(strconv.Quote(Version))
	b.WriteString(`,"checksum":`)
	b.WriteString(strconv.FormatUint(uint64(crc32.ChecksumIEEE(dataBytes)), 10))
	b.WriteString(`,"data":`)
	b.Write(dataBytes)
	b.WriteString("}\n")
	return dataBytes, b.Bytes(), nil
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
	if env.Version != Version {
		return corrupt("unknown version %q (this plugin reads %q)", env.Version, Version)
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
	return d, nil
}

// ReadFile reads and checks the checkpoint at path without changing anything on disk — unlike
// Open, which removes the temporary files of a write that a crash interrupted, and would remove
// a running plugin's: it is for tools and tests that look at the file while a plugin writes it.
// A missing file is an error (fs.ErrNotExist); a file that cannot be trusted is a *CorruptError.
func ReadFile(path string) (Data, error) {
	content, err := os.ReadFile(path)
	if err != nil {
		return Data{}, fmt.Errorf("read checkpoint: %w", err)
	}
	return decode(path, content)
}
