package contract

import (
	"slices"
	"testing"
)

// TestParsePIDs: what the registry writes parses; anything else is refused whole.
func TestParsePIDs(t *testing.T) {
	if got, err := ParsePIDs([]byte("12\n345\n")); err != nil || !slices.Equal(got, []int{12, 345}) {
		t.Errorf("ParsePIDs = %v, %v", got, err)
	}
	if got, err := ParsePIDs(nil); err != nil || len(got) != 0 {
		t.Errorf("empty: %v, %v", got, err)
	}
	for _, bad := range []string{"12\nx\n", "0\n", "-3\n", " 12\n", "12\n\n", "99999999999999999999\n"} {
		if got, err := ParsePIDs([]byte(bad)); err == nil {
			t.Errorf("ParsePIDs(%q) = %v, want an error", bad, got)
		}
	}
}
