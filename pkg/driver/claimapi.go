package driver

import (
	"context"

	resourceapi "k8s.io/api/resource/v1"
	resourceac "k8s.io/client-go/applyconfigurations/resource/v1"
)

// ClaimAPI is what the driver asks the API server about claims, off the Prepare path: the
// device status it writes and the claims it reconciles. pkg/plugin adapts client-go to it.
type ClaimAPI interface {
	// Get reads a claim. A claim that does not exist is an error for which
	// apierrors.IsNotFound holds.
	Get(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error)
	// ApplyStatus server-side-applies claim.status as this node's field manager (only the
	// status.devices entries it names are this node's).
	ApplyStatus(ctx context.Context, claim *resourceac.ResourceClaimApplyConfiguration) error
}
