package deviceplugin

import (
	"slices"
	"testing"
)

// TestPreferred: must-include first, then the policy; ties to the lower GPU, then share.
// Inventory: 3 GPUs of 4 shares; "free" lists what the kubelet says is available.
func TestPreferred(t *testing.T) {
	all := func(g int) [][2]int { return [][2]int{{g, 0}, {g, 1}, {g, 2}, {g, 3}} }
	// GPU 0 has 1 share free, GPU 1 all 4, GPU 2 has 2.
	mixed := ids(slices.Concat([][2]int{{0, 3}}, all(1), [][2]int{{2, 1}, {2, 3}})...)
	tests := []struct {
		name        string
		policy      Policy
		available   []string
		mustInclude []string
		size        int
		want        []string
	}{
		{"binpack one: the fullest GPU", PolicyBinpack, mixed, nil, 1, ids([2]int{0, 3})},
		{"binpack two: the fullest that holds both", PolicyBinpack, mixed, nil, 2, ids([2]int{2, 1}, [2]int{2, 3})},
		{"binpack three: one GPU", PolicyBinpack, mixed, nil, 3, ids([2]int{1, 0}, [2]int{1, 1}, [2]int{1, 2})},
		{"binpack six: fewest GPUs, largest first", PolicyBinpack, mixed, nil, 6,
			ids([2]int{1, 0}, [2]int{1, 1}, [2]int{1, 2}, [2]int{1, 3}, [2]int{2, 1}, [2]int{2, 3})},
		{"binpack fills the must-include GPU first", PolicyBinpack, mixed, ids([2]int{1, 2}), 3,
			ids([2]int{1, 2}, [2]int{1, 0}, [2]int{1, 1})},
		{"spread one: the emptiest GPU", PolicySpread, mixed, nil, 1, ids([2]int{1, 0})},
		{"spread three: three GPUs", PolicySpread, mixed, nil, 3, ids([2]int{1, 0}, [2]int{2, 1}, [2]int{0, 3})},
		{"spread avoids the must-include GPU", PolicySpread, mixed, ids([2]int{1, 2}), 2, ids([2]int{1, 2}, [2]int{2, 1})},
		{"must-include only", PolicyBinpack, mixed, ids([2]int{2, 3}, [2]int{0, 3}), 2, ids([2]int{2, 3}, [2]int{0, 3})},
		{"too few available: all of them", PolicyBinpack, ids([2]int{0, 1}, [2]int{2, 0}), nil, 3, ids([2]int{0, 1}, [2]int{2, 0})},
		{"unknown IDs last", PolicyBinpack, []string{"other-device", id(0, 0)}, nil, 2, []string{id(0, 0), "other-device"}},
		{"an ID listed twice counts once", PolicyBinpack, ids([2]int{0, 0}, [2]int{0, 0}, [2]int{0, 1}), nil, 2, ids([2]int{0, 0}, [2]int{0, 1})},
		{"nothing asked", PolicyBinpack, mixed, nil, 0, []string{}},
	}
	inv := testInventory(t, 3, 4)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := inv.preferredSafe(tc.policy, tc.available, tc.mustInclude, tc.size)
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("preferred = %v, %v\nwant %v", got, err, tc.want)
			}
		})
	}
}

// TestPreferredNeverFails: a panic inside (here: a corrupt inventory) is answered with the
// must-include IDs and then the available ones, never an error to the kubelet.
func TestPreferredNeverFails(t *testing.T) {
	inv := testInventory(t, 1, 2)
	inv.byID[id(0, 1)].GPU = 7 // no such GPU position: indexing panics
	got, err := inv.preferredSafe(PolicyBinpack, ids([2]int{0, 0}, [2]int{0, 1}), ids([2]int{0, 1}), 2)
	if err == nil {
		t.Fatal("no error reported for the log")
	}
	if want := ids([2]int{0, 1}, [2]int{0, 0}); !slices.Equal(got, want) {
		t.Errorf("fallback = %v, want %v", got, want)
	}
}
