package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"hash/crc32"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// TestRoundTripFieldNames writes every field and checks the file against the contract's
// names literally, then reads it back into an identical value.
func TestRoundTripFieldNames(t *testing.T) {
	path := checkpointPath(t)
	s := openStore(t, path)
	want := Data{BootID: "3f1e2d4c-boot", Claims: map[string]Claim{uidA: fullClaim()}}
	if err := s.Update(func(d *Data) error { *d = want.DeepCopy(); return nil }); err != nil {
		t.Fatalf("Update: %v", err)
	}
	content := readFile(t, path)

	var raw map[string]json.RawMessage
	if err := json.Unmarshal(content, &raw); err != nil {
		t.Fatal(err)
	}
	var sum uint32
	if err := json.Unmarshal(raw["checksum"], &sum); err != nil {
		t.Fatalf("checksum is not a uint32: %v", err)
	}
	if got := crc32.ChecksumIEEE(raw["data"]); got != sum {
		t.Errorf("checksum = %d, CRC-32 of the data bytes = %d", sum, got)
	}

	var doc map[string]any
	if err := json.Unmarshal(content, &doc); err != nil {
		t.Fatal(err)
	}
	data := doc["data"].(map[string]any)
	claim := data["claims"].(map[string]any)[uidA].(map[string]any)
	device := claim["devices"].([]any)[0].(map[string]any)
	keyTests := []struct {
		name string
		obj  map[string]any
		keys []string
	}{
		{"envelope", doc, []string{"version", "writer", "checksum", "data"}},
		{"data", data, []string{"bootID", "claims"}},
		{"claim", claim, []string{"namespace", "name", "state", "path", "reservedFor", "registerUUID", "devices"}},
		{"device", device, []string{"request", "pool", "device", "shareID", "gpuUUID", "index", "memoryBytes", "cores", "cdiDeviceIDs"}},
	}
	for _, kt := range keyTests {
		got := slices.Sorted(maps.Keys(kt.obj))
		if want := slices.Sorted(slices.Values(kt.keys)); !slices.Equal(got, want) {
			t.Errorf("%s keys = %v, want %v", kt.name, got, want)
		}
	}
	valueTests := []struct {
		name string
		got  any
		want any
	}{
		{"version", doc["version"], "v1"},
		{"bootID", data["bootID"], "3f1e2d4c-boot"},
		{"state", claim["state"], "PrepareCompleted"},
		{"path", claim["path"], "per-claim"},
		{"reservedFor", claim["reservedFor"], []any{podX, podY}},
		{"index", device["index"], float64(3)},
		{"memoryBytes", device["memoryBytes"], float64(4 << 30)},
		{"cores", device["cores"], float64(30)},
		{"gpuUUID", device["gpuUUID"], "GPU-3b2a1c0d-9e8f-7a6b-5c4d-3e2f1a0b9c8d"},
	}
	for _, vt := range valueTests {
		if !reflect.DeepEqual(vt.got, vt.want) {
			t.Errorf("%s = %#v, want %#v", vt.name, vt.got, vt.want)
		}
	}

	if got := openStore(t, path).Snapshot(); !reflect.DeepEqual(got, want) {
		t.Errorf("reloaded data differs:\n got %+v\nwant %+v", got, want)
	}
}

// TestOpenCorrupt damages a valid file in one way each and expects a *CorruptError that
// names the file, never a silent reset.
func TestOpenCorrupt(t *testing.T) {
	tests := []struct {
		name       string
		damage     func(content []byte) []byte
		wantReason string
	}{
		{
			name: "one byte flipped inside data",
			damage: func(c []byte) []byte {
				return bytes.Replace(c, []byte(`"team-a"`), []byte(`"team-b"`), 1)
			},
			wantReason: "checksum mismatch",
		},
		{
			name:       "truncated",
			damage:     func(c []byte) []byte { return c[:len(c)/2] },
			wantReason: "unparsable JSON",
		},
		{
			name:       "empty",
			damage:     func([]byte) []byte { return nil },
			wantReason: "unparsable JSON",
		},
		{
			name:       "unknown version",
			damage:     func(c []byte) []byte { return bytes.Replace(c, []byte(`"version":"v1"`), []byte(`"version":"v0"`), 1) },
			wantReason: `unknown version "v0"`,
		},
		{
			name:       "version that is not v<N>",
			damage:     func(c []byte) []byte { return bytes.Replace(c, []byte(`"version":"v1"`), []byte(`"version":"v02"`), 1) },
			wantReason: `unknown version "v02"`,
		},
		{
			name:       "no checksum",
			damage:     func(c []byte) []byte { return bytes.Replace(c, []byte(`"checksum"`), []byte(`"checksun"`), 1) },
			wantReason: "no checksum",
		},
		{
			name:       "no data",
			damage:     func([]byte) []byte { return []byte(`{"version":"v1","checksum":0}`) },
			wantReason: "no data",
		},
		{
			name: "data of the wrong shape with a matching checksum",
			damage: func([]byte) []byte {
				data := `{"bootID":1}`
				return []byte(`{"version":"v1","checksum":` + jsonNumber(crc32.ChecksumIEEE([]byte(data))) + `,"data":` + data + `}`)
			},
			wantReason: "unparsable data",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := checkpointPath(t)
			s := openStore(t, path)
			if err := s.Update(putClaim(uidA, fullClaim())); err != nil {
				t.Fatal(err)
			}
			damaged := tt.damage(readFile(t, path))
			if err := os.WriteFile(path, damaged, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Open(path)
			var ce *CorruptError
			if !errors.As(err, &ce) {
				t.Fatalf("Open = %v, want a *CorruptError", err)
			}
			if ce.Path != path || !strings.Contains(err.Error(), path) {
				t.Errorf("error %q does not name %s (Path %q)", err, path, ce.Path)
			}
			if !strings.Contains(ce.Reason, tt.wantReason) {
				t.Errorf("reason %q, want it to say %q", ce.Reason, tt.wantReason)
			}
			if got := readFile(t, path); !bytes.Equal(got, damaged) {
				t.Error("Open changed the corrupt file")
			}
			if _, err := ReadFile(path); !errors.As(err, &ce) || !strings.Contains(ce.Reason, tt.wantReason) {
				t.Errorf("ReadFile = %v, want a *CorruptError saying %q", err, tt.wantReason)
			}
		})
	}
}

// TestReadFileLeavesTheDirectoryAlone: ReadFile returns what Open loads, and, unlike Open, does
// not remove a temporary file a writer may be busy with.
func TestReadFileLeavesTheDirectoryAlone(t *testing.T) {
	path := checkpointPath(t)
	s := openStore(t, path)
	if err := s.Update(putClaim(uidA, fullClaim())); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp-in-flight")
	if err := os.WriteFile(tmp, []byte("half written"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := s.Snapshot(); !reflect.DeepEqual(got, want) {
		t.Errorf("ReadFile = %+v, want %+v", got, want)
	}
	if _, err := os.Stat(tmp); err != nil {
		t.Errorf("ReadFile touched the directory: %v", err)
	}
	if _, err := ReadFile(filepath.Join(t.TempDir(), "missing.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadFile of a missing file = %v, want fs.ErrNotExist", err)
	}
}

func jsonNumber(v uint32) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestDeepCopyIsIndependent(t *testing.T) {
	orig := Data{BootID: "b", Claims: map[string]Claim{uidA: fullClaim(), uidB: {Name: "empty"}}}
	cp := orig.DeepCopy()
	if !reflect.DeepEqual(cp, orig) {
		t.Fatalf("copy differs from original:\n got %+v\nwant %+v", cp, orig)
	}
	c := cp.Claims[uidA]
	c.ReservedFor[0] = "changed"
	c.Devices[0].CDIDeviceIDs[0] = "changed"
	c.Devices[0].Cores = 1
	cp.Claims[uidA] = c
	delete(cp.Claims, uidB)
	if want := (Data{BootID: "b", Claims: map[string]Claim{uidA: fullClaim(), uidB: {Name: "empty"}}}); !reflect.DeepEqual(orig, want) {
		t.Errorf("changing the copy changed the original: %+v", orig)
	}
	if got := (Data{}).DeepCopy(); got.Claims != nil {
		t.Errorf("copy of a nil map = %#v, want nil", got.Claims)
	}
	if got := (Claim{ReservedFor: []string{}}).DeepCopy(); got.ReservedFor == nil || got.Devices != nil {
		t.Errorf("copy changed nil-ness of slices: %#v", got)
	}
}

// TestDeepCopyAppendDoesNotClobber: the copies of all claims share backing arrays, so an
// append to one claim's slice must not overwrite the next claim's elements.
func TestDeepCopyAppendDoesNotClobber(t *testing.T) {
	orig := Data{Claims: map[string]Claim{}}
	for i := range 8 {
		orig.Claims[string(rune('a'+i))] = fullClaim()
	}
	cp := orig.DeepCopy()
	for uid, c := range cp.Claims {
		c.ReservedFor = append(c.ReservedFor, "appended-"+uid)
		c.Devices = append(c.Devices, Device{Device: "appended"})
		c.Devices[0].CDIDeviceIDs = append(c.Devices[0].CDIDeviceIDs, "appended")
		cp.Claims[uid] = c
	}
	for uid, c := range cp.Claims {
		want := fullClaim()
		want.ReservedFor = append(want.ReservedFor, "appended-"+uid)
		want.Devices[0].CDIDeviceIDs = append(want.Devices[0].CDIDeviceIDs, "appended")
		want.Devices = append(want.Devices, Device{Device: "appended"})
		if !reflect.DeepEqual(c, want) {
			t.Errorf("claim %s after appends = %+v, want %+v", uid, c, want)
		}
	}
	for uid, c := range orig.Claims {
		if !reflect.DeepEqual(c, fullClaim()) {
			t.Errorf("original claim %s changed: %+v", uid, c)
		}
	}
}
