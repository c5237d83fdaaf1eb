package cdi

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// TestWrittenSpecsLoad: every kind of spec Write produces loads with the CDI library's own
// loader, which the runtime uses: the in-memory validation stands in for loading it back.
func TestWrittenSpecsLoad(t *testing.T) {
	claims := map[string]Claim{
		"NRI path":                 nriClaim(gpu0Result()),
		"NRI path, two GPUs":       nriClaim(gpu0Result(), gpu3Result()),
		"per-claim path":           perClaimClaim(gpu0Result()),
		"per-claim path, two GPUs": perClaimClaim(gpu0Result(), gpu3Result()),
	}
	for name, c := range claims {
		for _, inj := range []Injection{InjectionCDI, InjectionEnv, InjectionNone} {
			t.Run(name+"/"+string(inj), func(t *testing.T) {
				w := newTestWriter(t, func(o *Options) { o.GPUInjection = inj })
				if err := w.Write(c); err != nil {
					t.Fatalf("Write: %v", err)
				}
				if _, err := cdiapi.ReadSpec(w.SpecPath(c.UID), 0); err != nil {
					t.Errorf("the CDI library's loader refuses a written spec: %v", err)
				}
			})
		}
	}
}

// TestValidateSpecAgreesWithTheLoader: specs broken the ways the library's loader refuses are
// refused by validateSpec too, and the spec Write builds passes both.
func TestValidateSpecAgreesWithTheLoader(t *testing.T) {
	w := newTestWriter(t, nil)
	build := func() *cdispec.Spec { c := nriClaim(gpu0Result()); return w.buildSpec(&c) }
	tests := []struct {
		name  string
		spoil func(*cdispec.Spec)
	}{
		{"as built", func(*cdispec.Spec) {}},
		{"bad device name", func(s *cdispec.Spec) { s.Devices[0].Name = "-bad" }},
		{"two devices of one name", func(s *cdispec.Spec) { s.Devices[1].Name = s.Devices[0].Name }},
		{"device without edits", func(s *cdispec.Spec) { s.Devices[0].ContainerEdits = cdispec.ContainerEdits{} }},
		{"no devices", func(s *cdispec.Spec) { s.Devices = nil }},
		{"bad vendor", func(s *cdispec.Spec) { s.Kind = "-x/claim" }},
		{"bad env", func(s *cdispec.Spec) {
			s.Devices[0].ContainerEdits.Env = append(s.Devices[0].ContainerEdits.Env, "NOVALUE")
		}},
		{"mount without a host path", func(s *cdispec.Spec) {
			s.Devices[0].ContainerEdits.Mounts = append(s.Devices[0].ContainerEdits.Mounts, &cdispec.Mount{ContainerPath: "/x"})
		}},
		{"unknown version", func(s *cdispec.Spec) { s.Version = "9.9.9" }},
	}
	dir := t.TempDir()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := build()
			tt.spoil(spec)
			data, err := json.Marshal(spec)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "x.json")
			if err := os.WriteFile(path, data, 0o644); err != nil {
				t.Fatal(err)
			}
			_, loadErr := cdiapi.ReadSpec(path, 0)
			ourErr := validateSpec(spec)
			if (loadErr == nil) != (ourErr == nil) {
				t.Errorf("the loader says %v, validateSpec says %v", loadErr, ourErr)
			}
			if tt.name != "as built" && ourErr == nil {
				t.Error("a broken spec passed")
			}
		})
	}
}
