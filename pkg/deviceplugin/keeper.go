package deviceplugin

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/go-logr/logr"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// keeper brings the share directory sets in line with what the kubelet says is held (contract
// §13): the device-plugin API has no call that says a container is gone, and after a reboot the
// kubelet re-creates containers from the Allocate answers it recorded, without asking again.
//
//   - A held set whose directory or vgpu.config is missing (a reboot emptied its tmpfs) is
//     rebuilt, never reset: a running container may be using it.
//   - A share directory set that no container holds is removed, but only once grace has passed
//     since the process started and since the set was last allocated (the kubelet records an
//     allocation after Allocate answers, and a set must not go in between), once keepMisses
//     answers in a row over at least keepMissSpan have not listed it (while the kubelet
//     restarts, its first answers may come before it has restored its own checkpoint), and
//     never while a process its pids.config lists still runs in a pod's container.
//
// Directories that are not a share's (another mode's claims) are left alone.
type keeper struct {
	alloc    *allocator
	holders  *holders
	grace    time.Duration
	interval time.Duration
	started  time.Time
	logger   logr.Logger
	// inUse reports whether a process of the share's containers still runs (its config
	// directory's pids.config); nil: not known, and only the misses decide.
	inUse func(configDir string) bool
	// misses are the shares the kubelet's answers have not listed, since when and how often.
	misses map[string]miss
}

type miss struct {
	first time.Time
	count int
}

const (
	// keepMisses answers in a row, over at least keepMissSpan, must miss a set before it goes.
	keepMisses   = 3
	keepMissSpan = 10 * time.Second
)

// pass reconciles once. An unreachable kubelet changes nothing.
func (k *keeper) pass(ctx context.Context) error {
	sets, err := k.holders.held(ctx)
	if err != nil {
		return err
	}
	a := k.alloc
	leads := map[string]bool{}
	heldIDs := map[string]bool{}
	for _, s := range sets {
		for _, id := range s.ids {
			heldIDs[id] = true
		}
	}
	k.holders.answers.forgetFreed(heldIDs)
	for _, s := range sets {
		al, err := a.inv.allocation(s.ids, nil)
		if err != nil {
			k.logger.Error(err, "A container holds devices this plugin does not offer (were the shares reconfigured?)", "pod", s.pod.namespace+"/"+s.pod.name, "devices", s.ids)
			continue
		}
		leads[al.lead.UID] = true
		if err := k.rebuild(al); err != nil {
			k.logger.Error(err, "Rebuild the directories of a held share", "share", al.lead.ID, "pod", s.pod.namespace+"/"+s.pod.name)
		}
	}
	uids, err := a.layout.ListClaims()
	if err != nil {
		return err
	}
	if k.misses == nil {
		k.misses = map[string]miss{}
	}
	now := a.now()
	for uid := range k.misses {
		if leads[uid] || !slices.Contains(uids, uid) {
			delete(k.misses, uid)
		}
	}
	for _, uid := range uids {
		sh, ok := a.inv.ByUID(uid)
		if !ok || leads[uid] {
			continue
		}
		m := k.misses[uid]
		if m.count == 0 {
			m.first = now
		}
		m.count++
		k.misses[uid] = m
		if m.count < keepMisses || now.Sub(m.first) < keepMissSpan {
			continue
		}
		if k.inUse != nil {
			if dirs, err := a.layout.PerClaimDirs(uid); err == nil && k.inUse(dirs.Config) {
				k.logger.V(2).Info("Keeping the directories of a share the kubelet does not list: a process of its containers still runs", "share", sh.ID)
				continue
			}
		}
		if err := k.remove(sh); err != nil {
			k.logger.Error(err, "Remove the directories of a share no container holds", "share", sh.ID)
		}
	}
	return nil
}

// rebuild makes a held set's directories and vgpu.config when they are missing.
func (k *keeper) rebuild(al allocation) error {
	a := k.alloc
	dirs, err := a.layout.PerClaimDirs(al.lead.UID)
	if err != nil {
		return err
	}
	_, err = os.Stat(filepath.Join(dirs.Config, contract.ContainerConfigName))
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, err := a.writeDirs(al, false); err != nil {
		return err
	}
	k.logger.Info("Rebuilt the directories of a held share", "share", al.lead.ID)
	return nil
}

// remove removes a set no container holds, once its grace has passed.
func (k *keeper) remove(sh *Share) error {
	a := k.alloc
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	if now.Sub(k.started) < k.grace || now.Sub(a.allocated[sh.UID]) < k.grace {
		return nil
	}
	if err := a.layout.RemoveClaim(sh.UID); err != nil {
		return err
	}
	delete(a.allocated, sh.UID)
	delete(k.misses, sh.UID)
	k.logger.V(2).Info("Removed the directories of a share no container holds", "share", sh.ID)
	return nil
}

// run reconciles every interval until ctx ends.
func (k *keeper) run(ctx context.Context) {
	t := time.NewTicker(k.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := k.pass(ctx); err != nil && ctx.Err() == nil {
				k.logger.V(2).Info("Share directories not reconciled", "err", err)
			}
		}
	}
}
