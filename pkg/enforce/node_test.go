package enforce

import (
	"testing"

	"k8s.io/klog/v2"

	rt "github.com/vgpu-dra/vgpu-dra/pkg/registry/registrytest"
)

// TestNodeHooks: the registration rule is the registry's where libvgpu.so is installed and off
// where it is not; a freezer exists only to throttle.
func TestNodeHooks(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	never := func(int, string) bool { return false }
	for _, tc := range []struct {
		cores       CoreMode
		library     bool
		wantFreeze  bool
		wantAllowed bool
	}{
		{CoreReport, true, false, false},
		{CoreThrottle, true, true, false},
		{CoreOff, false, false, true},
	} {
		freeze, reg := NodeHooks(klog.Background(), Settings{Cores: tc.cores}, h, tc.library, never)
		if (freeze != nil) != tc.wantFreeze || reg(1, "/cfg") != tc.wantAllowed {
			t.Errorf("cores %s, library %v: freezer %v, unregistered allowed %v; want %v, %v", tc.cores, tc.library, freeze != nil, reg(1, "/cfg"), tc.wantFreeze, tc.wantAllowed)
		}
	}
	if c := (Settings{}).Config(); c.SlackPerProcess != -1 {
		t.Errorf("an explicit slack of 0 is Config slack %d, want -1 (none)", c.SlackPerProcess)
	}
}
