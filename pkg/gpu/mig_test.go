package gpu

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func newSimMIG(t *testing.T, stateFile string) (*Simulated, string) {
	t.Helper()
	sim, err := NewSimulated("dgx-h200", 2, "mig-node")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	if stateFile != "" {
		if err := sim.SetMIGStateFile(stateFile); err != nil {
			t.Fatal(err)
		}
	}
	return sim, sim.visible[0].UUID
}

func TestMIGLayoutOfH200(t *testing.T) {
	sim, uuid := newSimMIG(t, "")
	l, err := sim.MIGLayout(uuid)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range l.Profiles {
		names = append(names, p.Name)
	}
	want := []string{"1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"}
	if !slices.Equal(names, want) {
		t.Errorf("profiles %v, want %v", names, want)
	}
	if l.Slots != 7 || l.Slices != 7 || l.MemoryBytes != 144384<<20 {
		t.Errorf("layout slots %d slices %d memory %d, want 7, 7, 141 GiB", l.Slots, l.Slices, l.MemoryBytes)
	}
	p, ok := l.Profile(nvml.GPU_INSTANCE_PROFILE_2_SLICE)
	if !ok || len(p.Placements) != 3 || p.Placements[1] != (MIGPlacement{Start: 2, Size: 2}) || p.MemoryBytes != 35840<<20 {
		t.Errorf("2g profile %+v", p)
	}
}

func TestMIGProfileNames(t *testing.T) {
	for _, c := range []struct {
		id, slices int
		mib        uint64
		want       string
	}{
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE, 1, 4864, "1g.5gb"}, // A100 40GB: rounded up
		{nvml.GPU_INSTANCE_PROFILE_7_SLICE, 7, 40192, "7g.40gb"},
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 1, 18432, "1g.18gb+me"},
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME, 1, 18432, "1g.18gb-me"},
	} {
		if got := migProfileName(c.id, c.slices, c.mib); got != c.want {
			t.Errorf("profile %d, %d slices, %d MiB: %q, want %q", c.id, c.slices, c.mib, got, c.want)
		}
	}
}

func TestSimulatedMIGBehavesLikeTheHardware(t *testing.T) {
	sim, uuid := newSimMIG(t, "")
	if _, err := sim.CreateMIGInstance(uuid, nvml.GPU_INSTANCE_PROFILE_1_SLICE, MIGPlacement{Start: 0, Size: 1}); err == nil {
		t.Fatal("a MIG instance was created with MIG mode off")
	}
	if err := sim.SetMIGMode(uuid, true); err != nil {
		t.Fatal(err)
	}
	if cur, pending, err := sim.MIGMode(uuid); err != nil || !cur || !pending {
		t.Fatalf("MIG mode %v/%v, %v; want on", cur, pending, err)
	}
	one, err := sim.CreateMIGInstance(uuid, nvml.GPU_INSTANCE_PROFILE_1_SLICE, MIGPlacement{Start: 0, Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(one.UUID, "MIG-") || one.ComputeInstanceID < 0 || one.Placement != (MIGPlacement{Start: 0, Size: 1}) {
		t.Errorf("instance %+v: want a MIG UUID, a compute instance and the placement asked for", one)
	}
	if _, err := sim.CreateMIGInstance(uuid, nvml.GPU_INSTANCE_PROFILE_2_SLICE, MIGPlacement{Start: 0, Size: 2}); !errors.Is(err, ErrMIGPlacementTaken) {
		t.Errorf("2g over the 1g's slot: %v, want ErrMIGPlacementTaken", err)
	}
	two, err := sim.CreateMIGInstance(uuid, nvml.GPU_INSTANCE_PROFILE_2_SLICE, MIGPlacement{Start: 2, Size: 2})
	if err != nil {
		t.Fatal(err)
	}
	// The media extensions exist once per GPU: a second 1g.18gb+me has no room, wherever.
	if _, err := sim.CreateMIGInstance(uuid, nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, MIGPlacement{Start: 4, Size: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := sim.CreateMIGInstance(uuid, nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, MIGPlacement{Start: 5, Size: 1}); !errors.Is(err, ErrMIGPlacementTaken) {
		t.Errorf("a second 1g.18gb+me: %v, want ErrMIGPlacementTaken", err)
	}
	if err := sim.SetMIGMode(uuid, false); err == nil {
		t.Error("MIG mode went off under three instances")
	}
	list, err := sim.MIGInstances(uuid)
	if err != nil || len(list) != 3 || list[0].UUID != one.UUID || list[1].UUID != two.UUID || one.UUID == two.UUID {
		t.Fatalf("instances %+v, %v; want the 1g, the 2g and the 1g+me, each with its own UUID", list, err)
	}
	for _, in := range list {
		if err := sim.DestroyMIGInstance(uuid, in.GPUInstanceID); err != nil {
			t.Fatal(err)
		}
	}
	if err := sim.DestroyMIGInstance(uuid, one.GPUInstanceID); err != nil {
		t.Errorf("destroying an instance that is gone: %v", err)
	}
	if list, _ := sim.MIGInstances(uuid); len(list) != 0 {
		t.Errorf("instances left: %+v", list)
	}
	if err := sim.SetMIGMode(uuid, false); err != nil {
		t.Errorf("MIG mode off on an empty GPU: %v", err)
	}
}

func TestSimulatedMIGOutlivesTheProcess(t *testing.T) {
	state := filepath.Join(t.TempDir(), "mig.json")
	first, uuid := newSimMIG(t, state)
	if err := first.SetMIGMode(uuid, true); err != nil {
		t.Fatal(err)
	}
	made, err := first.CreateMIGInstance(uuid, nvml.GPU_INSTANCE_PROFILE_3_SLICE, MIGPlacement{Start: 4, Size: 3})
	if err != nil {
		t.Fatal(err)
	}
	second, _ := newSimMIG(t, state)
	if cur, _, err := second.MIGMode(uuid); err != nil || !cur {
		t.Fatalf("MIG mode after a restart: %v, %v; want on", cur, err)
	}
	list, err := second.MIGInstances(uuid)
	if err != nil || len(list) != 1 || list[0] != made {
		t.Fatalf("instances after a restart %+v, %v; want %+v", list, err, made)
	}
	// IDs go on from the restored ones, as the driver's do.
	next, err := second.CreateMIGInstance(uuid, nvml.GPU_INSTANCE_PROFILE_1_SLICE, MIGPlacement{Start: 0, Size: 1})
	if err != nil || next.GPUInstanceID == made.GPUInstanceID || next.UUID == made.UUID {
		t.Fatalf("a new instance after a restart: %+v, %v", next, err)
	}
	if fresh, _ := newSimMIG(t, ""); fresh != nil {
		if list, _ := fresh.MIGInstances(uuid); len(list) != 0 {
			t.Errorf("a simulated GPU without the state file has instances: %+v", list)
		}
	}
}
