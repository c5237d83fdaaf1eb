// Command imagetool writes an OCI image archive from host files, for `ctr images import` on the
// local test cluster (hack/images.sh). There is no container engine or registry on the machines
// this project is tested on, so images are assembled file by file.
//
//	imagetool -o pause.tar -name vgpu-dra/pause:dev -add /tmp/pause:/pause -entrypoint '["/pause"]'
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/vgpu-dra/vgpu-dra/hack/tools/ociarchive"
)

// listFlag collects every value of a repeated flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// jsonListFlag takes an exec-form list such as '["/bin/sh","-c","sleep 1"]'.
type jsonListFlag []string

func (l *jsonListFlag) String() string { b, _ := json.Marshal([]string(*l)); return string(b) }
func (l *jsonListFlag) Set(v string) error {
	var list []string
	if err := json.Unmarshal([]byte(v), &list); err != nil {
		return fmt.Errorf("want a JSON list of strings: %w", err)
	}
	*l = list
	return nil
}

type options struct {
	out, name, workdir   string
	entrypoint, cmd      jsonListFlag
	env, add, tree, dirs listFlag
	symlinks             listFlag
}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fset := flag.NewFlagSet("imagetool", flag.ContinueOnError)
	fset.StringVar(&o.out, "o", "", "output archive (tar of an OCI image layout)")
	fset.StringVar(&o.name, "name", "", "image name with tag, e.g. vgpu-dra/test-workload:dev")
	fset.StringVar(&o.workdir, "workdir", "", "working directory of the image's process")
	fset.Var(&o.entrypoint, "entrypoint", "entrypoint as a JSON list")
	fset.Var(&o.cmd, "cmd", "default arguments as a JSON list")
	fset.Var(&o.env, "env", "KEY=VALUE environment entry (repeatable)")
	fset.Var(&o.add, "add", "HOST_FILE:IMAGE_PATH[:OCTAL_MODE] (repeatable; follows symlinks)")
	fset.Var(&o.tree, "tree", "HOST_DIR:IMAGE_DIR, every file below HOST_DIR (repeatable)")
	fset.Var(&o.dirs, "dir", "IMAGE_DIR[:OCTAL_MODE], e.g. /tmp:1777 (repeatable)")
	fset.Var(&o.symlinks, "symlink", "IMAGE_PATH:TARGET (repeatable)")
	if err := fset.Parse(args); err != nil {
		return nil, err
	}
	if o.out == "" || o.name == "" {
		return nil, fmt.Errorf("-o and -name are required")
	}
	if fset.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fset.Args())
	}
	return o, nil
}

// splitSpec splits "A:B[:MODE]" specs; host paths with ':' are not supported.
func splitSpec(spec string, withMode bool) (a, b string, mode fs.FileMode, err error) {
	parts := strings.Split(spec, ":")
	switch {
	case len(parts) == 2:
		return parts[0], parts[1], 0, nil
	case len(parts) == 3 && withMode:
		mode, err = ociarchive.ParseMode(parts[2])
		return parts[0], parts[1], mode, err
	default:
		return "", "", 0, fmt.Errorf("bad spec %q", spec)
	}
}

func buildRootFS(o *options) (*ociarchive.RootFS, error) {
	root := ociarchive.NewRootFS()
	for _, spec := range o.dirs {
		dir, modeText, hasMode := strings.Cut(spec, ":")
		mode := fs.FileMode(0o755)
		if hasMode {
			var err error
			if mode, err = ociarchive.ParseMode(modeText); err != nil {
				return nil, err
			}
		}
		if err := root.AddDir(dir, mode); err != nil {
			return nil, err
		}
	}
	for _, spec := range o.add {
		src, dst, mode, err := splitSpec(spec, true)
		if err != nil {
			return nil, err
		}
		if err := root.AddFile(src, dst, mode); err != nil {
			return nil, err
		}
	}
	for _, spec := range o.tree {
		src, dst, _, err := splitSpec(spec, false)
		if err != nil {
			return nil, err
		}
		if err := root.AddTree(src, dst); err != nil {
			return nil, err
		}
	}
	for _, spec := range o.symlinks {
		dst, target, _, err := splitSpec(spec, false)
		if err != nil {
			return nil, err
		}
		if err := root.AddSymlink(dst, target); err != nil {
			return nil, err
		}
	}
	return root, nil
}

func run(args []string) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	root, err := buildRootFS(o)
	if err != nil {
		return err
	}
	return ociarchive.WriteArchive(o.out, root, ociarchive.ImageConfig{
		Name:       o.name,
		Entrypoint: o.entrypoint,
		Cmd:        o.cmd,
		Env:        o.env,
		WorkingDir: o.workdir,
	})
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "imagetool:", err)
		os.Exit(1)
	}
}
