package integration

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestReconcileUnpreparesAClaimDeletedWhileThePluginWasStopped: the kubelet cannot unprepare a
// claim while the plugin is down; a claim deleted meanwhile is unprepared by the start-up pass
// of the reconciliation (files, checkpoint entry, capacity), counted, and a claim still in use
// is left alone.
func TestReconcileUnpreparesAClaimDeletedWhileThePluginWasStopped(t *testing.T) {
	n := newNode(t)
	n.start()
	k := n.register()
	gone := n.newClaim("gone", allocated{request: "gpu", device: "gpu-0", memory: "10Gi", cores: 20, shareID: shareN1})
	kept := n.newClaim("kept", allocated{request: "gpu", device: "gpu-1", memory: "10Gi", cores: 20, shareID: shareN2})
	k.prepare(t, gone, kept)
	n.stop()

	if err := n.kube.ResourceV1().ResourceClaims(gone.Namespace).Delete(context.Background(), gone.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	n.start()
	deadline := time.Now().Add(20 * time.Second)
	for counterValue(t, n, "vgpu_dra_reconciled_claims_total", "reason", "deleted") != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the start-up reconciliation did not unprepare the deleted claim")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cp := n.readCheckpoint()
	if _, ok := cp.Claims[string(gone.UID)]; ok || exists(n.specPath(string(gone.UID))) || exists(n.claimDir(string(gone.UID))) {
		t.Error("the deleted claim kept its checkpoint entry, CDI spec or directory")
	}
	if _, ok := cp.Claims[string(kept.UID)]; !ok || !exists(n.specPath(string(kept.UID))) {
		t.Error("the claim still in use was unprepared")
	}
	// The kubelet's own Unprepare, when it comes, finds nothing to do.
	k = n.register()
	k.unprepare(t, gone)
}
