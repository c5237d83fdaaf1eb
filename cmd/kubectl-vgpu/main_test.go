package main

import (
	"bytes"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

// node1 publishes one H200 that one pod's 10Gi/30% claim shares; the node's plugin wrote that
// the share is guaranteed and may burst to 60 %.
func node1() []runtime.Object {
	return []runtime.Object{
		&resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Spec: resourceapi.ResourceSliceSpec{
			Driver: "vgpu.dra.dev", NodeName: ptr.To("node-1"), Pool: resourceapi.ResourcePool{Name: "node-1", ResourceSliceCount: 1},
			Devices: []resourceapi.Device{{Name: "gpu-0", Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				"memory": {Value: resource.MustParse("141Gi")}, "cores": {Value: resource.MustParse("100")},
			}}},
		}},
		&resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "c"}, Status: resourceapi.ResourceClaimStatus{
			Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
				Request: "gpu", Driver: "vgpu.dra.dev", Pool: "node-1", Device: "gpu-0",
				ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("10Gi"), "cores": resource.MustParse("30")},
			}}}},
			Devices: []resourceapi.AllocatedDeviceStatus{{Driver: "vgpu.dra.dev", Pool: "node-1", Device: "gpu-0",
				Data: &runtime.RawExtension{Raw: []byte(`{"request":"gpu","cores":30,"class":"Guaranteed","coresCeiling":60}`)}}},
		}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "p"}, Spec: corev1.PodSpec{
			NodeName: "node-1", ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("c")}},
			Containers: []corev1.Container{{Name: "app"}},
		}},
	}
}

func TestCommands(t *testing.T) {
	tests := []struct {
		args            []string
		objects         []runtime.Object
		wantOut, wantEr string
		wantErr         bool
	}{
		{args: []string{"nodes"}, objects: node1(), wantOut: "NODE     DEVICE   MEMORY   ALLOCATED   FREE    CORES   CORES-ALLOCATED   CORES-FREE   SHARES   HEALTH\n" +
			"node-1   gpu-0    141Gi    10Gi        131Gi   100%    30%               70%          1        Healthy\n"},
		{args: []string{"pods", "-n", "team"}, objects: node1(), wantOut: "POD   CLAIM   NODE     DEVICE   MEMORY   CORES   CLASS        CEILING\n" +
			"p     c       node-1   gpu-0    10Gi     30%     Guaranteed   60%\n"},
		{args: []string{"pods", "-A", "-o", "wide"}, objects: node1(), wantOut: "NAMESPACE   POD   CLAIM   NODE     DEVICE   MEMORY   CORES   CLASS        CEILING   REQUEST   UUID     CONTAINERS\n" +
			"team        p     c       node-1   gpu-0    10Gi     30%     Guaranteed   60%       gpu       <none>   <none>\n"},
		{args: []string{"pods", "-n", "other"}, objects: node1(), wantEr: "No pods with shares of driver vgpu.dra.dev found in namespace other.\n"},
		{args: []string{"nodes", "--driver", "gpu.example.com"}, objects: node1(), wantEr: "No devices of driver gpu.example.com found.\n"},
		{args: []string{"nodes", "-o", "json"}, wantOut: "{\n    \"apiVersion\": \"vgpu.dra.dev/v1alpha1\",\n    \"items\": [],\n    \"kind\": \"GPUList\"\n}\n"},
		{args: []string{"nodes", "-o", "yaml"}, wantErr: true, wantEr: `unable to match a printer for output format "yaml"`},
		{args: []string{"nodes", "extra"}, wantErr: true, wantEr: `unknown command "extra"`},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			cmd := newRootCommand(genericiooptions.IOStreams{Out: &out, ErrOut: &errOut}, fake.NewClientset(tc.objects...))
			cmd.SetArgs(tc.args)
			err := cmd.ExecuteContext(t.Context())
			if (err != nil) != tc.wantErr {
				t.Fatalf("error %v, want error %v; stderr %q", err, tc.wantErr, errOut.String())
			}
			if out.String() != tc.wantOut {
				t.Errorf("stdout\n%q\nwant\n%q", out.String(), tc.wantOut)
			}
			if !strings.Contains(errOut.String(), tc.wantEr) {
				t.Errorf("stderr %q, want it to contain %q", errOut.String(), tc.wantEr)
			}
		})
	}
}
