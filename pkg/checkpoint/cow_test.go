package checkpoint

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// held collects the records readers see, sharing their memory with the store (Range does not
// copy), and a deep copy of them taken at the same moment.
func held(s *Store) (shared, copied map[string]Claim) {
	shared, copied = map[string]Claim{}, map[string]Claim{}
	s.Range(func(uid string, c *Claim) {
		shared[uid] = *c
		copied[uid] = c.DeepCopy()
	})
	return shared, copied
}

// TestCopyOnWriteLeavesHeldRecordsAlone: the store's states share every record that did not
// change, so no way of changing the store may modify a record in place. A reader holds the
// records of one state (without a copy) while every mutation path runs — Put of a new and of a
// replaced claim, Update adding, replacing and deleting claims and the boot ID, SetReservedFor,
// failing and panicking mutations, a failed write, RemoveDeferred and its flush, Seal and
// Unseal — and callers change what they handed in afterwards: what the reader holds is exactly
// what it was, and the store holds what was committed, not the callers' slices.
func TestCopyOnWriteLeavesHeldRecordsAlone(t *testing.T) {
	s := openStore(t, checkpointPath(t))
	var wc writeCounter
	wc.install(s)
	for _, uid := range []string{uidA, uidB} {
		if err := s.Put(uid, fullClaim()); err != nil {
			t.Fatal(err)
		}
	}
	shared, copied := held(s)
	const uidC, uidD = "cccccccc-0000-4000-8000-000000000000", "dddddddd-0000-4000-8000-000000000000"

	put := fullClaim()
	mustNot := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	mustNot("Put of a new claim", s.Put(uidC, put))
	put.ReservedFor[0], put.Devices[0].CDIDeviceIDs[0] = "caller changed it", "caller changed it"
	replaced := fullClaim()
	replaced.Devices[0].Cores = 70
	mustNot("Put replacing a claim", s.Put(uidA, replaced))
	replaced.Devices[0].MemoryBytes = 1
	mustNot("SetReservedFor", s.SetReservedFor(uidB, []string{podY}))
	var stored Claim
	mustNot("Update replacing and adding", s.Update(func(d *Data) error {
		c := d.Claims[uidB]
		c.Devices = []Device{{GPUUUID: "GPU-new", MemoryBytes: 1 << 30, Cores: 10}}
		d.Claims[uidB] = c
		stored = fullClaim()
		d.Claims[uidD] = stored
		d.BootID = "boot-2"
		return nil
	}))
	stored.ReservedFor[1] = "caller changed it"
	if got, _ := s.Get(uidD); !reflect.DeepEqual(got, fullClaim()) {
		t.Errorf("a caller's change to the record its Update stored reached the store: %+v", got)
	}
	mustNot("Update deleting", s.Update(func(d *Data) error { delete(d.Claims, uidD); return nil }))
	errNo := errors.New("no")
	if err := s.Update(func(d *Data) error {
		c := d.Claims[uidA]
		c.ReservedFor = nil
		d.Claims[uidA] = c
		delete(d.Claims, uidB)
		return errNo
	}); !errors.Is(err, errNo) {
		t.Fatalf("failing mutation: %v", err)
	}
	func() {
		defer func() { _ = recover() }()
		_ = s.Update(func(d *Data) error { delete(d.Claims, uidA); panic("boom") })
	}()
	wc.beforeWrite = func(int) error { return errors.New("disk full") }
	if err := s.Put(uidA, Claim{Name: "never written"}); err == nil {
		t.Fatal("Put on a failing disk succeeded")
	}
	wc.beforeWrite = nil
	s.RemoveDeferred(uidC)
	mustNot("Flush", s.Flush())
	mustNot("Seal", s.Seal(t.Context()))
	s.Unseal()

	if !reflect.DeepEqual(shared, copied) {
		t.Errorf("records held by a reader changed:\n%+v\nwant\n%+v", shared, copied)
	}
	wantB := fullClaim()
	wantB.ReservedFor = []string{podY}
	wantB.Devices = []Device{{GPUUUID: "GPU-new", MemoryBytes: 1 << 30, Cores: 10}}
	want := Data{BootID: "boot-2", Claims: map[string]Claim{uidA: fullClaim(), uidB: wantB}}
	want.Claims[uidA].Devices[0].Cores = 70
	if got := s.Snapshot(); !reflect.DeepEqual(got, want) {
		t.Errorf("store holds\n%+v\nwant\n%+v", got, want)
	}
	if got := openStore(t, s.Path()).Snapshot(); !reflect.DeepEqual(got, want) {
		t.Errorf("file holds\n%+v\nwant\n%+v", got, want)
	}
}

// TestTotalsFollowEveryChange: the per-GPU totals the store keeps as claims come and go equal a
// walk over every claim readers see, after each step of a long random run of puts, replacements,
// updates, reservedFor changes, deferred removals and flushes, failing mutations and failed
// writes, and after reopening the file.
func TestTotalsFollowEveryChange(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	path := checkpointPath(t)
	s := openStore(t, path)
	var wc writeCounter
	wc.install(s)
	uid := func() string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", rng.IntN(12)) }
	claim := func() Claim {
		c := Claim{Name: "c", State: PrepareCompleted}
		for range rng.IntN(3) {
			dev := Device{GPUUUID: fmt.Sprintf("GPU-%d", rng.IntN(3)), AdminAccess: rng.IntN(6) == 0}
			if !dev.AdminAccess && rng.IntN(4) > 0 {
				dev.MemoryBytes, dev.Cores = int64(1+rng.IntN(8))<<30, int64(rng.IntN(100))
			}
			c.Devices = append(c.Devices, dev)
		}
		return c
	}
	failDisk := false
	wc.beforeWrite = func(int) error {
		if failDisk {
			return errors.New("disk full")
		}
		return nil
	}
	for step := range 3000 {
		failDisk = rng.IntN(10) == 0
		switch r := rng.IntN(9); r {
		case 0, 1:
			_ = s.Put(uid(), claim())
		case 2:
			u, c := uid(), claim()
			_ = s.Update(func(d *Data) error { d.Claims[u] = c; delete(d.Claims, uid()); return nil })
		case 3:
			_ = s.SetReservedFor(uid(), []string{podX})
		case 4, 5:
			s.RemoveDeferred(uid())
		case 6:
			_ = s.Flush()
		case 7:
			_ = s.Update(func(d *Data) error { d.Claims[uid()] = claim(); return errors.New("no") })
		case 8:
			if rng.IntN(20) == 0 {
				failDisk = false
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				s = openStore(t, path)
				wc.install(s)
			}
		}
		snap := s.Snapshot()
		want := totalsOf(snap.Claims)
		for g := range 4 {
			gpu := fmt.Sprintf("GPU-%d", g)
			if got := s.Totals().GPU(gpu); got != want[gpu] {
				t.Fatalf("step %d: totals of %s = %+v, a walk over every claim gives %+v", step, gpu, got, want[gpu])
			}
		}
		for u, c := range snap.Claims {
			if devs, ok := s.Totals().Devices(u); !ok || !reflect.DeepEqual(devs, c.Devices) {
				t.Fatalf("step %d: Totals().Devices(%s) = %+v, %v; want the claim's %+v", step, u, devs, ok, c.Devices)
			}
		}
	}
}

// TestEqualComparesEveryField: the store decides from Claim.equal which records a mutation
// changed (and the encoder which to encode again): a field it did not compare would be lost.
// Each field of Claim and of Device, changed alone, must make two records differ — a field
// added to either type fails here until equal compares it.
func TestEqualComparesEveryField(t *testing.T) {
	base := fullClaim()
	base.Devices[0].AdminAccess = true
	var changed func(v reflect.Value)
	changed = func(v reflect.Value) {
		switch v.Kind() {
		case reflect.Struct: // every field of a nested record counts (Device.MIG)
			for i := range v.NumField() {
				changed(v.Field(i))
			}
		case reflect.String:
			v.SetString(v.String() + "x")
		case reflect.Int, reflect.Int64:
			v.SetInt(v.Int() + 1)
		case reflect.Bool:
			v.SetBool(!v.Bool())
		case reflect.Slice:
			if v.Type().Elem().Kind() != reflect.String {
				v.Set(reflect.MakeSlice(v.Type(), v.Len()+1, v.Len()+1))
				return
			}
			v.Set(reflect.Append(v, reflect.ValueOf("x")))
		default:
			t.Fatalf("field of kind %s: teach this test to change it", v.Kind())
		}
	}
	ct := reflect.TypeFor[Claim]()
	for i := range ct.NumField() {
		c := base.DeepCopy()
		changed(reflect.ValueOf(&c).Elem().Field(i))
		if c.equal(base) || base.equal(c) {
			t.Errorf("Claim.%s changed, yet equal says the records are the same", ct.Field(i).Name)
		}
	}
	dt := reflect.TypeFor[Device]()
	for i := range dt.NumField() {
		c := base.DeepCopy()
		changed(reflect.ValueOf(&c.Devices[0]).Elem().Field(i))
		if c.equal(base) || base.equal(c) {
			t.Errorf("Device.%s changed, yet equal says the records are the same", dt.Field(i).Name)
		}
	}
	if c := base.DeepCopy(); !c.equal(base) || slices.Equal(c.ReservedFor, nil) {
		t.Error("a deep copy is not equal to its original")
	}
}
