package cdi

import (
	"errors"
	"fmt"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// validateSpec has the CDI library's own validators accept a spec this package built: its
// version against the features it uses, vendor and class, the spec's edits, and every device's
// name and edits (a device must have some), no two devices of one name — what the library's
// loader checks after parsing a file, and so what the runtime checks when it loads the spec.
//
// Write used to write the spec to its temporary file and load it back with the library's
// loader (cdi.ReadSpec). The bytes are json.Marshal of these very values, so parsing them back
// only re-checked the encoder, at about 500 allocations and 115 µs of CPU per Prepare (YAML
// decoding) — most of Prepare's own allocations (issue 18). The tests still load every spec
// this package writes with the library's loader (helpers_test.go).
func validateSpec(spec *cdispec.Spec) error {
	if err := cdispec.ValidateVersion(spec); err != nil {
		return err
	}
	vendor, class := parser.ParseQualifier(spec.Kind)
	if err := parser.ValidateVendorName(vendor); err != nil {
		return err
	}
	if err := parser.ValidateClassName(class); err != nil {
		return err
	}
	if len(spec.Annotations) > 0 {
		return errors.New("this writer sets no spec annotations")
	}
	if err := (&cdiapi.ContainerEdits{ContainerEdits: &spec.ContainerEdits}).Validate(); err != nil {
		return err
	}
	if len(spec.Devices) == 0 {
		return errors.New("invalid spec, no devices")
	}
	seen := make(map[string]bool, len(spec.Devices))
	for i := range spec.Devices {
		d := &spec.Devices[i]
		if err := parser.ValidateDeviceName(d.Name); err != nil {
			return err
		}
		if seen[d.Name] {
			return fmt.Errorf("invalid spec, multiple device %q", d.Name)
		}
		seen[d.Name] = true
		if len(d.Annotations) > 0 {
			return fmt.Errorf("device %q: this writer sets no device annotations", d.Name)
		}
		e := d.ContainerEdits
		if len(e.Env) == 0 && len(e.DeviceNodes) == 0 && len(e.Hooks) == 0 && len(e.Mounts) == 0 && len(e.NetDevices) == 0 && len(e.AdditionalGIDs) == 0 && e.IntelRdt == nil {
			return fmt.Errorf("invalid device %q, empty device edits", d.Name)
		}
		if err := (&cdiapi.ContainerEdits{ContainerEdits: &d.ContainerEdits}).Validate(); err != nil {
			return fmt.Errorf("invalid device %q: %w", d.Name, err)
		}
	}
	return nil
}
