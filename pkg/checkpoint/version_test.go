package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestOpenFixtures opens a file of every format version ever written (testdata: v1 as the
// plugin wrote it before v2 existed, v2 with an admin-access device) and one of a newer
// version: the old ones load unchanged, the newer one is refused with an error naming its
// version and its writer, and nothing is rewritten.
func TestOpenFixtures(t *testing.T) {
	v1 := Data{BootID: "6c1d2e3f-boot", Claims: map[string]Claim{uidA: fullClaim(), uidB: v1NRIClaim()}}
	v2 := Data{BootID: "6c1d2e3f-boot", Claims: map[string]Claim{uidA: fullClaim(), uidB: adminClaim()}}
	tests := []struct {
		fixture     string
		want        *Data
		wantVersion []string // in the refusal
	}{
		{fixture: "checkpoint-v1.json", want: &v1},
		{fixture: "checkpoint-v2.json", want: &v2},
		{fixture: "checkpoint-v3.json", wantVersion: []string{"format v3", "written by vgpu-dra v0.9.0 (4f1c2d3e)", "reads formats v1 and v2"}},
	}
	for _, tt := range tests {
		t.Run(tt.fixture, func(t *testing.T) {
			path := copyFixture(t, tt.fixture)
			before := readFile(t, path)
			s, err := Open(path)
			if tt.want != nil {
				if err != nil {
					t.Fatalf("Open: %v", err)
				}
				if got := s.Snapshot(); !reflect.DeepEqual(got, *tt.want) {
					t.Errorf("loaded data differs:\n got %+v\nwant %+v", got, *tt.want)
				}
			} else {
				var ve *VersionError
				if !errors.As(err, &ve) {
					t.Fatalf("Open = %v, want a *VersionError", err)
				}
				for _, want := range append(tt.wantVersion, path) {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not say %q", err, want)
					}
				}
				var ce *CorruptError
				if errors.As(err, &ce) {
					t.Error("a newer version is reported as corrupt")
				}
			}
			if got := readFile(t, path); !bytes.Equal(got, before) {
				t.Error("Open rewrote the file")
			}
		})
	}
}

// TestWrittenVersion: a file is written in the oldest format that holds its data — v1 until
// an admin-access device is recorded, v2 while one is, v1 again once it is gone — so that a
// rollback to a v1-only plugin works whenever it can read the data right.
func TestWrittenVersion(t *testing.T) {
	path := copyFixture(t, "checkpoint-v1.json")
	s, err := Open(path, WithWriter("vgpu-dra test"))
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name   string
		mutate func(*Data) error
		want   string
	}{
		{"v1 data stays v1", putClaim(uidB, v1NRIClaim()), VersionV1},
		{"an admin-access device needs v2", putClaim(uidB, adminClaim()), VersionV2},
		{"back to v1 once it is gone", func(d *Data) error { delete(d.Claims, uidB); return nil }, VersionV1},
	}
	for _, st := range steps {
		if err := s.Update(st.mutate); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		var env struct{ Version, Writer string }
		if err := json.Unmarshal(readFile(t, path), &env); err != nil {
			t.Fatal(err)
		}
		if env.Version != st.want || env.Writer != "vgpu-dra test" {
			t.Errorf("%s: version %q writer %q, want %q and the store's writer", st.name, env.Version, env.Writer, st.want)
		}
		if _, err := Open(path); err != nil {
			t.Errorf("%s: reopen: %v", st.name, err)
		}
	}
}

// TestV1WithAdminAccessIsCorrupt: v1 has no admin-access devices; one claiming to be v1 with
// one was not written by any plugin.
func TestV1WithAdminAccessIsCorrupt(t *testing.T) {
	path := copyFixture(t, "checkpoint-v2.json")
	// The checksum covers the data only: the v2 data in a v1 envelope still matches it.
	forged := bytes.Replace(readFile(t, path), []byte(`"version":"v2"`), []byte(`"version":"v1"`), 1)
	if err := os.WriteFile(path, forged, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Open(path)
	var ce *CorruptError
	if !errors.As(err, &ce) || !strings.Contains(ce.Reason, "admin-access") {
		t.Fatalf("Open = %v, want a *CorruptError about the admin-access device", err)
	}
}

// v1NRIClaim is the second claim of the v1 fixture: a sub-request result on the NRI path.
func v1NRIClaim() Claim {
	return Claim{
		Namespace: "team-b", Name: "infer", State: PrepareCompleted, Path: "nri", RegisterUUID: "",
		ReservedFor: []string{podY},
		Devices: []Device{{
			Request: "gpu/small", Pool: "node-1", Device: "gpu-1", ShareID: "2e9c1d3f-0a3b-4c5d-8e6f-1a2b3c4d5e6f",
			GPUUUID: "GPU-0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d", Index: 1, MemoryBytes: 10 << 30,
			CDIDeviceIDs: []string{"vgpu.dra.dev/claim=" + uidB + "-gpu_small-gpu-1-2e9c1d3f", "vgpu.dra.dev/claim=" + uidB + "-common"},
		}},
	}
}

// copyFixture copies testdata/name to a checkpoint path of its own.
func copyFixture(t *testing.T, name string) string {
	t.Helper()
	content, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	path := checkpointPath(t)
	if err := os.WriteFile(path, content, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestClassAndCeilingKeepTheVersion: a device's class and ceiling are optional fields an older
// reader ignores (it serves the share at its request), so they do not raise the format version,
// and they survive a reopen.
func TestClassAndCeilingKeepTheVersion(t *testing.T) {
	path := copyFixture(t, "checkpoint-v1.json")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	c := v1NRIClaim()
	c.Devices[0].Class, c.Devices[0].CoresCeiling = "BestEffort", 90
	if err := s.Update(putClaim(uidB, c)); err != nil {
		t.Fatal(err)
	}
	var env struct{ Version string }
	if err := json.Unmarshal(readFile(t, path), &env); err != nil || env.Version != VersionV1 {
		t.Fatalf("version %q (%v), want %s", env.Version, err, VersionV1)
	}
	again, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	got := again.Snapshot().Claims[uidB].Devices[0]
	if got.Class != "BestEffort" || got.CoresCeiling != 90 {
		t.Fatalf("reopened device %+v, want class BestEffort ceiling 90", got)
	}
}
