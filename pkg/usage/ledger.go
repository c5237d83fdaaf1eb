package usage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// The memory ledger's layout, exactly as library/src/ledger.h lays it out (native byte order,
// the C compiler's alignment), for this reader and for the ledgers tests write (usagetest).
// ledger_layout_test.go compiles library/test/ledger_layout.c and fails when any of these
// differs from what the C compiler says.
const (
	LedgerMagic      = 0x4c4d4756 // "VGML"
	LedgerVersion    = 2
	LedgerSlots      = 1024
	LedgerDevices    = contract.ContainerConfigMaxGPUs // VGPU_MAX_DEVICES
	LedgerSlotFree   = 0
	LedgerSlotUsed   = 1
	LedgerHeaderSize = 352
	LedgerSlotSize   = 16 + 8*LedgerDevices
	LedgerFileSize   = LedgerHeaderSize + LedgerSlots*LedgerSlotSize

	// struct ledger_header
	LedgerOffMagic        = 0
	LedgerOffVersion      = 4
	LedgerOffHeaderSize   = 8
	LedgerOffSlotSize     = 12
	LedgerOffNSlots       = 16
	LedgerOffNDevices     = 20
	LedgerOffHighWater    = 24
	LedgerOffUnseen       = 32  // uint64[LedgerDevices]
	LedgerOffReconciledNS = 160 // uint64[LedgerDevices]
	LedgerOffReclaimedNS  = 288
	LedgerOffRefused      = 296

	// struct ledger_slot
	LedgerOffSlotState = 0
	LedgerOffSlotPID   = 4
	LedgerOffSlotOwner = 8
	LedgerOffSlotUsed  = 16 // uint64[LedgerDevices]
)

// Ledger is what a container's memory ledger says.
type Ledger struct {
	// Used is, per GPU position in the container's vgpu.config, the bytes its live processes
	// hold through the hooks plus the driver memory NVML saw and the hooks did not ("unseen"):
	// the figure libvgpu.so checks against the limit.
	Used [LedgerDevices]uint64
	// Refused counts the allocations libvgpu.so refused for the limit, on every GPU, since the
	// ledger was created (it lives as long as the container's directory).
	Refused uint64
	// Processes is the number of live processes with a slot.
	Processes int
}

// LedgerError says that a ledger file exists but is not one this reader (and the library of
// this version) can use: another layout version, a wrong size, a damaged header.
type LedgerError struct {
	Path   string
	Reason string
}

func (e *LedgerError) Error() string { return fmt.Sprintf("memory ledger %s: %s", e.Path, e.Reason) }

// ErrNoLedger is wrapped when the container has no ledger: none of its processes has used
// CUDA with a limit yet.
var ErrNoLedger = errors.New("no memory ledger")

// LedgerReader reads ledgers without ever blocking or writing: no lock is taken, so a stuck
// or hostile process in the container cannot stall the reader, and nothing in the file is
// changed. It reuses one buffer; it is not safe for concurrent use.
//
// The file lives in a directory the container can write (contract §4a): it is opened without
// following a symlink and without blocking on a FIFO, must be a regular file of the exact
// size, and every count in it is bounds-checked. It is read with pread, never mapped — a
// container that truncates a mapped file would crash the plugin with SIGBUS. A read that races
// an update may see one counter mid-change; the next sample corrects it.
type LedgerReader struct {
	buf []byte
}

// Read reads the ledger in dir, the host path of a container's vmem_node directory. A used
// slot counts only while its owner's lock is held (the library's liveness rule, ledger.h): a
// process killed without cleaning up stops counting at once, as it does for the library.
func (r *LedgerReader) Read(dir string) (Ledger, error) {
	path := filepath.Join(dir, contract.LedgerFileName)
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		return Ledger{}, fmt.Errorf("read %s: %w", path, errors.Join(ErrNoLedger, fs.ErrNotExist))
	case errors.Is(err, unix.ELOOP):
		return Ledger{}, &LedgerError{Path: path, Reason: "is a symlink"}
	case err != nil:
		return Ledger{}, fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return Ledger{}, fmt.Errorf("inspect %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != LedgerFileSize {
		return Ledger{}, &LedgerError{Path: path, Reason: fmt.Sprintf("is not a regular file of %d bytes (mode %o, %d bytes)", LedgerFileSize, st.Mode, st.Size)}
	}
	if cap(r.buf) < LedgerFileSize {
		r.buf = make([]byte, LedgerFileSize)
	}
	h := r.buf[:LedgerHeaderSize]
	if err := preadFull(fd, h, 0); err != nil {
		return Ledger{}, fmt.Errorf("read header of %s: %w", path, err)
	}
	highWater, err := checkHeader(h)
	if err != nil {
		return Ledger{}, &LedgerError{Path: path, Reason: err.Error()}
	}
	slots := r.buf[LedgerHeaderSize : LedgerHeaderSize+highWater*LedgerSlotSize]
	if err := preadFull(fd, slots, LedgerHeaderSize); err != nil {
		return Ledger{}, fmt.Errorf("read slots of %s: %w", path, err)
	}
	var l Ledger
	ne := binary.NativeEndian
	for dev := range LedgerDevices {
		l.Used[dev] = ne.Uint64(h[LedgerOffUnseen+8*dev:])
	}
	l.Refused = ne.Uint64(h[LedgerOffRefused:])
	for i := range highWater {
		s := slots[i*LedgerSlotSize : (i+1)*LedgerSlotSize]
		if ne.Uint32(s[LedgerOffSlotState:]) == LedgerSlotFree || !slotAlive(fd, i) {
			continue
		}
		l.Processes++
		for dev := range LedgerDevices {
			l.Used[dev] += ne.Uint64(s[LedgerOffSlotUsed+8*dev:])
		}
	}
	return l, nil
}

// checkHeader applies the library's header_matches and returns the high-water mark.
func checkHeader(h []byte) (int, error) {
	ne := binary.NativeEndian
	switch {
	case ne.Uint32(h[LedgerOffMagic:]) != LedgerMagic:
		return 0, errors.New("has no ledger magic (never completed, or not a ledger)")
	case ne.Uint32(h[LedgerOffVersion:]) != LedgerVersion:
		return 0, fmt.Errorf("has layout version %d, this plugin reads %d", ne.Uint32(h[LedgerOffVersion:]), LedgerVersion)
	case ne.Uint32(h[LedgerOffHeaderSize:]) != LedgerHeaderSize || ne.Uint32(h[LedgerOffSlotSize:]) != LedgerSlotSize ||
		ne.Uint32(h[LedgerOffNSlots:]) != LedgerSlots || ne.Uint32(h[LedgerOffNDevices:]) != LedgerDevices:
		return 0, errors.New("has a header of another layout")
	}
	hw := ne.Uint32(h[LedgerOffHighWater:])
	if hw > LedgerSlots {
		return 0, fmt.Errorf("has high-water mark %d past its %d slots", hw, LedgerSlots)
	}
	return int(hw), nil
}

// slotAlive asks whether anyone holds the lock on slot i's bytes: F_OFD_GETLK reports a
// conflicting lock without taking one. When the kernel cannot answer, the slot counts as
// alive, as the library counts it: never under-count.
func slotAlive(fd, i int) bool {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: int64(LedgerHeaderSize + i*LedgerSlotSize), Len: LedgerSlotSize}
	for {
		err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_GETLK, &lk)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err != nil || lk.Type != unix.F_UNLCK
	}
}

func preadFull(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pread(fd, b, off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return errors.New("file ends early")
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}
