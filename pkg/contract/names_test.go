package contract

import (
	"errors"
	"strings"
	"testing"
)

func TestValidateUID(t *testing.T) {
	tests := []struct {
		uid   string
		valid bool
	}{
		{"0f6c2a8e-4b1d-4c3a-9e2f-7a5b6c8d9e01", true},
		{"00000000-0000-0000-0000-000000000000", true},
		{"0F6C2A8E-4B1D-4C3A-9E2F-7A5B6C8D9E01", false}, // upper case is not canonical
		{"0f6c2a8e-4b1d-4c3a-9e2f-7a5b6c8d9e0", false},  // short
		{"0f6c2a8e-4b1d-4c3a-9e2f-7a5b6c8d9e011", false},
		{"0f6c2a8e4b1d-4c3a-9e2f-7a5b6c8d9e01-", false}, // dash misplaced
		{"{f6c2a8e-4b1d-4c3a-9e2f-7a5b6c8d9e0}", false},
		{"0f6c2a8e-4b1d-4c3a-9e2f-7a5b6c8d9e0g", false},
		{"../../../../../../../../../../etc/x", false}, // 36 characters of traversal
		{"0f6c2a8e-4b1d-4c3a-9e2f/7a5b6c8d9e01", false},
		{"..", false},
		{"", false},
	}
	for _, tt := range tests {
		t.Run(tt.uid, func(t *testing.T) {
			err := ValidateUID(tt.uid)
			if tt.valid {
				if err != nil {
					t.Errorf("ValidateUID(%q) = %v, want nil", tt.uid, err)
				}
				return
			}
			var ine *InvalidNameError
			if !errors.As(err, &ine) || ine.Name != tt.uid || ine.Kind != KindUID {
				t.Errorf("ValidateUID(%q) = %v, want an *InvalidNameError for it", tt.uid, err)
			}
		})
	}
}

func TestValidateContainerName(t *testing.T) {
	tests := []struct {
		name  string
		valid bool
	}{
		{"app", true},
		{"a", true},
		{"0", true},
		{"my-app-2", true},
		{strings.Repeat("a", 63), true},
		{strings.Repeat("a", 64), false},
		{"", false},
		{"App", false},
		{"-app", false},
		{"app-", false},
		{"my_app", false}, // '_' separates pod UID and name in directory names
		{"my.app", false},
		{"../x", false},
		{"..", false},
		{"a/b", false},
		{"app\x00", false},
		{"äpp", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidateContainerName(tt.name)
			if tt.valid {
				if err != nil {
					t.Errorf("ValidateContainerName(%q) = %v, want nil", tt.name, err)
				}
				return
			}
			var ine *InvalidNameError
			if !errors.As(err, &ine) || ine.Kind != KindContainerName {
				t.Errorf("ValidateContainerName(%q) = %v, want an *InvalidNameError", tt.name, err)
			}
		})
	}
}
