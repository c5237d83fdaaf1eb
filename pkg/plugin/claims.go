package plugin

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	resourceac "k8s.io/client-go/applyconfigurations/resource/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/driver"
)

// kubeClaims is the driver's ClaimAPI over client-go: claims are read with GET and their
// device status written by server-side apply as this node's field manager, so that a write
// names only this node's status.devices entries and never races another writer's.
type kubeClaims struct {
	kube    kubernetes.Interface
	manager string
}

var _ driver.ClaimAPI = kubeClaims{}

func newKubeClaims(kube kubernetes.Interface, node string) kubeClaims {
	return kubeClaims{kube: kube, manager: contract.DeviceFieldManagerPrefix + node}
}

func (c kubeClaims) Get(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error) {
	claim, err := c.kube.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get claim %s/%s: %w", namespace, name, err)
	}
	return claim, nil
}

func (c kubeClaims) ApplyStatus(ctx context.Context, claim *resourceac.ResourceClaimApplyConfiguration) error {
	// Force: the entries are this node's plugin's own; a field manager of an earlier version of
	// the plugin may hold them.
	_, err := c.kube.ResourceV1().ResourceClaims(*claim.Namespace).ApplyStatus(ctx, claim, metav1.ApplyOptions{FieldManager: c.manager, Force: true})
	if err != nil {
		return fmt.Errorf("apply device status of claim %s/%s: %w", *claim.Namespace, *claim.Name, err)
	}
	return nil
}
