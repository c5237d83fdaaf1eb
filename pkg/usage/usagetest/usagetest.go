// Package usagetest writes memory ledgers as libvgpu.so lays them out (usage.Ledger* layout),
// with the slots of live processes locked as theirs are, for the tests of the usage reader,
// the sampler and the plugin's metrics.
package usagetest

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/usage"
)

// Slot is one slot of a ledger.
type Slot struct {
	// Used is GPU position → bytes.
	Used map[int]uint64
	// State is usage.LedgerSlotFree or usage.LedgerSlotUsed.
	State uint32
	// Locked: the slot's owner is alive, its bytes are OFD-locked.
	Locked bool
}

// Live is a used slot of a live process holding used.
func Live(used map[int]uint64) Slot {
	return Slot{Used: used, State: usage.LedgerSlotUsed, Locked: true}
}

// Ledger is a ledger's content.
type Ledger struct {
	// Unseen is GPU position → driver memory NVML saw and the hooks did not.
	Unseen  map[int]uint64
	Refused uint64
	// HighWater is the header's high-water mark; 0 means the number of slots.
	HighWater uint32
	Slots     []Slot
	// Patch, when set, breaks the file after it is laid out.
	Patch func(b []byte)
	// HeaderLocked holds the header's write lock, as a process in the middle of a reservation
	// does (or one that stopped there, stuck or stopped by a debugger).
	HeaderLocked bool
}

// WriteLedger writes l into dir as contract.LedgerFileName and holds the OFD locks of its live
// slots through a file description of its own, as the processes of a container hold theirs,
// until the test ends. A reader's description is another one, so it sees them as conflicting
// locks, exactly as it sees another process's.
func WriteLedger(t testing.TB, dir string, l Ledger) {
	t.Helper()
	b := make([]byte, usage.LedgerFileSize)
	ne := binary.NativeEndian
	hw := l.HighWater
	if hw == 0 {
		hw = uint32(len(l.Slots))
	}
	for off, v := range map[int]uint32{usage.LedgerOffMagic: usage.LedgerMagic, usage.LedgerOffVersion: usage.LedgerVersion,
		usage.LedgerOffHeaderSize: usage.LedgerHeaderSize, usage.LedgerOffSlotSize: usage.LedgerSlotSize,
		usage.LedgerOffNSlots: usage.LedgerSlots, usage.LedgerOffNDevices: usage.LedgerDevices, usage.LedgerOffHighWater: hw} {
		ne.PutUint32(b[off:], v)
	}
	for dev, v := range l.Unseen {
		ne.PutUint64(b[usage.LedgerOffUnseen+8*dev:], v)
	}
	ne.PutUint64(b[usage.LedgerOffRefused:], l.Refused)
	for i, s := range l.Slots {
		at := usage.LedgerHeaderSize + i*usage.LedgerSlotSize
		ne.PutUint32(b[at+usage.LedgerOffSlotState:], s.State)
		ne.PutUint32(b[at+usage.LedgerOffSlotPID:], uint32(1000+i))
		for dev, v := range s.Used {
			ne.PutUint64(b[at+usage.LedgerOffSlotUsed+8*dev:], v)
		}
	}
	if l.Patch != nil {
		l.Patch(b)
	}
	path := filepath.Join(dir, contract.LedgerFileName)
	if err := os.WriteFile(path, b, 0o666); err != nil {
		t.Fatal(err)
	}
	holder, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Close() })
	if l.HeaderLocked {
		lk := unix.Flock_t{Type: unix.F_WRLCK, Start: 0, Len: usage.LedgerHeaderSize}
		if err := unix.FcntlFlock(holder.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
			t.Fatalf("lock the header of %s: %v", path, err)
		}
	}
	for i, s := range l.Slots {
		if !s.Locked {
			continue
		}
		lk := unix.Flock_t{Type: unix.F_WRLCK, Start: int64(usage.LedgerHeaderSize + i*usage.LedgerSlotSize), Len: usage.LedgerSlotSize}
		if err := unix.FcntlFlock(holder.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
			t.Fatalf("lock slot %d of %s: %v", i, path, err)
		}
	}
}
