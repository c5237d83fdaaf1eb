package cdi

import (
	"path/filepath"
	"strings"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

const (
	// specClass is the class of the CDI kind "<driver>/claim".
	specClass = "claim"
	// commonDeviceSuffix names the claim-common device "<claimUID>-common".
	commonDeviceSuffix = "common"
	// shareIDPrefixLen is how much of a share ID goes into a result's device name.
	shareIDPrefixLen = 8
)

// SpecPath returns the claim's spec file, <SpecDir>/<driver>-claim_<claimUID>.json, or "" when
// claimUID is not a canonical lower-case UUID (no path is built from an unchecked name).
func (w *Writer) SpecPath(claimUID string) string {
	if contract.ValidateUID(claimUID) != nil {
		return ""
	}
	return filepath.Join(w.opts.SpecDir, specFileName(w.opts.DriverName, claimUID))
}

func specFileName(driver, claimUID string) string {
	return cdiapi.GenerateTransientSpecName(driver, specClass, claimUID) + ".json"
}

// DeviceIDs returns, per result in order, the qualified CDI device IDs that a container of the
// claim gets for it: the result's own device, the claim-common device, and "<GPUCDIKind>=<UUID>"
// when GPUCDIKind is set and GPUInjection is InjectionCDI. It builds names only; Write validates.
func (w *Writer) DeviceIDs(c Claim) [][]string {
	common := w.qualified(commonDeviceName(c.UID))
	ids := make([][]string, len(c.Results))
	for i := range c.Results {
		r := &c.Results[i]
		ids[i] = []string{w.qualified(resultDeviceName(c.UID, r)), common}
		if w.gpuVendor != "" && w.opts.GPUInjection == InjectionCDI {
			ids[i] = append(ids[i], parser.QualifiedName(w.gpuVendor, w.gpuClass, r.GPUUUID))
		}
	}
	return ids
}

func (w *Writer) qualified(name string) string {
	return parser.QualifiedName(w.opts.DriverName, specClass, name)
}

// resultDeviceName is "<claimUID>-<request>-<device>[-<first 8 of shareID>]" (contract §3).
func resultDeviceName(claimUID string, r *Result) string {
	var b strings.Builder
	b.Grow(len(claimUID) + len(r.Request) + len(r.Device) + shareIDPrefixLen + 3)
	b.WriteString(claimUID)
	b.WriteByte('-')
	b.WriteString(strings.ReplaceAll(r.Request, "/", "_"))
	b.WriteByte('-')
	b.WriteString(r.Device)
	if r.ShareID != "" {
		b.WriteByte('-')
		b.WriteString(r.ShareID[:min(len(r.ShareID), shareIDPrefixLen)])
	}
	return b.String()
}

func commonDeviceName(claimUID string) string {
	return claimUID + "-" + commonDeviceSuffix
}

// ClaimUIDOf returns the claim UID of one of this driver's claim devices, given its qualified
// CDI ID ("<driver>/claim=<claimUID>-..."): the result devices and the claim-common device of
// contract §3. ok is false for any other ID (another vendor or class, a name that does not
// start with a canonical claim UID and a '-').
func ClaimUIDOf(driverName, qualifiedID string) (claimUID string, ok bool) {
	vendor, class, name, err := parser.ParseQualifiedName(qualifiedID)
	if err != nil || vendor != driverName || class != specClass {
		return "", false
	}
	// Every device name starts with the canonical claim UID, which has a fixed length.
	const uidLen = len("00000000-0000-0000-0000-000000000000")
	if len(name) <= uidLen || name[uidLen] != '-' || contract.ValidateClaimUID(name[:uidLen]) != nil {
		return "", false
	}
	return name[:uidLen], true
}
