package usage

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// fixtureSlot is one slot of a ledger written by writeLedger.
type fixtureSlot struct {
	used   map[int]uint64 // GPU position → bytes
	state  uint32
	locked bool // its owner is alive: the slot's bytes are OFD-locked
}

// fixture is a ledger as the library lays it out.
type fixture struct {
	unseen    map[int]uint64
	refused   uint64
	highWater uint32 // 0: the number of slots
	slots     []fixtureSlot
	patch     func(b []byte) // breaks the file after it is laid out
}

// writeLedger writes f into dir and holds the OFD locks of its live slots through a file
// description of its own, as the processes of a container hold theirs; they are released when
// the test ends. The reader's description is another one, so it sees them as conflicting locks,
// exactly as it sees another process's.
func writeLedger(t *testing.T, dir string, f fixture) {
	t.Helper()
	b := make([]byte, ledgerFileSize)
	ne := binary.NativeEndian
	hw := f.highWater
	if hw == 0 {
		hw = uint32(len(f.slots))
	}
	for off, v := range map[int]uint32{offMagic: ledgerMagic, offVersion: ledgerVersion, offHeaderSize: ledgerHeaderSize,
		offSlotSize: ledgerSlotSize, offNSlots: ledgerSlots, offNDevices: ledgerDevices, offHighWater: hw} {
		ne.PutUint32(b[off:], v)
	}
	for dev, v := range f.unseen {
		ne.PutUint64(b[offUnseen+8*dev:], v)
	}
	ne.PutUint64(b[offRefused:], f.refused)
	for i, s := range f.slots {
		at := ledgerHeaderSize + i*ledgerSlotSize
		ne.PutUint32(b[at+offSlotState:], s.state)
		ne.PutUint32(b[at+offSlotPID:], uint32(1000+i))
		for dev, v := range s.used {
			ne.PutUint64(b[at+offSlotUsed+8*dev:], v)
		}
	}
	if f.patch != nil {
		f.patch(b)
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
	for i, s := range f.slots {
		if !s.locked {
			continue
		}
		lk := unix.Flock_t{Type: unix.F_WRLCK, Start: int64(ledgerHeaderSize + i*ledgerSlotSize), Len: ledgerSlotSize}
		if err := unix.FcntlFlock(holder.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
			t.Fatalf("lock slot %d: %v", i, err)
		}
	}
}

func live(used map[int]uint64) fixtureSlot {
	return fixtureSlot{used: used, state: ledgerSlotUsed, locked: true}
}

func TestLedgerReader(t *testing.T) {
	const gib = 1 << 30
	cases := []struct {
		name    string
		fixture *fixture
		setup   func(t *testing.T, dir string) // instead of a fixture
		want    Ledger
		wantErr string
		noLedger bool // the error wraps ErrNoLedger
	}{
		{
			name: "live processes count, with the unseen driver memory",
			fixture: &fixture{unseen: map[int]uint64{0: 300, 2: 7}, refused: 4, slots: []fixtureSlot{
				live(map[int]uint64{0: 2 * gib, 1: 5}), live(map[int]uint64{0: gib}),
			}},
			want: Ledger{Used: [ledgerDevices]uint64{0: 3*gib + 300, 1: 5, 2: 7}, Refused: 4, Processes: 2},
		},
		{
			name: "a used slot whose lock nobody holds is a dead process: not counted",
			fixture: &fixture{slots: []fixtureSlot{
				live(map[int]uint64{0: gib}), {used: map[int]uint64{0: 8 * gib}, state: ledgerSlotUsed},
			}},
			want: Ledger{Used: [ledgerDevices]uint64{0: gib}, Processes: 1},
		},
		{
			name: "a free slot is not counted, whatever it holds",
			fixture: &fixture{slots: []fixtureSlot{
				{used: map[int]uint64{0: 8 * gib}, state: ledgerSlotFree, locked: true}, live(map[int]uint64{3: 10}),
			}},
			want: Ledger{Used: [ledgerDevices]uint64{3: 10}, Processes: 1},
		},
		{
			name: "slots past the high-water mark are not read, as the library does not",
			fixture: &fixture{highWater: 1, slots: []fixtureSlot{
				live(map[int]uint64{0: 1}), live(map[int]uint64{0: gib}),
			}},
			want: Ledger{Used: [ledgerDevices]uint64{0: 1}, Processes: 1},
		},
		{name: "an empty ledger", fixture: &fixture{}, want: Ledger{}},
		{name: "no ledger yet", setup: func(*testing.T, string) {}, noLedger: true},
		{
			name: "a symlink is not followed",
			setup: func(t *testing.T, dir string) {
				other := t.TempDir()
				writeLedger(t, other, fixture{slots: []fixtureSlot{live(map[int]uint64{0: gib})}})
				if err := os.Symlink(filepath.Join(other, contract.LedgerFileName), filepath.Join(dir, contract.LedgerFileName)); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: "is a symlink",
		},
		{
			name: "a FIFO neither blocks nor counts",
			setup: func(t *testing.T, dir string) {
				if err := unix.Mkfifo(filepath.Join(dir, contract.LedgerFileName), 0o666); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: "is not a regular file",
		},
		{
			name: "a file of another size",
			setup: func(t *testing.T, dir string) {
				if err := os.WriteFile(filepath.Join(dir, contract.LedgerFileName), make([]byte, ledgerFileSize+8), 0o666); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: "is not a regular file of 147808 bytes",
		},
		{
			name:    "never completed: no magic",
			fixture: &fixture{patch: func(b []byte) { binary.NativeEndian.PutUint32(b[offMagic:], 0) }},
			wantErr: "no ledger magic",
		},
		{
			name:    "another layout version",
			fixture: &fixture{patch: func(b []byte) { binary.NativeEndian.PutUint32(b[offVersion:], 3) }},
			wantErr: "layout version 3, this plugin reads 2",
		},
		{
			name:    "another slot size",
			fixture: &fixture{patch: func(b []byte) { binary.NativeEndian.PutUint32(b[offSlotSize:], 152) }},
			wantErr: "header of another layout",
		},
		{
			name:    "a high-water mark past the slots",
			fixture: &fixture{highWater: ledgerSlots + 1},
			wantErr: "high-water mark 1025",
		},
	}
	var r LedgerReader
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.fixture != nil {
				writeLedger(t, dir, *tc.fixture)
			} else {
				tc.setup(t, dir)
			}
			got, err := r.Read(dir)
			switch {
			case tc.noLedger:
				if !errors.Is(err, ErrNoLedger) {
					t.Fatalf("Read = %+v, %v; want ErrNoLedger", got, err)
				}
			case tc.wantErr != "":
				var le *LedgerError
				if !errors.As(err, &le) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Read = %+v, %v; want a LedgerError saying %q", got, err, tc.wantErr)
				}
			case err != nil:
				t.Fatalf("Read: %v", err)
			case got != tc.want:
				t.Errorf("Read = %+v, want %+v", got, tc.want)
			}
		})
	}
}
