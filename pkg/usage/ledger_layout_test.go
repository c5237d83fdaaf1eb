package usage_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/usage"
)

// TestLedgerLayoutMatchesC compiles library/test/ledger_layout.c against the library's own
// ledger.h, runs it, and compares every constant, offset and size it prints with this
// package's: a change on either side that the other does not follow fails here. It needs a C
// compiler, as make test does for the library; without one it fails rather than skips.
func TestLedgerLayoutMatchesC(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Fatalf("no C compiler (cc) to check the ledger layout against library/src/ledger.h: %v (hack/install-test-deps.sh installs gcc)", err)
	}
	lib := filepath.Join("..", "..", "library")
	bin := filepath.Join(t.TempDir(), "ledger_layout")
	out, err := exec.Command(cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE",
		"-o", bin, filepath.Join(lib, "test", "ledger_layout.c")).CombinedOutput()
	if err != nil {
		t.Fatalf("compile library/test/ledger_layout.c: %v\n%s", err, out)
	}
	out, err = exec.Command(bin).Output()
	if err != nil {
		t.Fatalf("run ledger_layout: %v", err)
	}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if !ok {
			t.Fatalf("ledger_layout printed %q", line)
		}
		got[k] = v
	}
	u64s := strconv.Itoa(8 * usage.LedgerDevices)
	want := map[string]string{
		"file_name": contract.LedgerFileName,
		"magic":     strconv.Itoa(usage.LedgerMagic), "version": strconv.Itoa(usage.LedgerVersion),
		"slots": strconv.Itoa(usage.LedgerSlots), "devices": strconv.Itoa(usage.LedgerDevices),
		"slot_free": strconv.Itoa(usage.LedgerSlotFree), "slot_used": strconv.Itoa(usage.LedgerSlotUsed),
		"ledger_header.size": strconv.Itoa(usage.LedgerHeaderSize),
		"ledger_slot.size":   strconv.Itoa(usage.LedgerSlotSize),
		"ledger_file.size":   strconv.Itoa(usage.LedgerFileSize),

		"ledger_header.magic.offset": strconv.Itoa(usage.LedgerOffMagic), "ledger_header.magic.size": "4",
		"ledger_header.version.offset": strconv.Itoa(usage.LedgerOffVersion), "ledger_header.version.size": "4",
		"ledger_header.header_size.offset": strconv.Itoa(usage.LedgerOffHeaderSize), "ledger_header.header_size.size": "4",
		"ledger_header.slot_size.offset": strconv.Itoa(usage.LedgerOffSlotSize), "ledger_header.slot_size.size": "4",
		"ledger_header.nslots.offset": strconv.Itoa(usage.LedgerOffNSlots), "ledger_header.nslots.size": "4",
		"ledger_header.ndevices.offset": strconv.Itoa(usage.LedgerOffNDevices), "ledger_header.ndevices.size": "4",
		"ledger_header.high_water.offset": strconv.Itoa(usage.LedgerOffHighWater), "ledger_header.high_water.size": "4",
		"ledger_header.unseen.offset": strconv.Itoa(usage.LedgerOffUnseen), "ledger_header.unseen.size": u64s,
		"ledger_header.reconciled_ns.offset": strconv.Itoa(usage.LedgerOffReconciledNS), "ledger_header.reconciled_ns.size": u64s,
		"ledger_header.reclaimed_ns.offset": strconv.Itoa(usage.LedgerOffReclaimedNS), "ledger_header.reclaimed_ns.size": "8",
		"ledger_header.refused.offset": strconv.Itoa(usage.LedgerOffRefused), "ledger_header.refused.size": "8",

		"ledger_slot.state.offset": strconv.Itoa(usage.LedgerOffSlotState), "ledger_slot.state.size": "4",
		"ledger_slot.pid.offset": strconv.Itoa(usage.LedgerOffSlotPID), "ledger_slot.pid.size": "4",
		"ledger_slot.owner.offset": strconv.Itoa(usage.LedgerOffSlotOwner), "ledger_slot.owner.size": "8",
		"ledger_slot.used.offset": strconv.Itoa(usage.LedgerOffSlotUsed), "ledger_slot.used.size": u64s,

		"ledger_file.h.offset": "0", "ledger_file.h.size": strconv.Itoa(usage.LedgerHeaderSize),
		"ledger_file.slot.offset": strconv.Itoa(usage.LedgerHeaderSize), "ledger_file.slot.size": strconv.Itoa(usage.LedgerSlots * usage.LedgerSlotSize),
	}
	for k, w := range want {
		if g, ok := got[k]; !ok || g != w {
			t.Errorf("%s: C says %q, Go says %q", k, g, w)
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("ledger_layout.c prints %s = %s, which the Go reader does not check: add it to this test and, if it is read, to ledger.go", k, g)
		}
	}
	if _, err := os.Stat(filepath.Join(lib, "src", "ledger.h")); err != nil {
		t.Fatalf("library/src/ledger.h: %v", err)
	}
}
