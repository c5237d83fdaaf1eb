package chartpolicy

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"
)

// TestResourceSlicesOwnNode: the chart's policy <release>-resourceslices-own-node lets the
// plugin of a node create, update and delete its own node's ResourceSlices only, and refuses a
// token that names no node with the policy's message.
func TestResourceSlicesOwnNode(t *testing.T) {
	e := compile(t, policy(t, "node-restriction-policy.yaml", "-resourceslices-own-node"))
	slice := func(node string) *resourceapi.ResourceSlice {
		return &resourceapi.ResourceSlice{
			TypeMeta:   metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceSlice"},
			ObjectMeta: metav1.ObjectMeta{Name: node + "-" + driver},
			Spec:       resourceapi.ResourceSliceSpec{Driver: driver, NodeName: &node, Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1}},
		}
	}
	for _, tc := range []struct {
		name      string
		operation admission.Operation
		slice     string // the node of the slice
		caller    user.Info
		denial    string
	}{
		{name: "own slice created", operation: admission.Create, slice: node},
		{name: "own slice deleted", operation: admission.Delete, slice: node},
		{name: "another node's slice created", operation: admission.Create, slice: otherNode, denial: "may only write ResourceSlices of its own node, not those of node " + otherNode},
		{name: "another node's slice deleted", operation: admission.Delete, slice: otherNode, denial: "not those of node " + otherNode},
		{name: "a token without a node", operation: admission.Update, slice: node, caller: pluginUser(""), denial: "carries no node name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			caller := tc.caller
			if caller == nil {
				caller = pluginUser(node)
			}
			r := request{operation: tc.operation, resource: resourceapi.SchemeGroupVersion.WithResource("resourceslices"),
				kind: resourceapi.SchemeGroupVersion.WithKind("ResourceSlice"), name: tc.slice + "-" + driver, user: caller}
			switch tc.operation {
			case admission.Create:
				r.object = slice(tc.slice)
			case admission.Delete:
				r.old = slice(tc.slice)
			default:
				r.object, r.old = slice(tc.slice), slice(tc.slice)
			}
			denial, matched := e.denial(t, r)
			if !matched {
				t.Fatal("the policy's match conditions left the plugin's request alone")
			}
			if tc.denial == "" && denial != "" || tc.denial != "" && !strings.Contains(denial, tc.denial) {
				t.Errorf("denial %q, want %q", denial, tc.denial)
			}
		})
	}
}
