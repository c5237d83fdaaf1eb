// Command etcd is the etcd server built from go.etcd.io/etcd/server/v3 at the version this
// module pins (the one Kubernetes pins), so the test cluster needs no etcd download.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
