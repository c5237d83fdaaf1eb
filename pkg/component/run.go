package component

import (
	"context"
	"os/signal"
	"syscall"

	"k8s.io/component-base/logs"
	"k8s.io/klog/v2"
)

// Run runs fn with a context that ends on SIGTERM or SIGINT and carries the binary's logger,
// then flushes the logs. fn should return once its context ends (after a graceful stop).
func Run(o *Options, fn func(ctx context.Context) error) error {
	defer logs.FlushLogs()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background().WithName(o.Name))
	return fn(ctx)
}
