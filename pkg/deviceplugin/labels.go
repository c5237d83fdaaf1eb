package deviceplugin

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// labelFieldManager owns the labels and the annotation through server-side apply: applying
// again replaces exactly what this plugin set, and nobody else's.
const labelFieldManager = "vgpu-device-plugin"

// ShareSizes is one GPU's entry of the shares annotation (contract §13).
type ShareSizes struct {
	Index       int    `json:"index"`
	UUID        string `json:"uuid"`
	Shares      int    `json:"shares"`
	MemoryBytes int64  `json:"memoryBytes"`
	// Cores is each share's percent of the GPU's SMs; 100 is unlimited.
	Cores int64 `json:"cores"`
}

// nodeMetadata is what the node is labelled and annotated with: per share, the number of
// shares per GPU, the memory in MiB and the cores (100: unlimited) — the smallest over the
// node's GPUs, which is what a pod can count on — and every GPU's sizes in the annotation.
// No GPUs: nothing.
func nodeMetadata(inv *Inventory, resourceName string) (labels, annotations map[string]string, err error) {
	labels, annotations = map[string]string{}, map[string]string{}
	if len(inv.GPUs) == 0 {
		return labels, annotations, nil
	}
	per := make([]ShareSizes, 0, len(inv.GPUs))
	minShares, minMem, minCores := inv.GPUs[0].Count, inv.GPUs[0].MemoryBytes, coresLabel(inv.GPUs[0].Cores)
	for _, g := range inv.GPUs {
		per = append(per, ShareSizes{Index: g.Device.Index, UUID: g.Device.UUID, Shares: g.Count, MemoryBytes: g.MemoryBytes, Cores: coresLabel(g.Cores)})
		minShares, minMem, minCores = min(minShares, g.Count), min(minMem, g.MemoryBytes), min(minCores, coresLabel(g.Cores))
	}
	labels[resourceName+"."+contract.LabelSuffixSharesPerGPU] = strconv.Itoa(minShares)
	labels[resourceName+"."+contract.LabelSuffixMemoryMiB] = strconv.FormatInt(minMem/mib, 10)
	labels[resourceName+"."+contract.LabelSuffixCores] = strconv.FormatInt(minCores, 10)
	b, err := json.Marshal(per)
	if err != nil {
		return nil, nil, fmt.Errorf("encode the shares annotation: %w", err)
	}
	annotations[resourceName+"."+contract.AnnotationSuffixShares] = string(b)
	return labels, annotations, nil
}

func coresLabel(c int64) int64 {
	if c == 0 {
		return unlimitedCores
	}
	return c
}

// publishLabels applies the node's labels and annotation, retrying (1 s doubling to 30 s)
// until the API server takes them or ctx ends: a plugin that cannot reach the API server still
// serves the kubelet.
func publishLabels(ctx context.Context, kube kubernetes.Interface, node string, labels, annotations map[string]string, logger logr.Logger) {
	apply := corev1ac.Node(node).WithLabels(labels).WithAnnotations(annotations)
	delay := time.Second
	for {
		_, err := kube.CoreV1().Nodes().Apply(ctx, apply, metav1.ApplyOptions{FieldManager: labelFieldManager, Force: true})
		if err == nil {
			logger.Info("Published the share sizes on the node", "node", node, "labels", labels)
			return
		}
		logger.Error(err, "Publish the share sizes on the node; retrying", "node", node, "after", delay)
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, 30*time.Second)
	}
}
