package usage_test

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/usage"
	"github.com/vgpu-dra/vgpu-dra/pkg/usage/usagetest"
)

func TestLedgerReader(t *testing.T) {
	const gib = 1 << 30
	cases := []struct {
		name     string
		fixture  *usagetest.Ledger
		setup    func(t *testing.T, dir string) // instead of a fixture
		want     usage.Ledger
		wantErr  string
		noLedger bool // the error wraps usage.ErrNoLedger
	}{
		{
			name: "live processes count, with the unseen driver memory",
			fixture: &usagetest.Ledger{Unseen: map[int]uint64{0: 300, 2: 7}, Refused: 4, Slots: []usagetest.Slot{
				usagetest.Live(map[int]uint64{0: 2 * gib, 1: 5}), usagetest.Live(map[int]uint64{0: gib}),
			}},
			want: usage.Ledger{Used: [usage.LedgerDevices]uint64{0: 3*gib + 300, 1: 5, 2: 7}, Refused: 4, Processes: 2},
		},
		{
			name: "a used slot whose lock nobody holds is a dead process: not counted",
			fixture: &usagetest.Ledger{Slots: []usagetest.Slot{
				usagetest.Live(map[int]uint64{0: gib}), {Used: map[int]uint64{0: 8 * gib}, State: usage.LedgerSlotUsed},
			}},
			want: usage.Ledger{Used: [usage.LedgerDevices]uint64{0: gib}, Processes: 1},
		},
		{
			name: "a free slot is not counted, whatever it holds",
			fixture: &usagetest.Ledger{Slots: []usagetest.Slot{
				{Used: map[int]uint64{0: 8 * gib}, State: usage.LedgerSlotFree, Locked: true}, usagetest.Live(map[int]uint64{3: 10}),
			}},
			want: usage.Ledger{Used: [usage.LedgerDevices]uint64{3: 10}, Processes: 1},
		},
		{
			name: "slots past the high-water mark are not read, as the library does not",
			fixture: &usagetest.Ledger{HighWater: 1, Slots: []usagetest.Slot{
				usagetest.Live(map[int]uint64{0: 1}), usagetest.Live(map[int]uint64{0: gib}),
			}},
			want: usage.Ledger{Used: [usage.LedgerDevices]uint64{0: 1}, Processes: 1},
		},
		{name: "an empty ledger", fixture: &usagetest.Ledger{}, want: usage.Ledger{}},
		{
			// The reader takes no lock: a process holding the ledger's lock forever (stuck in
			// a reservation) cannot stall the sampler, and through it nothing else.
			name:    "a header lock held by a stuck process does not block",
			fixture: &usagetest.Ledger{HeaderLocked: true, Slots: []usagetest.Slot{usagetest.Live(map[int]uint64{0: gib})}},
			want:    usage.Ledger{Used: [usage.LedgerDevices]uint64{0: gib}, Processes: 1},
		},
		{name: "no ledger yet", setup: func(*testing.T, string) {}, noLedger: true},
		{
			name: "a symlink is not followed",
			setup: func(t *testing.T, dir string) {
				other := t.TempDir()
				usagetest.WriteLedger(t, other, usagetest.Ledger{Slots: []usagetest.Slot{usagetest.Live(map[int]uint64{0: gib})}})
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
				if err := os.WriteFile(filepath.Join(dir, contract.LedgerFileName), make([]byte, usage.LedgerFileSize+8), 0o666); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: "is not a regular file of 147808 bytes",
		},
		{
			name:    "never completed: no magic",
			fixture: &usagetest.Ledger{Patch: func(b []byte) { binary.NativeEndian.PutUint32(b[usage.LedgerOffMagic:], 0) }},
			wantErr: "no ledger magic",
		},
		{
			name:    "another layout version",
			fixture: &usagetest.Ledger{Patch: func(b []byte) { binary.NativeEndian.PutUint32(b[usage.LedgerOffVersion:], 3) }},
			wantErr: "layout version 3, this plugin reads 2",
		},
		{
			name:    "another slot size",
			fixture: &usagetest.Ledger{Patch: func(b []byte) { binary.NativeEndian.PutUint32(b[usage.LedgerOffSlotSize:], 152) }},
			wantErr: "header of another layout",
		},
		{
			name:    "a high-water mark past the slots",
			fixture: &usagetest.Ledger{HighWater: usage.LedgerSlots + 1},
			wantErr: "high-water mark 1025",
		},
	}
	var r usage.LedgerReader
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.fixture != nil {
				usagetest.WriteLedger(t, dir, *tc.fixture)
			} else {
				tc.setup(t, dir)
			}
			got, err := r.Read(dir)
			switch {
			case tc.noLedger:
				if !errors.Is(err, usage.ErrNoLedger) {
					t.Fatalf("Read = %+v, %v; want usage.ErrNoLedger", got, err)
				}
			case tc.wantErr != "":
				var le *usage.LedgerError
				if !errors.As(err, &le) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Read = %+v, %v; want a usage.LedgerError saying %q", got, err, tc.wantErr)
				}
			case err != nil:
				t.Fatalf("Read: %v", err)
			case got != tc.want:
				t.Errorf("Read = %+v, want %+v", got, tc.want)
			}
		})
	}
}
