package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Timings of the endpoint; tests shorten them.
type endpointTimings struct {
	// registerTimeout bounds one Register call: the kubelet dials back inside it (up to 10 s).
	registerTimeout time.Duration
	// retryMin and retryMax bound the backoff between failed registrations.
	retryMin, retryMax time.Duration
	// resync is the backstop: how often the sockets are looked at without an event.
	resync time.Duration
	// settle is how long events gather before they are acted on.
	settle time.Duration
}

var defaultEndpointTimings = endpointTimings{registerTimeout: 15 * time.Second, retryMin: 100 * time.Millisecond,
	retryMax: 5 * time.Second, resync: 5 * time.Second, settle: 50 * time.Millisecond}

// fileID tells one file at a path from a later one at the same path: an inode number can be
// reused as soon as a file is gone, its change time (in ns) is new.
type fileID struct {
	dev, ino uint64
	ctime    int64
}

func statID(path string) (fileID, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return fileID{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, fmt.Errorf("stat %s: no inode", path)
	}
	return fileID{dev: st.Dev, ino: st.Ino, ctime: st.Ctim.Nano()}, nil
}

// endpoint serves the DevicePlugin service on the plugin's socket and keeps it registered
// with the kubelet, in this order: listen, serve, then register — the kubelet dials back into
// the plugin while it handles Register, so a plugin that registers before it serves is refused.
//
// One goroutine, with one fsnotify watcher on the device-plugin directory for the life of the
// process, keeps it so: the plugin's socket removed (a kubelet start removes every socket
// there), or kubelet.sock created anew (a kubelet restarted) → a new server on a new socket,
// then register. A periodic look at both sockets backs the events up, and failed
// registrations are retried with backoff.
type endpoint struct {
	socket        string
	kubeletSocket string
	resourceName  string
	// services registers the DevicePlugin service (and nothing else) on a new server.
	services func(*grpc.Server)
	timings  endpointTimings
	logger   logr.Logger
	// onRegistered is called after each registration the kubelet accepted.
	onRegistered func()

	watcher *fsnotify.Watcher
	done    chan struct{}
	// streams counts the ListAndWatch streams open now (the kubelet keeps one while it uses
	// the plugin).
	streams atomic.Int64
	// accepted counts the registrations the kubelet accepted.
	accepted atomic.Int64

	mu             sync.Mutex
	srv            *grpc.Server
	own            fileID // our socket, as we bound it
	registeredWith fileID // kubelet.sock when the kubelet last accepted us; zero: not registered
	lastErr        error
}

// start creates the directory when missing, serves on the socket and starts the loop that
// registers and keeps the registration. It returns once the first server is serving; the
// first registration follows in the background.
func (e *endpoint) start(ctx context.Context) error {
	dir := filepath.Dir(e.socket)
	if filepath.Dir(e.kubeletSocket) != dir {
		return fmt.Errorf("the plugin socket %s is not in the kubelet's device-plugin directory %s", e.socket, filepath.Dir(e.kubeletSocket))
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("create the device-plugin directory: %w", err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch the device-plugin directory: %w", err)
	}
	if err := w.Add(dir); err != nil {
		_ = w.Close()
		return fmt.Errorf("watch the device-plugin directory %s: %w", dir, err)
	}
	e.watcher = w
	e.mu.Lock()
	err = e.serveLocked()
	e.mu.Unlock()
	if err != nil {
		_ = w.Close()
		return err
	}
	e.done = make(chan struct{}) // wait waits only for a loop that runs
	go e.loop(ctx)
	return nil
}

// serveLocked replaces the server: the old one stops (its ListAndWatch streams end, so the
// kubelet drops the old endpoint), a stale file at the path goes, and a new server serves on a
// new socket. Registration is due afterwards.
func (e *endpoint) serveLocked() error {
	if e.srv != nil {
		e.srv.Stop()
		e.srv = nil
	}
	e.registeredWith = fileID{}
	if err := os.Remove(e.socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove the old plugin socket: %w", err)
	}
	lis, err := net.Listen("unix", e.socket)
	if err != nil {
		return fmt.Errorf("listen on the plugin socket: %w", err)
	}
	// The listener must not unlink the path on close: after a restart of the server the path
	// may already be a successor's.
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	id, err := statID(e.socket)
	if err != nil {
		_ = lis.Close()
		return fmt.Errorf("stat the plugin socket: %w", err)
	}
	srv := grpc.NewServer()
	e.services(srv)
	go func() { _ = srv.Serve(lis) }()
	e.srv, e.own = srv, id
	e.logger.Info("Serving the device plugin", "socket", e.socket)
	return nil
}

// loop is the one watcher's loop. Events settle for a moment first (a starting kubelet removes
// every socket and listens anew within milliseconds: one reconciliation answers the burst);
// retries and the resync reconcile too.
func (e *endpoint) loop(ctx context.Context) {
	defer close(e.done)
	dir := filepath.Dir(e.socket)
	resync := time.NewTicker(e.timings.resync)
	defer resync.Stop()
	var retry, settle <-chan time.Time
	backoff := e.timings.retryMin
	watching, newKubelet := true, false
	reconcile := func() {
		settle = nil
		done := e.reconcile(ctx, newKubelet)
		newKubelet = false // a new server is serving now; what is left is to register it
		if done {
			retry, backoff = nil, e.timings.retryMin
			return
		}
		retry = time.After(backoff)
		backoff = min(2*backoff, e.timings.retryMax)
	}
	reconcile()
	for {
		select {
		case <-ctx.Done():
			e.stop()
			return
		case ev, ok := <-e.watcher.Events:
			if !ok {
				return
			}
			e.logger.V(4).Info("Device-plugin directory event", "event", ev.String())
			switch {
			case ev.Name == e.kubeletSocket && ev.Has(fsnotify.Create):
				newKubelet = true
			case ev.Name == dir && ev.Has(fsnotify.Remove|fsnotify.Rename):
				watching = false // the directory went; the resync watches the new one
			}
			if settle == nil {
				settle = time.After(e.timings.settle)
			}
		case err, ok := <-e.watcher.Errors:
			if !ok {
				return
			}
			e.logger.Error(err, "Watching the device-plugin directory")
		case <-settle:
			reconcile()
		case <-retry:
			reconcile()
		case <-resync.C:
			if !watching {
				if err := os.MkdirAll(dir, 0o750); err == nil && e.watcher.Add(dir) == nil {
					watching = true
				}
			}
			reconcile()
		}
	}
}

// reconcile brings the server and the registration in line with the directory and reports
// whether nothing is left to retry. A new kubelet.sock (newKubelet: its creation was seen)
// means a new kubelet: the plugin serves on a new socket and registers it. Seen without the
// event (the resync), a kubelet.sock that is not the file the last registration was accepted
// on means the same. Neither an inode number nor a change time alone tells two files apart (an
// inode is reused at once, change times have the clock's coarse tick), which is why the event
// decides: serving anew is never wrong, only a moment of churn. Registering twice on one
// server would be — the kubelet refuses a connected endpoint ("already connected").
//
// Only the loop calls it; the lock guards the fields the checks read, and is not held while the
// kubelet is asked.
func (e *endpoint) reconcile(ctx context.Context, newKubelet bool) bool {
	e.mu.Lock()
	id, err := statID(e.socket)
	if gone := err != nil || id != e.own; gone || newKubelet {
		if gone {
			e.logger.Info("The plugin socket is gone or replaced: serving on a new one", "socket", e.socket)
		} else {
			e.logger.Info("The kubelet's registration socket is new: serving on a new socket for the new kubelet", "socket", e.kubeletSocket)
		}
		if err := e.serveLocked(); err != nil {
			e.lastErr = err
			e.mu.Unlock()
			e.logger.Error(err, "Serve the device plugin")
			return false
		}
	}
	kubelet, err := statID(e.kubeletSocket)
	if err != nil {
		if e.registeredWith != (fileID{}) {
			e.logger.Info("The kubelet's registration socket is gone; waiting for it", "socket", e.kubeletSocket)
		}
		e.registeredWith = fileID{}
		e.lastErr = fmt.Errorf("kubelet registration socket: %w", err)
		e.mu.Unlock()
		return false // a Create event, or the retry, brings it back
	}
	done := kubelet == e.registeredWith
	e.mu.Unlock()
	if done {
		return true
	}
	err = e.register(ctx)
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil {
		e.lastErr = err
		e.logger.Error(err, "Register with the kubelet", "socket", e.kubeletSocket)
		return false
	}
	e.registeredWith, e.lastErr = kubelet, nil
	e.accepted.Add(1)
	e.logger.Info("Registered with the kubelet", "resource", e.resourceName, "endpoint", filepath.Base(e.socket))
	if e.onRegistered != nil {
		e.onRegistered()
	}
	return true
}

// register calls the kubelet's Register with the options GetDevicePluginOptions answers.
func (e *endpoint) register(ctx context.Context) error {
	conn, err := grpc.NewClient("unix://"+e.kubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dial the kubelet: %w", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, e.timings.registerTimeout)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(e.socket),
		ResourceName: e.resourceName,
		Options:      pluginOptions(),
	})
	if err != nil {
		return fmt.Errorf("register %s with the kubelet: %w", e.resourceName, err)
	}
	return nil
}

// stop ends the server and removes the socket if it is still ours.
func (e *endpoint) stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.srv != nil {
		e.srv.Stop()
		e.srv = nil
	}
	if id, err := statID(e.socket); err == nil && id == e.own {
		_ = os.Remove(e.socket)
	}
	e.registeredWith = fileID{}
	_ = e.watcher.Close()
}

// wait returns once the loop has ended (after its context).
func (e *endpoint) wait() {
	if e.done != nil {
		<-e.done
	}
}

// registered reports whether the kubelet accepted the current server's registration, and the
// last error when not.
func (e *endpoint) registered() (bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.registeredWith != (fileID{}), e.lastErr
}

// check is the liveness check "kubelet-registration": registered with the kubelet that serves
// kubelet.sock now, the socket still ours, and the kubelet listening (a ListAndWatch stream
// open). A kubelet that dropped the plugin without
// restarting leaves no stream: liveness then restarts the plugin, which registers anew.
func (e *endpoint) check(context.Context) error {
	ok, lastErr := e.registered()
	if !ok {
		if lastErr != nil {
			return fmt.Errorf("not registered with the kubelet: %w", lastErr)
		}
		return errors.New("not registered with the kubelet yet")
	}
	e.mu.Lock()
	own, with := e.own, e.registeredWith
	e.mu.Unlock()
	if id, err := statID(e.socket); err != nil || id != own {
		return fmt.Errorf("the plugin socket %s is gone or replaced", e.socket)
	}
	if id, err := statID(e.kubeletSocket); err != nil || id != with {
		return errors.New("the kubelet restarted since the registration; registering again")
	}
	if e.streams.Load() == 0 {
		return errors.New("registered, but the kubelet has no ListAndWatch stream open")
	}
	return nil
}
