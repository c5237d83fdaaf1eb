package deviceplugin

import (
	"errors"
	"testing"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

func TestParseShareID(t *testing.T) {
	tests := []struct {
		in   string
		uuid string
		n    int
		ok   bool
	}{
		{"GPU-1::0", "GPU-1", 0, true},
		{"GPU-1::12", "GPU-1", 12, true},
		{"GPU-1:0", "", 0, false},
		{"::1", "", 0, false},
		{"GPU-1::", "", 0, false},
		{"GPU-1::01", "", 0, false},
		{"GPU-1::-1", "", 0, false},
		{"GPU-1::+1", "", 0, false},
		{"GPU-1::1x", "", 0, false},
		{"GPU-1::99999999999999999999", "", 0, false},
	}
	for _, tc := range tests {
		uuid, n, err := ParseShareID(tc.in)
		if (err == nil) != tc.ok || uuid != tc.uuid || n != tc.n {
			t.Errorf("ParseShareID(%q) = %q, %d, %v; want %q, %d, ok=%v", tc.in, uuid, n, err, tc.uuid, tc.n, tc.ok)
		}
		if tc.ok && ShareID(uuid, n) != tc.in {
			t.Errorf("ShareID(%q, %d) does not give %q back", uuid, n, tc.in)
		}
	}
}

// TestNewInventorySizing: the default is an equal split of what the reserve leaves, in whole
// MiB; an explicit size must fit; cores are passed on.
func TestNewInventorySizing(t *testing.T) {
	tests := []struct {
		name    string
		memory  uint64
		sizing  Sizing
		wantMem int64
		wantErr bool
	}{
		{"equal split", 80 * gib, Sizing{SharesPerGPU: 4}, 20 * gib, false},
		{"split rounds down to MiB", 10*gib + 3, Sizing{SharesPerGPU: 3}, (10 * gib / 3) / mib * mib, false},
		{"reserve first", 80 * gib, Sizing{SharesPerGPU: 2, MemoryReserve: 2 * gib}, 39 * gib, false},
		{"explicit size", 80 * gib, Sizing{SharesPerGPU: 3, ShareMemory: 10*gib + 5}, 10 * gib, false},
		{"explicit size too big", 80 * gib, Sizing{SharesPerGPU: 4, ShareMemory: 21 * gib}, 0, true},
		{"reserve eats it all", 80 * gib, Sizing{SharesPerGPU: 1, MemoryReserve: 80 * gib}, 0, true},
		{"no shares", 80 * gib, Sizing{}, 0, true},
		{"cores over 100", 80 * gib, Sizing{SharesPerGPU: 1, ShareCores: 101}, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			inv, err := NewInventory(testGPUs(2, tc.memory), tc.sizing, resource)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			for _, g := range inv.GPUs {
				if g.MemoryBytes != tc.wantMem || g.Count != tc.sizing.SharesPerGPU {
					t.Errorf("GPU %d: %d shares of %d bytes, want %d of %d", g.Device.Index, g.Count, g.MemoryBytes, tc.sizing.SharesPerGPU, tc.wantMem)
				}
			}
			if len(inv.Shares) != 2*tc.sizing.SharesPerGPU {
				t.Errorf("%d shares", len(inv.Shares))
			}
		})
	}
}

// TestShareUIDs: a share's UID is the same on every start (its directories and register UUID
// must survive a restart), differs between shares and between resource names, and is a
// canonical lower-case UUID (it names a host directory).
func TestShareUIDs(t *testing.T) {
	a, b := testInventory(t, 2, 3), testInventory(t, 2, 3)
	other, err := NewInventory(testGPUs(2, 80*gib), Sizing{SharesPerGPU: 3}, "example.com/gpu")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i, sh := range a.Shares {
		if sh.UID != b.Shares[i].UID {
			t.Errorf("share %s: UID %s, then %s", sh.ID, sh.UID, b.Shares[i].UID)
		}
		if sh.UID == other.Shares[i].UID {
			t.Errorf("share %s has the same UID under another resource name", sh.ID)
		}
		if err := contract.ValidateUID(sh.UID); err != nil {
			t.Errorf("share %s: %v", sh.ID, err)
		}
		if seen[sh.UID] {
			t.Errorf("UID %s twice", sh.UID)
		}
		seen[sh.UID] = true
		if got, ok := a.ByUID(sh.UID); !ok || got != sh {
			t.Errorf("ByUID(%s) = %v", sh.UID, got)
		}
	}
	if _, err := a.Lookup(id(0, 3)); !errors.Is(err, ErrUnknownShare) {
		t.Errorf("share 3 of a GPU with 3: %v", err)
	}
	if _, err := a.Lookup("nonsense"); !errors.Is(err, ErrUnknownShare) {
		t.Errorf("malformed ID: %v", err)
	}
}
