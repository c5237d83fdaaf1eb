package clusterview

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/printers"
)

// Output formats of -o.
const (
	OutputTable = ""
	OutputWide  = "wide"
	OutputJSON  = "json"
)

// APIVersion and the kinds are what -o json prints: lists of this package's own types, not
// API objects (their fields are stable for scripts; see GPU and PodShare).
const (
	APIVersion   = "vgpu.dra.dev/v1alpha1"
	KindGPUs     = "GPUList"
	KindPodShare = "PodShareList"
)

// CheckOutput rejects an -o value this command cannot print.
func CheckOutput(output string) error {
	switch output {
	case OutputTable, OutputWide, OutputJSON:
		return nil
	}
	return fmt.Errorf("unable to match a printer for output format %q: want one of: json, wide (or none, for a table)", output)
}

// PrintGPUs prints gpus as kubectl prints tables: aligned columns, the wide-only ones with
// -o wide; or as JSON.
func PrintGPUs(w io.Writer, gpus []GPU, output string) error {
	if output == OutputJSON {
		return printJSON(w, KindGPUs, gpus)
	}
	t := &metav1.Table{ColumnDefinitions: []metav1.TableColumnDefinition{
		{Name: "Node", Type: "string"}, {Name: "Device", Type: "string"},
		{Name: "Memory", Type: "string", Description: "published in the ResourceSlice"},
		{Name: "Allocated", Type: "string", Description: "memory taken by allocated claims"},
		{Name: "Free", Type: "string", Description: "memory left"},
		{Name: "Cores", Type: "string"}, {Name: "Cores-Allocated", Type: "string"}, {Name: "Cores-Free", Type: "string"},
		{Name: "Shares", Type: "integer"}, {Name: "Health", Type: "string"},
		{Name: "UUID", Type: "string", Priority: 1}, {Name: "Product", Type: "string", Priority: 1},
		{Name: "Claims", Type: "string", Priority: 1, Description: "namespace/claim of every share; (class,ceiling) after one that may burst"},
	}}
	for _, g := range gpus {
		claims := make([]string, 0, len(g.Shares))
		for _, s := range g.Shares {
			c := s.Namespace + "/" + s.Claim
			if s.CoresCeiling > 0 { // the plugin writes one for every best-effort share
				c += fmt.Sprintf("(%s,%s)", s.Class, percent(s.CoresCeiling))
			}
			claims = append(claims, c)
		}
		t.Rows = append(t.Rows, metav1.TableRow{Cells: []any{
			g.Node, g.Device, quantity(g.Memory.Published), quantity(g.Memory.Allocated), quantity(g.Memory.Free),
			percent(g.Cores.Published), percent(g.Cores.Allocated), percent(g.Cores.Free),
			int64(len(g.Shares)), g.Health, orNone(g.UUID), orNone(g.Product), orNone(strings.Join(claims, ",")),
		}})
	}
	return printers.NewTablePrinter(printers.PrintOptions{Wide: output == OutputWide}).PrintObj(t, w)
}

// PrintPods prints the pods' shares; withNamespace adds the NAMESPACE column (all namespaces).
func PrintPods(w io.Writer, shares []PodShare, output string, withNamespace bool) error {
	if output == OutputJSON {
		return printJSON(w, KindPodShare, shares)
	}
	cols := []metav1.TableColumnDefinition{
		{Name: "Pod", Type: "string"}, {Name: "Claim", Type: "string"}, {Name: "Node", Type: "string"},
		{Name: "Device", Type: "string"}, {Name: "Memory", Type: "string"}, {Name: "Cores", Type: "string"},
		{Name: "Class", Type: "string", Description: "compute class, from the claim's device status"},
		{Name: "Ceiling", Type: "string", Description: "what the share may burst to when the GPU has idle time; - when it does not burst"},
		{Name: "Request", Type: "string", Priority: 1}, {Name: "UUID", Type: "string", Priority: 1},
		{Name: "Containers", Type: "string", Priority: 1},
	}
	if withNamespace {
		cols = append([]metav1.TableColumnDefinition{{Name: "Namespace", Type: "string"}}, cols...)
	}
	t := &metav1.Table{ColumnDefinitions: cols}
	for _, s := range shares {
		cells := []any{s.Pod, s.Claim, orNone(s.Node), s.Device, quantity(s.Memory), percent(s.Cores),
			orNone(s.Class), ceiling(s.Class, s.CoresCeiling), s.Request, orNone(s.UUID), orNone(strings.Join(s.Containers, ","))}
		if withNamespace {
			cells = append([]any{s.Namespace}, cells...)
		}
		t.Rows = append(t.Rows, metav1.TableRow{Cells: cells})
	}
	return printers.NewTablePrinter(printers.PrintOptions{Wide: output == OutputWide}).PrintObj(t, w)
}

// printJSON prints items as a list object through cli-runtime's JSON printer, as kubectl -o
// json prints: {"apiVersion", "kind", "items"}.
func printJSON(w io.Writer, kind string, items any) error {
	raw, err := json.Marshal(items)
	if err != nil {
		return fmt.Errorf("encode %s: %w", kind, err)
	}
	var list []any
	if err := json.Unmarshal(raw, &list); err != nil {
		return fmt.Errorf("encode %s: %w", kind, err)
	}
	obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": APIVersion, "kind": kind, "items": list}}
	return (&printers.JSONPrinter{}).PrintObj(obj, w)
}

// quantity prints memory as a Kubernetes quantity, e.g. 141Gi.
func quantity(v int64) string { return resource.NewQuantity(v, resource.BinarySI).String() }

func percent(v int64) string { return fmt.Sprintf("%d%%", v) }

// ceiling prints a share's burst ceiling: "80%"; "-" for a share that does not burst; "<none>"
// where no class is known (no device status yet, or no core limit). No spaces: scripts split
// the table's rows on them.
func ceiling(class string, coresCeiling int64) string {
	switch {
	case coresCeiling > 0:
		return percent(coresCeiling)
	case class != "":
		return "-"
	}
	return "<none>"
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}
