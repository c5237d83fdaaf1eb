package cluster

import (
	"context"
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// EnforcerComponent is the source component of the node-side enforcer's Warning events.
const EnforcerComponent = "vgpu-dra-enforcer"

// CheckNoFalsePositives is issue 23's false-positive check, run after a whole suite: the
// enforcer raised no event (kill, report or throttle) on any pod but those the suite made go
// over their limits on purpose (misbehaving, by pod name). Every other pod stays within its
// limits, so an event on one of them is the wall acting on a tenant who did nothing wrong.
// Events outlive their pods (an hour by default), so the cluster's events cover the whole run.
func (c *Cluster) CheckNoFalsePositives(misbehaving map[string]bool) error {
	l, err := c.Kube.CoreV1().Events(metav1.NamespaceAll).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list events: %w", err)
	}
	var bad []string
	for _, e := range l.Items {
		if e.Source.Component == EnforcerComponent && !misbehaving[e.InvolvedObject.Name] {
			bad = append(bad, fmt.Sprintf("%s/%s %s: %s", e.InvolvedObject.Namespace, e.InvolvedObject.Name, e.Reason, e.Message))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%d enforcer events on pods within their limits:\n%s", len(bad), strings.Join(bad, "\n"))
	}
	return nil
}
