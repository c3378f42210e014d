package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// dirEnv gives the child process (mainexec) the test's temporary
// directory, for its XRC domains.
const dirEnv = "GOXRC_SERVER_TEST_DIR"

// onFabric, in the child process, makes main listen on an in-memory fabric
// (on the node of -addr's host) and, once it listens, runs client on a
// connection to it from another node of the fabric.
func onFabric(client func(ctx context.Context, c *cm.Conn)) {
	fab := memfabric.New()
	dir := os.Getenv(dirEnv)
	listen = func(ctx context.Context, addr string, opts ...cm.Option) (*cm.Listener, error) {
		host, _, _ := net.SplitHostPort(addr)
		opts = append(opts, cm.WithFabric(fab.Node(host).Process()), cm.WithDomainPath(filepath.Join(dir, "server")))
		l, err := cm.Listen(ctx, addr, opts...)
		if err == nil {
			go func() {
				ctx := context.Background() // not main's, which Ctrl-C ends
				c, err := cm.Dial(ctx, l.Addr().String(), cm.WithFabric(fab.Node("10.7.0.99").Process()), cm.WithDomainPath(filepath.Join(dir, "client")))
				if err != nil {
					fmt.Fprintln(os.Stderr, "test client:", err)
					return
				}
				client(ctx, c)
			}()
		}
		return l, err
	}
}
