package checkpoint

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestClaimEncoderMatchesJSON: through a long run of changes to every field of claims, adding
// and removing claims, nil and empty slices, the incremental encoder writes exactly the bytes
// json.Marshal writes — the checksum and every reader of the file rely on it.
func TestClaimEncoderMatchesJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	enc := newClaimEncoder()
	d := Data{BootID: "boot-\"1\"", Claims: map[string]Claim{}}
	uid := func() string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", rng.IntN(20)) }
	changes := []func(c *Claim){
		func(c *Claim) { c.Namespace += "x" },
		func(c *Claim) { c.Name = "n<&>" + fmt.Sprint(rng.IntN(3)) },
		func(c *Claim) { c.State = PrepareStarted },
		func(c *Claim) { c.Path = "per-claim" },
		func(c *Claim) { c.RegisterUUID = fmt.Sprint(rng.IntN(3)) },
		func(c *Claim) { c.ReservedFor = nil },
		func(c *Claim) { c.ReservedFor = []string{} },
		func(c *Claim) { c.ReservedFor = append(c.ReservedFor, podY) },
		func(c *Claim) { c.Devices = nil },
		func(c *Claim) { c.Devices = []Device{} },
		func(c *Claim) { c.Devices = append(c.Devices, fullClaim().Devices[0]) },
		func(c *Claim) {
			if len(c.Devices) > 0 {
				c.Devices[0].Cores = int64(rng.IntN(100))
			}
		},
		func(c *Claim) {
			if len(c.Devices) > 0 {
				c.Devices[0].AdminAccess = !c.Devices[0].AdminAccess
			}
		},
		func(c *Claim) {
			if len(c.Devices) > 0 {
				c.Devices[0].CDIDeviceIDs = nil
			}
		},
		func(c *Claim) {
			if len(c.Devices) > 0 {
				c.Devices[0].Class = []string{"", "Guaranteed", "BestEffort"}[rng.IntN(3)]
			}
		},
		func(c *Claim) {
			if len(c.Devices) > 0 {
				c.Devices[0].CoresCeiling = int64(rng.IntN(101))
			}
		},
	}
	for step := range 2000 {
		u := uid()
		switch r := rng.IntN(10); {
		case r == 0:
			delete(d.Claims, u)
		case r == 1:
			d.BootID = fmt.Sprint(step)
		default:
			c := fullClaim()
			if old, ok := d.Claims[u]; ok {
				c = old.DeepCopy()
			}
			changes[rng.IntN(len(changes))](&c)
			d.Claims[u] = c
		}
		got, err := enc.encode(d)
		if err != nil {
			t.Fatal(err)
		}
		want, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("step %d: encoded\n%s\nwant\n%s", step, got, want)
		}
	}
	if len(enc.claims) != len(d.Claims) {
		t.Errorf("the encoder keeps %d claims, the data holds %d", len(enc.claims), len(d.Claims))
	}
}

// BenchmarkEncode: encoding the file for one changed claim among n.
func BenchmarkEncode(b *testing.B) {
	for _, n := range []int{100, 800} {
		b.Run(fmt.Sprintf("claims=%d", n), func(b *testing.B) {
			d := Data{BootID: "boot", Claims: map[string]Claim{}}
			for i := range n {
				d.Claims[fmt.Sprintf("00000000-0000-4000-8000-%012d", i)] = fullClaim()
			}
			enc := newClaimEncoder()
			c := fullClaim()
			for i := 0; b.Loop(); i++ {
				c.Devices[0].Cores = int64(i)
				d.Claims[uidA] = c.DeepCopy()
				if _, _, err := encode(enc, d, "w"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
