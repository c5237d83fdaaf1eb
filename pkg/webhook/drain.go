package webhook

import (
	"context"
	"net/http"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
)

// Bounds of the drain after the shutdown delay.
const (
	// drainQuiet: the drain ends once no review has come for this long.
	drainQuiet = time.Second
	// drainMaxExtra bounds the drain past the shutdown delay while reviews keep coming (the
	// chart's terminationGracePeriodSeconds, 30, covers delay + this + the 10 s shutdown).
	drainMaxExtra = 10 * time.Second
)

// drainer lets a webhook pod go without losing a review. The API server keeps HTTP/1.1
// connections to the pod open between reviews and does not retry a POST whose connection the
// server closed (kubernetes/kubernetes#127335); a connection that kube-proxy set up before the
// endpoints changed stays on this pod. So once draining, every response carries
// "Connection: close": the server closes that connection after the response, and the API server,
// told so in the response, opens its next one to another replica; none is closed while a review
// may be on its way on it. The drain lasts the shutdown delay and then until reviews stop coming.
type drainer struct {
	draining atomic.Bool
	// last is when the last review came, in UnixNano.
	last atomic.Int64
}

// wrap marks h's responses "Connection: close" while draining and notes when each review came.
func (d *drainer) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.last.Store(time.Now().UnixNano())
		if d.draining.Load() {
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	})
}

// drain turns unready and returns once delay has passed and no review has come for drainQuiet,
// or at delay+drainMaxExtra.
func (d *drainer) drain(ctx context.Context, delay time.Duration) {
	logger := klog.FromContext(ctx)
	d.draining.Store(true)
	begin := time.Now()
	logger.Info("Shutting down: unready, answering with Connection: close while endpoints forget this pod", "delay", delay)
	// Not a synchronisation: the lag of other components, which this pod cannot observe.
	time.Sleep(delay)
	for {
		quiet := time.Since(time.Unix(0, d.last.Load()))
		if quiet >= drainQuiet {
			break
		}
		if time.Since(begin) >= delay+drainMaxExtra {
			logger.Info("Reviews still coming at the end of the drain; stopping anyway", "lastReviewAgo", quiet)
			break
		}
		time.Sleep(drainQuiet - quiet)
	}
	logger.Info("Drained", "after", time.Since(begin).Round(time.Millisecond))
}
