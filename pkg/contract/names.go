// Validation of the names that come from outside (claim and pod UIDs, register UUIDs, container
// names) before any path, file name or frame is built from them.
package contract

import "fmt"

// InvalidNameError says that a name from outside (a claim or pod UID, a container name) is
// not of the form it must have before it may become part of a host path.
type InvalidNameError struct {
	// Kind is what the name was supposed to be: "claim UID", "pod UID" or "container name".
	Kind string
	// Name is the rejected value.
	Name string
	// Reason says which rule it breaks.
	Reason string
}

// Error names the value and the rule it breaks.
func (e *InvalidNameError) Error() string {
	return fmt.Sprintf("invalid %s %q: %s", e.Kind, e.Name, e.Reason)
}

// Kinds of names, as they appear in InvalidNameError.Kind.
const (
	KindUID           = "UID"
	KindClaimUID      = "claim UID"
	KindPodUID        = "pod UID"
	KindContainerName = "container name"
)

// maxContainerName is the longest DNS-1123 label.
const maxContainerName = 63

// ValidateUID checks that uid is a canonical lower-case UUID, 8-4-4-4-12 hexadecimal digits,
// as the API server assigns them (claim and pod UIDs, register UUIDs).
func ValidateUID(uid string) error { return validateUID(KindUID, uid) }

// ValidateClaimUID is ValidateUID with "claim UID" named in the error.
func ValidateClaimUID(uid string) error { return validateUID(KindClaimUID, uid) }

// ValidatePodUID is ValidateUID with "pod UID" named in the error.
func ValidatePodUID(uid string) error { return validateUID(KindPodUID, uid) }

// validateUID is ValidateUID with the kind of UID named in the error.
func validateUID(kind, uid string) error {
	if len(uid) != 36 {
		return &InvalidNameError{Kind: kind, Name: uid, Reason: "not 36 characters (8-4-4-4-12)"}
	}
	for i := 0; i < len(uid); i++ {
		c := uid[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return &InvalidNameError{Kind: kind, Name: uid, Reason: fmt.Sprintf("no '-' at position %d", i)}
			}
		default:
			if !isDigit(c) && (c < 'a' || c > 'f') {
				return &InvalidNameError{Kind: kind, Name: uid, Reason: fmt.Sprintf("character %q at position %d is not a lower-case hexadecimal digit", c, i)}
			}
		}
	}
	return nil
}

// ValidateContainerName checks that name is a DNS-1123 label, as Kubernetes requires of
// container names: 1 to 63 characters of [a-z0-9-], starting and ending alphanumeric.
func ValidateContainerName(name string) error {
	invalid := func(reason string) error {
		return &InvalidNameError{Kind: KindContainerName, Name: name, Reason: reason}
	}
	switch {
	case name == "":
		return invalid("empty")
	case len(name) > maxContainerName:
		return invalid(fmt.Sprintf("longer than %d characters", maxContainerName))
	case name[0] == '-' || name[len(name)-1] == '-':
		return invalid("must start and end with a letter or digit")
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !isDigit(c) && (c < 'a' || c > 'z') && c != '-' {
			return invalid(fmt.Sprintf("character %q at position %d is not in [a-z0-9-]", c, i))
		}
	}
	return nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
