package webhook

import (
	"context"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// apiPods reads pods from the API server, one read per claim created: a claim made from a
// template costs one GET of its pod, a claim created by name one List of its namespace's pods,
// served from the API server's watch cache (resourceVersion 0). A cache of every pod would cost
// the webhook far more memory than these reads cost the API server: claims are created far
// less often than pods are reviewed.
type apiPods struct {
	client kubernetes.Interface
}

// Pod implements Pods.
func (a apiPods) Pod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	p, err := a.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return p, err
}

// ReferencingClaim implements Pods.
func (a apiPods) ReferencingClaim(ctx context.Context, namespace, claim string) ([]corev1.Pod, error) {
	list, err := a.client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(list.Items, func(p corev1.Pod) bool {
		return !slices.ContainsFunc(p.Spec.ResourceClaims, func(pc corev1.PodResourceClaim) bool {
			return pc.ResourceClaimName != nil && *pc.ResourceClaimName == claim
		})
	}), nil
}
