// Command kubectl-vgpu is the `kubectl vgpu` plugin: which GPU share each pod holds and what is
// left of every GPU, from the API server alone (ResourceSlices, ResourceClaims, pods).
//
//	kubectl vgpu nodes [-o wide|json]
//	kubectl vgpu pods [-n NAMESPACE | -A] [-o wide|json]
//
// Flags → clusterview.Reader → clusterview.Print*; nothing else.
package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes"

	"github.com/vgpu-dra/vgpu-dra/pkg/clusterview"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

func main() {
	streams := genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}
	if err := newRootCommand(streams, nil).ExecuteContext(context.Background()); err != nil {
		os.Exit(1)
	}
}

// options are the flags of every subcommand.
type options struct {
	config        *genericclioptions.ConfigFlags
	driver        string
	output        string
	allNamespaces bool
	streams       genericiooptions.IOStreams
	// client is injected by tests; built from config when nil.
	client kubernetes.Interface
}

// newRootCommand builds `kubectl vgpu`; client nil reads the kubeconfig flags.
func newRootCommand(streams genericiooptions.IOStreams, client kubernetes.Interface) *cobra.Command {
	o := &options{config: genericclioptions.NewConfigFlags(true), streams: streams, client: client}
	root := &cobra.Command{
		Use:           "kubectl vgpu",
		Short:         "Shared GPUs of vgpu-dra: what is left of every GPU, and the share each pod holds",
		SilenceUsage:  true,
		SilenceErrors: false,
	}
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)
	o.config.AddFlags(root.PersistentFlags())
	root.PersistentFlags().StringVar(&o.driver, "driver", contract.DefaultDriverName, "DRA driver whose devices are shown.")
	root.PersistentFlags().StringVarP(&o.output, "output", "o", "", "Output format: wide or json; a table when empty.")
	nodes := &cobra.Command{
		Use:   "nodes",
		Short: "Every GPU the driver publishes: memory and cores published, allocated and free, shares, health",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(func(r clusterview.Reader, w io.Writer) error {
				gpus, err := r.GPUs(cmd.Context())
				if err != nil {
					return err
				}
				if len(gpus) == 0 && o.output != clusterview.OutputJSON {
					fmt.Fprintf(o.streams.ErrOut, "No devices of driver %s found.\n", o.driver)
					return nil
				}
				return clusterview.PrintGPUs(w, gpus, o.output)
			})
		},
	}
	pods := &cobra.Command{
		Use:   "pods",
		Short: "The GPU shares of the pods in a namespace: claim, node, device, memory and cores",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(func(r clusterview.Reader, w io.Writer) error {
				ns, err := o.namespace()
				if err != nil {
					return err
				}
				shares, err := r.Pods(cmd.Context(), ns)
				if err != nil {
					return err
				}
				if len(shares) == 0 && o.output != clusterview.OutputJSON {
					where := "in namespace " + ns
					if ns == metav1.NamespaceAll {
						where = "in any namespace"
					}
					fmt.Fprintf(o.streams.ErrOut, "No pods with shares of driver %s found %s.\n", o.driver, where)
					return nil
				}
				return clusterview.PrintPods(w, shares, o.output, o.allNamespaces)
			})
		},
	}
	pods.Flags().BoolVarP(&o.allNamespaces, "all-namespaces", "A", false, "List the pods of every namespace.")
	root.AddCommand(nodes, pods)
	return root
}

// run checks the output format, builds the reader and calls fn with it.
func (o *options) run(fn func(clusterview.Reader, io.Writer) error) error {
	if err := clusterview.CheckOutput(o.output); err != nil {
		return err
	}
	client := o.client
	if client == nil {
		rc, err := o.config.ToRESTConfig()
		if err != nil {
			return fmt.Errorf("read the kubeconfig: %w", err)
		}
		if client, err = kubernetes.NewForConfig(rc); err != nil {
			return fmt.Errorf("create the Kubernetes client: %w", err)
		}
	}
	return fn(clusterview.Reader{Client: client, Driver: o.driver}, o.streams.Out)
}

// namespace is -n, else the kubeconfig context's; every namespace with -A.
func (o *options) namespace() (string, error) {
	if o.allNamespaces {
		return metav1.NamespaceAll, nil
	}
	ns, _, err := o.config.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return "", fmt.Errorf("find the namespace: %w", err)
	}
	return ns, nil
}
