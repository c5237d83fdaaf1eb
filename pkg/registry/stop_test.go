package registry_test

import (
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
	rt "github.com/vgpu-dra/vgpu-dra/pkg/registry/registrytest"
)

// TestStopAnswersRetry: a server that stops answers RETRY with retry_after_ms to every
// connection it accepted — one still sending its frame, and each of many that connect while
// it stops — instead of closing it without an answer, which the library takes as final
// (contract §5). A connect that fails is fine: the client retries those.
func TestStopAnswersRetry(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	cs := newContainers()
	cs.set(podB, "x", registry.Container{}, true)
	// What is checked is that every connection accepted around Stop is answered, not how fast:
	// a grace long enough that a loaded machine (-race, other suites) does not cut it short.
	s := startServer(t, registry.Config{StopGrace: 10 * time.Second}, registry.Deps{Containers: cs, Cgroups: &h})
	good := wellFormed(t, registry.Request{PodUID: podA, ContainerName: "app"})

	half, err := net.Dial("unix", s.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer half.Close()
	if _, err := half.Write(good[:5]); err != nil {
		t.Fatal(err)
	}

	type outcome struct {
		connected bool
		resp      registry.Response
		err       error
	}
	const clients = 64
	results := make(chan outcome, clients*50)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := net.Dial("unix", s.Socket())
				if err != nil {
					continue // the socket is gone or refuses: the client's retry covers it
				}
				resp, err := readAnswer(c, good)
				results <- outcome{connected: true, resp: resp, err: err}
				if len(results) == cap(results) {
					return
				}
			}
		})
	}
	time.Sleep(20 * time.Millisecond) // let connections be in every phase
	stopWithin(t, s)
	close(stop)
	wg.Wait()
	close(results)

	resp, err := readAnswer(half, good[5:])
	if err != nil || resp.Status != registry.StatusRetry || !resp.HasRetryAfter {
		t.Errorf("connection still sending its frame when the server stopped: %+v, %v; want RETRY with retry_after_ms", resp, err)
	}
	n := 0
	for o := range results {
		n++
		if o.err != nil {
			t.Errorf("a connection accepted around Stop got no answer: %v", o.err)
			break
		}
		// 64 clients of one container may pass its own bounds: BUSY with a hint is an answer too.
		if st := o.resp.Status; st != registry.StatusNotFound && ((st != registry.StatusRetry && st != registry.StatusBusy) || !o.resp.HasRetryAfter) {
			t.Errorf("a connection accepted around Stop: %+v; want NOT_FOUND before, RETRY with retry_after_ms after (or BUSY)", o.resp)
			break
		}
	}
	if n == 0 {
		t.Fatal("no client connected")
	}
}

// readAnswer sends rest of a frame on c and reads one response.
func readAnswer(c net.Conn, rest []byte) (registry.Response, error) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write(rest); err != nil && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
		return registry.Response{}, err
	}
	all, err := io.ReadAll(c)
	if err != nil && len(all) == 0 {
		return registry.Response{}, err
	}
	if len(all) == 0 {
		return registry.Response{}, errors.New("closed without an answer")
	}
	_, v, err := registry.ParseFrame(all)
	if err != nil {
		return registry.Response{}, err
	}
	return v.(registry.Response), nil
}
