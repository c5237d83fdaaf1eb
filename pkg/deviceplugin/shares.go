package deviceplugin

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
)

const (
	mib = 1 << 20
	// unlimitedCores is the whole GPU's compute; written as 0 (unlimited) in vgpu.config.
	unlimitedCores = 100
)

// shareNamespace is the UUID namespace of share UIDs (UUID v5 of "<resource>/<device ID>"): a
// share's directory set and register UUID must be the same after a restart, so they are
// derived, never drawn.
var shareNamespace = uuid.MustParse("5e7d1a4c-8b2f-4c69-9d3e-0f6a1b2c3d4e")

// ErrUnknownShare marks a device ID that is not one of this node's shares.
var ErrUnknownShare = errors.New("not a share of this node")

// Sizing is how each GPU is cut into shares (contract §13).
type Sizing struct {
	// SharesPerGPU is the number of shares of every GPU, at least 1.
	SharesPerGPU int
	// MemoryReserve is kept back from every GPU's memory before it is shared, in bytes.
	MemoryReserve int64
	// ShareMemory is each share's memory in bytes; 0: an equal split of what the reserve
	// leaves. Rounded down to whole MiB.
	ShareMemory int64
	// ShareCores is each share's percentage of the GPU's SMs, 1–100; 0 is unlimited.
	ShareCores int64
}

// GPUShares is one GPU and what each of its shares is.
type GPUShares struct {
	Device gpu.Device
	// Count is the number of shares.
	Count int
	// MemoryBytes and Cores are one share's limits (Cores 0: unlimited).
	MemoryBytes int64
	Cores       int64
}

// Share is one share of a GPU: one device of the extended resource.
type Share struct {
	// ID is the kubelet's device ID, "<GPU UUID>::<n>".
	ID string
	// UID is a UUID derived from the resource name and ID: the name of the share's directory
	// set and the register UUID of a container that holds it first (contract §13).
	UID string
	// GPU is the position of the share's GPU in Inventory.GPUs; N its number on that GPU.
	GPU, N int
}

// Inventory is the node's shares, fixed for the life of the process.
type Inventory struct {
	// GPUs are ordered by NVML index.
	GPUs []GPUShares
	// Shares are ordered by GPU, then number.
	Shares []*Share
	byID   map[string]*Share
	byUID  map[string]*Share
}

// ShareID is the device ID of share n of the GPU: "<uuid>::<n>".
func ShareID(gpuUUID string, n int) string {
	return gpuUUID + contract.ShareIDSeparator + strconv.Itoa(n)
}

// ParseShareID splits a device ID into the GPU's UUID and the share's number. It checks the
// form only: "<uuid>::<n>" with a non-empty UUID and n a decimal number without sign or
// leading zero.
func ParseShareID(id string) (gpuUUID string, n int, err error) {
	gpuUUID, num, ok := strings.Cut(id, contract.ShareIDSeparator)
	if !ok || gpuUUID == "" || num == "" || (len(num) > 1 && num[0] == '0') {
		return "", 0, fmt.Errorf("device ID %q: want <GPU UUID>%s<n>", id, contract.ShareIDSeparator)
	}
	for _, c := range num {
		if c < '0' || c > '9' {
			return "", 0, fmt.Errorf("device ID %q: share number %q is not a decimal number", id, num)
		}
	}
	n, err = strconv.Atoi(num)
	if err != nil {
		return "", 0, fmt.Errorf("device ID %q: %w", id, err)
	}
	return gpuUUID, n, nil
}

// NewInventory cuts every GPU into shares. It fails, naming the GPU, when a GPU's memory does
// not hold SharesPerGPU shares of the asked size (or of 1 MiB each).
func NewInventory(devices []gpu.Device, s Sizing, resourceName string) (*Inventory, error) {
	if s.SharesPerGPU < 1 {
		return nil, fmt.Errorf("shares per GPU: %d, want at least 1", s.SharesPerGPU)
	}
	if s.ShareCores < 0 || s.ShareCores > unlimitedCores {
		return nil, fmt.Errorf("share cores: %d, want 0 (unlimited) to 100", s.ShareCores)
	}
	if s.MemoryReserve < 0 || s.ShareMemory < 0 {
		return nil, errors.New("memory reserve and share memory must not be negative")
	}
	inv := &Inventory{byID: map[string]*Share{}, byUID: map[string]*Share{}}
	sorted := slices.Clone(devices)
	slices.SortFunc(sorted, func(a, b gpu.Device) int { return a.Index - b.Index })
	for pos, d := range sorted {
		usable := max(int64(d.MemoryBytes)-s.MemoryReserve, 0)
		per := s.ShareMemory / mib * mib
		if s.ShareMemory == 0 {
			per = usable / int64(s.SharesPerGPU) / mib * mib
		}
		if per < mib || per*int64(s.SharesPerGPU) > usable {
			return nil, fmt.Errorf("GPU %d (%s) has %d MiB after the reserve: not enough for %d shares of %d MiB",
				d.Index, d.UUID, usable/mib, s.SharesPerGPU, max(per, mib)/mib)
		}
		inv.GPUs = append(inv.GPUs, GPUShares{Device: d, Count: s.SharesPerGPU, MemoryBytes: per, Cores: s.ShareCores})
		for n := range s.SharesPerGPU {
			id := ShareID(d.UUID, n)
			sh := &Share{ID: id, UID: shareUID(resourceName, id), GPU: pos, N: n}
			if _, dup := inv.byID[id]; dup {
				return nil, fmt.Errorf("two GPUs with UUID %s", d.UUID)
			}
			inv.Shares = append(inv.Shares, sh)
			inv.byID[id] = sh
			inv.byUID[sh.UID] = sh
		}
	}
	return inv, nil
}

func shareUID(resourceName, id string) string {
	return uuid.NewSHA1(shareNamespace, []byte(resourceName+"/"+id)).String()
}

// Lookup returns the share of a device ID; the error wraps ErrUnknownShare.
func (inv *Inventory) Lookup(id string) (*Share, error) {
	if sh, ok := inv.byID[id]; ok {
		return sh, nil
	}
	if _, _, err := ParseShareID(id); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnknownShare, err)
	}
	return nil, fmt.Errorf("device ID %q: %w (no such GPU, or a share number past the GPU's count)", id, ErrUnknownShare)
}

// ByUID returns the share whose UID is uid.
func (inv *Inventory) ByUID(uid string) (*Share, bool) {
	sh, ok := inv.byUID[uid]
	return sh, ok
}

// GPUOf returns the GPU of a share.
func (inv *Inventory) GPUOf(sh *Share) *GPUShares { return &inv.GPUs[sh.GPU] }

// less orders shares by GPU position, then number: the order in which a container's shares
// are listed, whose first is its lead.
func less(a, b *Share) int {
	if a.GPU != b.GPU {
		return a.GPU - b.GPU
	}
	return a.N - b.N
}
