// Package component is the process plumbing every vgpu-dra binary shares: the flags they all
// take (kubeconfig and client rate limits, logging, feature gates, metrics and health
// addresses), turning them into a Kubernetes client, the metrics endpoint (the binary's own
// metrics served together with the process-wide Go, process and client-go REST client metrics),
// and running until SIGTERM or SIGINT.
//
// A binary's main adds its own flags next to these, then calls Run (cmd/vgpu-webhook):
//
//	opts, err := component.NewOptions("vgpu-webhook", defaultHealthPort)
//	opts.AddFlags(fs)
//	fs.Parse(os.Args[1:])
//	opts.Complete()
//	component.Run(opts, func(ctx context.Context) error { ... })
package component
